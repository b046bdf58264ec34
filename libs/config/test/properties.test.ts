import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { ConfigError, createRouter, loadConfig } from '../src/index.js';
import { VARIABLES, type VariableName } from '../src/variables.js';
import { select } from './cases.js';
import { configError, loadFile } from './helpers.js';

const MAX_TIMER_MS = 2_147_483_647;

/** Other variables a case needs: an engine for pool-level values, room for the relay relation. */
const context: Partial<Record<VariableName, Record<string, string>>> = {
  VLLM_MAX_NUM_SEQS: { VLLM_URL: 'http://e:1' },
  ADMISSION_MAX_INFLIGHT: { VLLM_URL: 'http://e:1' },
  ADMISSION_MAX_PARK_SECONDS: { VLLM_URL: 'http://e:1' },
  VLLM_MAX_QUEUE_DEPTH: { VLLM_URL: 'http://e:1' },
  ADMISSION_LONG_PROMPT_TOKENS: { VLLM_URL: 'http://e:1' },
  ADMISSION_LONG_MAX_SHARE: { VLLM_URL: 'http://e:1' },
  ADMISSION_LONG_MAX_PREFILLS: { VLLM_URL: 'http://e:1' },
  ADMISSION_LONG_AGING_SECONDS: { VLLM_URL: 'http://e:1' },
  SLUICE_RELAY_LIVENESS_MS: { SLUICE_RELAY_SILENCE_TIMEOUT_MS: String(MAX_TIMER_MS) },
  SLUICE_RELAY_SILENCE_TIMEOUT_MS: { SLUICE_RELAY_LIVENESS_MS: '10' },
  // It must differ from PORT; with PORT=0 (a free port) every value is allowed.
  GATEWAY_METRICS_PORT: { PORT: '0' },
};
/** Ranges narrowed by a relation with another variable (tested on their own elsewhere). */
const narrowed: Partial<Record<VariableName, { min?: number; max?: number }>> = {
  SLUICE_RELAY_LIVENESS_MS: { max: Math.floor((MAX_TIMER_MS - 1) / 2) },
  SLUICE_RELAY_SILENCE_TIMEOUT_MS: { min: 21 },
};

const names = Object.keys(VARIABLES) as VariableName[];

/** The range each numeric variable documents, read from its `allowed` text. */
function documentedRange(name: VariableName) {
  const allowed = VARIABLES[name].allowed;
  const between = /^an? (integer|number) from (\S+) to (\S+)$/.exec(allowed);
  const atLeast = /^an integer >= (\S+)$/.exec(allowed);
  const above = /^a number > (\S+)(?: and <= (\S+))?$/.exec(allowed);
  if (between)
    return {
      integer: between[1] === 'integer',
      min: Number(between[2]),
      max: Number(between[3]),
      exclusiveMin: false,
    };
  if (atLeast)
    return {
      integer: true,
      min: Number(atLeast[1]),
      max: Number.MAX_SAFE_INTEGER,
      exclusiveMin: false,
    };
  if (above)
    return {
      integer: false,
      min: Number(above[1]),
      max: Number(above[2] ?? Number.MAX_VALUE),
      exclusiveMin: true,
    };
  return undefined;
}

const integers = names.flatMap((name) => {
  const range = documentedRange(name);
  return range?.integer ? [{ name, ...range }] : [];
});
const decimals = names.flatMap((name) => {
  const range = documentedRange(name);
  return range && !range.integer ? [{ name, ...range }] : [];
});

