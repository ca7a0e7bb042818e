// Self-checks of tests/lib/harness.mjs that need neither the Worker nor the origin.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { test } from 'node:test';
import { Webhook } from 'standardwebhooks';
import { newSecret, signHeaders, signedFetch, startSubscriber, waitFor } from './lib/harness.mjs';

test('newSecret is whsec_ + base64 of 32 bytes', () => {
  const s = newSecret();
  assert.match(s, /^whsec_[A-Za-z0-9+/]+=*$/);
  assert.equal(Buffer.from(s.slice(6), 'base64').length, 32);
});

test('signHeaders output verifies with the official standardwebhooks verifier', () => {
  const secret = newSecret();
  const body = JSON.stringify({ id: 'evt_1', type: 'video.trending', note: 'ünïcode ✓' });
  const headers = signHeaders(secret, body, { id: 'evt_1' });
  assert.equal(headers['webhook-id'], 'evt_1');
  assert.deepEqual(new Webhook(secret).verify(body, headers), JSON.parse(body));
  assert.throws(() => new Webhook(newSecret()).verify(body, headers));
});

test('signedFetch sends the exact body and verifiable headers; subscriber records them', async () => {
  const secret = newSecret();
  const sub = await startSubscriber((req) => (req.path === '/slow' ? { status: 429, headers: { 'retry-after': '3' } } : undefined));
  try {
    const body = '{"a":1,  "b":"x"}';
    const res = await signedFetch(`${sub.url}/hook?q=1`, secret, body);
    assert.equal(res.status, 200);
    assert.equal(await res.text(), 'ok');
    const res2 = await signedFetch(`${sub.url}/slow`, secret, null, { method: 'GET' });
    assert.equal(res2.status, 429);
    assert.equal(res2.headers.get('retry-after'), '3');
    await waitFor(() => sub.requests.length === 2, 2_000);
    const [r, r2] = sub.requests;
    assert.equal(r.method, 'POST');
    assert.equal(r.path, '/hook?q=1');
    assert.equal(r.body, body);
    assert.equal(typeof r.time, 'number');
    new Webhook(secret).verify(r.body, r.headers);
    assert.equal(r2.method, 'GET');
    assert.equal(r2.body, '');
    // A call without a body signs its method and path in its place (checked by hand: the
    // official verifier insists on a JSON payload).
    const key = Buffer.from(secret.slice('whsec_'.length), 'base64');
    const v1 = (payload) => `v1,${crypto
      .createHmac('sha256', key)
      .update(`${r2.headers['webhook-id']}.${r2.headers['webhook-timestamp']}.${payload}`)
      .digest('base64')}`;
    assert.equal(r2.headers['webhook-signature'], v1('GET /slow'));
    assert.notEqual(r2.headers['webhook-signature'], v1(''));
  } finally {
    await sub.close();
  }
});

test('waitFor returns the truthy value and times out with a clear error', async () => {
  let n = 0;
  assert.equal(await waitFor(() => (++n >= 3 ? n : 0), 1_000, { intervalMs: 1 }), 3);
  await assert.rejects(waitFor(() => false, 50), /waitFor timed out after 50 ms/);
});
