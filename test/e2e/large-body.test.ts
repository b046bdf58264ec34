// A large prompt (over SLUICE_BODY_KEY_MIN_BYTES) through the whole stack: its body travels
// raw in a key of its own, written by the gateway's admission script and read and deleted by
// the dispatcher. The engine must get exactly the prompt the client sent (compared with the
// same request sent straight to it), and nothing of the body may stay in Redis.
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answer, startStack, type Stack } from '../support/index.ts';

let stack: Stack;
let client: Redis;

beforeAll(async () => {
  stack = await startStack({ env: { ADMISSION_MAX_INFLIGHT: '2' } });
  client = new Redis(stack.redis.url);
});

afterAll(async () => {
  await client?.quit();
  await stack?.stop();
});

/** About `bytes` of chat body whose text needs JSON escapes and UTF-8 of every width. */
function largeChat(bytes: number, tag: string, stream: boolean): string {
  const unit = `${tag} caf\u00e9 "q" \\ back\nslash \u4e2d\u6587 \u{1F600} \t end. `;
  return JSON.stringify({
    model: 'm',
    messages: [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: unit.repeat(Math.ceil(bytes / Buffer.byteLength(unit))) },
    ],
    max_tokens: 4,
    stream,
    // The simulator's prefill stays short; the prompt's bytes are what is checked.
    sim_prompt_tokens: 100,
  });
}

async function post(base: string, body: string) {
  return answer(
    fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    }),
  );
}

interface Received {
  requests: Array<{ promptSha256: string }>;
}

async function lastPromptSha(): Promise<string> {
  const received = (await (await fetch(`${stack.sim.url}/sim/received`)).json()) as Received;
  return received.requests.at(-1)!.promptSha256;
}

/** Every key Redis holds whose name matches `pattern`. */
async function keysLike(pattern: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await client.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    found.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return found;
}

describe('a large prompt', () => {
  it.each([false, true])(
    'reaches the engine byte for byte and leaves nothing in Redis (stream: %s)',
    async (stream) => {
      const body = largeChat(300 * 1024, `large-${stream}`, stream);
      expect(Buffer.byteLength(body)).toBeGreaterThan(64 * 1024);

      const viaSluice = await post(stack.gateway.url, body);
      expect(viaSluice.status, viaSluice.body.slice(0, 300)).toBe(200);
      if (stream) expect(viaSluice.body.endsWith('data: [DONE]\n\n')).toBe(true);
      else expect(JSON.parse(viaSluice.body).choices[0].finish_reason).toBe('length');
      const sluiceSha = await lastPromptSha();

      const direct = await post(stack.sim.url, body);
      expect(direct.status).toBe(200);
      expect(sluiceSha).toBe(await lastPromptSha());

      // The dispatcher deleted the body as it read it; BullMQ removed the job.
      expect(await keysLike('sluice:*sluice-body*')).toEqual([]);
    },
  );
});
