// Scale out by pool: two pools spread over several dispatchers, by a cap on leased pools
// (SLUICE_MAX_LEASED_POOLS) or by a partition (SLUICE_POOLS). Who leads what is read from each
// dispatcher's own `sluice_leader{pool}`; every pool must still serve its requests.
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  eventually,
  sluiceBin,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  type SluiceProcess,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';

const POOLS = ['alpha', 'beta'] as const;
type Pool = (typeof POOLS)[number];

let redis: TestRedis;
let sims: Record<Pool, TestEngineSim>;
let dir: string;
let config: string;
/** The processes of the running test, stopped after it. */
const running: SluiceProcess[] = [];

beforeAll(async () => {
  redis = await startRedis();
  const simArgs = (model: string) => ['--profile', 'instant', '--model', model];
  const [alpha, beta] = await Promise.all(POOLS.map((p) => startEngineSim(simArgs(p))));
  sims = { alpha: alpha!, beta: beta! };
  dir = mkdtempSync(join(tmpdir(), 'sluice-pools-scale-'));
  config = join(dir, 'sluice.yaml');
  writeFileSync(
    config,
    [
      'pools:',
      ...POOLS.flatMap((p) => [
        `  - name: ${p}`,
        `    models: [${p}]`,
        `    engines: [{ url: "${sims[p].url}", name: ${p}-0, maxInflight: 2 }]`,
      ]),
      '',
    ].join('\n'),
  );
});

afterEach(async () => {
  await Promise.all(running.splice(0).map((p) => p.stop()));
});

afterAll(async () => {
  await Promise.all(Object.values(sims ?? {}).map((s) => s.stop()));
  await redis?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** Each test has its own key space, so no lease of an earlier test is in the way. */
const env = (prefix: string, extra: Record<string, string> = {}) => ({
  REDIS_URL: redis.url,
  SLUICE_REDIS_PREFIX: prefix,
  SLUICE_CONFIG: config,
  SLUICE_LEASE_TTL_MS: '1000',
  ...extra,
});

async function started(p: Promise<SluiceProcess>): Promise<SluiceProcess> {
  const proc = await p;
  running.push(proc);
  return proc;
}

/** The `sluice_leader` series of one dispatcher: pool → value. */
async function leaderSeries(d: SluiceProcess): Promise<Map<string, number>> {
  const text = await (await fetch(`${d.url}/metrics`)).text();
  const series = new Map<string, number>();
  for (const m of text.matchAll(/^sluice_leader\{pool="([^"]+)"\} (\S+)$/gm))
    series.set(m[1]!, Number(m[2]));
  return series;
}

/** The pools a dispatcher says it leads, sorted. */
async function leads(d: SluiceProcess): Promise<string[]> {
  return [...(await leaderSeries(d))]
    .filter(([, v]) => v === 1)
    .map(([pool]) => pool)
    .sort();
}

/** Waits until the dispatchers lead exactly these pools each. */
function settle(ds: SluiceProcess[], expected: (pools: string[][]) => boolean, what: string) {
  return eventually(async () => {
    const pools = await Promise.all(ds.map(leads));
    return expected(pools) ? pools : undefined;
  }, what);
}

async function ask(gateway: SluiceProcess, pool: Pool) {
  const res = await answer(
    fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: pool, messages: [{ role: 'user', content: 'hi' }] }),
    }),
  );
  return { status: res.status, body: res.body };
}

/** Both pools answer, each from its own engine. */
async function bothServed(gateway: SluiceProcess) {
  const before = await Promise.all(POOLS.map(async (p) => (await sims[p].state()).receivedTotal));
  for (const pool of POOLS) {
    const res = await ask(gateway, pool);
    expect(res.status, res.body).toBe(200);
    expect(JSON.parse(res.body).choices).toHaveLength(1);
  }
  const after = await Promise.all(POOLS.map(async (p) => (await sims[p].state()).receivedTotal));
  expect(after.map((n, i) => (n as number) - (before[i] as number))).toEqual([1, 1]);
}

const onePoolEach = (pools: string[][]) =>
  pools.every((p) => p.length === 1) && pools.flat().sort().join() === POOLS.join();

describe('SLUICE_MAX_LEASED_POOLS=1: two pools over two dispatchers', () => {
  it('gives each dispatcher one pool, and a third one takes the pool a SIGTERM orphans', async () => {
    const e = env('scale-limit', { SLUICE_MAX_LEASED_POOLS: '1' });
    // Started together: both contend for both pools at once.
    const [first, second] = await Promise.all([
      started(startDispatcher({ ...e, SLUICE_DISPATCHER_ID: 'first' })),
      started(startDispatcher({ ...e, SLUICE_DISPATCHER_ID: 'second' })),
    ]);
    const gateway = await started(startGateway(e));
    const [firstLeads] = await settle([first!, second!], onePoolEach, 'one pool each');
    await bothServed(gateway);

    // A standby at limit 1 leads nothing while both pools are led, then takes the orphan.
    const standby = await started(startDispatcher({ ...e, SLUICE_DISPATCHER_ID: 'standby' }));
    await first!.stop('SIGTERM');
    const [secondLeads, standbyLeads] = await settle(
      [second!, standby],
      onePoolEach,
      "the standby to take the first dispatcher's pool",
    );
    // The second dispatcher was at its limit: it kept its own pool and did not take the orphan.
    expect(standbyLeads).toEqual(firstLeads);
    expect(secondLeads).not.toEqual(firstLeads);
    await bothServed(gateway);
  });
});

describe('SLUICE_POOLS: a partition of the pools', () => {
  it('makes each dispatcher lead only its own pool, with no series for the other', async () => {
    const e = env('scale-partition');
    const [a, b] = await Promise.all([
      started(startDispatcher({ ...e, SLUICE_POOLS: 'alpha' })),
      started(startDispatcher({ ...e, SLUICE_POOLS: 'beta' })),
    ]);
    const gateway = await started(startGateway(e));
    await settle(
      [a!, b!],
      ([pa, pb]) => pa?.join() === 'alpha' && pb?.join() === 'beta',
      'alpha led by one, beta by the other',
    );
    // A pool outside SLUICE_POOLS has nothing here: no series of any metric names it.
    const metrics = await Promise.all(
      [a!, b!].map(async (d) => (await fetch(`${d.url}/metrics`)).text()),
    );
    expect(metrics[0]).not.toContain('pool="beta"');
    expect(metrics[1]).not.toContain('pool="alpha"');
    expect(metrics[0]).toContain('pool="alpha"');
    expect(metrics[1]).toContain('pool="beta"');
    await bothServed(gateway);
  });

  it('refuses a pool name that is not in the config: exit code 2, one line naming it', async () => {
    const result = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
      const child = execFile(
        process.execPath,
        [sluiceBin, 'dispatcher'],
        { env: { ...process.env, ...env('scale-bad', { SLUICE_POOLS: 'alpha,gamma' }) } },
        (_err, _stdout, stderr) => resolve({ code: child.exitCode, stderr }),
      );
    });
    expect(result.code).toBe(2);
    expect(result.stderr.trim().split('\n')).toEqual([
      'sluice dispatcher: SLUICE_POOLS="alpha,gamma" is invalid: expected names of configured pools (alpha, beta); "gamma" is not one',
    ]);
  });
});
