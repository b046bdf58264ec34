import { Client } from 'undici';
import { DCGM_MAX_BODY_BYTES, DCGM_TIMEOUT_MS } from '../defaults.js';
import { GpuSourceError, messageOf } from '../errors.js';
import { createPollingSource } from '../polling-source.js';
import type { GpuSource } from '../types.js';
import { dcgmReadings } from './readings.js';

export interface DcgmSourceOptions {
  url: URL;
  pollMs: number;
  now: () => number;
}

/**
 * Scrapes an NVIDIA dcgm-exporter every `pollMs` on its own undici client, each scrape
 * abandoned after 1 s. A failed scrape (refused, timed out, non-200, not an
 * exposition, a GPU without its metrics) emits one 'error' line and keeps the last snapshot.
 */
export function createDcgmSource(options: DcgmSourceOptions): GpuSource {
  const { url, pollMs } = options;
  const timeoutMs = DCGM_TIMEOUT_MS;
  return createPollingSource({
    kind: 'dcgm',
    pollMs,
    now: options.now,
    open(warn) {
      const client = new Client(url.origin, {
        connectTimeout: timeoutMs,
        headersTimeout: timeoutMs,
        bodyTimeout: timeoutMs,
      });
      // A MIG GPU is left out of every reading, said once per GPU, as the NVML source does.
      const warned = new Set<number>();
      const onMig = (index: number, detail: string) => {
        if (warned.has(index)) return;
        warned.add(index);
        warn(
          new GpuSourceError(
            'ERR_GPU_UNSUPPORTED',
            `GPU_SOURCE=dcgm: GPU ${index} is left out of every reading: it is in MIG mode ` +
              `(${detail}), which has no device-level utilization`,
          ),
        );
      };
      return {
        read: async () => dcgmReadings(await scrape(client, url, timeoutMs), onMig),
        close: () => client.close(),
      };
    },
  });
}

async function scrape(client: Client, url: URL, timeoutMs: number): Promise<string> {
  const failed = (detail: string, cause?: unknown) =>
    new GpuSourceError('ERR_GPU_SCRAPE', `GPU_SOURCE=dcgm: scrape of ${url.href} ${detail}`, {
      cause,
    });
  try {
    const response = await client.request({
      method: 'GET',
      path: url.pathname + url.search,
      headers: { accept: 'text/plain;version=0.0.4' },
      signal: AbortSignal.timeout(timeoutMs),
    });
    if (response.statusCode !== 200) {
      await response.body.dump();
      throw failed(`answered HTTP ${response.statusCode}`);
    }
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of response.body) {
      size += (chunk as Buffer).length;
      if (size > DCGM_MAX_BODY_BYTES) {
        response.body.destroy();
        throw failed(`answered more than ${DCGM_MAX_BODY_BYTES} bytes`);
      }
      chunks.push(chunk as Buffer);
    }
    return Buffer.concat(chunks).toString('utf8');
  } catch (error) {
    if (error instanceof GpuSourceError) throw error;
    if (error instanceof Error && error.name === 'TimeoutError')
      throw failed(`timed out after ${timeoutMs} ms`, error);
    throw failed(`failed: ${messageOf(error)}`, error);
  }
}
