// The dispatcher's read-only /status page in a real headless Chromium: served by the standby
// as well as the leader, it shows the queue filling under load and draining back to zero,
// and never any prompt text. The screenshot taken under load goes to test/output/.
import { mkdir } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answer, chat, startStack, type Stack } from '../support/index.ts';

const outputDir = fileURLToPath(new URL('../output/', import.meta.url));
const REQUESTS = 10;
// In the prompts only: the page and its JSON must never show it.
const PROMPT_MARKER = 'prompt-text-that-must-not-show';

// The little of the DOM the in-page conditions use (the tests compile without lib.dom).
declare const document: {
  querySelector(selector: string): { textContent: string | null } | null;
  getElementById(id: string): { dataset: Record<string, string | undefined> } | null;
};

let stack: Stack;
let browser: Browser;

beforeAll(async () => {
  stack = await startStack({
    // One second per answer (20 tokens, 50 ms a step) and one at a time: a queue builds.
    sim: [
      '--decode-seconds-per-sequence',
      '0.05',
      '--output-len-min',
      '20',
      '--output-len-max',
      '20',
    ],
    env: { ADMISSION_MAX_INFLIGHT: '1', VLLM_MAX_QUEUE_DEPTH: '100', SLUICE_DEGRADATION: 'off' },
    dispatchers: 2,
  });
  browser = await chromium.launch({
    executablePath: process.env['CHROMIUM_BIN'] ?? '/usr/bin/chromium',
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await stack?.stop();
});

/** Resolves once a field of the default pool shows a number from `min` to `max`. */
async function waitForField(page: Page, field: string, min: number, max = Number.MAX_SAFE_INTEGER) {
  try {
    await page.waitForFunction(
      ({ field, min, max }) => {
        const text = document.querySelector(
          `[data-pool="default"] [data-field="${field}"]`,
        )?.textContent;
        const n = text ? Number(text) : NaN;
        return n >= min && n <= max;
      },
      { field, min, max },
      { timeout: 45_000 },
    );
  } catch (err) {
    const shown = await page.textContent('body').catch(() => '?');
    throw new Error(`the page did not show ${field} from ${min} to ${max}; it shows: ${shown}`, {
      cause: err,
    });
  }
}

describe('the /status page', () => {
  it('shows the queue filling under load and draining back, from the standby too', async () => {
    const standby = stack.dispatchers[1]!;
    const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
    const errors: string[] = [];
    page.on('pageerror', (err) => errors.push(err.message));
    page.on('console', (msg) => {
      if (msg.type() === 'error') errors.push(msg.text());
    });
    const res = await page.goto(`${standby.url}/status`);
    expect(res?.status()).toBe(200);
    expect(res?.headers()['content-security-policy']).toMatch(/script-src 'sha256-/);

    // Drawn from the leader's published stats: an idle pool, and who serves the page.
    await waitForField(page, 'queued', 0, 0);
    await page.waitForFunction(
      () => document.getElementById('served')?.dataset['leads'] === 'false',
    );
    expect(await page.textContent('#served')).toMatch(/stands by for default/);
    const leader = await page.textContent('[data-pool="default"] [data-field="leader"]');
    expect(await page.textContent('[data-pool="default"] [data-field="role"]')).toBe('standby');

    const answers = Array.from({ length: REQUESTS }, (_, i) =>
      answer(chat(stack.gateway.url, `${PROMPT_MARKER} ${i}`)),
    );
    await waitForField(page, 'queued', 3);
    await waitForField(page, 'active', 1, 1);
    await mkdir(outputDir, { recursive: true });
    await page.screenshot({ path: `${outputDir}status-page.png`, fullPage: true });

    // The page and what it polls carry counts and names, not prompts.
    expect(await page.content()).not.toContain(PROMPT_MARKER);
    const json = await (await fetch(`${standby.url}/status.json`)).text();
    expect(json).not.toContain(PROMPT_MARKER);
    expect(JSON.parse(json)).toMatchObject({
      dispatcher: { leading: [], standby: ['default'] },
      pools: [{ pool: 'default', stats: { leader } }],
    });

    for (const a of await Promise.all(answers)) expect(a.status).toBe(200);
    await waitForField(page, 'queued', 0, 0);
    await waitForField(page, 'active', 0, 0);
    expect(errors).toEqual([]);
    await page.close();
  }, 180_000);

  it('is served by the leader, which says it leads', async () => {
    const page = await browser.newPage();
    await page.goto(`${stack.dispatcher.url}/status`);
    await page.waitForFunction(
      () => document.getElementById('served')?.dataset['leads'] === 'true',
    );
    expect(await page.textContent('#served')).toMatch(/leads default/);
    expect(await page.textContent('[data-pool="default"] [data-field="role"]')).toBe('leader');
    await page.close();
  });
});
