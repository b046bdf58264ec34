import { afterEach, describe, expect, it } from 'vitest';
import { createGpuSource, mockUtilization, type GpuSource } from '../src/index.ts';
import { GiB, record } from './helpers.ts';

describe('mockUtilization: min + (max - min) * (0.5 + 0.5 * sin(2πt / period))', () => {
  const curve = { periodMs: 40_000, min: 0.2, max: 0.9 };

  it('is halfway at t = 0, max at a quarter period, halfway at a half, min at three quarters', () => {
    expect(mockUtilization(0, curve)).toBeCloseTo(0.55, 12);
    expect(mockUtilization(10_000, curve)).toBeCloseTo(0.9, 12);
    expect(mockUtilization(20_000, curve)).toBeCloseTo(0.55, 12);
    expect(mockUtilization(30_000, curve)).toBeCloseTo(0.2, 12);
    expect(mockUtilization(40_000, curve)).toBeCloseTo(0.55, 12);
  });

  it('follows the curve between those points and repeats every period', () => {
    for (const t of [1234, 5000, 17_321, 33_333]) {
      const expected = 0.2 + 0.7 * (0.5 + 0.5 * Math.sin((2 * Math.PI * t) / 40_000));
      expect(mockUtilization(t, curve)).toBeCloseTo(expected, 12);
      expect(mockUtilization(t + 5 * 40_000, curve)).toBeCloseTo(expected, 9);
    }
  });

  it('defaults to a 60 s period from 0.1 to 1', () => {
    expect(mockUtilization(15_000)).toBeCloseTo(1, 12);
    expect(mockUtilization(45_000)).toBeCloseTo(0.1, 12);
  });

  it('refuses a curve outside 0..1 or without a period', () => {
    expect(() => mockUtilization(0, { min: 0.5, max: 0.4 })).toThrow(/min <= max/);
    expect(() => mockUtilization(0, { max: 1.5 })).toThrow(/<= 1/);
    expect(() => mockUtilization(0, { periodMs: 0 })).toThrow(/periodMs/);
  });
});

describe('GPU_SOURCE=mock', () => {
  let source: GpuSource | undefined;
  afterEach(async () => {
    await source?.stop();
    source = undefined;
  });

  it('reads one GPU from the injected clock at each poll', async () => {
    let clock = 10_000; // a quarter of the period: the top of the curve
    source = createGpuSource({
      source: 'mock',
      pollMs: 10,
      now: () => clock,
      mock: { periodMs: 40_000, min: 0.2, max: 0.9 },
    })!;
    expect(source.kind).toBe('mock');
    const events = record(source);
    await source.start();
    const top = source.latest()!;
    expect(top.at).toBe(10_000);
    expect(top.gpus).toHaveLength(1);
    expect(top.gpus[0]!.index).toBe(0);
    expect(top.gpus[0]!.utilization).toBeCloseTo(0.9, 12);
    expect(top.gpus[0]!.memoryTotal).toBe(80 * GiB);
    expect(top.gpus[0]!.memoryUsed).toBe(Math.round(80 * GiB * top.gpus[0]!.utilization));

    clock = 30_000; // three quarters: the bottom
    const bottom = await events.nextSnapshot();
    expect(bottom.at).toBe(30_000);
    expect(bottom.gpus[0]!.utilization).toBeCloseTo(0.2, 12);

    clock = 45_000;
    expect((await events.nextSnapshot()).gpus[0]!.utilization).toBeCloseTo(
      mockUtilization(45_000, { periodMs: 40_000, min: 0.2, max: 0.9 }),
      12,
    );
  });
});
