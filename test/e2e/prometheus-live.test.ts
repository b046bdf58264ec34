// The shipped dashboard and alert rules, evaluated by a real Prometheus (Debian's binary)
// that scrapes a running stack with a leader and a standby: every expression evaluates, the
// queue depth panel shows the depth Redis holds, the bypass panel the leader's 0 (all traffic
// goes through Sluice), no alert fires, and the standby exports none of the pool gauges.
// `promtool check metrics` accepts a live scrape of both processes. Then the leader is killed:
// the former standby exports the pool, and the panels and alerts stay true. The tests run in
// order on one stack, each going on from the state the one before left.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  eventually,
  freePort,
  queuedJobs,
  repoRoot,
  startProcess,
  startStack,
  type SluiceProcess,
  type Stack,
  type StartedProcess,
} from '../support/index.ts';

/** The pool-level gauges only a pool's leader exports (apps/dispatcher/src/leader-metrics.ts). */
const LEADER_ONLY = [
  'sluice_queue_depth',
  'sluice_queue_oldest_age_seconds',
  'sluice_pool_mode',
  'sluice_engine_running',
  'sluice_engine_waiting',
  'sluice_engine_kv_usage_ratio',
  'sluice_engine_bypass_requests',
  'sluice_engine_up',
  'sluice_engine_last_scrape_timestamp_seconds',
  'sluice_observer_degraded',
  'sluice_inflight_limit',
  'sluice_gate_open',
  'sluice_load_state',
  'sluice_load_signal_ratio',
  'sluice_long_prompts_held',
  'sluice_long_prefill_tokens_per_second',
  'sluice_tenant_queued',
  'sluice_tenant_virtual_tokens',
];
/** promtool's lint on prom-client's own nodejs_active_{handles,requests,resources}_total. */
const PROM_CLIENT_TOTAL_GAUGE =
  /^sluice_(gateway|dispatcher)_nodejs_active_(handles|requests|resources)_total non-counter metrics should not have "_total" suffix$/;
const CAP = 2;
const QUEUED = 3;

const rulesFile = join(repoRoot, 'deploy', 'prometheus', 'sluice-rules.yaml');
// The dashboard's queries as Grafana sends them with the namespace variable at All (its
// allValue `.*`, which matches compose's stack, where no series has a namespace label).
const dashboard = JSON.parse(
  readFileSync(join(repoRoot, 'deploy', 'grafana', 'sluice-dashboard.json'), 'utf8').replaceAll(
    '$namespace',
    '.*',
  ),
) as { panels: { title: string; targets?: { expr: string }[] }[] };

let stack: Stack;
let leader: SluiceProcess;
let standby: SluiceProcess;
let client: Redis;
let prometheus: StartedProcess;
let promUrl: string;
let dir: string;
const streams = new AbortController();

interface Sample {
  metric: Record<string, string>;
  value: [number, string];
}

/** One instant query; a Prometheus error is thrown with the expression it came from. */
async function query(expr: string): Promise<Sample[]> {
  const res = await fetch(`${promUrl}/api/v1/query?query=${encodeURIComponent(expr)}`);
  const body = (await res.json()) as {
    status: string;
    error?: string;
    data?: { resultType: string; result: Sample[] };
  };
  if (body.status !== 'success') throw new Error(`${expr}: ${body.error ?? res.status}`);
  return body.data!.result;
}

async function scrape(process: SluiceProcess): Promise<string> {
  return (await fetch(`${process.url}/metrics`)).text();
}

/**
 * The value of the sample line of an exposition that starts with `prefix` (a name and the
 * first labels, or a whole series followed by a space); undefined when absent.
 */
function sample(text: string, prefix: string): number | undefined {
  const found = text.split('\n').find((l) => l.startsWith(prefix));
  return found === undefined ? undefined : Number(found.slice(found.lastIndexOf(' ') + 1));
}

const hostPort = (url: string) => new URL(url).host;

