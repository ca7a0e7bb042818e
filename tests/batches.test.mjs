// Batched webhooks on the edge lane: the real daemon forms each batch and hands it to the real
// Worker as one delivery, which signs and sends `{"events":[…]}` as one request (one token of
// the subscriber's rate at the Durable Object), verified by the official `standardwebhooks`
// package and by Node's own HMAC over the exact bytes; a 2xx naming `failed` events makes the
// origin retry those alone, a 503 retries the batch's events, each with its own attempt count.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { Webhook } from 'standardwebhooks';

import { startEdge, startOrigin, startSubscriber, waitFor } from './lib/harness.mjs';

test('through the edge: batches signed as one message, failed events retried alone', async (t) => {
  const edge = await startEdge();
  const origin = await startOrigin({ edge, args: ['--backoff-scale', '0.001', '--breaker-threshold', '1000'] });
  let secret;
  let named = false;
  let refused = false;
  const sink = await startSubscriber(async (rec) => {
    new Webhook(secret).verify(rec.body, rec.headers);
    const ids = JSON.parse(rec.body).events.map((e) => e.id);
    if (ids.includes('evt_33') && !refused) {
      refused = true;
      return 503;
    }
    if (ids.includes('evt_4') && !named) {
      named = true;
      return { status: 200, body: JSON.stringify({ failed: ['evt_4', 'evt_5', 'evt_unknown'] }) };
    }
    return 200;
  });
  t.after(async () => {
    await origin.stop();
    await edge.stop();
    await sink.close();
  });
  const res = await origin.api('/v1/subscribers', {
    body: {
      id: 'batched',
      url: sink.url,
      event_types: ['*'],
      lane: 'edge',
      rate_per_sec: 5,
      burst: 1,
      max_in_flight: 2,
      batch: { max_events: 10, max_bytes: 65536 },
    },
  });
  const created = await res.json();
  assert.equal(res.status, 201, JSON.stringify(created));
  assert.deepEqual(created.batch, { max_events: 10, max_bytes: 65536, max_wait_ms: 0 });
  secret = created.secret;

  const events = Array.from({ length: 50 }, (_, i) => ({ id: `evt_${i}`, type: 'video.trending', n: i }));
  const posted = Date.now();
  const ingest = await origin.api('/v1/events', { body: events });
  assert.equal(ingest.status, 202, await ingest.text());
  const sent = async () => {
    const r = await origin.api('/v1/deliveries?subscriber=batched&status=sent&limit=100');
    return (await r.json()).deliveries.length;
  };
  await waitFor(async () => (await sent()) === 50, 30_000, { message: 'every event sent' });
  const took = Date.now() - posted;
  // 50 single requests at 5/s would take 9.8 s; a batch is one request.
  assert.ok(took < 7_000, `50 events took ${took} ms in ${sink.requests.length} requests`);
  assert.ok(sink.requests.length <= 9, `${sink.requests.length} requests`);

  const key = Buffer.from(secret.slice('whsec_'.length), 'base64');
  const carried = new Map();
  const listed = new Map(
    (await (await origin.api('/v1/deliveries?subscriber=batched&limit=100')).json()).deliveries.map((d) => [d.event_id, d]),
  );
  for (const r of sink.requests) {
    const id = r.headers['webhook-id'];
    assert.match(id, /^msg_batch_[0-9a-f]{24}$/);
    const mac = createHmac('sha256', key).update(`${id}.${r.headers['webhook-timestamp']}.${r.body}`).digest('base64');
    assert.ok(r.headers['webhook-signature'].split(' ').includes(`v1,${mac}`), 'signed over the exact batch body');
    const elements = JSON.parse(r.body).events;
    assert.ok(elements.length >= 1 && elements.length <= 10, `${elements.length} events`);
    for (const e of elements) assert.equal(e.n, Number(e.id.slice(4)), 'each element is the event');
    const sequences = elements.map((e) => String(listed.get(e.id).sequence));
    assert.equal(r.headers['webhook-sequences'], sequences.join(','));
    assert.equal(r.headers['webhook-sequence'], sequences[0]);
    for (const e of elements) carried.set(e.id, (carried.get(e.id) ?? 0) + 1);
  }
  const refusedBatch = new Set(
    JSON.parse(sink.requests.find((r) => r.body.includes('"evt_33"')).body).events.map((e) => e.id),
  );
  for (const e of events) {
    const twice = e.id === 'evt_4' || e.id === 'evt_5' || refusedBatch.has(e.id);
    assert.equal(carried.get(e.id), twice ? 2 : 1, `${e.id} carried`);
    assert.equal(listed.get(e.id).attempt_count, twice ? 2 : 1, `${e.id} attempts`);
  }

  // Ordered by key, a batch is a run of one key in order: each request carries one key (its
  // `webhook-ordering-key`, the run's `webhook-previous-sequence`), and a key's requests, in
  // arrival order, carry its events in order, each once.
  const runs = await startSubscriber(async () => 200);
  t.after(() => runs.close());
  const made = await origin.api('/v1/subscribers', {
    body: {
      id: 'runs',
      url: runs.url,
      event_types: ['run.*'],
      lane: 'edge',
      ordering: 'key',
      ordering_key: '/k',
      max_in_flight: 2,
      batch: { max_events: 4 },
    },
  });
  assert.equal(made.status, 201, await made.text());
  const keyed = [];
  for (let i = 0; i < 6; i++) for (const k of ['a', 'b', 'c']) keyed.push({ id: `run_${k}${i}`, type: 'run.x', k });
  assert.equal((await origin.api('/v1/events', { body: keyed })).status, 202);
  const runsSent = async () => {
    const r = await origin.api('/v1/deliveries?subscriber=runs&status=sent&limit=100');
    return (await r.json()).deliveries.length;
  };
  await waitFor(async () => (await runsSent()) === 18, 30_000, { message: 'every ordered event sent' });
  const runListed = new Map(
    (await (await origin.api('/v1/deliveries?subscriber=runs&limit=100')).json()).deliveries.map((d) => [d.event_id, d]),
  );
  const perKey = { a: [], b: [], c: [] };
  for (const r of runs.requests) {
    const elements = JSON.parse(r.body).events;
    const k = elements[0].k;
    assert.ok(elements.every((e) => e.k === k), `one key a request: ${r.body}`);
    assert.ok(elements.length <= 4, `${elements.length} events`);
    assert.equal(r.headers['webhook-ordering-key'], k);
    const first = runListed.get(elements[0].id);
    const previous = first.previous_sequence == null ? undefined : String(first.previous_sequence);
    assert.equal(r.headers['webhook-previous-sequence'], previous, 'the run\'s previous sequence');
    perKey[k].push(...elements.map((e) => e.id));
  }
  for (const k of ['a', 'b', 'c']) {
    assert.deepEqual(perKey[k], Array.from({ length: 6 }, (_, i) => `run_${k}${i}`), `key ${k} in order, each once`);
  }
  assert.ok(runs.requests.length < 18, `${runs.requests.length} requests for 18 events`);
});
