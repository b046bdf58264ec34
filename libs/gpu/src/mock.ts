import { MOCK_MAX, MOCK_MEMORY_TOTAL, MOCK_MIN, MOCK_PERIOD_MS } from './defaults.js';
import { GpuSourceError } from './errors.js';
import { createPollingSource } from './polling-source.js';
import type { GpuReading, GpuSource, MockOptions } from './types.js';

/** Mock options with every default filled in and checked. */
export function mockCurve(options: MockOptions = {}): Required<MockOptions> {
  const curve = {
    periodMs: options.periodMs ?? MOCK_PERIOD_MS,
    min: options.min ?? MOCK_MIN,
    max: options.max ?? MOCK_MAX,
  };
  const bad = (detail: string) =>
    new GpuSourceError('ERR_GPU_OPTIONS', `GPU_SOURCE=mock: ${detail}`);
  if (!(Number.isFinite(curve.periodMs) && curve.periodMs > 0))
    throw bad(`periodMs must be a positive number of ms, got ${curve.periodMs}`);
  if (!(curve.min >= 0 && curve.max <= 1 && curve.min <= curve.max))
    throw bad(`need 0 <= min <= max <= 1, got min ${curve.min}, max ${curve.max}`);
  return curve;
}

/**
 * The reference article's development emulator: utilization
 * `min + (max - min) * (0.5 + 0.5 * sin(2π t / periodMs))` at clock time `t` (ms). At t = 0
 * (and every whole period) it is halfway, at a quarter period `max`, at three quarters `min`.
 * Options default to a 60 s period from 0.1 to 1.
 */
export function mockUtilization(t: number, options: MockOptions = {}): number {
  const { periodMs, min, max } = mockCurve(options);
  return min + (max - min) * (0.5 + 0.5 * Math.sin((2 * Math.PI * t) / periodMs));
}

/** The mock's one GPU at time `t`: an 80 GiB card whose memory in use follows utilization. */
export function mockReading(t: number, curve: Required<MockOptions>): GpuReading {
  const utilization = mockUtilization(t, curve);
  return {
    index: 0,
    uuid: 'GPU-00000000-0000-0000-0000-00000000m0c0',
    utilization,
    memoryUsed: Math.round(MOCK_MEMORY_TOTAL * utilization),
    memoryTotal: MOCK_MEMORY_TOTAL,
  };
}

/** One GPU following the sinusoid, read from the injected clock every `pollMs`. */
export function createMockSource(options: {
  pollMs: number;
  now: () => number;
  mock?: MockOptions;
}): GpuSource {
  const curve = mockCurve(options.mock);
  return createPollingSource({
    kind: 'mock',
    pollMs: options.pollMs,
    now: options.now,
    open: () => ({ read: () => [mockReading(options.now(), curve)] }),
  });
}