describe('properties of environment values', () => {
  it('finds the numeric variables', () => {
    expect(integers).toHaveLength(23);
    expect(integers.map((v) => v.name)).toContain('ADMISSION_MAX_INFLIGHT');
    expect(decimals.map((v) => v.name).sort()).toEqual([
      'ADMISSION_FROZEN_GAUGES_SECONDS',
      'ADMISSION_KV_THRESHOLD',
      'ADMISSION_LONG_AGING_SECONDS',
      'ADMISSION_LONG_MAX_SHARE',
      'ADMISSION_MAX_PARK_SECONDS',
      'GATEWAY_AUTH_FAILURE_WINDOW_SECONDS',
      'GATEWAY_REQUEST_TIMEOUT_SECONDS',
      'SLUICE_REDIS_LOSS_GRACE_SECONDS',
      'SLUICE_SHUTDOWN_DRAIN_SECONDS',
      'SLUICE_SLOW_CLIENT_STALL_SECONDS',
      'SSE_HEARTBEAT_SECONDS',
    ]);
  });

  it.each(integers)('$name: any integer string in the documented range round-trips', (v) => {
    const min = narrowed[v.name]?.min ?? v.min;
    const max = narrowed[v.name]?.max ?? v.max;
    fc.assert(
      fc.property(fc.integer({ min, max }), (n) => {
        const config = loadConfig({ ...context[v.name], [v.name]: String(n) });
        expect(select[v.name](config)).toBe(n);
      }),
      { numRuns: 50 },
    );
  });

  it.each(integers)('$name: any integer outside the range is refused, naming it', (v) => {
    const outside = fc.oneof(
      fc.bigInt({ min: -(2n ** 70n), max: BigInt(v.min) - 1n }),
      fc.bigInt({ min: BigInt(v.max) + 1n, max: 2n ** 70n }),
    );
    fc.assert(
      fc.property(outside, (n) => {
        const raw = String(n);
        const error = configError(() => loadConfig({ ...context[v.name], [v.name]: raw }));
        expect(error.variable).toBe(v.name);
        expect(error.message).toBe(
          `${v.name}="${raw}" is invalid: expected ${VARIABLES[v.name].allowed}`,
        );
      }),
      { numRuns: 50 },
    );
  });

  it.each(decimals)('$name: any number in the documented range round-trips', (v) => {
    const inside = fc
      .double({ min: v.min, max: v.max, noNaN: true, noDefaultInfinity: true })
      .filter((x) => !v.exclusiveMin || x > v.min);
    fc.assert(
      fc.property(inside, (x) => {
        const config = loadConfig({ ...context[v.name], [v.name]: String(x) });
        expect(select[v.name](config)).toBe(x === 0 ? 0 : x);
      }),
      { numRuns: 100 },
    );
  });

  it.each(decimals)('$name: any number outside the range is refused, naming it', (v) => {
    const outside = fc.oneof(
      fc
        .double({ max: v.min, noNaN: true })
        .filter((x) => x < v.min || (v.exclusiveMin && x === v.min)),
      fc.double({ min: v.max, noNaN: true }).filter((x) => x > v.max),
    );
    fc.assert(
      fc.property(outside, (x) => {
        const error = configError(() => loadConfig({ ...context[v.name], [v.name]: String(x) }));
        expect(error.variable).toBe(v.name);
        expect(error.message.startsWith(`${v.name}="${String(x)}" is invalid: expected `)).toBe(
          true,
        );
      }),
      { numRuns: 100 },
    );
  });

  it('any string in any variable either loads or throws one line naming that variable', () => {
    const relay = ['SLUICE_RELAY_LIVENESS_MS', 'SLUICE_RELAY_SILENCE_TIMEOUT_MS'];
    fc.assert(
      fc.property(
        fc.constantFrom(...names.filter((n) => n !== 'SLUICE_CONFIG')),
        fc.oneof(fc.string(), fc.string({ unit: 'binary' }), fc.integer().map(String)),
        (name, raw) => {
          let error: unknown;
          try {
            loadConfig({ [name]: raw });
          } catch (caught) {
            error = caught;
          }
          if (error === undefined) return;
          expect(error).toBeInstanceOf(ConfigError);
          const { variable, message } = error as ConfigError;
          expect(message).not.toMatch(/[\r\n\u2028\u2029]/);
          if (relay.includes(name)) expect(relay).toContain(variable);
          else expect(variable).toBe(name);
          expect(message.startsWith(`${variable}=`)).toBe(true);
        },
      ),
      { numRuns: 500 },
    );
  });
});

describe('properties of the YAML file', () => {
  const loose = fc.oneof(
    fc.jsonValue({ maxDepth: 2 }),
    fc.constantFrom('http://e:1', 'http://e:1/v1', 'm', 'p', 4, 0, -1, 1.5, null, [], {}),
  );
  const engine = fc.dictionary(
    fc.constantFrom('url', 'name', 'maxInflight', 'apiKey', 'extra'),
    loose,
  );
  const pool = fc.dictionary(
    fc.constantFrom(
      'name',
      'models',
      'maxInflight',
      'queueDepth',
      'maxParkSeconds',
      'engines',
      'x',
    ),
    fc.oneof(loose, fc.array(engine, { maxLength: 3 }), fc.array(loose, { maxLength: 3 })),
  );
  const document = fc.oneof(
    fc.dictionary(
      fc.constantFrom('pools', 'passthrough', 'other'),
      fc.oneof(fc.array(pool, { maxLength: 3 }), fc.array(engine, { maxLength: 2 }), loose),
    ),
    loose,
  );

  it('any document either loads or throws one line naming the file', () => {
    fc.assert(
      fc.property(document, (doc) => {
        let error: unknown;
        try {
          loadFile(stringify(doc));
        } catch (caught) {
          error = caught;
        }
        if (error === undefined) return;
        expect(error).toBeInstanceOf(ConfigError);
        expect((error as ConfigError).message).toMatch(/^\/etc\/sluice\.yaml: [^\r\n]*$/);
      }),
      { numRuns: 400 },
    );
    // 400 documents: about a second alone, near 5 s at a load average of 19 on two cores.
  }, 30_000);

  it('every model of a valid file routes to its own pool, and nothing else routes', () => {
    const model = fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._/:-]{0,20}$/);
    const layout = fc.uniqueArray(model, { minLength: 1, maxLength: 12 }).chain((models) =>
      fc.tuple(
        fc.constant(models),
        fc.array(fc.integer({ min: 0, max: 3 }), {
          minLength: models.length,
          maxLength: models.length,
        }),
        fc.integer({ min: 0, max: models.length - 1 }),
      ),
    );
    fc.assert(
      fc.property(layout, model, ([models, owners, split], stranger) => {
        // models[split..] are pass-through; the rest belong to pool `owner`.
        const pools = [0, 1, 2, 3]
          .map((p) => ({
            name: `pool-${p}`,
            models: models.slice(0, split).filter((_, i) => owners[i] === p),
            engines: [{ url: `http://engine-${p}:8000` }],
          }))
          .filter((p) => p.models.length > 0);
        const passthrough = models
          .slice(split)
          .map((m, i) => ({ model: m, url: `http://pt-${i}:8080` }));
        const config = loadFile(stringify({ pools, passthrough }));
        const router = createRouter(config);
        models.slice(0, split).forEach((m, i) => {
          const route = router.route(m);
          expect(route?.kind === 'pool' && route.pool.name).toBe(`pool-${owners[i]}`);
        });
        models.slice(split).forEach((m, i) => {
          expect(router.route(m)).toEqual({ kind: 'passthrough', url: `http://pt-${i}:8080` });
        });
        if (!models.includes(stranger)) expect(router.route(stranger)).toBeUndefined();
      }),
      { numRuns: 200 },
    );
  });
});
