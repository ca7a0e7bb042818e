// The limiter lives in Durable Object storage: a subscriber's bucket, its Retry-After pause and
// its open breaker survive a restart of `wrangler dev` on the same --persist-to directory.
import assert from 'node:assert/strict';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { newSecret, startEdge, startSubscriber } from './lib/harness.mjs';
import { deliveries, send, subscriberSpec, subscriberStatus, tally } from './lib/edge_client.mjs';

let dir;
let sub;
const key = newSecret();
before(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-durable-'));
  sub = await startSubscriber((req) => {
    if (req.path === '/limited') return { status: 429, headers: { 'retry-after': '120' } };
    if (req.path === '/broken') return 500;
    return 200;
  });
});
after(async () => {
  await sub?.close();
  if (dir) await fsp.rm(dir, { recursive: true, force: true });
});

test('bucket, pause and breaker survive a restart of wrangler dev with the same --persist-to', async () => {
  // A slow bucket (1 token a minute) emptied; a subscriber paused for 120 s; an open breaker.
  const slow = subscriberSpec(`${sub.url}/slow`, { rate_per_sec: 1 / 60, burst: 5 });
  const paused = subscriberSpec(`${sub.url}/limited`);
  const broken = subscriberSpec(`${sub.url}/broken`);

  let edge = await startEdge({ key, persistDir: dir });
  let saved;
  try {
    assert.deepEqual(tally(await send(edge, slow, deliveries(5))), { delivered: 5 });
    const [limited] = await send(edge, paused, deliveries(1));
    assert.equal(limited.status, 429);
    assert.equal(limited.retry_after_ms, 120_000);
    assert.deepEqual(tally(await send(edge, broken, deliveries(20))), { failed: 20 });

    saved = {};
    for (const s of [slow, paused, broken]) {
      const st = await subscriberStatus(edge, s.id);
      assert.equal(st.status, 200, st.text);
      saved[s.id] = st.json;
    }
    assert.ok(saved[slow.id].tokens < 0.5, JSON.stringify(saved[slow.id]));
    assert.ok(saved[paused.id].paused_until_ms > Date.now() + 100_000);
    assert.equal(saved[broken.id].breaker.state, 'open');
  } finally {
    await edge.stop();
  }

  const received = sub.requests.length;
  edge = await startEdge({ key, persistDir: dir });
  try {
    // The status view, read back from storage by a fresh object in a fresh process.
    const slowSt = await subscriberStatus(edge, slow.id);
    assert.equal(slowSt.status, 200, slowSt.text);
    assert.ok(slowSt.json.tokens < 1, `bucket still empty after restart: ${slowSt.text}`);
    assert.equal(slowSt.json.burst, 5);

    const pausedSt = await subscriberStatus(edge, paused.id);
    assert.equal(pausedSt.json.paused_until_ms, saved[paused.id].paused_until_ms, pausedSt.text);

    const brokenSt = await subscriberStatus(edge, broken.id);
    assert.equal(brokenSt.json.breaker.state, 'open', brokenSt.text);
    assert.equal(brokenSt.json.breaker.consecutive_failures, 20);
    assert.equal(brokenSt.json.breaker.open_until_ms, saved[broken.id].breaker.open_until_ms);

    // And they still act on it: nothing is sent.
    const r1 = await send(edge, slow, deliveries(2));
    assert.deepEqual(tally(r1), { 'deferred:rate': 2 }, JSON.stringify(r1));
    assert.ok(r1[0].retry_after_ms > 30_000, `about a minute for the next token: ${JSON.stringify(r1[0])}`);
    assert.deepEqual(tally(await send(edge, paused, deliveries(2))), { 'deferred:paused': 2 });
    assert.deepEqual(tally(await send(edge, broken, deliveries(2))), { 'deferred:breaker_open': 2 });
    assert.equal(sub.requests.length, received, 'nothing sent after the restart');
  } finally {
    await edge.stop();
  }
});
