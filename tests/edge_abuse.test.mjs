// No caller can abuse the edge (issue 9): a captured signed call replayed within the tolerance is
// refused, a signed status read included, and that one's signature covers its method and path;
// the signature header holds at most 10 signatures; a body without content-length is
// cut at the limit while it streams; endpoints embedding IPv4 in IPv6 (and the other special
// ranges) are refused.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';
import { sign, signHeaders, startEdge, startSubscriber } from './lib/harness.mjs';
import { deliveries, postBatch, send, subscriberSpec, subscriberStatus } from './lib/edge_client.mjs';

let edge;
let sub;
before(async () => {
  edge = await startEdge();
  sub = await startSubscriber(() => 200);
});
after(async () => {
  await sub?.close();
  await edge?.stop();
});

test('a captured call replayed within the tolerance: 401 `replayed`, nothing sent twice', async () => {
  const spec = subscriberSpec(`${sub.url}/replay`);
  const body = JSON.stringify({ subscriber: spec, deliveries: deliveries(2) });
  const headers = { 'content-type': 'application/json', ...signHeaders(edge.key, body, { id: 'call_captured_1' }) };
  const call = () => fetch(`${edge.url}/v1/deliveries`, { method: 'POST', headers, body });
  const before = sub.requests.length;
  const first = await call();
  assert.equal(first.status, 200, await first.text());
  for (let i = 0; i < 3; i++) {
    const again = await call();
    const json = await again.json();
    assert.equal(again.status, 401, JSON.stringify(json));
    assert.equal(json.error.code, 'replayed');
  }
  assert.equal(sub.requests.length - before, 2, 'the deliveries were sent once');
  // The same batch in a new call (a fresh id) goes through: the origin resends that way.
  const fresh = await postBatch(edge, spec, JSON.parse(body).deliveries);
  assert.equal(fresh.status, 200, fresh.text);
  assert.equal(sub.requests.length - before, 4);
});

test('GET /v1/subscribers/{id}: signed over its method and path, accepted once', async () => {
  const a = subscriberSpec(`${sub.url}/status-a`);
  const b = subscriberSpec(`${sub.url}/status-b`);
  await send(edge, a, deliveries(1));
  await send(edge, b, deliveries(1));
  const pathA = `/v1/subscribers/${encodeURIComponent(a.id)}`;
  const pathB = `/v1/subscribers/${encodeURIComponent(b.id)}`;
  const get = (path, headers) => fetch(`${edge.url}${path}`, { headers });
  const code = async (res) => ({ status: res.status, code: (await res.json())?.error?.code });

  // What the origin's client sends: a fresh id, the method and path signed.
  const ok = await subscriberStatus(edge, a.id);
  assert.equal(ok.status, 200, ok.text);
  assert.equal(ok.json.id, a.id);

  // Captured, the same call again: refused, like a replayed batch.
  const captured = signHeaders(edge.key, `GET ${pathA}`, { id: 'status_captured_1' });
  assert.equal((await get(pathA, captured)).status, 200);
  for (let i = 0; i < 2; i++) {
    assert.deepEqual(await code(await get(pathA, captured)), { status: 401, code: 'replayed' });
  }
  // Its signature moved to another subscriber's path: the path is signed.
  const moved = signHeaders(edge.key, `GET ${pathA}`, { id: 'status_moved_1' });
  assert.deepEqual(await code(await get(pathB, moved)), { status: 401, code: 'unauthorized' });
  // Signed over an empty body (no method or path): refused.
  const bodiless = signHeaders(edge.key, '', { id: 'status_bodiless_1' });
  assert.deepEqual(await code(await get(pathA, bodiless)), { status: 401, code: 'unauthorized' });
  // Signed as another method.
  const posted = signHeaders(edge.key, `POST ${pathA}`, { id: 'status_post_1' });
  assert.deepEqual(await code(await get(pathA, posted)), { status: 401, code: 'unauthorized' });
});

