// A client of a running stack, as e2e tests use it: chat requests, whole answers (a transport
// failure is an answer too, to be asserted on), and metrics read from /metrics.
import type { SluiceProcess } from './sluice.ts';

/** POSTs a chat completion for model `m` with one user message and `extra` fields. */
export function chat(
  base: string,
  content: string,
  extra: Record<string, unknown> = {},
  signal?: AbortSignal,
): Promise<Response> {
  return fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content }], ...extra }),
    ...(signal ? { signal } : {}),
  });
}

export interface Answer {
  /** 0 when the transport failed before a response. */
  status: number;
  /** `x-sluice-reject-reason`. */
  reason: string | null;
  retryAfter: string | null;
  /** The whole body; a transport failure mid-body is appended as `transport error: ...`. */
  body: string;
}

/** Reads a whole answer. Never rejects. */
export async function answer(response: Promise<Response>): Promise<Answer> {
  let res: Response;
  try {
    res = await response;
  } catch (err) {
    return { status: 0, reason: null, retryAfter: null, body: `transport error: ${String(err)}` };
  }
  return {
    status: res.status,
    reason: res.headers.get('x-sluice-reject-reason'),
    retryAfter: res.headers.get('retry-after'),
    body: await readAll(res),
  };
}

/** The body as text; a transport failure mid-body is appended as `transport error: ...`. */
export async function readAll(res: Response): Promise<string> {
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return text;
      text += decoder.decode(value, { stream: true });
    }
  } catch (err) {
    return `${text}\ntransport error: ${String(err)}`;
  }
}

/**
 * Reads a stream until its first `data:` event (the engine runs it) and goes on reading in the
 * background: `rest` resolves with the whole text once the stream ends.
 */
export async function streamStarted(res: Response): Promise<{ rest: Promise<string> }> {
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes('data: ')) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
  }
  const rest = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return text;
      text += decoder.decode(value, { stream: true });
    }
  })();
  return { rest };
}

/** A metric summed over its series; undefined when the process exports none of them. */
export async function metricSum(
  url: string,
  name: string,
  /** Only samples carrying each of these labels with this value. */
  labels: Record<string, string> = {},
): Promise<number | undefined> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  const lines = text
    .split('\n')
    .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
    .filter((l) => wanted.every((w) => l.slice(0, l.lastIndexOf(' ')).includes(w)));
  if (lines.length === 0) return undefined;
  return lines.reduce((sum, l) => sum + Number(l.split(' ').pop()), 0);
}

/** True while the process has neither exited nor been killed by a signal. */
export const alive = (p: SluiceProcess): boolean =>
  p.process.child.exitCode === null && p.process.child.signalCode === null;
