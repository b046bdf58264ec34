// deploy/ as shipped: the kustomize base and the with-redis overlay rendered by the real
// `kubectl kustomize`, every object validated against the Kubernetes (and Prometheus
// Operator) schemas of kubernetes-models, then checked for the production shape the bundle
// promises (deploy/README.md). docker-compose.yml is parsed (no container engine here), its
// Prometheus config checked by the real promtool, and its `node -e` health checks run
// against real Sluice processes.
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, isAbsolute, join, posix, relative } from 'node:path';
import { promisify } from 'node:util';
import {
  PrometheusRule,
  ServiceMonitor,
} from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { loadConfig } from '@sluice/config';
import { Deployment, StatefulSet } from 'kubernetes-models/apps/v1';
import { HorizontalPodAutoscaler } from 'kubernetes-models/autoscaling/v2';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { ConfigMap, Secret, Service } from 'kubernetes-models/v1';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { eventually, freePort, repoRoot, startStack, type Stack } from '../support/index.ts';

const run = promisify(execFile);
const path = (p: string) => join(repoRoot, p);

// Parsed YAML: the tests assert the shapes they read instead of typing them.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type J = any;

/** The schema class of each kind the bundle may contain; any other kind fails the test. */
const models: Record<string, new (data: J) => { validate(): void }> = {
  'v1/ConfigMap': ConfigMap,
  'v1/Secret': Secret,
  'v1/Service': Service,
  'apps/v1/Deployment': Deployment,
  'apps/v1/StatefulSet': StatefulSet,
  'autoscaling/v2/HorizontalPodAutoscaler': HorizontalPodAutoscaler,
  'policy/v1/PodDisruptionBudget': PodDisruptionBudget,
  'networking.k8s.io/v1/NetworkPolicy': NetworkPolicy,
  'monitoring.coreos.com/v1/ServiceMonitor': ServiceMonitor,
  'monitoring.coreos.com/v1/PrometheusRule': PrometheusRule,
};

function validate(obj: J): void {
  const model = models[`${obj.apiVersion}/${obj.kind}`];
  if (!model) throw new Error(`no schema for ${obj.apiVersion} ${obj.kind} ${obj.metadata?.name}`);
  new model(obj).validate();
}

async function render(dir: string): Promise<J[]> {
  const where = isAbsolute(dir) ? dir : path(dir);
  const { stdout } = await run('kubectl', ['kustomize', where], { maxBuffer: 16 << 20 });
  return parseAllDocuments(stdout).map((doc) => {
    expect(doc.errors).toEqual([]);
    return doc.toJS();
  });
}

/** The one object of this kind and name (generated names carry kustomize's hash suffix). */
function one(objects: J[], kind: string, name: string): J {
  const found = objects.filter((o) => o.kind === kind && o.metadata.name === name);
  expect(found, `${kind} ${name}`).toHaveLength(1);
  return found[0];
}

const ofKind = (objects: J[], kind: string): J[] => objects.filter((o) => o.kind === kind);
const workloads = (objects: J[]): J[] =>
  objects.filter((o) => o.kind === 'Deployment' || o.kind === 'StatefulSet');

function selects(selector: J, labels: Record<string, string> = {}): boolean {
  const matchLabels: Record<string, string> = selector?.matchLabels ?? {};
  const expressions: J[] = selector?.matchExpressions ?? [];
  return (
    Object.entries(matchLabels).every(([k, v]) => labels[k] === v) &&
    expressions.every((e) => {
      if (e.operator === 'In') return e.values.includes(labels[e.key]);
      if (e.operator === 'NotIn') return !e.values.includes(labels[e.key]);
      if (e.operator === 'Exists') return e.key in labels;
      return !(e.key in labels);
    })
  );
}

/** The workloads whose pods the selector picks. */
const podsOf = (objects: J[], selector: J): J[] =>
  workloads(objects).filter((w) => selects(selector, w.spec.template.metadata.labels));

