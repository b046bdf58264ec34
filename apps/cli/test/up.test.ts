// What `sluice up` starts, and on which ports, read from the environment the way
// @sluice/config reads it (an empty variable is unset).
import { describe, expect, it } from 'vitest';
import { upPlan } from '../src/up.ts';

describe('sluice up plan', () => {
  it('starts redis-server and the simulator on the default ports when nothing is set', () => {
    expect(upPlan({})).toEqual({
      redis: true,
      redisPort: '6379',
      simulator: true,
      enginePort: '8000',
      gatewayPorts: ['8080', '8081'],
      metricsPorts: ['9464', '9465'],
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
});
