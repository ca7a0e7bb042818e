// Bad input to the edge, one case a row: each gets its HTTP status and JSON `error.code`, and
// nothing reaches the (recording) subscriber. Plus the routes' methods and GET /healthz.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { newSecret, signHeaders, startEdge, startSubscriber } from './lib/harness.mjs';
import { delivery, postBatch, send, subscriberSpec, subscriberStatus } from './lib/edge_client.mjs';

let edge; // ALLOW_LOOPBACK_HTTP=true (the harness default)
let strictEdge; // the flag off: production policy
let sub;
before(async () => {
  [edge, strictEdge, sub] = await Promise.all([
    startEdge(),
    startEdge({ vars: { ALLOW_LOOPBACK_HTTP: 'false' } }),
    startSubscriber(() => 200),
  ]);
});
after(async () => {
  await Promise.all([edge?.stop(), strictEdge?.stop(), sub?.close()]);
});

const MiB = 1024 * 1024;

/** A valid batch for the recording subscriber, with `mutate(batch)` applied. */
function batch(mutate = () => {}) {
  const b = { subscriber: subscriberSpec(`${sub.url}/hook`), deliveries: [delivery(), delivery()] };
  mutate(b);
  return b;
}

const now = () => Math.floor(Date.now() / 1000);

// Each row: name, status, code, and how to send it: `body` (object or raw string) plus fetch
// options, or `call(edgeUrl, body)` for requests signedFetch cannot make. `target` picks the edge.
const rows = [
  {
    name: 'no signature headers',
    status: 401,
    code: 'unauthorized',
    body: () => batch(),
    call: (e, text) =>
      fetch(`${e.url}/v1/deliveries`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: text }),
  },
  { name: 'signed with the wrong key', status: 401, code: 'unauthorized', body: () => batch(), opts: { key: newSecret() } },
  {
    name: 'signature of another body',
    status: 401,
    code: 'unauthorized',
    body: () => batch(),
    call: (e, text) =>
      fetch(`${e.url}/v1/deliveries`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...signHeaders(e.key, `${text} `) },
        body: text,
      }),
  },
  { name: 'timestamp 301 s old', status: 401, code: 'unauthorized', body: () => batch(), opts: () => ({ timestamp: now() - 301 }) },
  { name: 'timestamp 301 s ahead', status: 401, code: 'unauthorized', body: () => batch(), opts: () => ({ timestamp: now() + 301 }) },
  { name: 'malformed JSON', status: 400, code: 'invalid_request', body: '{"subscriber": {"id": "sub_x", ' },
  { name: 'not an object', status: 400, code: 'invalid_request', body: '[1,2,3]' },
  {
    name: 'wrong type: rate_per_sec is a string',
    status: 400,
    code: 'invalid_request',
    body: () => batch((b) => (b.subscriber.rate_per_sec = '10')),
  },
  {
    name: 'wrong type: secrets is a string',
    status: 400,
    code: 'invalid_request',
    body: () => batch((b) => (b.subscriber.secrets = b.subscriber.secrets[0])),
  },
  {
    name: 'wrong type: delivery body is an object',
    status: 400,
    code: 'invalid_request',
    body: () => batch((b) => (b.deliveries[0].body = { id: 'evt' })),
  },
  {
    name: 'wrong type: attempt is negative',
    status: 400,
    code: 'invalid_request',
    body: () => batch((b) => (b.deliveries[1].attempt = -1)),
  },
  {
    name: 'rate so small its wait overflows (1e-300/s)',
    status: 400,
    code: 'invalid_request',
    message: 'subscriber.rate_per_sec must be a number from 0.0001 to 1000000',
    body: () => batch((b) => (b.subscriber.rate_per_sec = 1e-300)),
  },
  {
    name: 'rate too large to mean anything (1e300/s)',
    status: 400,
    code: 'invalid_request',
    message: 'subscriber.rate_per_sec must be a number from 0.0001 to 1000000',
    body: () => batch((b) => (b.subscriber.rate_per_sec = 1e300)),
  },
  {
    name: 'burst over its bound',
    status: 400,
    code: 'invalid_request',
    message: 'subscriber.burst must be from 1 to 1000000',
    body: () => batch((b) => (b.subscriber.burst = 1_000_001)),
  },
  {
    name: 'max_in_flight over its bound',
    status: 400,
    code: 'invalid_request',
    message: 'subscriber.max_in_flight must be from 1 to 1000000',
    body: () => batch((b) => (b.subscriber.max_in_flight = 4_000_000_000)),
  },
  {
    name: 'missing subscriber.url',
    status: 400,
    code: 'invalid_request',
    body: () => batch((b) => delete b.subscriber.url),
  },
  { name: 'missing deliveries', status: 400, code: 'invalid_request', body: () => batch((b) => delete b.deliveries) },
  {
    name: 'missing delivery event_id',
    status: 400,
    code: 'invalid_request',
    body: () => batch((b) => delete b.deliveries[0].event_id),
  },
  { name: 'empty deliveries', status: 400, code: 'invalid_request', body: () => batch((b) => (b.deliveries = [])) },
  {
    name: 'subscriber.id of 256 characters (the origin takes up to 255)',
    status: 400,
    code: 'invalid_request',
    body: () => batch((b) => (b.subscriber.id = `sub_${'x'.repeat(252)}`)),
  },
  {
    name: "subscriber.id with a '/'",
    status: 400,
    code: 'invalid_request',
    body: () => batch((b) => (b.subscriber.id = 'sub/other')),
  },
  {
    name: 'secret that is not whsec_',
    status: 400,
    code: 'invalid_request',
    body: () => batch((b) => (b.subscriber.secrets = ['hunter2'])),
  },
  {
    name: 'request body over 8 MiB',
    status: 413,
    code: 'too_large',
    body: () => batch((b) => (b.deliveries[0].body = JSON.stringify({ pad: 'x'.repeat(8 * MiB + 1024) }))),
  },
  {
    name: 'one delivery body over 256 KiB',
    status: 413,
    code: 'too_large',
    body: () => batch((b) => (b.deliveries[0].body = 'x'.repeat(256 * 1024 + 1))),
  },
  {
    name: 'more than 500 deliveries in one call',
    status: 413,
    code: 'too_large',
    body: () => batch((b) => (b.deliveries = Array.from({ length: 501 }, () => delivery()))),
  },
  {
    name: 'content-type text/plain',
    status: 415,
    code: 'unsupported_media_type',
    body: () => batch(),
    opts: { headers: { 'content-type': 'text/plain' } },
  },
  {
    name: 'endpoint https://10.0.0.1/x (private)',
    status: 400,
    code: 'endpoint_refused',
    body: () => batch((b) => (b.subscriber.url = 'https://10.0.0.1/x')),
  },
  {
    name: 'endpoint https://169.254.169.254/ (link-local metadata)',
    status: 400,
    code: 'endpoint_refused',
    body: () => batch((b) => (b.subscriber.url = 'https://169.254.169.254/')),
  },
  // Without the flag (production policy), loopback is refused even over https.
  {
    name: 'endpoint https://[::1]/ without ALLOW_LOOPBACK_HTTP',
    status: 400,
    code: 'endpoint_refused',
    target: 'strict',
    body: () => batch((b) => (b.subscriber.url = 'https://[::1]/')),
  },
  {
    name: 'endpoint https://127.0.0.1/ without ALLOW_LOOPBACK_HTTP',
    status: 400,
    code: 'endpoint_refused',
    target: 'strict',
    body: () => batch((b) => (b.subscriber.url = 'https://127.0.0.1/')),
  },
  {
    name: 'endpoint https://192.168.1.1/ without ALLOW_LOOPBACK_HTTP',
    status: 400,
    code: 'endpoint_refused',
    target: 'strict',
    body: () => batch((b) => (b.subscriber.url = 'https://192.168.1.1/')),
  },
  {
    name: 'endpoint http:// to a public name',
    status: 400,
    code: 'endpoint_refused',
    body: () => batch((b) => (b.subscriber.url = 'http://partner.example.com/hooks')),
  },
  {
    name: 'endpoint http://127.0.0.1 without ALLOW_LOOPBACK_HTTP',
    status: 400,
    code: 'endpoint_refused',
    target: 'strict',
    body: () => batch(),
  },
];

