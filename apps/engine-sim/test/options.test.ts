import { describe, expect, it } from 'vitest';
import { parseSimOptions, simHelp } from '../src/options.ts';
import { profiles } from '../src/profiles.ts';

describe('simulator options', () => {
  it('takes the profile numbers, then env, then flags', () => {
    const fromProfile = parseSimOptions(['--profile', 'datacenter'], {});
    expect(fromProfile.maxNumSeqs).toBe(profiles.datacenter.maxNumSeqs);
    const fromEnv = parseSimOptions(['--profile', 'datacenter'], {
      SIM_MAX_NUM_SEQS: '64',
      PORT: '9000',
    });
    expect(fromEnv.maxNumSeqs).toBe(64);
    expect(fromEnv.port).toBe(9000);
    const fromFlag = parseSimOptions(['--max-num-seqs=8', '--port', '9001'], {
      SIM_MAX_NUM_SEQS: '64',
      PORT: '9000',
    });
    expect(fromFlag.maxNumSeqs).toBe(8);
    expect(fromFlag.port).toBe(9001);
    expect(fromFlag.profile).toBe('homelab');
  });

  it('defaults to the homelab engine of the reference PR', () => {
    const o = parseSimOptions([], {});
    expect([o.maxNumSeqs, o.numGpuBlocks, o.blockSize, o.prefillTokensPerSecond]).toEqual([
      4, 9527, 16, 525,
    ]);
    expect(o.numGpuBlocks * o.blockSize).toBe(152_432);
  });

  it('accepts boolean flags bare or with a value, and inf for rates', () => {
    expect(parseSimOptions(['--legacy-kv-metric'], {}).legacyKvMetric).toBe(true);
    expect(parseSimOptions(['--legacy-kv-metric', 'false'], {}).legacyKvMetric).toBe(false);
    expect(parseSimOptions(['--prefill-tokens-per-second', 'inf'], {}).prefillTokensPerSecond).toBe(
      Infinity,
    );
  });

  it.each([
    [['--max-num-seqs', '0'], {}, '--max-num-seqs="0" is invalid: expected an integer >= 1'],
    [['--time-scale', 'fast'], {}, '--time-scale="fast" is invalid: expected a number > 0'],
    [[], { SIM_BLOCK_SIZE: '1.5' }, 'SIM_BLOCK_SIZE="1.5" is invalid: expected an integer >= 1'],
    [
      ['--profile', 'tiny'],
      {},
      '--profile="tiny" is invalid: expected one of homelab, datacenter, instant',
    ],
    [['--bogus'], {}, 'unknown flag --bogus (see --help)'],
    [['--port'], {}, '--port needs a value'],
    [['stray'], {}, 'unexpected argument "stray"'],
    [
      ['--max-model-len', '200000'],
      {},
      'max-model-len 200000 exceeds the KV cache (9527 blocks x 16 = 152432 tokens)',
    ],
    [
      ['--output-len-min', '10', '--output-len-max', '5'],
      {},
      'output-len-min 10 is above output-len-max 5',
    ],
  ])('refuses %j %j with one line naming the value and what is allowed', (argv, env, message) => {
    expect(() => parseSimOptions(argv, env)).toThrow(message);
  });

  it('lists every flag with its env name and default in --help', () => {
    const help = simHelp();
    for (const flag of [
      '--profile',
      '--time-scale',
      '--port',
      '--max-num-seqs',
      '--num-gpu-blocks',
      '--model',
      '--prefill-tokens-per-second',
    ]) {
      expect(help).toContain(flag);
    }
    expect(help).toMatch(/--max-num-seqs <value>\s+.*\[SIM_MAX_NUM_SEQS; default 4\]/);
  });
});
