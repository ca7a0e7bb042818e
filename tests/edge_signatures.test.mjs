// Signatures on deliveries: the official npm `standardwebhooks` verifier accepts every delivery
// the edge sends, byte for byte, with one secret and during rotation (two secrets); it refuses a
// tampered body; the legacy `x-fanout-signature` header is the hex HMAC of the body.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { after, before, test } from 'node:test';
import { Webhook } from 'standardwebhooks';
import { newSecret, secretBytes, startEdge, startSubscriber } from './lib/harness.mjs';
import { delivery, send, subscriberSpec } from './lib/edge_client.mjs';

let edge;
before(async () => {
  edge = await startEdge();
});
after(async () => {
  await edge?.stop();
});

/** Bodies that trip up re-serialising verifiers: whitespace, key order, unicode, escapes, size. */
function trickyBodies() {
  return [
    '{"id":"evt_a","type":"video.trending"}',
    '{ "type" : "video.trending",\n  "id":"evt_b" ,"n": 1.50 }',
    JSON.stringify({ id: 'evt_c', title: 'ünïcödé ✓ — 日本語 🎬', esc: 'quote " backslash \\ tab \t' }),
    '{"id":"evt_d","emoji":"\\ud83c\\udfac","slash":"a\\/b"}',
    JSON.stringify({ id: 'evt_e', pad: 'x'.repeat(100_000) }),
    '[]',
  ];
}

/**
 * A subscriber that verifies every request with the given secrets, each on its own (a verifier
 * that knows only that one secret), and answers 200 only when all of them accept it.
 */
async function verifyingSubscriber(secrets) {
  const verdicts = [];
  const sub = await startSubscriber((req) => {
    const v = secrets.map((s) => {
      try {
        new Webhook(s).verify(req.body, req.headers);
        return true;
      } catch (e) {
        return String(e?.message ?? e);
      }
    });
    verdicts.push(v);
    return v.every((x) => x === true) ? { status: 200 } : { status: 400, body: JSON.stringify(v) };
  });
  return { sub, verdicts };
}

function checkHeaders(req, d) {
  assert.equal(req.method, 'POST');
  assert.equal(req.body, d.body, 'body sent byte for byte');
  assert.equal(req.headers['webhook-id'], d.event_id, 'webhook-id is the event id');
  const ts = Number(req.headers['webhook-timestamp']);
  assert.ok(Number.isInteger(ts) && Math.abs(ts - Date.now() / 1000) < 30, `timestamp ${ts}`);
  assert.match(req.headers['content-type'] ?? '', /^application\/json/);
}

test('one secret: standardwebhooks accepts every delivery; a tampered body is refused', async () => {
  const secret = newSecret(24);
  const { sub, verdicts } = await verifyingSubscriber([secret]);
  try {
    const spec = subscriberSpec(`${sub.url}/hooks/one`, { secrets: [secret] });
    const dels = trickyBodies().map((body) => delivery({ body }));
    const results = await send(edge, spec, dels);
    for (const r of results) assert.equal(r.outcome, 'delivered', JSON.stringify(r));
    for (const r of results) assert.equal(r.status, 200);
    assert.equal(sub.requests.length, dels.length);
    assert.ok(verdicts.every((v) => v[0] === true), JSON.stringify(verdicts));

    const byEvent = new Map(sub.requests.map((r) => [r.headers['webhook-id'], r]));
    for (const d of dels) {
      const req = byEvent.get(d.event_id);
      assert.ok(req, `delivery for ${d.event_id} received`);
      assert.equal(req.path, '/hooks/one');
      checkHeaders(req, d);
      assert.match(req.headers['webhook-signature'], /^v1,[A-Za-z0-9+/]+=*$/, 'one v1 signature');
      // Tamper with the recorded delivery: the same verifier refuses it.
      const wh = new Webhook(secret);
      assert.throws(() => wh.verify(`${req.body} `, req.headers), /signature/i);
      assert.throws(() => wh.verify(req.body.replace(/.$/, 'X'), req.headers), /signature/i);
      assert.throws(() => wh.verify(req.body, { ...req.headers, 'webhook-id': `${d.event_id}x` }));
      // And a verifier with some other secret refuses the untouched delivery.
      assert.throws(() => new Webhook(newSecret()).verify(req.body, req.headers));
    }
  } finally {
    await sub.close();
  }
});

test('rotation: with two secrets, a verifier knowing only the old or only the new one accepts', async () => {
  const oldSecret = newSecret(32);
  const newOne = newSecret(64);
  const { sub, verdicts } = await verifyingSubscriber([oldSecret, newOne]);
  try {
    // Newest first, as the origin sends them.
    const spec = subscriberSpec(`${sub.url}/hooks/rot`, { secrets: [newOne, oldSecret] });
    const dels = trickyBodies().map((body) => delivery({ body }));
    const results = await send(edge, spec, dels);
    for (const r of results) assert.equal(r.outcome, 'delivered', JSON.stringify(r));
    assert.equal(sub.requests.length, dels.length);
    assert.ok(
      verdicts.every((v) => v.length === 2 && v[0] === true && v[1] === true),
      JSON.stringify(verdicts),
    );
    for (const req of sub.requests) {
      const sigs = req.headers['webhook-signature'].split(' ');
      assert.equal(sigs.length, 2, 'one v1 signature per active secret, space-separated');
      for (const s of sigs) assert.match(s, /^v1,[A-Za-z0-9+/]+=*$/);
      assert.equal(req.headers['x-fanout-signature'], undefined, 'no legacy header unless asked');
      for (const s of [oldSecret, newOne]) {
        assert.throws(() => new Webhook(s).verify(`${req.body}\n`, req.headers), /signature/i);
      }
      assert.throws(() => new Webhook(newSecret()).verify(req.body, req.headers));
    }
  } finally {
    await sub.close();
  }
});

test('legacy_signature: x-fanout-signature is sha256=<hex HMAC-SHA256(secret, body)>', async () => {
  const secret = newSecret();
  const other = newSecret();
  const { sub, verdicts } = await verifyingSubscriber([secret]);
  try {
    const spec = subscriberSpec(`${sub.url}/legacy`, { secrets: [secret, other], legacy_signature: true });
    const dels = trickyBodies().map((body) => delivery({ body }));
    const results = await send(edge, spec, dels);
    for (const r of results) assert.equal(r.outcome, 'delivered', JSON.stringify(r));
    assert.ok(verdicts.every((v) => v[0] === true));
    const byEvent = new Map(sub.requests.map((r) => [r.headers['webhook-id'], r]));
    for (const d of dels) {
      const req = byEvent.get(d.event_id);
      checkHeaders(req, d);
      const expected = `sha256=${crypto.createHmac('sha256', secretBytes(secret)).update(Buffer.from(d.body, 'utf8')).digest('hex')}`;
      assert.equal(req.headers['x-fanout-signature'], expected);
      // Tampered body: the legacy MAC no longer matches.
      const tampered = `sha256=${crypto.createHmac('sha256', secretBytes(secret)).update(`${d.body} `).digest('hex')}`;
      assert.notEqual(req.headers['x-fanout-signature'], tampered);
    }
  } finally {
    await sub.close();
  }
});
