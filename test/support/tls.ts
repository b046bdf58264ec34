// TLS for tests: a certificate authority and a server certificate for 127.0.0.1 made on the
// spot (node-forge: Node 20 cannot sign X.509, and the openssl CLI may be missing on CI), and
// a redis-server that speaks only TLS with them.
import { generateKeyPair } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import forge from 'node-forge';
import type { StartedProcess } from './process.ts';
import { startRedisNode, stopAll, tempDir } from './redis-node.ts';

export interface TestCertificates {
  /** PEM files: the CA's certificate, and the server's certificate and key. */
  readonly caFile: string;
  readonly certFile: string;
  readonly keyFile: string;
  /** The CA's certificate, PEM. */
  readonly ca: string;
}

const DAY_MS = 86_400_000;

async function rsaKeys(): Promise<forge.pki.rsa.KeyPair> {
  // Node's native key generation; forge only builds and signs the certificates.
  const { publicKey, privateKey } = await promisify(generateKeyPair)('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  return {
    publicKey: forge.pki.publicKeyFromPem(publicKey),
    privateKey: forge.pki.privateKeyFromPem(privateKey),
  };
}

function certificate(
  serial: string,
  subject: forge.pki.CertificateField[],
  publicKey: forge.pki.PublicKey,
  extensions: object[],
): forge.pki.Certificate {
  const cert = forge.pki.createCertificate();
  cert.serialNumber = serial;
  cert.publicKey = publicKey;
  // A day back: a clock a little behind the test machine's still accepts it.
  cert.validity.notBefore = new Date(Date.now() - DAY_MS);
  cert.validity.notAfter = new Date(Date.now() + 365 * DAY_MS);
  cert.setSubject(subject);
  cert.setExtensions(extensions);
  return cert;
}

/** Writes a fresh CA and a server certificate for 127.0.0.1 and localhost into `dir`. */
export async function makeTestCertificates(dir: string): Promise<TestCertificates> {
  const [caKeys, serverKeys] = await Promise.all([rsaKeys(), rsaKeys()]);
  const caName = [{ name: 'commonName', value: 'Sluice test CA' }];
  const ca = certificate('01', caName, caKeys.publicKey, [
    { name: 'basicConstraints', cA: true, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
  ca.setIssuer(caName);
  ca.sign(caKeys.privateKey, forge.md.sha256.create());

  const server = certificate(
    '02',
    [{ name: 'commonName', value: '127.0.0.1' }],
    serverKeys.publicKey,
    [
      { name: 'basicConstraints', cA: false },
      { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
      { name: 'extKeyUsage', serverAuth: true },
      {
        name: 'subjectAltName',
        altNames: [
          { type: 7, ip: '127.0.0.1' },
          { type: 2, value: 'localhost' },
        ],
      },
    ],
  );
  server.setIssuer(caName);
  server.sign(caKeys.privateKey, forge.md.sha256.create());

  const files = {
    caFile: join(dir, 'ca.pem'),
    certFile: join(dir, 'server.pem'),
    keyFile: join(dir, 'server-key.pem'),
  };
  writeFileSync(files.caFile, forge.pki.certificateToPem(ca));
  writeFileSync(files.certFile, forge.pki.certificateToPem(server));
  writeFileSync(files.keyFile, forge.pki.privateKeyToPem(serverKeys.privateKey), { mode: 0o600 });
  return { ...files, ca: readFileSync(files.caFile, 'utf8') };
}

export interface TestTlsRedis {
  /** `rediss://[:password@]127.0.0.1:<tls port>`. */
  readonly url: string;
  readonly port: number;
  readonly certificates: TestCertificates;
  /** The environment that points Sluice at this server: REDIS_URL and REDIS_TLS_CA_FILE. */
  readonly env: Record<string, string>;
  readonly process: StartedProcess;
  stop(): Promise<void>;
}

/** A redis-server that accepts TLS only (no plain port), with a certificate from a fresh CA. */
export async function startTlsRedis(options: { password?: string } = {}): Promise<TestTlsRedis> {
  const dir = await tempDir('tls');
  const started: { stop(): Promise<void> }[] = [{ stop: () => dir.remove() }];
  try {
    const certificates = await makeTestCertificates(dir.path);
    const node = await startRedisNode({
      args: (port) => [
        '--port',
        '0',
        '--tls-port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--tls-cert-file',
        certificates.certFile,
        '--tls-key-file',
        certificates.keyFile,
        '--tls-ca-cert-file',
        certificates.caFile,
        '--tls-auth-clients',
        'no',
        ...(options.password ? ['--requirepass', options.password] : []),
      ],
    });
    started.push(node);
    const auth = options.password ? `:${options.password}@` : '';
    const url = `rediss://${auth}127.0.0.1:${node.port}`;
    return {
      url,
      port: node.port,
      certificates,
      env: { REDIS_URL: url, REDIS_TLS_CA_FILE: certificates.caFile },
      process: node.process,
      stop: () => stopAll(started),
    };
  } catch (err) {
    await stopAll(started).catch(() => {});
    throw err;
  }
}
