// Ed25519 (`v1a`) signatures on both lanes, checked by an implementation that shares nothing
// with Fanout's: Node's `crypto.verify` with the subscriber's `whpk_` public key, and the
// official `standardwebhooks` package for the `v1` beside it. One daemon, one local edge: each
// scheme has a subscriber on the origin lane and one on the edge lane. A forged body must fail;
// `both` carries a `v1` and a `v1a`; during a rotation's overlap there are two of each; a PATCH
// switches an HMAC subscriber to Ed25519; no answer ever holds a private key.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { Webhook } from 'standardwebhooks';

import { startEdge, startOrigin, startSubscriber, waitFor } from './lib/harness.mjs';

/** A Node public key from `whpk_` + base64 of the 32 raw bytes (SPKI's fixed Ed25519 prefix). */
function publicKey(whpk) {
  assert.match(whpk, /^whpk_[A-Za-z0-9+/]{43}=$/);
  const raw = Buffer.from(whpk.slice(5), 'base64');
  assert.equal(raw.length, 32);
  return crypto.createPublicKey({
    key: Buffer.concat([Buffer.from('302a300506032b6570032100', 'hex'), raw]),
    format: 'der',
    type: 'spki',
  });
}

/** The header's signatures of one scheme, in order. */
const parts = (headers, version) =>
  headers['webhook-signature'].split(' ').filter((p) => p.startsWith(`${version},`)).map((p) => p.slice(version.length + 1));

/** Whether `sig` (base64) is `key`'s Ed25519 signature of `{id}.{timestamp}.{body}`. */
function verifiesV1a(key, headers, body, sig) {
  const msg = Buffer.from(`${headers['webhook-id']}.${headers['webhook-timestamp']}.${body}`);
  return crypto.verify(null, msg, key, Buffer.from(sig, 'base64'));
}

test('v1a on both lanes: verified by crypto.verify, forged bodies fail, both, rotation, PATCH', async (t) => {
  const edge = await startEdge();
  const origin = await startOrigin({ edge });
  const receiver = await startSubscriber(() => 200);
  t.after(async () => {
    await origin.stop();
    await edge.stop();
    await receiver.close();
  });
  const answers = [];
  const api = async (p, opts) => {
    const res = await origin.api(p, opts);
    const text = await res.text();
    answers.push(text);
    assert.ok(res.status < 300, `${p}: ${res.status} ${text}`);
    return JSON.parse(text);
  };
  const subs = {};
  for (const lane of ['origin', 'edge']) {
    for (const signature of ['ed25519', 'both', 'hmac']) {
      const id = `${signature}_${lane}`;
      const made = await api('/v1/subscribers', {
        body: { id, url: `${receiver.url}/${id}`, event_types: ['*'], lane, signature },
      });
      assert.equal(made.signature, signature);
      const got = await api(`/v1/subscribers/${id}`);
      assert.equal(got.signature, signature);
      assert.equal(got.public_key, made.public_key, 'GET shows the key the answer showed');
      subs[id] = { secret: made.secret, keys: [publicKey(made.public_key)] };
    }
  }
  const received = (id) => receiver.requests.filter((r) => r.path === `/${id}`);
  const check = (id, { v1, v1a, evt }) => {
    const [r] = received(id).filter((q) => q.headers['webhook-id'] === evt);
    assert.ok(r, `${id} got ${evt}`);
    assert.equal(parts(r.headers, 'v1').length, v1, `${id}: ${r.headers['webhook-signature']}`);
    const sigs = parts(r.headers, 'v1a');
    assert.equal(sigs.length, v1a, `${id}: ${r.headers['webhook-signature']}`);
    // Newest key first; each signature verifies with its own key and with no other, and never
    // over a forged body.
    sigs.forEach((sig, i) => {
      const key = subs[id].keys[i];
      assert.ok(verifiesV1a(key, r.headers, r.body, sig), `${id}: v1a #${i} verifies`);
      assert.ok(!verifiesV1a(key, r.headers, r.body.replace('"n":1', '"n":2'), sig), `${id}: a forged body fails`);
      for (const other of subs[id].keys.filter((_, j) => j !== i)) {
        assert.ok(!verifiesV1a(other, r.headers, r.body, sig), `${id}: not the other key's`);
      }
    });
    if (v1 > 0) new Webhook(subs[id].secret).verify(r.body, r.headers);
    else assert.throws(() => new Webhook(subs[id].secret).verify(r.body, r.headers), 'no v1 to verify');
  };

  await api('/v1/events', { body: { id: 'evt_1', type: 'video.trending', n: 1 } });
  await waitFor(() => Object.keys(subs).every((id) => received(id).length === 1), 30_000, {
    message: 'the first event at every subscriber',
  });
  for (const lane of ['origin', 'edge']) {
    check(`ed25519_${lane}`, { v1: 0, v1a: 1, evt: 'evt_1' });
    check(`both_${lane}`, { v1: 1, v1a: 1, evt: 'evt_1' });
    check(`hmac_${lane}`, { v1: 1, v1a: 0, evt: 'evt_1' });
  }

  // A rotation: the new generation signs first, the old one still signs (two v1a, two v1);
  // the answer and GET show the new public key, GET /secret both.
  for (const lane of ['origin', 'edge']) {
    const id = `both_${lane}`;
    const rotated = await api(`/v1/subscribers/${id}/rotate-secret`, { method: 'POST' });
    subs[id].keys.unshift(publicKey(rotated.public_key));
    subs[id].secret = rotated.secret;
    assert.equal((await api(`/v1/subscribers/${id}`)).public_key, rotated.public_key);
    const listed = await api(`/v1/subscribers/${id}/secret`);
    assert.equal(listed.secrets.length, 2);
    assert.equal(listed.secrets[0].public_key, rotated.public_key);
  }
  // A switch by PATCH: HMAC to Ed25519 signs v1a with the key GET shows.
  for (const lane of ['origin', 'edge']) {
    const id = `hmac_${lane}`;
    const patched = await api(`/v1/subscribers/${id}`, { method: 'PATCH', body: { signature: 'ed25519' } });
    assert.equal(patched.signature, 'ed25519');
    subs[id].keys = [publicKey(patched.public_key)];
  }
  await api('/v1/events', { body: { id: 'evt_2', type: 'video.trending', n: 1 } });
  await waitFor(() => Object.keys(subs).every((id) => received(id).length === 2), 30_000, {
    message: 'the second event at every subscriber',
  });
  for (const lane of ['origin', 'edge']) {
    check(`both_${lane}`, { v1: 2, v1a: 2, evt: 'evt_2' });
    check(`ed25519_${lane}`, { v1: 0, v1a: 1, evt: 'evt_2' });
    check(`hmac_${lane}`, { v1: 0, v1a: 1, evt: 'evt_2' });
  }
  const bad = await origin.api('/v1/subscribers/ed25519_origin', { method: 'PATCH', body: { signature: 'rsa' } });
  assert.equal(bad.status, 400, await bad.text());
  for (const text of answers) assert.ok(!text.includes('whsk_'), `a private key in an answer: ${text}`);
});
