// The overhead scenario's latency breakdown: where one request's time goes between the
// client, the gateway, Redis, the dispatcher and the engine. Stage marks come from the Sluice
// processes (libs/observability/src/stages.ts, recorded by stage-recorder.mjs) and from the
// client, all on the machine-wide monotonic clock. Pure apart from `readMarks`.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { quantile } from './results.ts';

export interface Mark {
  at: bigint;
  stage: string;
}

export interface Span {
  /** The stage this one is measured from (its cause). */
  from: string;
  /** What happens in between. */
  spans: string;
  /** Messages between processes in between (0: work inside one process). */
  hops: number;
  /** On the path from the client's send to its last byte (else beside it). */
  critical: boolean;
}

/** How each stage follows from an earlier one, for a non-streaming request. */
export const spans: Record<string, Span> = {
  'gateway.request': {
    from: 'client.send',
    spans: 'client to gateway: the HTTP request',
    hops: 1,
    critical: true,
  },
  'gateway.enqueue': {
    from: 'gateway.request',
    spans: 'gateway: peek at the body, build the job',
    hops: 0,
    critical: true,
  },
  'gateway.enqueued': {
    from: 'gateway.enqueue',
    spans: 'gateway to Redis and back: the admission count and BullMQ add in one MULTI',
    hops: 2,
    critical: false,
  },
  'dispatcher.job': {
    from: 'gateway.enqueue',
    spans:
      "gateway to Redis (the add), Redis to dispatcher (BullMQ's marker ends its blocking read), dispatcher to Redis and back (move to active)",
    hops: 4,
    critical: true,
  },
  'dispatcher.engine-call': {
    from: 'dispatcher.job',
    spans: 'dispatcher: check, degrade, hand to undici',
    hops: 0,
    critical: true,
  },
  'gateway.frame-start': {
    from: 'dispatcher.engine-call',
    spans: 'dispatcher to Redis to gateway: the start frame, sent with the head',
    hops: 2,
    critical: false,
  },
  'dispatcher.engine-head': {
    from: 'dispatcher.engine-call',
    spans: "dispatcher to engine and back: the engine's answer up to its head",
    hops: 2,
    critical: true,
  },
  'dispatcher.engine-end': {
    from: 'dispatcher.engine-head',
    spans: "dispatcher: the engine's body",
    hops: 0,
    critical: false,
  },
  'gateway.frame-head': {
    from: 'dispatcher.engine-head',
    spans: 'dispatcher to Redis to gateway: the head frame (pub/sub)',
    hops: 2,
    critical: true,
  },
  'gateway.response-end': {
    from: 'gateway.frame-head',
    spans: 'gateway: data and end frames, the response written',
    hops: 0,
    critical: true,
  },
  'client.done': {
    from: 'gateway.response-end',
    spans: 'gateway to client: the response',
    hops: 1,
    critical: true,
  },
};

/** Every mark the recorder wrote for `prefix` (one file per process). */
export function readMarks(dir: string, prefix: string): Mark[] {
  const marks: Mark[] = [];
  for (const file of readdirSync(dir).filter((f) => f.startsWith(`${prefix}.`)))
    for (const line of readFileSync(join(dir, file), 'utf8').split('\n')) {
      if (!line) continue;
      const space = line.indexOf(' ');
      marks.push({ at: BigInt(line.slice(0, space)), stage: line.slice(space + 1) });
    }
  return marks;
}

export interface StageRow extends Span {
  stage: string;
  /** Median time from the client's send to this stage, ms. */
  fromSend: number;
  /** Median time from `from` to this stage in the same request, ms. */
  gap: number;
  /** Its 99th percentile: which stage the slow requests lose their time in. */
  gapP99: number;
}

const quantileOf = (q: number) => (values: number[]) =>
  quantile(
    [...values].sort((a, b) => a - b),
    q,
  );
const median = quantileOf(0.5);
const p99 = quantileOf(0.99);

/**
 * One row per stage of `spans`, in the order of their median time. A request is the marks
 * between a `client.send` and the next `client.done` (requests run one at a time); a request
 * missing a stage is left out of that stage's row.
 */
export function breakdown(all: Mark[]): { rows: StageRow[]; requests: number } {
  const marks = [...all].sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0));
  const requests: Map<string, bigint>[] = [];
  let current: Map<string, bigint> | undefined;
  for (const mark of marks) {
    if (mark.stage === 'client.send') requests.push((current = new Map()));
    if (current && !current.has(mark.stage)) current.set(mark.stage, mark.at);
    if (mark.stage === 'client.done') current = undefined;
  }
  const complete = requests.filter((r) => r.has('client.done'));
  const ms = (ns: bigint) => Number(ns) / 1e6;
  const rows = Object.entries(spans).flatMap(([stage, span]) => {
    const fromSend: number[] = [];
    const gap: number[] = [];
    for (const r of complete) {
      const at = r.get(stage);
      const from = r.get(span.from);
      if (at === undefined || from === undefined) continue;
      fromSend.push(ms(at - r.get('client.send')!));
      gap.push(ms(at - from));
    }
    return fromSend.length === 0
      ? []
      : [{ stage, ...span, fromSend: median(fromSend), gap: median(gap), gapP99: p99(gap) }];
  });
  return { rows: rows.sort((a, b) => a.fromSend - b.fromSend), requests: complete.length };
}

/** Time on the critical path in gaps that cross processes, and in work inside one. */
export function criticalPath(rows: StageRow[]): { hops: number; hopMs: number; workMs: number } {
  const critical = rows.filter((r) => r.critical);
  const sum = (xs: StageRow[]) => xs.reduce((s, r) => s + r.gap, 0);
  return {
    hops: critical.reduce((n, r) => n + r.hops, 0),
    hopMs: sum(critical.filter((r) => r.hops > 0)),
    workMs: sum(critical.filter((r) => r.hops === 0)),
  };
}
