// What `sluice up` starts, and on which ports, read from the environment the way
// @sluice/config reads it (an empty variable is unset).
import { describe, expect, it } from 'vitest';
import { echoed, upPlan } from '../src/up.ts';

describe('sluice up plan', () => {
  it('starts redis-server and the simulator on the default ports when nothing is set', () => {
    expect(upPlan({})).toEqual({
      redis: true,
      redisPort: '6379',
      simulator: true,
      enginePort: '8000',
      gatewayPorts: ['8080', '8081'],
      metricsPorts: ['9464', '9465'],
      echoLevel: 30,
    });
  });

  it('reads an empty variable as unset, as the configuration does', () => {
    // PORT="" was port 0 (a random port) for up while the gateways' configuration reads 8080.
    expect(
      upPlan({
        PORT: '',
        METRICS_PORT: '',
        SLUICE_REDIS_PORT: '',
        SLUICE_ENGINE_PORT: '',
        REDIS_URL: '',
        VLLM_URL: '',
        SLUICE_CONFIG: '',
        GATEWAY_METRICS_PORT: '',
        LOG_LEVEL: '',
      }),
    ).toEqual(upPlan({}));
  });

  it('gives both of a pair port 0 (each picks a free one) and the next port otherwise', () => {
    const plan = upPlan({ PORT: '0', METRICS_PORT: '9000' });
    expect(plan.gatewayPorts).toEqual(['0', '0']);
    expect(plan.metricsPorts).toEqual(['9000', '9001']);
  });

  it('passes a value that is no port to both children as written, for them to refuse by name', () => {
    expect(upPlan({ PORT: 'http' }).gatewayPorts).toEqual(['http', 'http']);
  });

  it('starts no simulator when VLLM_URL or SLUICE_CONFIG names the engines', () => {
    expect(upPlan({ VLLM_URL: 'http://127.0.0.1:8000' }).simulator).toBe(false);
    // The pools file lists its engines; the configuration refuses VLLM_URL beside it.
    expect(upPlan({ SLUICE_CONFIG: 'pools.yaml' }).simulator).toBe(false);
  });

  it('starts no redis-server when a Redis, a Sentinel or a Cluster is named', () => {
    for (const name of ['REDIS_URL', 'REDIS_SENTINELS', 'REDIS_CLUSTER_NODES'])
      expect(upPlan({ [name]: 'x' }).redis).toBe(false);
  });

  it('gives each gateway its own GATEWAY_METRICS_PORT, as it does PORT', () => {
    // Both on the same port, the second gateway exited "address already in use".
    expect(upPlan({ GATEWAY_METRICS_PORT: '9100' }).gatewayMetricsPorts).toEqual(['9100', '9101']);
    expect(upPlan({ GATEWAY_METRICS_PORT: '0' }).gatewayMetricsPorts).toEqual(['0', '0']);
    // Unset: /metrics stays on each gateway's API port.
    expect(upPlan({}).gatewayMetricsPorts).toBeUndefined();
  });

  it('runs the children at info at least, and echoes only the operator LOG_LEVEL and above', () => {
    // Their "... ready" lines are info: at warn, up waited for them for good.
    for (const [level, echoLevel] of [
      ['warn', 40],
      ['error', 50],
      ['fatal', 60],
      ['silent', Infinity],
    ] as const)
      expect(upPlan({ LOG_LEVEL: level }), level).toMatchObject({
        childLogLevel: 'info',
        echoLevel,
      });
    expect(upPlan({ LOG_LEVEL: 'debug' })).toMatchObject({ childLogLevel: 'debug', echoLevel: 20 });
    // Not a level: passed on as written, for the children to refuse by name.
    expect(upPlan({ LOG_LEVEL: 'loud' })).toMatchObject({ childLogLevel: 'loud', echoLevel: 30 });
    expect(upPlan({ LOG_LEVEL: 'constructor' }).childLogLevel).toBe('constructor');
  });

  it('echoes a child line below the operator level only when it is no pino line', () => {
    const info = '{"level":30,"time":1,"msg":"gateway ready"}';
    const warn = '{"level":40,"time":1,"msg":"engine slow"}';
    expect(echoed(info, 30)).toBe(true);
    expect(echoed(info, 40)).toBe(false);
    expect(echoed(warn, 40)).toBe(true);
    expect(echoed(warn, Infinity)).toBe(false);
    // redis-server's lines and a fatal line on stderr are always shown.
    expect(echoed('1:M 01 Jan Ready to accept connections tcp', 50)).toBe(true);
    expect(echoed('sluice gateway: cannot listen on 127.0.0.1:1: address already in use', 60)).toBe(
      true,
    );
    expect(echoed('{not json', 60)).toBe(true);
  });
});
