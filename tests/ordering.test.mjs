// Ordered delivery on the edge lane: the real daemon hands an ordered subscriber's deliveries
// to the real Worker, which never has two of one key open (the origin only ever hands out a
// key's head), sends each with `webhook-ordering-key` and `webhook-previous-sequence`, and the
// key's next one goes once its head is answered; a head that fails holds back its own key only.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Webhook } from 'standardwebhooks';

import { startEdge, startOrigin, startSubscriber, waitFor } from './lib/harness.mjs';

test('through the edge: one delivery of a key open at a time, ordering headers, a failing head holds its key only', async (t) => {
  const edge = await startEdge();
  const origin = await startOrigin({ edge, args: ['--backoff-scale', '0.05'] });
  let secret;
  const open = new Map(); // key -> requests open now
  const overlaps = [];
  const tries = new Map();
  const sub = await startSubscriber(async (rec) => {
    new Webhook(secret).verify(rec.body, rec.headers);
    const key = rec.headers['webhook-ordering-key'];
    const id = rec.headers['webhook-id'];
    tries.set(id, (tries.get(id) ?? 0) + 1);
    open.set(key, (open.get(key) ?? 0) + 1);
    if (open.get(key) > 1) overlaps.push(id);
    await new Promise((resolve) => setTimeout(resolve, 20));
    open.set(key, open.get(key) - 1);
    // `v0`'s first event fails twice and until key v1 has all arrived: v1 flows while v0
    // waits (were v1 held back by v0, evt_0 would fail until dead).
    const v1Done = sub.requests.filter((r) => r.headers['webhook-ordering-key'] === 'v1').length === 10;
    return id === 'evt_0' && (tries.get(id) <= 2 || !v1Done) ? 500 : 200;
  });
  t.after(async () => {
    await origin.stop();
    await edge.stop();
    await sub.close();
  });
  const res = await origin.api('/v1/subscribers', {
    body: {
      id: 'ordered', url: sub.url, event_types: ['*'], lane: 'edge',
      rate_per_sec: 1000, burst: 1000, max_in_flight: 32,
      ordering: 'key', ordering_key: '/video_id',
    },
  });
  const body = await res.json();
  assert.equal(res.status, 201, JSON.stringify(body));
  secret = body.secret;
  // 40 events over 4 keys, interleaved.
  const events = Array.from({ length: 40 }, (_, i) => ({ id: `evt_${i}`, type: 'video.x', video_id: `v${i % 4}` }));
  const sent = await origin.api('/v1/events', { body: events });
  assert.equal(sent.status, 202, await sent.text());
  await waitFor(async () => {
    const r = await origin.api('/v1/deliveries?subscriber=ordered&status=sent&limit=100');
    return (await r.json()).deliveries.length === 40;
  }, 60_000, { message: 'every event delivered, evt_0 after its failures' });
  assert.ok(tries.get('evt_0') >= 3, `evt_0 failed twice, then went (${tries.get('evt_0')} tries)`);

  assert.deepEqual(overlaps, [], 'never two deliveries of one key open');
  const byKey = new Map();
  for (const r of sub.requests) {
    const key = r.headers['webhook-ordering-key'];
    if (!byKey.has(key)) byKey.set(key, []);
    byKey.get(key).push(r);
  }
  assert.deepEqual([...byKey.keys()].sort(), ['v0', 'v1', 'v2', 'v3']);
  for (const [key, list] of byKey) {
    const ids = list.map((r) => r.headers['webhook-id']).filter((id, i, all) => all.indexOf(id) === i);
    const expected = events.filter((e) => e.video_id === key).map((e) => e.id);
    assert.deepEqual(ids, expected, `key ${key} in order`);
    // Each names its key's previous delivery (none for the first); a retry sends the same.
    let previous;
    const first = new Map();
    for (const r of list) {
      const id = r.headers['webhook-id'];
      if (first.has(id)) {
        assert.equal(r.headers['webhook-previous-sequence'], first.get(id), `${id} again`);
        continue;
      }
      assert.equal(r.headers['webhook-previous-sequence'], previous, id);
      first.set(id, previous);
      previous = r.headers['webhook-sequence'];
    }
  }
  // Key v0 waited for its failing head and went on as soon as it succeeded.
  const v0 = byKey.get('v0').map((r) => r.headers['webhook-id']);
  assert.deepEqual(v0.slice(0, tries.get('evt_0')), Array(tries.get('evt_0')).fill('evt_0'));
});