beforeAll(async () => {
  stack = await startStack({
    dispatchers: 2,
    // Slow decoding and long answers: the requests on the engine run until the test ends.
    sim: ['--max-num-seqs', '64', '--decode-seconds-per-sequence', '0.01'],
    env: {
      ADMISSION_MAX_INFLIGHT: String(CAP),
      ENGINE_SCRAPE_INTERVAL_MS: '200',
      ENGINE_STALE_AFTER_FAILURES: '20',
    },
  });
  client = new Redis(stack.redis.url);
  // The first dispatcher started leads; asked of each, not assumed.
  const leading = await Promise.all(
    stack.dispatchers.map(async (d) => sample(await scrape(d), 'sluice_leader{pool="default"} ')),
  );
  expect([...leading].sort()).toEqual([0, 1]);
  [leader, standby] =
    leading[0] === 1
      ? [stack.dispatchers[0]!, stack.dispatchers[1]!]
      : [stack.dispatchers[1]!, stack.dispatchers[0]!];

  dir = mkdtempSync(join(tmpdir(), 'sluice-prometheus-'));
  const port = await freePort();
  promUrl = `http://127.0.0.1:${port}`;
  const config = {
    global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
    rule_files: [rulesFile],
    scrape_configs: [
      { job_name: 'sluice-gateway', static_configs: [{ targets: [hostPort(stack.gateway.url)] }] },
      {
        job_name: 'sluice-dispatcher',
        static_configs: [{ targets: stack.dispatchers.map((d) => hostPort(d.url)) }],
      },
    ],
  };
  // JSON is YAML.
  writeFileSync(join(dir, 'prometheus.yml'), JSON.stringify(config));
  prometheus = await startProcess({
    command: 'prometheus',
    args: [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
    ],
    ready: /Server is ready to receive web requests/,
  });
  await eventually(async () => {
    const res = await fetch(`${promUrl}/-/ready`).catch(() => undefined);
    return res?.status === 200 ? true : undefined;
  }, 'Prometheus /-/ready');
}, 120_000);

