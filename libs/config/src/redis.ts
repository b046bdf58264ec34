// Which Redis: one node (REDIS_URL), Sentinel (REDIS_SENTINELS) or Cluster (REDIS_CLUSTER_NODES),
// and the relations between those variables. Exactly one topology comes out; a contradiction
// stops the process with a message naming both sides.
import { invalid } from './errors.js';
import type { RedisAccess, RedisConfig } from './types.js';
import type { EnvValues, VariableName } from './variables.js';

/** `NAME=<value> is invalid: expected unset when OTHER is set (why)`. */
function conflict(vars: EnvValues, name: VariableName, other: string, why: string) {
  return invalid(name, vars.shown(name), `unset when ${other} is set (${why})`);
}

function access(vars: EnvValues): RedisAccess {
  const username = vars.get('REDIS_USERNAME');
  const password = vars.get('REDIS_PASSWORD');
  const tlsCaFile = vars.get('REDIS_TLS_CA_FILE');
  return {
    ...(username === undefined ? {} : { username }),
    ...(password === undefined ? {} : { password }),
    ...(tlsCaFile === undefined ? {} : { tlsCaFile }),
  };
}

export function redisConfig(vars: EnvValues): RedisConfig {
  const prefix = vars.must('SLUICE_REDIS_PREFIX');
  const sentinels = vars.get('REDIS_SENTINELS');
  const nodes = vars.get('REDIS_CLUSTER_NODES');
  const masterName = vars.get('REDIS_SENTINEL_MASTER');
  const sentinelPassword = vars.get('REDIS_SENTINEL_PASSWORD');

  if (sentinels !== undefined && nodes !== undefined)
    throw conflict(vars, 'REDIS_CLUSTER_NODES', 'REDIS_SENTINELS', 'one topology at a time');
  const chosen = sentinels !== undefined ? 'REDIS_SENTINELS' : 'REDIS_CLUSTER_NODES';
  if ((sentinels !== undefined || nodes !== undefined) && vars.isSet('REDIS_URL'))
    throw conflict(vars, 'REDIS_URL', chosen, `the nodes come from ${chosen}`);
  if (sentinels === undefined)
    for (const name of ['REDIS_SENTINEL_MASTER', 'REDIS_SENTINEL_PASSWORD'] as const)
      if (vars.isSet(name))
        throw invalid(name, vars.shown(name), 'unset unless REDIS_SENTINELS is set');

  if (sentinels !== undefined) {
    if (masterName === undefined)
      throw invalid(
        'REDIS_SENTINELS',
        vars.shown('REDIS_SENTINELS'),
        'REDIS_SENTINEL_MASTER set too (the name the sentinels monitor the master under)',
      );
    return {
      kind: 'sentinel',
      sentinels,
      masterName,
      ...(sentinelPassword === undefined ? {} : { sentinelPassword }),
      ...access(vars),
      prefix,
    };
  }
  if (nodes !== undefined) return { kind: 'cluster', nodes, ...access(vars), prefix };

  const url = vars.must('REDIS_URL');
  const parsed = new URL(url);
  if (parsed.username !== '' || parsed.password !== '')
    for (const name of ['REDIS_USERNAME', 'REDIS_PASSWORD'] as const)
      if (vars.isSet(name))
        throw invalid(name, vars.shown(name), 'unset when REDIS_URL carries credentials');
  if (vars.isSet('REDIS_TLS_CA_FILE') && parsed.protocol !== 'rediss:')
    throw invalid(
      'REDIS_TLS_CA_FILE',
      vars.shown('REDIS_TLS_CA_FILE'),
      `unset unless REDIS_URL is rediss:// (REDIS_URL=${vars.shown('REDIS_URL')})`,
    );
  return { kind: 'single', url, ...access(vars), prefix };
}