/** The environment a container gets from its ConfigMaps and Secrets, as the kubelet builds it. */
function containerEnv(objects: J[], container: J): Record<string, string> {
  const env: Record<string, string> = {};
  for (const from of container.envFrom ?? []) {
    const cm = one(objects, 'ConfigMap', from.configMapRef.name);
    Object.assign(env, cm.data);
  }
  for (const e of container.env ?? []) {
    if (e.value !== undefined) env[e.name] = e.value;
    const ref = e.valueFrom?.secretKeyRef;
    if (ref) {
      const data = one(objects, 'Secret', ref.name).data ?? {};
      if (data[ref.key] !== undefined)
        env[e.name] = Buffer.from(data[ref.key], 'base64').toString('utf8');
      else expect(ref.optional, `${e.name}: key ${ref.key} missing in ${ref.name}`).toBe(true);
    }
  }
  return env;
}

function workload(objects: J[], name: string): { w: J; pod: J; c: J } {
  const w = workloads(objects).find((o) => o.metadata.name === name);
  expect(w, name).toBeDefined();
  const pod = w.spec.template.spec;
  return { w, pod, c: pod.containers[0] };
}

/** The container port a probe or Service names, by name or number; it must be declared. */
const portNumber = (container: J, port: string | number): number => {
  const found = (container.ports ?? []).find((p: J) =>
    typeof port === 'number' ? p.containerPort === port : p.name === port,
  );
  expect(found, `${container.name}: container port ${port}`).toBeDefined();
  return found.containerPort;
};

/** The rules of an ingress or egress list that let traffic to `port` through (a rule without ports allows all). */
const allowsPort = (rules: J[], port: number, protocol = 'TCP'): J[] =>
  rules.filter(
    (r) =>
      r.ports === undefined ||
      r.ports.some(
        (p: J) => (p.protocol ?? 'TCP') === protocol && (p.port === undefined || p.port === port),
      ),
  );

const rulesFile = parse(readFileSync(path('deploy/prometheus/sluice-rules.yaml'), 'utf8'));

