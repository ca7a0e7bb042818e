// Sequence numbers and thin payloads on the edge lane: the real daemon hands its deliveries to
// the real Worker, which sends each with `webhook-sequence` (the number the ledger fixed at
// ingest, 1..N per subscriber, the same on a retry) and the body the origin chose — a thin one
// for a `"payload": "thin"` subscriber — verified by the official `standardwebhooks` package.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Webhook } from 'standardwebhooks';

import { startEdge, startOrigin, startSubscriber, waitFor } from './lib/harness.mjs';

test('through the edge: webhook-sequence 1..N kept across a retry, thin bodies signed', async (t) => {
  const edge = await startEdge();
  const origin = await startOrigin({
    edge,
    args: ['--backoff-scale', '0.001', '--event-url', 'https://api.example.com/events/{id}'],
  });
  const secrets = {};
  const failedOnce = new Set();
  // `full` answers 500 to the first request of each event, 200 to the next.
  const verify = (name) => async (rec) => {
    new Webhook(secrets[name]).verify(rec.body, rec.headers);
    if (name === 'full' && !failedOnce.has(rec.headers['webhook-id'])) {
      failedOnce.add(rec.headers['webhook-id']);
      return 500;
    }
    return 200;
  };
  const full = await startSubscriber(verify('full'));
  const thin = await startSubscriber(verify('thin'));
  t.after(async () => {
    await origin.stop();
    await edge.stop();
    await full.close();
    await thin.close();
  });
  for (const [name, sub] of [['full', full], ['thin', thin]]) {
    const res = await origin.api('/v1/subscribers', {
      body: { id: name, url: sub.url, event_types: ['*'], lane: 'edge', payload: name },
    });
    const body = await res.json();
    assert.equal(res.status, 201, JSON.stringify(body));
    assert.equal(body.payload, name);
    secrets[name] = body.secret;
  }
  const events = Array.from({ length: 12 }, (_, i) => ({ id: `evt_${i}`, type: 'video.trending', n: i }));
  for (const batch of [events.slice(0, 5), events.slice(5)]) {
    const res = await origin.api('/v1/events', { body: batch });
    assert.equal(res.status, 202, await res.text());
  }
  await waitFor(() => full.requests.length === 24 && thin.requests.length === 12, 30_000, {
    message: 'every event to both, each once to thin and twice (a 500, then 200) to full',
  });

  const expected = new Map(events.map((e, i) => [e.id, String(i + 1)]));
  for (const sub of [full, thin]) {
    for (const r of sub.requests) {
      assert.equal(r.headers['webhook-sequence'], expected.get(r.headers['webhook-id']), r.headers['webhook-id']);
    }
  }
  for (const r of full.requests) {
    assert.equal(JSON.parse(r.body).n, Number(r.headers['webhook-sequence']) - 1, 'the full body is the event');
  }
  for (const r of thin.requests) {
    const body = JSON.parse(r.body);
    const id = r.headers['webhook-id'];
    assert.deepEqual(Object.keys(body), ['id', 'type', 'timestamp', 'url']);
    assert.equal(body.id, id);
    assert.equal(body.type, 'video.trending');
    assert.equal(body.url, `https://api.example.com/events/${id}`);
    assert.ok(Math.abs(Date.parse(body.timestamp) - Date.now()) < 120_000, body.timestamp);
  }
  const res = await origin.api('/v1/deliveries?subscriber=thin&limit=100');
  const listed = (await res.json()).deliveries;
  assert.deepEqual(
    listed.map((d) => [d.event_id, String(d.sequence)]).sort(),
    [...expected.entries()].sort(),
    'the API shows the numbers the webhooks carried',
  );
});