for (const row of rows) {
  test(`bad input: ${row.name} → ${row.status} ${row.code}`, async () => {
    const e = row.target === 'strict' ? strictEdge : edge;
    const body = typeof row.body === 'function' ? row.body() : row.body;
    const text = typeof body === 'string' ? body : JSON.stringify(body);
    const before = sub.requests.length;
    let status;
    let json;
    let ctype;
    if (row.call) {
      const res = await row.call(e, text);
      status = res.status;
      ctype = res.headers.get('content-type');
      json = JSON.parse(await res.text());
    } else {
      const opts = typeof row.opts === 'function' ? row.opts() : row.opts;
      const r = await postBatch(e, null, null, { raw: text, ...opts });
      status = r.status;
      ctype = r.headers.get('content-type');
      json = r.json;
    }
    assert.equal(status, row.status, JSON.stringify(json));
    assert.match(ctype ?? '', /^application\/json/);
    assert.equal(json?.error?.code, row.code, JSON.stringify(json));
    assert.equal(typeof json.error.message, 'string');
    assert.ok(json.error.message.length > 0);
    if (row.message) assert.ok(json.error.message.includes(row.message), json.error.message);
    // Nothing was sent, and the subscriber's Durable Object never heard of it.
    assert.equal(sub.requests.length, before, 'the subscriber received nothing');
    const id = body?.subscriber?.id;
    if (id) {
      const st = await subscriberStatus(e, id);
      assert.equal(st.status, 404, `no state for ${id}: ${st.text}`);
    }
  });
}