/** Checks every rendering shares: base and overlay alike. */
function checkSluiceBundle(objects: J[]) {
  it('renders only objects that validate against the Kubernetes schemas', () => {
    expect(objects.length).toBeGreaterThan(10);
    for (const obj of objects) validate(obj);
  });

  it('runs every container as a numeric non-root user on a read-only root filesystem', () => {
    expect(workloads(objects).length).toBeGreaterThanOrEqual(2);
    for (const w of workloads(objects)) {
      const pod = w.spec.template.spec;
      for (const c of [...(pod.initContainers ?? []), ...pod.containers]) {
        const what = `${w.metadata.name}/${c.name}`;
        const sc = { ...pod.securityContext, ...c.securityContext };
        expect(sc.runAsNonRoot, what).toBe(true);
        expect(Number.isInteger(sc.runAsUser) && sc.runAsUser > 0, what).toBe(true);
        expect(Number.isInteger(sc.runAsGroup) && sc.runAsGroup > 0, what).toBe(true);
        expect(sc.seccompProfile, what).toEqual({ type: 'RuntimeDefault' });
        expect(c.securityContext.allowPrivilegeEscalation, what).toBe(false);
        expect(c.securityContext.readOnlyRootFilesystem, what).toBe(true);
        expect(c.securityContext.capabilities, what).toEqual({ drop: ['ALL'] });
        expect(c.resources.requests.cpu, what).toBeDefined();
        expect(c.resources.requests.memory, what).toBeDefined();
        expect(c.resources.limits.memory, what).toBeDefined();
        expect(c.startupProbe && c.livenessProbe && c.readinessProbe, what).toBeTruthy();
        // What may be written: an emptyDir or a claim, and /tmp is one of them.
        const claims = (w.spec.volumeClaimTemplates ?? []).map((t: J) => t.metadata.name);
        const writable = (c.volumeMounts ?? []).filter((m: J) => !m.readOnly);
        for (const m of writable) {
          const volume = (pod.volumes ?? []).find((v: J) => v.name === m.name);
          expect(volume?.emptyDir !== undefined || claims.includes(m.name), m.name).toBe(true);
        }
        expect(writable.map((m: J) => m.mountPath)).toContain('/tmp');
      }
    }
  });

  it('probes the gateway and dispatcher: /healthz for start-up and liveness, /readyz for readiness', () => {
    // A gateway's readiness is its own state only (draining): Redis and the leaders are
    // shared, and failing them would empty the Service of every replica at once.
    for (const [name, readiness] of [
      ['sluice-gateway', '/readyz?scope=replica'],
      ['sluice-dispatcher', '/readyz'],
    ] as const) {
      const { c } = workload(objects, name);
      for (const probe of [c.startupProbe, c.livenessProbe, c.readinessProbe])
        portNumber(c, probe.httpGet.port);
      expect(c.startupProbe.httpGet.path).toBe('/healthz');
      expect(c.livenessProbe.httpGet.path).toBe('/healthz');
      expect(c.readinessProbe.httpGet.path).toBe(readiness);
    }
  });

  it('lets a node drain evict pods that are not ready (Redis away makes them all so)', () => {
    const budgets = ofKind(objects, 'PodDisruptionBudget');
    expect(budgets.length).toBeGreaterThanOrEqual(2);
    for (const b of budgets) expect(b.spec.unhealthyPodEvictionPolicy).toBe('AlwaysAllow');
  });

  it('gives a gateway the grace to sit out its preStop and drain its held requests', () => {
    const { pod, c } = workload(objects, 'sluice-gateway');
    const command: string[] = c.lifecycle.preStop.exec.command;
    expect(command[0]).toBe('sleep');
    const preStop = Number(command[1]);
    expect(preStop).toBeGreaterThan(0);
    const drain = Number(containerEnv(objects, c).SLUICE_SHUTDOWN_DRAIN_SECONDS);
    expect(drain).toBeGreaterThan(0);
    // The sum stated in gateway.yaml and deploy/README.md: closing takes up to 1 s more,
    // and at least 4 s of margin for the last answers and Redis QUITs.
    expect(pod.terminationGracePeriodSeconds).toBeGreaterThanOrEqual(preStop + drain + 1 + 4);
    // A dispatcher hands its lease over and finishes its jobs; its grace must outlast
    // its own bounded steps (blocked take 11 s, BullMQ close 10 s).
    const dispatcher = workload(objects, 'sluice-dispatcher');
    expect(dispatcher.pod.terminationGracePeriodSeconds).toBeGreaterThan(21);
  });

  it('runs two dispatchers on different nodes and lets HPA own the gateway count', () => {
    const dispatcher = workload(objects, 'sluice-dispatcher');
    expect(dispatcher.w.spec.replicas).toBe(2);
    const gateway = workload(objects, 'sluice-gateway');
    expect(gateway.w.spec.replicas).toBeUndefined();
    for (const { w, pod } of [dispatcher, gateway]) {
      const spread: J[] = pod.topologySpreadConstraints;
      expect(spread.map((s) => s.topologyKey)).toEqual(
        expect.arrayContaining(['kubernetes.io/hostname', 'topology.kubernetes.io/zone']),
      );
      for (const s of spread)
        expect(selects(s.labelSelector, w.spec.template.metadata.labels)).toBe(true);
    }
    const hostname = dispatcher.pod.topologySpreadConstraints.find(
      (s: J) => s.topologyKey === 'kubernetes.io/hostname',
    );
    expect(hostname.whenUnsatisfiable).toBe('DoNotSchedule');

    const [hpa] = ofKind(objects, 'HorizontalPodAutoscaler');
    expect(ofKind(objects, 'HorizontalPodAutoscaler')).toHaveLength(1);
    expect(hpa.apiVersion).toBe('autoscaling/v2');
    expect(hpa.spec.scaleTargetRef).toMatchObject({ kind: 'Deployment', name: 'sluice-gateway' });
    expect(hpa.spec.minReplicas).toBeGreaterThanOrEqual(2);
    const cpu = hpa.spec.metrics.find((m: J) => m.resource?.name === 'cpu');
    expect(cpu.resource.target.type).toBe('Utilization');
    expect(gateway.c.resources.requests.cpu).toBeDefined(); // Utilization is of the request
  });

  it('covers the gateway and dispatcher pods with PodDisruptionBudgets that select pods', () => {
    const pdbs = ofKind(objects, 'PodDisruptionBudget');
    for (const pdb of pdbs)
      expect(podsOf(objects, pdb.spec.selector), pdb.metadata.name).not.toEqual([]);
    for (const name of ['sluice-gateway', 'sluice-dispatcher']) {
      const { w } = workload(objects, name);
      const covering = pdbs.filter((p) =>
        selects(p.spec.selector, w.spec.template.metadata.labels),
      );
      expect(covering, name).toHaveLength(1);
    }
  });

  it('points SLUICE_CONFIG into the mounted ConfigMap, and the shipped config loads', () => {
    for (const name of ['sluice-gateway', 'sluice-dispatcher']) {
      const { pod, c } = workload(objects, name);
      const env = containerEnv(objects, c);
      const file = env.SLUICE_CONFIG;
      expect(file, name).toMatch(/^\//);
      const mount = c.volumeMounts.find((m: J) => posix.dirname(file!) === m.mountPath);
      expect(mount?.readOnly, name).toBe(true);
      const volume = pod.volumes.find((v: J) => v.name === mount.name);
      const content = one(objects, 'ConfigMap', volume.configMap.name).data[posix.basename(file!)];
      expect(content, `${name}: ${file}`).toBeDefined();
      // The real loader, on the environment and file the pod gets: a bad value fails here.
      const config = loadConfig(env, (p) => {
        expect(p).toBe(file);
        return content;
      });
      expect(config.pools.length).toBeGreaterThan(0);
      expect(config.redis.password, `${name}: REDIS_PASSWORD`).toBeTruthy();
      // The ports the process listens on are the ones its probes and Services use.
      if (name === 'sluice-gateway') {
        expect(config.http.port).toBe(portNumber(c, 'http'));
        expect(config.http.gatewayMetricsPort).toBe(portNumber(c, 'metrics'));
      } else expect(config.http.metricsPort).toBe(portNumber(c, 'metrics'));
    }
  });

  it('feeds REDIS_PASSWORD and VLLM_API_KEY from the Secret and keeps credentials out of ConfigMaps', () => {
    for (const name of ['sluice-gateway', 'sluice-dispatcher']) {
      const { c } = workload(objects, name);
      const entry = c.env.find((e: J) => e.name === 'REDIS_PASSWORD');
      const ref = entry.valueFrom.secretKeyRef;
      expect(one(objects, 'Secret', ref.name).data[ref.key]).toBeDefined();
    }
    // Both call the engines: the dispatchers to serve, the gateways for GET /v1/models (model
    // discovery and the model cards), with the same key; optional, as vLLM may run without.
    const keyRefs = ['sluice-gateway', 'sluice-dispatcher'].map((name) => {
      const { c } = workload(objects, name);
      return c.env.find((e: J) => e.name === 'VLLM_API_KEY')?.valueFrom?.secretKeyRef;
    });
    expect(keyRefs[0], 'sluice-gateway: VLLM_API_KEY').toMatchObject({
      key: 'VLLM_API_KEY',
      optional: true,
    });
    // The Secret that holds REDIS_PASSWORD (kustomize's hashed name), not one of its own.
    one(objects, 'Secret', keyRefs[0].name);
    expect(keyRefs[1], 'sluice-dispatcher: VLLM_API_KEY').toEqual(keyRefs[0]);
    // No credential in a ConfigMap: not as a variable, not in REDIS_URL, not as a plain
    // key in the pools file (tenants' keys go in as digests, apiKeySha256).
    for (const cm of ofKind(objects, 'ConfigMap')) {
      for (const key of ['REDIS_PASSWORD', 'VLLM_API_KEY', 'REDIS_SENTINEL_PASSWORD'])
        expect(cm.data[key], `${cm.metadata.name}.${key}`).toBeUndefined();
      if (cm.data.REDIS_URL) expect(new URL(cm.data.REDIS_URL).password).toBe('');
    }
    const plainKeys = (node: J): string[] =>
      node && typeof node === 'object'
        ? Object.entries(node).flatMap(([k, v]) =>
            k === 'apiKey' || k === 'apiKeys' ? [k] : plainKeys(v),
          )
        : [];
    expect(plainKeys(parse(configFile(objects)))).toEqual([]);
  });

  it('lets clients reach the API port, the monitoring namespace the metrics, and Sluice reach Redis, the engine and DNS', () => {
    const policies = ofKind(objects, 'NetworkPolicy');
    for (const np of policies)
      expect(podsOf(objects, np.spec.podSelector), np.metadata.name).not.toEqual([]);
    const { c: gatewayContainer } = workload(objects, 'sluice-gateway');
    const env = containerEnv(objects, gatewayContainer);
    const pools = loadConfig(env, () => configFile(objects)).pools;
    const enginePorts = pools.flatMap((p) =>
      p.engines.map((e) => Number(new URL(e.url).port || 80)),
    );
    const redisPort = Number(new URL(env.REDIS_URL!).port || 6379);
    for (const name of ['sluice-gateway', 'sluice-dispatcher']) {
      const { w, c } = workload(objects, name);
      const mine = policies.filter((np) =>
        selects(np.spec.podSelector, w.spec.template.metadata.labels),
      );
      expect(mine, name).toHaveLength(1);
      const np = mine[0];
      expect(np.spec.policyTypes).toEqual(['Ingress', 'Egress']);
      const metrics = allowsPort(np.spec.ingress, portNumber(c, 'metrics'));
      expect(metrics.length, `${name} metrics`).toBeGreaterThan(0);
      for (const rule of metrics)
        expect(rule.from, `${name}: metrics only from monitoring`).toEqual([
          { namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'monitoring' } } },
        ]);
      const egress = np.spec.egress;
      expect(allowsPort(egress, redisPort).length, `${name} -> redis`).toBeGreaterThan(0);
      for (const port of enginePorts)
        expect(allowsPort(egress, port).length, `${name} -> engine`).toBeGreaterThan(0);
      expect(allowsPort(egress, 53, 'UDP').length, `${name} -> DNS`).toBeGreaterThan(0);
    }
    const gateway = policies.find((np) => np.metadata.name === 'sluice-gateway');
    const api = allowsPort(gateway.spec.ingress, portNumber(gatewayContainer, 'http'));
    expect(api.some((rule) => rule.from === undefined)).toBe(true);
    // The dispatcher takes no client traffic at all.
    const dispatcher = policies.find((np) => np.metadata.name === 'sluice-dispatcher');
    expect(dispatcher.spec.ingress.every((r: J) => r.from !== undefined)).toBe(true);
  });

  it('routes every Service to pods that declare its target port', () => {
    for (const svc of ofKind(objects, 'Service')) {
      const pods = podsOf(objects, { matchLabels: svc.spec.selector });
      expect(pods, svc.metadata.name).toHaveLength(1);
      for (const p of svc.spec.ports)
        portNumber(pods[0].spec.template.spec.containers[0], p.targetPort);
    }
  });

  it('scrapes the gateway and dispatcher Services on a port they name', () => {
    const [monitor] = ofKind(objects, 'ServiceMonitor');
    const scraped = ofKind(objects, 'Service').filter((s) =>
      selects(monitor.spec.selector, s.metadata.labels),
    );
    expect(scraped.map((s) => s.metadata.name).sort()).toEqual([
      'sluice-dispatcher',
      'sluice-gateway',
    ]);
    for (const svc of scraped)
      for (const endpoint of monitor.spec.endpoints)
        expect(
          svc.spec.ports.map((p: J) => p.name),
          svc.metadata.name,
        ).toContain(endpoint.port);
  });

  it('ships deploy/prometheus/sluice-rules.yaml unchanged as the PrometheusRule (node scripts/k8s-rules.mjs)', () => {
    const rule = one(objects, 'PrometheusRule', 'sluice');
    expect(rule.spec.groups).toEqual(rulesFile.groups);
  });
}

