// The dispatcher's side of the GPU source: how old a reading may be before the load signal
// stops trusting it, and how a source that keeps failing shows in the log.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { DCGM_TIMEOUT_MS, POLL_MS, type GpuSource } from '@sluice/gpu';
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { describe, expect, it } from 'vitest';
import { gpuMaxAgeMs, gpuUtilization, startGpu } from '../src/gpu.ts';

/** A source whose latest reading completed at `at`, 97 % busy. */
function readAt(at: number): GpuSource {
  return {
    kind: 'stand-in',
    latest: () => ({
      at,
      gpus: [{ index: 0, utilization: 0.97, memoryUsed: 0, memoryTotal: 1 }],
    }),
    start: async () => {},
    stop: async () => {},
    on: () => {},
  };
}

describe('gpuMaxAgeMs', () => {
  it('keeps every reading a healthy source makes, however short ENGINE_SCRAPE_INTERVAL_MS is', () => {
    for (const kind of ['nvml', 'nvidia-smi', 'mock', 'dcgm'] as const) {
      // A reading takes a moment; a dcgm scrape may take up to its whole timeout.
      const readMs = kind === 'dcgm' ? DCGM_TIMEOUT_MS : 25;
      for (const scrapeIntervalMs of [20, 50, 100, 200, 250, 500, 1000]) {
        const maxAgeMs = gpuMaxAgeMs(kind, scrapeIntervalMs);
        const dropped: number[] = [];
        // The source reads every POLL_MS after the previous reading finished; the pool
        // samples its load signal every scrape interval, for a minute.
        for (let now = POLL_MS; now < 60_000; now += scrapeIntervalMs) {
          const period = POLL_MS + readMs;
          const lastReading = Math.floor(now / period) * period;
          if (gpuUtilization(readAt(lastReading), maxAgeMs, now) === undefined) dropped.push(now);
        }
        expect({ kind, scrapeIntervalMs, dropped }).toEqual({
          kind,
          scrapeIntervalMs,
          dropped: [],
        });
      }
    }
  });

  it('is four scrape intervals when those are longer, and still drops a reading older than that', () => {
    expect(gpuMaxAgeMs('nvml', 5000)).toBe(20_000);
    expect(gpuMaxAgeMs('dcgm', 5000)).toBe(20_000);
    const maxAgeMs = gpuMaxAgeMs('nvml', 100);
    expect(gpuUtilization(readAt(0), maxAgeMs, maxAgeMs)).toBe(0.97);
    expect(gpuUtilization(readAt(0), maxAgeMs, maxAgeMs + 1)).toBeUndefined();
  });
});

describe('startGpu', () => {
  it('logs a source that fails every poll once per kind of failure, not once per poll', async () => {
    const server = createServer((_req, res) => res.writeHead(500).end('exporter broken'));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    const lines: { level: string; msg: string; o: object }[] = [];
    const log = {
      info: (o: object, msg: string) => lines.push({ level: 'info', msg, o }),
      warn: (o: object, msg: string) => lines.push({ level: 'warn', msg, o }),
      error: (o: object, msg: string) => lines.push({ level: 'error', msg, o }),
    };
    const source = await startGpu(
      { source: 'dcgm', dcgmUrl: `http://127.0.0.1:${port}/metrics` },
      dispatcherMetrics(new Registry()),
      60_000,
      () => {},
      log,
    );
    try {
      expect(source).toBeDefined();
      // The first failed scrape happened inside start; wait for two more polls to fail.
      await new Promise<void>((resolve) => {
        let failures = 0;
        source!.on('error', () => {
          if (++failures === 2) resolve();
        });
      });
      expect(lines.filter((l) => l.msg === 'GPU reading failed')).toEqual([
        {
          level: 'warn',
          msg: 'GPU reading failed',
          o: {
            err: `GPU_SOURCE=dcgm: scrape of http://127.0.0.1:${port}/metrics answered HTTP 500`,
          },
        },
      ]);
    } finally {
      await source?.stop();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  /**
   * A dcgm-exporter stand-in: what it answers next is two GPUs, one, a failure, or nothing
   * at all (a request left hanging); and the dispatcher's GPU source on it, on a clock the
   * test moves.
   */
  async function exporterAndSource(maxAgeMs: number) {
    const state = {
      answer: 'two' as 'two' | 'one' | 'broken' | 'silent',
      clock: 1_700_000_000_000,
    };
    const gpu = (i: number, util: number) => [
      `DCGM_FI_DEV_GPU_UTIL{gpu="${i}",UUID="GPU-${i}"} ${util}`,
      `DCGM_FI_DEV_FB_USED{gpu="${i}",UUID="GPU-${i}"} 1000`,
      `DCGM_FI_DEV_FB_FREE{gpu="${i}",UUID="GPU-${i}"} 3000`,
    ];
    const server = createServer((_req, res) => {
      if (state.answer === 'silent') return;
      if (state.answer === 'broken') return res.writeHead(500).end('exporter broken');
      const lines = state.answer === 'two' ? [...gpu(0, 97), ...gpu(1, 50)] : gpu(0, 97);
      res.writeHead(200, { 'content-type': 'text/plain' }).end(lines.join('\n') + '\n');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    const registry = new Registry();
    const series = async () =>
      (await registry.getSingleMetric('sluice_gpu_utilization_ratio')!.get()).values.map((v) => [
        v.labels['gpu'],
        v.value,
      ]);
    const quiet = { info: () => {}, warn: () => {}, error: () => {} };
    const source = await startGpu(
      { source: 'dcgm', dcgmUrl: `http://127.0.0.1:${port}/metrics` },
      dispatcherMetrics(registry),
      maxAgeMs,
      () => {},
      quiet,
      () => state.clock,
    );
    const next = (event: 'snapshot' | 'error') =>
      new Promise<void>((resolve) =>
        event === 'snapshot'
          ? source!.on('snapshot', () => resolve())
          : source!.on('error', () => resolve()),
      );
    const close = async () => {
      await source?.stop();
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    };
    return { state, series, next, close };
  }

  it('drops the GPU series once the last reading is too old, and GPUs a reading leaves out', async () => {
    const { state, series, next, close } = await exporterAndSource(10_000);
    try {
      expect(await series()).toEqual([
        ['0', 0.97],
        ['1', 0.5],
      ]);
      state.answer = 'one';
      await next('snapshot');
      await next('snapshot');
      expect(await series()).toEqual([['0', 0.97]]);
      state.answer = 'broken';
      await next('error');
      // A failure alone does not drop a reading that still counts for the load signal.
      expect(await series()).toEqual([['0', 0.97]]);
      state.clock += 10_001;
      expect(await series()).toEqual([]);
    } finally {
      await close();
    }
  });

  it('drops the GPU series of a source that goes silent without an error, and shows them again at its next reading', async () => {
    const { state, series, next, close } = await exporterAndSource(10_000);
    try {
      state.answer = 'silent';
      expect(await series()).toEqual([
        ['0', 0.97],
        ['1', 0.5],
      ]);
      state.clock += 10_000;
      expect(await series()).toEqual([
        ['0', 0.97],
        ['1', 0.5],
      ]);
      // No event: the reading is simply too old by the time /metrics is collected.
      state.clock += 1;
      expect(await series()).toEqual([]);
      state.answer = 'one';
      await next('snapshot');
      expect(await series()).toEqual([['0', 0.97]]);
    } finally {
      await close();
    }
  });
});
