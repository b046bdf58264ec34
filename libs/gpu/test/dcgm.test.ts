import { readFileSync } from 'node:fs';
import { createServer, type RequestListener, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { freePort } from '@sluice/test/support';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createGpuSource, dcgmReadings, GpuSourceError, type GpuSource } from '../src/index.ts';
import { MiB, record } from './helpers.ts';

const FIXTURE = readFileSync(
  new URL('./fixtures/dcgm-exporter-4xh100.prom', import.meta.url),
  'utf8',
);
const H100_MIB = 81559;

/** Two H100s; pods share GPU 0 (time slicing): three series each, differing in pod labels. */
const SHARED = readFileSync(
  new URL('./fixtures/dcgm-exporter-shared-gpu.prom', import.meta.url),
  'utf8',
);

const FOUR_H100 = [
  {
    index: 0,
    uuid: 'GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52',
    utilization: 0.37,
    memoryUsed: 20480 * MiB,
    memoryTotal: H100_MIB * MiB,
  },
  {
    index: 1,
    uuid: 'GPU-1c2e8d4b-0f7a-5b39-84c6-3e9a1d7f2b60',
    utilization: 0.91,
    memoryUsed: 79872 * MiB,
    memoryTotal: H100_MIB * MiB,
  },
  {
    index: 2,
    uuid: 'GPU-a3f9b2e1-7c4d-4e8f-9a0b-5d6c7e8f9012',
    utilization: 0,
    memoryUsed: 0,
    memoryTotal: H100_MIB * MiB,
  },
  {
    index: 3,
    uuid: 'GPU-e7d6c5b4-a392-4180-b7f6-e5d4c3b2a190',
    utilization: 1,
    memoryUsed: 81000 * MiB,
    memoryTotal: H100_MIB * MiB,
  },
];

function listen(handler: RequestListener, port = 0): Promise<Server> {
  const server = createServer(handler);
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve(server));
  });
}

function close(server: Server): Promise<void> {
  server.closeAllConnections();
  return new Promise((resolve) => server.close(() => resolve()));
}