function configFile(objects: J[]): string {
  const cm = ofKind(objects, 'ConfigMap').find((c) => c.data['sluice.yaml'] !== undefined);
  return cm.data['sluice.yaml'];
}

describe('kustomize base (deploy/kubernetes)', async () => {
  const objects = await render('deploy/kubernetes');

  checkSluiceBundle(objects);

  it('brings no Redis of its own', () => {
    expect(ofKind(objects, 'StatefulSet')).toEqual([]);
  });

  it("names the image apart for the dispatcher and the gateway: an overlay moves the dispatchers' first", async () => {
    const imageOf = (all: J[], name: string) =>
      workload(all, name).w.spec.template.spec.containers[0].image;
    expect([imageOf(objects, 'sluice-dispatcher'), imageOf(objects, 'sluice-gateway')]).toEqual([
      'sluice:dev',
      'sluice:dev',
    ]);
    const overlay = await mkdtemp(join(tmpdir(), 'sluice-overlay-'));
    try {
      await writeFile(
        join(overlay, 'kustomization.yaml'),
        [
          // Kustomize takes a base by a relative path only.
          'resources: [' + JSON.stringify(relative(overlay, path('deploy/kubernetes/base'))) + ']',
          'images:',
          '  - { name: sluice-dispatcher, newName: registry.example/sluice, newTag: "2" }',
          '  - { name: sluice-gateway, newName: sluice, newTag: dev }',
          '',
        ].join('\n'),
      );
      const moved = await render(overlay);
      expect([imageOf(moved, 'sluice-dispatcher'), imageOf(moved, 'sluice-gateway')]).toEqual([
        'registry.example/sluice:2',
        'sluice:dev',
      ]);
    } finally {
      await rm(overlay, { recursive: true, force: true });
    }
  });

  it('uses a schema validator that rejects a broken object', () => {
    const { w } = workload(objects, 'sluice-gateway');
    const broken = structuredClone(w);
    broken.spec.template.spec.securityContext.runAsUser = 'node';
    expect(() => validate(broken)).toThrow(/runAsUser must be integer/);
    const nameless = structuredClone(w);
    delete nameless.spec.template.spec.containers[0].name;
    expect(() => validate(nameless)).toThrow(
      /required property 'name'|must have required property/,
    );
    expect(() => validate({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'x' } })).toThrow(
      /no schema/,
    );
  });
});