test('more than 10 signatures in webhook-signature: 401, whatever else it holds', async () => {
  const spec = subscriberSpec(`${sub.url}/many`);
  const body = JSON.stringify({ subscriber: spec, deliveries: deliveries(1) });
  const ts = String(Math.floor(Date.now() / 1000));
  const good = sign(edge.key, 'call_many', ts, body);
  const junk = 'v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=';
  const attempt = async (nJunk, id) => {
    const res = await fetch(`${edge.url}/v1/deliveries`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'webhook-id': id,
        'webhook-timestamp': ts,
        'webhook-signature': [...Array(nJunk).fill(junk), sign(edge.key, id, ts, body)].join(' '),
      },
      body,
    });
    return { status: res.status, text: await res.text() };
  };
  assert.ok(good.startsWith('v1,'));
  const ok = await attempt(9, 'call_nine_junk');
  assert.equal(ok.status, 200, ok.text);
  const refused = await attempt(10, 'call_ten_junk');
  assert.equal(refused.status, 401, refused.text);
  assert.match(refused.text, /more than 10 signatures/);
  const flood = await attempt(100, 'call_flood');
  assert.equal(flood.status, 401, flood.text);
});

test('endpoints that embed or tunnel IPv4 in IPv6, and the other special ranges, are refused', async () => {
  const refused = [
    'https://[::93.184.216.34]/h',
    'https://[::ffff:93.184.216.34]/h',
    'https://[::ffff:0:93.184.216.34]/h',
    'https://[64:ff9b::5db8:d822]/h',
    'https://[64:ff9b:1::5db8:d822]/h',
    'https://[2002:5db8:d822::1]/h',
    'https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/h',
    'https://[ff02::1]/h',
    'https://100.64.0.1/h',
    'https://198.18.0.1/h',
    'https://0.1.2.3/h',
    'https://224.0.0.1/h',
    'https://255.255.255.255/h',
  ];
  for (const url of refused) {
    const r = await postBatch(edge, subscriberSpec(url), deliveries(1));
    assert.equal(r.status, 400, `${url}: ${r.status} ${r.text}`);
    assert.equal(r.json.error.code, 'endpoint_refused', `${url}: ${r.text}`);
  }
  // A public IPv6 literal is fine (nothing listens there; the batch is accepted and fails to
  // connect, which is all this checks).
  const ok = await postBatch(edge, subscriberSpec('https://[2606:4700::1]:1/h', { timeout_ms: 500 }), deliveries(1));
  assert.ok(ok.status === 200, ok.text);
  // The edge keeps working for ordinary subscribers.
  const [r] = await send(edge, subscriberSpec(`${sub.url}/fine`), deliveries(1));
  assert.equal(r.outcome, 'delivered');
});

test('a body without content-length is cut at 8 MiB while it streams: 413 before the sender finishes', async () => {
  // A raw request (chunked, no content-length) that sends 9 MiB and then never ends its body:
  // only an edge that stops reading at the limit can answer.
  const u = new URL(edge.url);
  let sent = 0;
  const req = http.request({
    host: u.hostname,
    port: u.port,
    path: '/v1/deliveries',
    method: 'POST',
    headers: { 'content-type': 'application/json', ...signHeaders(edge.key, 'never signed in full') },
  });
  const answer = new Promise((resolve, reject) => {
    req.on('response', (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode, text }));
    });
    req.on('error', reject);
  });
  const chunk = Buffer.alloc(1024 * 1024, 32); // spaces: valid JSON whitespace
  for (let i = 0; i < 9; i++) {
    req.write(chunk);
    sent += chunk.length;
  }
  try {
    const r = await Promise.race([
      answer,
      new Promise((_, reject) => setTimeout(() => reject(new Error('no answer while the body was still open')), 15_000)),
    ]);
    assert.equal(r.status, 413, r.text);
    assert.equal(JSON.parse(r.text).error.code, 'too_large');
    assert.equal(sent, 9 * 1024 * 1024);
    assert.equal(req.writableEnded, false, 'answered before the sender finished');
  } finally {
    req.destroy();
  }
  // (wrangler dev's local proxy takes a few seconds to let go of the abandoned upload; it is
  // the last test here for that reason.)
});