test('a timestamp 299 s old is still accepted (the window is 300 s)', async () => {
  const b = batch();
  const results = await send(edge, b.subscriber, b.deliveries, { timestamp: now() - 299 });
  assert.deepEqual(
    results.map((r) => r.outcome),
    ['delivered', 'delivered'],
  );
});

test('control: the same subscriber receives a valid batch (so "received nothing" above means something)', async () => {
  const before = sub.requests.length;
  const b = batch();
  const results = await send(edge, b.subscriber, b.deliveries);
  assert.deepEqual(
    results.map((r) => r.outcome),
    ['delivered', 'delivered'],
  );
  assert.equal(sub.requests.length, before + 2);
});

test('GET /v1/deliveries → 405 with Allow: POST; GET /healthz → 200; unknown route → 404', async () => {
  const res = await fetch(`${edge.url}/v1/deliveries`);
  assert.equal(res.status, 405);
  assert.equal(res.headers.get('allow'), 'POST');
  assert.equal((await res.json()).error.code, 'method_not_allowed');

  const h = await fetch(`${edge.url}/healthz`);
  await h.arrayBuffer();
  assert.equal(h.status, 200);

  const nf = await fetch(`${edge.url}/v1/nope`);
  assert.equal(nf.status, 404);
  assert.equal((await nf.json()).error.code, 'not_found');
});

test('GET /v1/subscribers/{id} needs the signature too', async () => {
  const unsigned = await fetch(`${edge.url}/v1/subscribers/sub_anything`);
  assert.equal(unsigned.status, 401);
  assert.equal((await unsigned.json()).error.code, 'unauthorized');
  const wrong = await subscriberStatus(edge, 'sub_anything', { key: newSecret() });
  assert.equal(wrong.status, 401);
  assert.equal(wrong.json?.error?.code, 'unauthorized');
});