function exposition(body: string, status = 200): RequestListener {
  return (_req, res) => {
    res.writeHead(status, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' });
    res.end(body);
  };
}

describe('GPU_SOURCE=dcgm against a real HTTP server', () => {
  let respond: RequestListener = exposition(FIXTURE);
  let server: Server;
  let url: string;
  let requests: string[] = [];
  let source: GpuSource | undefined;
  let clock = 1_700_000_000_000;
  const now = () => clock;

  beforeAll(async () => {
    server = await listen((req, res) => {
      requests.push(`${req.method} ${req.url}`);
      respond(req, res);
    });
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/metrics`;
  });

  afterEach(async () => {
    await source?.stop();
    source = undefined;
    respond = exposition(FIXTURE);
    requests = [];
  });

  afterAll(() => close(server));

  function dcgm(pollMs = 25, dcgmUrl = url) {
    source = createGpuSource({ source: 'dcgm', dcgmUrl, pollMs, now })!;
    return source;
  }

  it('reads every GPU of a dcgm-exporter exposition on start (MiB to bytes, total = used + free)', async () => {
    const gpu = dcgm();
    expect(gpu.kind).toBe('dcgm');
    await gpu.start();
    expect(gpu.latest()).toEqual({ at: clock, gpus: FOUR_H100 });
    expect(requests[0]).toBe('GET /metrics');
  });

  it('scrapes every pollMs and emits each reading', async () => {
    const gpu = dcgm();
    const events = record(gpu);
    await gpu.start();
    clock += 25;
    expect((await events.nextSnapshot()).at).toBe(clock);
    expect(requests.length).toBeGreaterThanOrEqual(2);
  });

  it('emits an error with the reason on a 500 or on garbage, keeps the last snapshot, and recovers', async () => {
    const gpu = dcgm();
    const events = record(gpu);
    await gpu.start();
    const good = gpu.latest()!;

    respond = exposition('upstream exploded\n', 500);
    expect(await events.nextError()).toMatchObject({
      code: 'ERR_GPU_SCRAPE',
      message: `GPU_SOURCE=dcgm: scrape of ${url} answered HTTP 500`,
    });
    expect(gpu.latest()).toBe(good);

    respond = exposition('<html><body>It works!</body></html>\n');
    expect(await events.nextError()).toMatchObject({
      code: 'ERR_GPU_PARSE',
      message: expect.stringMatching(/^GPU_SOURCE=dcgm: exposition does not parse: line 1: /),
    });
    expect(gpu.latest()).toBe(good);

    respond = exposition('# TYPE node_load1 gauge\nnode_load1 0.42\n');
    expect(await events.nextError()).toMatchObject({
      code: 'ERR_GPU_PARSE',
      message: expect.stringContaining('no DCGM_FI_DEV_GPU_UTIL samples'),
    });
    expect(gpu.latest()).toBe(good);
    expect(events.errors.every((e) => !e.message.includes('\n'))).toBe(true);

    respond = exposition(FIXTURE);
    clock += 5000;
    const recovered = await events.nextSnapshot();
    expect(recovered).toEqual({ at: clock, gpus: FOUR_H100 });
  });

  it('gives up a scrape that does not answer within 1 s', async () => {
    const gpu = dcgm();
    const events = record(gpu);
    respond = () => {}; // never answers
    await gpu.start();
    expect(gpu.latest()).toBeUndefined();
    expect(events.errors[0]).toMatchObject({
      code: 'ERR_GPU_SCRAPE',
      message: `GPU_SOURCE=dcgm: scrape of ${url} timed out after 1000 ms`,
    });
  });

  it('starts without an exporter (the error is emitted, not thrown) and reads once it appears', async () => {
    const port = await freePort();
    const later = `http://127.0.0.1:${port}/metrics`;
    const gpu = dcgm(25, later);
    const events = record(gpu);
    await gpu.start();
    expect(gpu.latest()).toBeUndefined();
    expect(events.errors[0]).toMatchObject({
      code: 'ERR_GPU_SCRAPE',
      message: expect.stringMatching(
        new RegExp(`^GPU_SOURCE=dcgm: scrape of ${later} failed: .*ECONNREFUSED`),
      ),
    });
    const exporter = await listen(exposition(FIXTURE), port);
    try {
      expect((await events.nextSnapshot()).gpus).toEqual(FOUR_H100);
    } finally {
      await gpu.stop();
      await close(exporter);
    }
  });

  it('reads a GPU that pods share (one series per pod) as one GPU', async () => {
    respond = exposition(SHARED);
    const gpu = dcgm();
    const events = record(gpu);
    await gpu.start();
    expect(events.errors).toEqual([]);
    expect(gpu.latest()).toEqual({
      at: clock,
      gpus: [
        {
          index: 0,
          uuid: 'GPU-5d0b2c4e-91a7-4f3e-b6d8-2e7f1a9c3b40',
          utilization: 0.83,
          memoryUsed: 71680 * MiB,
          memoryTotal: H100_MIB * MiB,
        },
        {
          index: 1,
          uuid: 'GPU-c81e3f77-0a2d-4b59-9e14-6d3a8b5f2c91',
          utilization: 0.97,
          memoryUsed: 79488 * MiB,
          memoryTotal: H100_MIB * MiB,
        },
      ],
    });
  });

  it('leaves a MIG GPU out of every reading, with one warning', async () => {
    const mig = `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",GPU_I_PROFILE="1g.18gb",GPU_I_ID="7"} 5
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1"} 40
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1"} 1000
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-1"} 3000
`;
    respond = exposition(mig);
    const gpu = dcgm();
    const events = record(gpu);
    await gpu.start();
    // A second scrape says nothing more.
    await events.nextSnapshot();
    expect(events.errors).toEqual([]);
    expect(gpu.latest()?.gpus.map((g) => g.index)).toEqual([1]);
    expect(events.warnings.map((w) => w.message)).toEqual([
      'GPU_SOURCE=dcgm: GPU 0 is left out of every reading: it is in MIG mode (DCGM_FI_DEV_GPU_UTIL per GPU instance, GPU_I_ID="7"), which has no device-level utilization',
    ]);
  });

  it('refuses options without a usable DCGM_URL', () => {
    for (const dcgmUrl of [undefined, '', 'dcgm-exporter:9400', 'ftp://x/metrics']) {
      expect(() => createGpuSource({ source: 'dcgm', dcgmUrl })).toThrow(GpuSourceError);
    }
    expect(() => createGpuSource({ source: 'dcgm' })).toThrow(
      'GPU_SOURCE=dcgm: DCGM_URL is required, e.g. http://dcgm-exporter:9400/metrics',
    );
  });
});

describe('dcgmReadings', () => {
  const labels = (gpu: number, extra = '') =>
    `gpu="${gpu}",UUID="GPU-${gpu}",device="nvidia${gpu}",modelName="NVIDIA H200",Hostname="n1"${extra}`;

  it('matches the memory samples of each GPU whatever the label and line order', () => {
    const text = [
      `DCGM_FI_DEV_FB_USED{Hostname="n1",UUID="GPU-1",gpu="1"} 1000`,
      `DCGM_FI_DEV_GPU_UTIL{${labels(1)}} 50`,
      `DCGM_FI_DEV_FB_FREE{${labels(0)}} 3000`,
      `DCGM_FI_DEV_GPU_UTIL{${labels(0)}} 25`,
      `DCGM_FI_DEV_FB_USED{${labels(0)}} 5000`,
      `DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-1"} 7000`,
    ].join('\n');
    expect(dcgmReadings(text)).toEqual([
      {
        index: 0,
        uuid: 'GPU-0',
        utilization: 0.25,
        memoryUsed: 5000 * MiB,
        memoryTotal: 8000 * MiB,
      },
      {
        index: 1,
        uuid: 'GPU-1',
        utilization: 0.5,
        memoryUsed: 1000 * MiB,
        memoryTotal: 8000 * MiB,
      },
    ]);
  });

  it('counts DCGM_FI_DEV_FB_RESERVED into the total when the exporter reports it', () => {
    const text = [
      `DCGM_FI_DEV_GPU_UTIL{${labels(0)}} 10`,
      `DCGM_FI_DEV_FB_USED{${labels(0)}} 100000`,
      `DCGM_FI_DEV_FB_FREE{${labels(0)}} 42000`,
      `DCGM_FI_DEV_FB_RESERVED{${labels(0)}} 771`,
    ].join('\n');
    expect(dcgmReadings(text)[0]!.memoryTotal).toBe(142771 * MiB);
  });

  it('refuses a GPU without its memory samples, a mix of hosts, and impossible values', () => {
    const util = `DCGM_FI_DEV_GPU_UTIL{${labels(0)}} 10\n`;
    expect(() => dcgmReadings(util + `DCGM_FI_DEV_FB_FREE{${labels(0)}} 1\n`)).toThrow(
      'GPU_SOURCE=dcgm: GPU 0 has no DCGM_FI_DEV_FB_USED sample',
    );
    const other = `DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1",Hostname="n2"} 10\n`;
    expect(() => dcgmReadings(util + other)).toThrow(/mixes hosts n1, n2/);
    const memory = `DCGM_FI_DEV_FB_USED{${labels(0)}} 1\nDCGM_FI_DEV_FB_FREE{${labels(0)}} 1\n`;
    expect(() => dcgmReadings(util.replace(' 10', ' 140') + memory)).toThrow(
      'GPU_SOURCE=dcgm: GPU 0 reports utilization (percent) 140',
    );
    expect(() => dcgmReadings(util.replace(' 10', ' NaN') + memory)).toThrow(GpuSourceError);
    expect(() => dcgmReadings(`DCGM_FI_DEV_GPU_UTIL{UUID="GPU-0"} 1\n`)).toThrow(
      /without a gpu label/,
    );
  });

  it('takes the series of pods sharing a GPU as that GPU, the busiest if they differ', () => {
    const pod = (name: string) => labels(0, `,namespace="llm",container="vllm",pod="${name}"`);
    const text = [
      `DCGM_FI_DEV_GPU_UTIL{${pod('a')}} 40`,
      `DCGM_FI_DEV_GPU_UTIL{${pod('b')}} 60`,
      `DCGM_FI_DEV_FB_USED{${pod('a')}} 5000`,
      `DCGM_FI_DEV_FB_USED{${pod('b')}} 5000`,
      `DCGM_FI_DEV_FB_FREE{${pod('a')}} 3000`,
      `DCGM_FI_DEV_FB_FREE{${pod('b')}} 3000`,
    ].join('\n');
    expect(dcgmReadings(text)).toEqual([
      {
        index: 0,
        uuid: 'GPU-0',
        utilization: 0.6,
        memoryUsed: 5000 * MiB,
        memoryTotal: 8000 * MiB,
      },
    ]);
  });

  it('leaves a MIG GPU out and reads the others, as the NVML and nvidia-smi sources do', () => {
    const memory = (gpu: number) =>
      `DCGM_FI_DEV_FB_USED{${labels(gpu)}} 1\nDCGM_FI_DEV_FB_FREE{${labels(gpu)}} 1\n`;
    // dcgm-exporter's labels for a MIG GPU instance.
    const mig = (id: number) =>
      `DCGM_FI_DEV_GPU_UTIL{${labels(0, `,GPU_I_PROFILE="1g.18gb",GPU_I_ID="${id}"`)}} 5\n`;
    const plain = `DCGM_FI_DEV_GPU_UTIL{${labels(1)}} 40\n`;
    const told: string[] = [];
    const readings = dcgmReadings(mig(7) + mig(8) + plain + memory(0) + memory(1), (i, d) =>
      told.push(`${i}: ${d}`),
    );
    expect(readings.map((r) => [r.index, r.utilization])).toEqual([[1, 0.4]]);
    expect(told).toEqual(['0: DCGM_FI_DEV_GPU_UTIL per GPU instance, GPU_I_ID="7"']);
    expect(dcgmReadings(mig(7) + memory(0))).toEqual([]);
  });

  it('refuses one gpu index with two UUIDs', () => {
    const memory = `DCGM_FI_DEV_FB_USED{${labels(0)}} 1\nDCGM_FI_DEV_FB_FREE{${labels(0)}} 1\n`;
    const twice = `DCGM_FI_DEV_GPU_UTIL{${labels(0)}} 5\nDCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-9"} 5\n`;
    expect(() => dcgmReadings(twice + memory)).toThrow(
      'GPU_SOURCE=dcgm: GPU 0 has DCGM_FI_DEV_GPU_UTIL samples of two UUIDs, GPU-0 and GPU-9',
    );
  });
});
