// A gateway's own series on a running stack (the `sluice gateway` process, a dispatcher, the
// simulator): before any request, a refusal series at 0 for each reason the alerts read, so a
// gateway's first dispatcher_lost is a change rate() sees; its pool's leader as it sees it;
// and sluice_ttft_seconds counting streamed answers only, as a non-streamed answer's first
// byte comes with its whole body.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startStack, type Stack } from '../support/index.ts';

let stack: Stack;

beforeAll(async () => {
  stack = await startStack();
});

afterAll(async () => {
  await stack?.stop();
});

async function scrape(): Promise<string> {
  return (await fetch(`${stack.gateway.url}/metrics`)).text();
}

/** The value of one series, as written (`name{labels}`); undefined when absent. */
function value(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

const TTFT = 'sluice_ttft_seconds_count{model="m"}';
const DURATION = 'sluice_request_duration_seconds_count{model="m"}';

function complete(stream: boolean) {
  return fetch(`${stack.gateway.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: 'hello', max_tokens: 4, stream }),
  });
}

describe("the gateway's series", () => {
  it('start with every refusal reason the alerts read at 0, and the pool led', async () => {
    const text = await scrape();
    for (const reason of [
      'dispatcher_lost',
      'frame_lost',
      'queue_full',
      'park_timeout',
      'long_backlog',
      'no_leader',
    ])
      expect({
        reason,
        value: value(text, `sluice_rejected_total{model="m",reason="${reason}"}`),
      }).toEqual({ reason, value: 0 });
    // startStack waits for the gateway to see a leader.
    expect(value(text, 'sluice_pool_has_leader{pool="default"}')).toBe(1);
    expect(value(text, 'sluice_redis_up')).toBe(1);
  });

  it('do not count a non-streamed answer in sluice_ttft_seconds; a streamed one, once', async () => {
    const before = await scrape();
    const whole = await complete(false);
    expect(whole.status).toBe(200);
    await whole.json();
    const afterWhole = await scrape();
    expect(value(afterWhole, DURATION)).toBe((value(before, DURATION) ?? 0) + 1);
    expect(value(afterWhole, TTFT) ?? 0).toBe(value(before, TTFT) ?? 0);

    const streamed = await complete(true);
    expect(streamed.status).toBe(200);
    expect(await streamed.text()).toContain('data: [DONE]');
    const afterStream = await scrape();
    expect(value(afterStream, DURATION)).toBe((value(before, DURATION) ?? 0) + 2);
    expect(value(afterStream, TTFT)).toBe((value(before, TTFT) ?? 0) + 1);
  });
});
