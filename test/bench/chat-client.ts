// One chat completion as a benchmark client sees it: when its first token and its end
// arrived (performance.now()), for the scenarios that measure time to first token.
import { performance } from 'node:perf_hooks';
import { request, type Dispatcher } from 'undici';

export interface ChatTiming {
  status?: number;
  /** The first `data:` line of a stream (keep-alive comments are not tokens). */
  firstTokenAt?: number;
  doneAt?: number;
  error?: string;
}

/**
 * POSTs `payload` to `target`'s /v1/chat/completions and fills `record` in as the answer
 * arrives; resolves with the body's last 256 characters (to tell a complete answer), or
 * undefined when the request failed (`record.error` says how). Never rejects.
 */
export async function timedChat(
  target: string,
  payload: string,
  headers: Record<string, string>,
  agent: Dispatcher,
  record: ChatTiming,
): Promise<string | undefined> {
  try {
    const res = await request(`${target}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: payload,
      dispatcher: agent,
    });
    record.status = res.statusCode;
    let tail = '';
    for await (const chunk of res.body) {
      const text = (chunk as Buffer).toString('utf8');
      if (record.firstTokenAt === undefined && text.includes('data: '))
        record.firstTokenAt = performance.now();
      tail = (tail + text).slice(-256);
    }
    record.doneAt = performance.now();
    return tail;
  } catch (err) {
    record.doneAt = performance.now();
    record.error = (err as Error).message;
    return undefined;
  }
}
