import { POLL_MS } from './defaults.js';
import { createDcgmSource } from './dcgm/source.js';
import { GpuSourceError } from './errors.js';
import { createMockSource } from './mock.js';
import { createNvidiaSmiSource } from './nvidia-smi/source.js';
import { createNvmlSource } from './nvml/source.js';
import type { GpuSource, GpuSourceKind, GpuSourceOptions } from './types.js';

export const GPU_SOURCE_KINDS: readonly GpuSourceKind[] = [
  'none',
  'nvml',
  'dcgm',
  'nvidia-smi',
  'mock',
];

/**
 * The source `GPU_SOURCE` names, not yet started; `undefined` for 'none'. Throws a one-line
 * ERR_GPU_OPTIONS error for an unknown kind, a bad `pollMs`, `dcgm` without a valid
 * `dcgmUrl`, or a bad mock curve.
 */
export function createGpuSource(options: GpuSourceOptions): GpuSource | undefined {
  const bad = (detail: string) => new GpuSourceError('ERR_GPU_OPTIONS', detail);
  const { source } = options;
  if (!GPU_SOURCE_KINDS.includes(source))
    throw bad(`GPU_SOURCE=${String(source)}: expected one of ${GPU_SOURCE_KINDS.join(', ')}`);
  const pollMs = options.pollMs ?? POLL_MS;
  if (!(Number.isInteger(pollMs) && pollMs > 0))
    throw bad(`GPU_SOURCE=${source}: pollMs must be a positive whole number of ms, got ${pollMs}`);
  const now = options.now ?? Date.now;

  switch (source) {
    case 'none':
      return undefined;
    case 'nvml':
      return createNvmlSource({ pollMs, now, libraryPath: options.libraryPath });
    case 'dcgm':
      return createDcgmSource({ url: dcgmUrl(options.dcgmUrl), pollMs, now });
    case 'nvidia-smi':
      return createNvidiaSmiSource({ pollMs, now, nvidiaSmiPath: options.nvidiaSmiPath });
    case 'mock':
      return createMockSource({ pollMs, now, mock: options.mock });
  }
}

function dcgmUrl(text: string | undefined): URL {
  const bad = (detail: string) =>
    new GpuSourceError('ERR_GPU_OPTIONS', `GPU_SOURCE=dcgm: ${detail}`);
  if (text === undefined || text === '')
    throw bad('DCGM_URL is required, e.g. http://dcgm-exporter:9400/metrics');
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw bad(`DCGM_URL=${text} is not a URL`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw bad(`DCGM_URL=${text} must be http:// or https://`);
  return url;
}
