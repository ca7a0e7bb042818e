// The origin's OpenAPI document (GET /openapi.json) checked against the running daemon with
// schemathesis (PyPI, installed by scripts/setup.sh): every generated request — valid and invalid
// — must get no 5xx, a documented status code, a documented content type and a body that matches
// the documented schema.
//
// Two runs, so that the daemon never sends a webhook to a host the fuzzer made up: first
// POST /v1/events alone, while no subscriber exists (events fan out to nobody); then every other
// operation, after two seeded loopback subscribers have left sent and dead deliveries (with their
// attempts and response bodies) to read, and have been removed again — so no delivery the fuzzer
// can replay belongs to a subscriber whose URL it can change, and the subscribers it creates
// never see an event.
//
// FANOUT_SCHEMATHESIS_EXAMPLES (default 100 per operation) and FANOUT_SCHEMATHESIS_SEED (default
// fixed, so CI is repeatable) tune the runs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

import { startOrigin, startSubscriber, waitFor } from './lib/harness.mjs';

const SCHEMATHESIS = process.env.SCHEMATHESIS_BIN ?? 'schemathesis';
const EXAMPLES = process.env.FANOUT_SCHEMATHESIS_EXAMPLES ?? '100';
const SEED = process.env.FANOUT_SCHEMATHESIS_SEED ?? '20261130';
const CHECKS = [
  'not_a_server_error',
  'response_schema_conformance',
  'status_code_conformance',
  'content_type_conformance',
];

/** Runs schemathesis to completion in a scratch directory (it keeps a cache there): {code, output}. */
async function schemathesis(args, timeoutMs) {
  const cwd = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-schemathesis-'));
  try {
    return await spawnToEnd(args, cwd, timeoutMs);
  } finally {
    await fsp.rm(cwd, { recursive: true, force: true });
  }
}

function spawnToEnd(args, cwd, timeoutMs) {
  return new Promise((resolve, reject) => {
    const child = spawn(SCHEMATHESIS, args, {
      cwd,
      env: { ...process.env, NO_COLOR: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (c) => (output += c));
    child.stderr.on('data', (c) => (output += c));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', (e) =>
      reject(new Error(`cannot run ${SCHEMATHESIS} (${e.message}): run bash scripts/setup.sh`)),
    );
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ code: code ?? `signal ${signal}`, output });
    });
  });
}

async function run(t, origin, name, filter) {
  const args = [
    'run',
    `${origin.url}/openapi.json`,
    '--header',
    `Authorization: Bearer ${origin.token}`,
    '--checks',
    CHECKS.join(','),
    '--max-examples',
    EXAMPLES,
    '--seed',
    SEED,
    '--workers',
    '1',
    '--request-timeout',
    '10',
    '--no-color',
    ...filter,
  ];
  const { code, output } = await schemathesis(args, 150_000);
  const cases = output.match(/(\d+) generated/)?.[1] ?? '?';
  const tested = output.match(/Tested:\s+(\d+)/)?.[1] ?? '?';
  t.diagnostic(`${name}: ${tested} operations, ${cases} test cases, exit ${code}`);
  assert.equal(code, 0, `schemathesis (${name}) failed:\n${output}`);
  return output;
}

test('GET /openapi.json needs no token and describes every route', async (t) => {
  const origin = await startOrigin();
  t.after(() => origin.stop());
  const res = await fetch(`${origin.url}/openapi.json`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^application\/json/);
  const doc = await res.json();
  assert.equal(doc.openapi, '3.1.0');
  const { type, scheme } = doc.components.securitySchemes.bearerAuth;
  assert.deepEqual([type, scheme], ['http', 'bearer']);
  // The documented error shape is what the daemon answers.
  const unauth = await fetch(`${origin.url}/v1/subscribers`);
  assert.equal(unauth.status, 401);
  const body = await unauth.json();
  assert.deepEqual(Object.keys(body.error).sort(), ['code', 'message']);
  assert.ok(doc.components.schemas.Error.properties.error.properties.code.enum.includes(body.error.code));
});

