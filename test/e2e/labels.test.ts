// Metric labels take configured values only: 10,000 requests for unique 2 KB model names
// leave the series, /metrics and the gateway's memory where 100 such requests left them.
import { randomBytes } from 'node:crypto';
import { Pool } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startStack, type SluiceProcess, type Stack } from '../support/index.ts';

let stack: Stack;
let gateway: SluiceProcess;

beforeAll(async () => {
  stack = await startStack();
  ({ gateway } = stack);
});

afterAll(() => stack?.stop());

const randomModel = () => randomBytes(1024).toString('hex'); // 2 KB

async function scrape() {
  const text = await (await fetch(`${gateway.url}/metrics`)).text();
  const rss = Number(/^sluice_gateway_process_resident_memory_bytes (\S+)$/m.exec(text)?.[1]);
  return { text, rss };
}

async function sendUnknown(pool: Pool, names: string[]) {
  let next = 0;
  const worker = async () => {
    while (next < names.length) {
      const model = names[next++]!;
      const res = await pool.request({
        path: '/v1/chat/completions',
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'x' }] }),
      });
      await res.body.dump();
      if (res.statusCode !== 404) throw new Error(`expected 404, got ${res.statusCode}`);
    }
  };
  await Promise.all(Array.from({ length: 16 }, worker));
}

describe('metric labels from configured values only', () => {
  it('10,000 unique 2 KB model names leave /metrics, its series and the memory flat', async () => {
    const pool = new Pool(gateway.url, { connections: 16 });
    try {
      const first = Array.from({ length: 100 }, randomModel);
      await sendUnknown(pool, first);
      const early = await scrape();
      const rest = Array.from({ length: 9_900 }, randomModel);
      await sendUnknown(pool, rest);
      const late = await scrape();

      for (const name of [...first, ...rest]) expect(late.text.includes(name)).toBe(false);
      expect(late.text).toMatch(
        /^sluice_rejected_total\{model="unknown",reason="model_not_found"\} 10000$/m,
      );
      // Sluice's own series. The runtime's default metrics (`sluice_gateway_` + prom-client's
      // names) take their labels from Node, not from clients: a GC kind or an active resource
      // type seen for the first time adds a series (seen once under load: 91 -> 93).
      const series = (text: string) =>
        text.split('\n').filter((l) => /^sluice_/.test(l) && !/^sluice_gateway_/.test(l)).length;
      expect(series(late.text)).toBe(series(early.text));
      // Only counter digits and process gauges change.
      expect(late.text.length - early.text.length).toBeLessThan(2048);
      // Generous: the bound is against growth with the names (the issue saw +58 MB), not noise.
      expect(late.rss - early.rss).toBeLessThan(60 * 1024 * 1024);
      // For the operator's figures.
      console.info(
        `labels: /metrics ${early.text.length} -> ${late.text.length} bytes, ${series(late.text)} series, ` +
          `RSS ${(early.rss / 2 ** 20).toFixed(1)} -> ${(late.rss / 2 ** 20).toFixed(1)} MiB after 10,000 names`,
      );
    } finally {
      await pool.close();
    }
  }, 120_000);
});
