// The YAML of a deployment with keyed tenants and one pool on one engine, as the tests that
// exercise the fair share write it (docs/configuration: `tenants`, `pools`).

export interface TenantPoolYaml {
  /** Tenant name to its one API key, in configuration order. */
  tenants: Record<string, string>;
  engineUrl: string;
  maxInflight: number;
  queueDepth: number;
  pool?: string;
}

export function tenantPoolYaml(o: TenantPoolYaml): string {
  return [
    'tenants:',
    ...Object.entries(o.tenants).flatMap(([name, key]) => [
      `  - name: ${name}`,
      `    apiKeys: [${key}]`,
    ]),
    'pools:',
    `  - name: ${o.pool ?? 'main'}`,
    '    models: [m]',
    `    queueDepth: ${o.queueDepth}`,
    '    engines:',
    `      - { url: "${o.engineUrl}", name: e, maxInflight: ${o.maxInflight} }`,
    '',
  ].join('\n');
}
