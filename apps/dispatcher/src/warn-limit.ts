// During an outage every connection, queue and worker reports the same error over and over.
// One warn line per kind of error and interval, with the message only (no stack): the JSON
// logs stay readable, and the first occurrence of each kind is never lost.
export type LimitedWarn = (what: string, err: unknown, fields?: object) => void;

export function limitedWarn(
  log: { warn(o: object, m: string): void },
  intervalMs = 10_000,
  now: () => number = Date.now,
): LimitedWarn {
  const last = new Map<string, number>();
  return (what, err, fields = {}) => {
    const e = err as { code?: unknown; message?: unknown } | undefined;
    const message = typeof e?.message === 'string' ? e.message : String(err);
    const kind = `${what}:${typeof e?.code === 'string' ? e.code : message.slice(0, 80)}`;
    const at = now();
    const previous = last.get(kind);
    if (previous !== undefined && at - previous < intervalMs) return;
    last.set(kind, at);
    if (last.size > 1000) last.clear();
    log.warn({ ...fields, err: message }, what);
  };
}
