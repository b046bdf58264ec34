import { describe, expect, it } from 'vitest';
import { createGpuSource, GPU_SOURCE_KINDS, GpuSourceError } from '../src/index.ts';

describe('createGpuSource', () => {
  it('returns no source for GPU_SOURCE=none', () => {
    expect(createGpuSource({ source: 'none' })).toBeUndefined();
  });

  it('creates every other kind without starting it', () => {
    const sources = GPU_SOURCE_KINDS.filter((kind) => kind !== 'none').map((source) =>
      createGpuSource({ source, dcgmUrl: 'http://127.0.0.1:1/metrics' }),
    );
    expect(sources.map((s) => s?.kind)).toEqual(['nvml', 'dcgm', 'nvidia-smi', 'mock']);
    expect(sources.every((s) => s?.latest() === undefined)).toBe(true);
  });

  it('refuses an unknown kind and a bad pollMs with one line and a code', () => {
    const unknown = () => createGpuSource({ source: 'rocm' as 'none' });
    expect(unknown).toThrow(GpuSourceError);
    expect(unknown).toThrow('GPU_SOURCE=rocm: expected one of none, nvml, dcgm, nvidia-smi, mock');
    for (const pollMs of [0, -5, 1.5, Number.NaN]) {
      expect(() => createGpuSource({ source: 'mock', pollMs })).toThrow(
        expect.objectContaining({ code: 'ERR_GPU_OPTIONS' }),
      );
    }
  });

  it('starts a source once', async () => {
    const source = createGpuSource({ source: 'mock', pollMs: 1000 })!;
    await source.start();
    await expect(source.start()).rejects.toMatchObject({ code: 'ERR_GPU_OPTIONS' });
    await source.stop();
    await source.stop();
  });
});
