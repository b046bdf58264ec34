// The logger options on a real pino writing to a stream the test reads: every listed place a
// credential or a body can sit is removed, and fields beside them are kept.
import { jsonLines } from '@sluice/test/support';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { loggerOptions, REDACTED_PATHS } from '../src/logger.ts';

function logger() {
  const { stream, lines } = jsonLines();
  return { log: pino(loggerOptions('info', 'test'), stream), lines };
}

const SECRET = 'sk-secret-value';

describe('loggerOptions', () => {
  it('removes credentials and bodies wherever the paths say, and keeps what is beside them', () => {
    const { log, lines } = logger();
    log.info(
      {
        req: { method: 'POST', headers: { authorization: SECRET, cookie: SECRET, host: 'h' } },
        headers: { 'proxy-authorization': SECRET, accept: 'a' },
        authorization: SECRET,
        apiKey: SECRET,
        apiKeys: [SECRET],
        password: SECRET,
        sentinelPassword: SECRET,
        engine: { url: 'http://e', apiKey: SECRET },
        engines: [{ url: 'http://e1', apiKey: SECRET }, { url: 'http://e2' }],
        backend: { url: 'http://b', apiKey: SECRET },
        backends: [{ url: 'http://b1', apiKey: SECRET }],
        tenant: { name: 't', apiKeys: [SECRET] },
        tenants: [{ name: 't', apiKeys: [SECRET] }],
        redis: { kind: 'single', password: SECRET, sentinelPassword: SECRET },
        body: SECRET,
        payload: { body: SECRET, bodyBase64: SECRET, model: 'm' },
        job: { data: { body: SECRET, bodyBase64: SECRET, model: 'm' } },
      },
      'everything',
    );
    const line = lines[0]!;
    expect(JSON.stringify(line)).not.toContain(SECRET);
    expect(line).toMatchObject({
      msg: 'everything',
      component: 'test',
      req: { method: 'POST', headers: { host: 'h' } },
      headers: { accept: 'a' },
      engine: { url: 'http://e' },
      engines: [{ url: 'http://e1' }, { url: 'http://e2' }],
      backend: { url: 'http://b' },
      tenant: { name: 't' },
      redis: { kind: 'single' },
      payload: { model: 'm' },
      job: { data: { model: 'm' } },
    });
  });

  it('leaves a line without those fields as it was logged', () => {
    const { log, lines } = logger();
    const fields = { id: 'r1', model: 'm', status: 200, durationMs: 3.5, stream: false };
    log.info(fields, 'request completed');
    expect(lines[0]).toMatchObject({ ...fields, msg: 'request completed' });
  });

  it('has no path that starts with a wildcard (it would run on every field of every line)', () => {
    for (const path of REDACTED_PATHS) expect(path.startsWith('*'), path).toBe(false);
  });
});