test('every error is the documented JSON, even for a malformed path', async (t) => {
  const origin = await startOrigin();
  t.after(() => origin.stop());
  const cases = [
    ['GET', '/v1/subscribers/%FF', 400, 'invalid_request'],
    ['DELETE', '/v1/subscribers/%C3%28', 400, 'invalid_request'],
    ['POST', '/v1/subscribers/%FF/rotate-secret', 400, 'invalid_request'],
    ['GET', '/v1/subscribers/%FF/secret', 400, 'invalid_request'],
    ['GET', '/v1/deliveries/%FF', 400, 'invalid_request'],
    ['POST', '/v1/deliveries/%FF/replay', 400, 'invalid_request'],
    ['GET', '/v1/deliveries?status=%FF', 400, 'invalid_request'],
    ['GET', '/v1/subscribers?stats=maybe', 400, 'invalid_request'],
    ['GET', '/v1/deliveries/dlv_1', 404, 'not_found'],
    ['PUT', '/v1/events', 405, 'method_not_allowed'],
    ['GET', '/v1/nothing', 404, 'not_found'],
  ];
  for (const [method, p, status, code] of cases) {
    const res = await origin.api(p, { method });
    const text = await res.text();
    assert.equal(res.status, status, `${method} ${p}: ${text}`);
    assert.match(res.headers.get('content-type'), /^application\/json/, `${method} ${p}`);
    assert.equal(JSON.parse(text).error.code, code, `${method} ${p}: ${text}`);
  }
});

test('schemathesis: no 5xx and every response as documented', { timeout: 300_000 }, async (t) => {
  const sub = await startSubscriber((rec) => (rec.path.includes('fail') ? { status: 500, body: 'nope' } : 200));
  const origin = await startOrigin({ args: ['--max-attempts', '1'] });
  t.after(async () => {
    await origin.stop();
    await sub.close();
  });

  // 1. Ingest alone, with no subscriber: nothing can be sent anywhere.
  await run(t, origin, 'POST /v1/events', ['--include-path', '/v1/events']);

  // 2. Seed deliveries to read: two loopback subscribers, some sent, some dead; then remove them.
  const seeds = [
    ['seed_ok', `${sub.url}/ok`],
    ['seed_fail', `${sub.url}/fail`],
  ];
  for (const [id, url] of seeds) {
    const res = await origin.api('/v1/subscribers', {
      body: { id, url, event_types: ['seed.*'], lane: 'origin' },
    });
    assert.equal(res.status, 201, await res.text());
  }
  const events = Array.from({ length: 5 }, (_, i) => ({ id: `seed_evt_${i}`, type: 'seed.made' }));
  assert.equal((await origin.api('/v1/events', { body: events })).status, 202);
  await waitFor(async () => {
    const res = await origin.api('/v1/deliveries?status=pending');
    const pending = (await res.json()).deliveries.length;
    const res2 = await origin.api('/v1/deliveries?status=in_flight');
    return pending + (await res2.json()).deliveries.length === 0;
  }, 15_000);
  for (const [id] of seeds) {
    assert.equal((await origin.api(`/v1/subscribers/${id}`, { method: 'DELETE' })).status, 200);
  }
  const seeded = await (await origin.api('/v1/deliveries')).json();
  assert.deepEqual(seeded.deliveries.map((d) => d.status).sort(), [...Array(5).fill('dead'), ...Array(5).fill('sent')]);

  // 3. Every other operation, but the test event: it would send to a subscriber the fuzzer made up
  // (tests/portal.test.mjs and origin/tests/customers.rs send test events to real ones).
  await run(t, origin, 'every other operation', ['--exclude-path', '/v1/events', '--exclude-path', '/v1/subscribers/{id}/test']);
});