describe('kustomize overlay with Redis (deploy/kubernetes/overlays/with-redis)', async () => {
  const objects = await render('deploy/kubernetes/overlays/with-redis');

  checkSluiceBundle(objects);

  it('runs Redis as a StatefulSet behind the headless Service REDIS_URL names, with a claim and the Secret password', () => {
    const [redis] = ofKind(objects, 'StatefulSet');
    expect(ofKind(objects, 'StatefulSet')).toHaveLength(1);
    const service = one(objects, 'Service', redis.spec.serviceName);
    expect(service.spec.clusterIP).toBe('None');
    expect(
      selects({ matchLabels: service.spec.selector }, redis.spec.template.metadata.labels),
    ).toBe(true);
    const { c: gateway } = workload(objects, 'sluice-gateway');
    const url = new URL(containerEnv(objects, gateway).REDIS_URL!);
    expect(url.hostname).toBe(service.metadata.name);
    const container = redis.spec.template.spec.containers[0];
    expect(Number(url.port)).toBe(portNumber(container, 'redis'));

    const [claim] = redis.spec.volumeClaimTemplates;
    expect(container.volumeMounts.map((m: J) => m.name)).toContain(claim.metadata.name);
    // The server's password and the clients' are the same Secret key.
    const env = containerEnv(objects, container);
    expect(env.REDIS_PASSWORD).toBe(containerEnv(objects, gateway).REDIS_PASSWORD);
    expect(container.args).toEqual(expect.arrayContaining(['--requirepass', '$(REDIS_PASSWORD)']));
    expect(container.args.join(' ')).toContain('--maxmemory-policy noeviction');
    expect(env.REDISCLI_AUTH).toBe(env.REDIS_PASSWORD);
  });

  it('lets only the gateway and dispatcher pods reach Redis', () => {
    const redis = ofKind(objects, 'StatefulSet')[0];
    const port = portNumber(redis.spec.template.spec.containers[0], 'redis');
    const policies = ofKind(objects, 'NetworkPolicy').filter((np) =>
      selects(np.spec.podSelector, redis.spec.template.metadata.labels),
    );
    expect(policies).toHaveLength(1);
    const rules = allowsPort(policies[0].spec.ingress, port);
    const peers = rules.flatMap((r) => r.from ?? [{}]);
    expect(peers.every((peer: J) => peer.podSelector && !peer.namespaceSelector)).toBe(true);
    const allowed = peers.flatMap((peer: J) =>
      podsOf(objects, peer.podSelector).map((w) => w.metadata.name),
    );
    expect(allowed.sort()).toEqual(['sluice-dispatcher', 'sluice-gateway']);
  });
});