afterAll(async () => {
  streams.abort();
  await prometheus?.stop();
  await client?.quit();
  await stack?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/**
 * Resolves once Prometheus has scraped every target after this call, and found up those
 * that are alive (all but `dead`).
 */
async function freshScrape(dead: SluiceProcess[] = []): Promise<void> {
  const after = Date.now();
  const down = new Set(dead.map((d) => hostPort(d.url)));
  await eventually(
    async () => {
      const res = await fetch(`${promUrl}/api/v1/targets`);
      const body = (await res.json()) as {
        data: {
          activeTargets: { health: string; lastScrape: string; labels: { instance: string } }[];
        };
      };
      const targets = body.data.activeTargets;
      return targets.length === 3 &&
        targets.every(
          (t) =>
            Date.parse(t.lastScrape) > after &&
            t.health === (down.has(t.labels.instance) ? 'down' : 'up'),
        )
        ? true
        : undefined;
    },
    'Prometheus to scrape the gateway and both dispatchers',
    60_000,
  );
}

/** Resolves once every rule group was evaluated after this call; returns the rules. */
async function freshRules() {
  const after = Date.now();
  return eventually(
    async () => {
      const res = await fetch(`${promUrl}/api/v1/rules`);
      const body = (await res.json()) as {
        data: {
          groups: {
            lastEvaluation: string;
            rules: { name: string; query: string; health: string; lastError?: string }[];
          }[];
        };
      };
      const groups = body.data.groups;
      return groups.length > 0 && groups.every((g) => Date.parse(g.lastEvaluation) > after)
        ? groups.flatMap((g) => g.rules)
        : undefined;
    },
    'Prometheus to evaluate the rules',
    60_000,
  );
}

/**
 * Waits until `d`'s own reading has caught up with the stack: `queued` jobs waiting, the cap
 * active and on the engine, no bypass traffic.
 */
async function caughtUp(d: SluiceProcess, queued: number): Promise<void> {
  let seen = '';
  await eventually(async () => {
    const text = await scrape(d);
    seen = text;
    const at = (state: string) =>
      sample(text, `sluice_queue_depth{pool="default",state="${state}"} `);
    return (at('wait') ?? 0) + (at('prioritized') ?? 0) + (at('delayed') ?? 0) === queued &&
      at('active') === CAP &&
      sample(text, 'sluice_engine_running{pool="default",') === CAP &&
      sample(text, 'sluice_engine_bypass_requests{pool="default",') === 0
      ? true
      : undefined;
  }, "the leader's gauges to show the queue and the engine").catch((err: Error) => {
    const lines = seen.split('\n').filter((l) => /^sluice_(queue_depth|engine_|leader)/.test(l));
    throw new Error(`${err.message}; last seen:\n${lines.join('\n')}`);
  });
}

/** The sum of the queue depth panel's waiting states for pool default, and its active one. */
async function depthPanel() {
  const panel = dashboard.panels.find((p) => p.title === 'Queue depth by state')!;
  const depth = await query(panel.targets![0]!.expr);
  const byState = Object.fromEntries(
    depth
      .filter((s) => s.metric['pool'] === 'default')
      .map((s) => [s.metric['state'], Number(s.value[1])]),
  );
  return {
    queued: byState['wait']! + byState['prioritized']! + byState['delayed']!,
    active: byState['active'],
  };
}

describe('the shipped dashboard and rules, on a live stack with a standby', () => {
  it('show the true queue depth and bypass; every expression evaluates; no alert fires', async () => {
    // Five requests: the cap of 2 on the engine, 3 in the queue, all staying there.
    for (let i = 0; i < CAP + QUEUED; i += 1)
      void fetch(`${stack.gateway.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'm',
          messages: [{ role: 'user', content: `request ${i}` }],
          stream: true,
          max_tokens: 30_000,
          ignore_eos: true,
        }),
        signal: streams.signal,
      })
        // Read as it streams: a client that stops reading is cut off as a slow reader.
        .then((res) => res.body?.pipeTo(new WritableStream()))
        .catch(() => undefined);
    await eventually(
      async () =>
        (await stack.sim.state()).running === CAP && (await queuedJobs(client)) === QUEUED
          ? true
          : undefined,
      `${CAP} requests on the engine and ${QUEUED} queued`,
    );
    await caughtUp(leader, QUEUED);
    await freshScrape();
    await freshRules();

    // The truth, read again after the scrape: nothing moved.
    const queued = await queuedJobs(client);
    expect(queued).toBe(QUEUED);
    expect((await stack.sim.state()).running).toBe(CAP);

    // Every dashboard expression evaluates.
    const exprs = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr));
    expect(exprs.length).toBeGreaterThan(20);
    const results = new Map<string, Sample[]>();
    for (const expr of exprs) results.set(expr, await query(expr));

    // The queue depth panel: the depth Redis holds, per state, once.
    expect(await depthPanel()).toEqual({ queued, active: CAP });
    // One exporter per fact: each pool series comes from one dispatcher.
    for (const s of await query('count by (pool, state) (sluice_queue_depth)'))
      expect(Number(s.value[1])).toBe(1);
    // Across the instances, summed as an operator might: still the truth.
    const summed = await query(
      'sum(sluice_queue_depth{state=~"wait|prioritized|delayed", pool="default"})',
    );
    expect(Number(summed[0]!.value[1])).toBe(queued);

    // The bypass panel: the leader's 0, with the engine running what Sluice sent.
    const bypassExpr = exprs.find((e) => e.includes('sluice_engine_bypass_requests'))!;
    const bypass = results.get(bypassExpr)!;
    const engine = new URL(stack.sim.url).host;
    expect(bypass.map((s) => [s.metric['pool'], s.metric['engine'], Number(s.value[1])])).toEqual([
      ['default', engine, 0],
    ]);
    const runningExpr = exprs.find((e) => e.includes('sluice_engine_running'))!;
    expect(Number(results.get(runningExpr)![0]!.value[1])).toBe(CAP);

    // The standby exports none of the pool gauges, neither on its /metrics nor in Prometheus.
    const standbyText = await scrape(standby);
    expect(sample(standbyText, 'sluice_leader{pool="default"} ')).toBe(0);
    const exported = LEADER_ONLY.filter((name) =>
      standbyText.split('\n').some((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `)),
    );
    expect(exported).toEqual([]);
    const standbyTarget = hostPort(standby.url);
    const fromStandby = await query(
      `count by (__name__) ({__name__=~"${LEADER_ONLY.join('|')}", instance="${standbyTarget}"})`,
    );
    expect(fromStandby).toEqual([]);

    // Every rule: loaded from the shipped file, evaluated without error; and nothing fires
    // (the engine is fresh, a leader leads, no refusals).
    const rules = await freshRules();
    const shipped = readFileSync(rulesFile, 'utf8').match(/^\s+- alert: /gm)!.length;
    expect(rules.length).toBe(shipped);
    for (const rule of rules) {
      expect({ rule: rule.name, health: rule.health, error: rule.lastError ?? '' }).toEqual({
        rule: rule.name,
        health: 'ok',
        error: '',
      });
      expect({ rule: rule.name, result: await query(rule.query) }).toEqual({
        rule: rule.name,
        result: [],
      });
    }
    expect(await query('ALERTS')).toEqual([]);
  }, 180_000);

  it('passes `promtool check metrics` on a live scrape of the gateway and the dispatcher', async () => {
    for (const process of [stack.gateway, leader, standby]) {
      const text = await scrape(process);
      expect(text).toContain('sluice_');
      const { output } = await checkMetrics(text);
      // prom-client's default collector names three gauges `*_total` (docs/metrics.md): the
      // only complaints accepted, every other line would be ours.
      const ours = output.split('\n').filter((l) => l !== '' && !PROM_CLIENT_TOTAL_GAUGE.test(l));
      expect({ url: process.url, complaints: ours }).toEqual({ url: process.url, complaints: [] });
    }
  });

  it('after the leader dies, the former standby exports the pool: still the true depth, a leader, no bypass', async () => {
    const truthBefore = await queuedJobs(client);
    await leader.stop('SIGKILL');
    await eventually(
      async () =>
        sample(await scrape(standby), 'sluice_leader{pool="default"} ') === 1 ? true : undefined,
      'the standby to take the lease',
    );
    // The dead leader's jobs fail by the stalled check; the new leader fills the cap from the
    // queue, and its own reading catches up.
    const queued = truthBefore - CAP;
    await eventually(
      async () =>
        (await queuedJobs(client)) === queued && (await stack.sim.state()).running === CAP
          ? true
          : undefined,
      `the new leader to run ${CAP} and leave ${queued} queued`,
    );
    await caughtUp(standby, queued);
    await freshScrape([leader]);
    await freshRules();

    expect(await queuedJobs(client)).toBe(queued);
    expect(await depthPanel()).toEqual({ queued, active: CAP });
    for (const s of await query('count by (pool, state) (sluice_queue_depth)'))
      expect(Number(s.value[1])).toBe(1);
    const bypassExpr = dashboard.panels
      .flatMap((p) => (p.targets ?? []).map((t) => t.expr))
      .find((e) => e.includes('sluice_engine_bypass_requests'))!;
    expect((await query(bypassExpr)).map((s) => Number(s.value[1]))).toEqual([0]);
    const noLeader = (await freshRules()).find((r) => r.name === 'SluiceNoLeader')!;
    expect(await query(noLeader.query)).toEqual([]);
    expect(await query('ALERTS{alertname="SluiceNoLeader"}')).toEqual([]);
  }, 180_000);
});

/** `promtool check metrics` with the exposition on stdin: exit status and its complaints. */
function checkMetrics(text: string): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('promtool', ['check', 'metrics'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, output }));
    child.stdin.end(text);
  });
}