describe('deploy/Dockerfile', () => {
  const lines = readFileSync(path('deploy/Dockerfile'), 'utf8').split('\n');
  const final = lines.slice(lines.findLastIndex((l) => l.startsWith('FROM ')));

  it('runs the final stage as a numeric user under tini, the user the pods run as', async () => {
    const user = final.find((l) => l.startsWith('USER '));
    expect(user).toMatch(/^USER \d+:\d+$/);
    const [uid, gid] = user!.slice(5).split(':').map(Number);
    const { pod } = workload(await render('deploy/kubernetes'), 'sluice-gateway');
    expect([pod.securityContext.runAsUser, pod.securityContext.runAsGroup]).toEqual([uid, gid]);
    expect(final.join('\n')).toMatch(/apt-get install[^\n]* tini/);
    const entry = JSON.parse(final.find((l) => l.startsWith('ENTRYPOINT '))!.slice(11));
    expect(entry.slice(0, 2)).toEqual(['/usr/bin/tini', '--']);
  });
});

describe('docker-compose.yml', () => {
  const compose = parse(readFileSync(path('docker-compose.yml'), 'utf8'), { merge: true });
  const services: Record<string, J> = compose.services;
  const sluiceServices = Object.entries(services).filter(([, s]) => s.image === 'sluice:dev');
  const role = (s: J): string => s.command[0];

  it('restarts every service and checks its health; depends_on waits only on checked services', () => {
    expect(Object.keys(services)).toEqual(
      expect.arrayContaining([
        'redis',
        'prometheus',
        'grafana',
        'gateway-1',
        'gateway-2',
        'dispatcher-1',
        'dispatcher-2',
      ]),
    );
    for (const [name, s] of Object.entries(services)) {
      expect(s.restart, name).toBe('unless-stopped');
      expect(s.healthcheck?.test?.length, name).toBeGreaterThan(0);
      for (const [dep, { condition }] of Object.entries<J>(s.depends_on ?? {})) {
        expect(services[dep], `${name} depends on ${dep}`).toBeDefined();
        if (condition === 'service_healthy') expect(services[dep].healthcheck).toBeDefined();
      }
    }
    // The image has no curl: Sluice's checks are node one-liners.
    for (const [name, s] of sluiceServices) {
      expect(s.healthcheck.test.slice(0, 3), name).toEqual(['CMD', 'node', '-e']);
      expect(s.read_only, name).toBe(true);
    }
  });

  it('mounts only files and folders that exist', () => {
    const mounts = Object.values(services).flatMap((s) => (s.volumes ?? []) as string[]);
    expect(mounts.length).toBeGreaterThan(0);
    for (const m of mounts) {
      const source = m.split(':')[0]!;
      expect(source.startsWith('./'), m).toBe(true);
      expect(existsSync(path(source)), m).toBe(true);
    }
  });

  it('gives every Sluice process an environment the real loader accepts', () => {
    const kinds = sluiceServices.map(([, s]) => role(s));
    expect(kinds.filter((k) => k === 'gateway')).toHaveLength(2);
    expect(kinds.filter((k) => k === 'dispatcher')).toHaveLength(2);
    for (const [name, s] of sluiceServices)
      if (role(s) !== 'engine-sim') expect(() => loadConfig(s.environment), name).not.toThrow();
  });

  const mountTarget = (service: string, source: string): string => {
    const m = (services[service].volumes as string[]).find((v) => v.split(':')[0] === source);
    expect(m, `${service} mounts ${source}`).toBeDefined();
    return m!.split(':')[1]!;
  };

  it('has Prometheus scrape every gateway and dispatcher and load the rules (promtool check config)', async () => {
    const configPath = 'deploy/prometheus/prometheus.yml';
    const { stdout } = await run('promtool', ['check', 'config', path(configPath)]);
    expect(stdout).toMatch(/SUCCESS/);
    const config = parse(readFileSync(path(configPath), 'utf8'));
    const targets = config.scrape_configs.flatMap((job: J) =>
      job.static_configs.flatMap((c: J) => c.targets),
    );
    for (const [name, s] of sluiceServices) {
      if (role(s) === 'engine-sim') continue;
      const port =
        role(s) === 'gateway' ? s.environment.GATEWAY_METRICS_PORT : s.environment.METRICS_PORT;
      expect(targets, name).toContain(`${name}:${port}`);
    }
    // Inside the container the rules sit where rule_files says, relative to the config.
    const configDir = posix.dirname(mountTarget('prometheus', `./${configPath}`));
    const rulesTarget = mountTarget('prometheus', './deploy/prometheus/sluice-rules.yaml');
    expect(config.rule_files.map((f: string) => posix.resolve(configDir, f))).toEqual([
      rulesTarget,
    ]);
  });

  it('provisions Grafana with the Prometheus datasource and the Sluice dashboard', () => {
    const provisioning = mountTarget('grafana', './deploy/grafana/provisioning');
    expect(provisioning).toBe('/etc/grafana/provisioning');
    const datasources = parse(
      readFileSync(path('deploy/grafana/provisioning/datasources/prometheus.yaml'), 'utf8'),
    );
    const prometheus = datasources.datasources.find((d: J) => d.type === 'prometheus');
    expect(prometheus.isDefault).toBe(true);
    expect(prometheus.url).toBe('http://prometheus:9090');
    expect(services.prometheus.ports.some((p: string) => p.endsWith(':9090'))).toBe(true);
    const providers = parse(
      readFileSync(path('deploy/grafana/provisioning/dashboards/sluice.yaml'), 'utf8'),
    );
    const dashboard = mountTarget('grafana', './deploy/grafana/sluice-dashboard.json');
    expect(providers.providers.map((p: J) => p.options.path)).toContain(dirname(dashboard));
    const json = JSON.parse(readFileSync(path('deploy/grafana/sluice-dashboard.json'), 'utf8'));
    expect(json.panels.length).toBeGreaterThan(0);
  });

  describe('health checks run against real processes', () => {
    let stack: Stack;
    beforeAll(async () => {
      stack = await startStack();
    });
    afterAll(() => stack?.stop());

    /** The check's script with its loopback origin moved to `origin`; resolves its exit code. */
    const check = async (service: J, origin: string): Promise<number> => {
      const script: string = service.healthcheck.test[3];
      expect(script).toMatch(/http:\/\/127\.0\.0\.1:\d+\//);
      const moved = script.replace(/http:\/\/127\.0\.0\.1:\d+/, origin);
      return run(process.execPath, ['-e', moved]).then(
        () => 0,
        (err: { code: number }) => err.code,
      );
    };

    // The time-out is a ceiling for a dozen node start-ups on a loaded machine.
    it('passes for a ready process and fails where nothing listens', async () => {
      const origins: Record<string, string> = {
        gateway: stack.gateway.url,
        dispatcher: stack.dispatcher.url,
        'engine-sim': stack.sim.url,
      };
      const nothing = `http://127.0.0.1:${await freePort()}`;
      for (const [name, s] of sluiceServices) {
        const origin = origins[role(s)];
        expect(origin, name).toBeDefined();
        // A gateway is ready once it has seen the leader: wait for that, not for a time.
        await eventually(
          async () => (await check(s, origin!)) === 0,
          `${name}'s health check to pass`,
        );
        expect(await check(s, nothing), name).toBe(1);
      }
    }, 120_000);
  });
});
