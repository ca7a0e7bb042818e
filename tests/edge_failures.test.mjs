// How the edge reports and reacts to a misbehaving subscriber: 429/503 Retry-After pauses the
// whole subscriber, a hanging one times out without breaking the in-flight cap, 404/410 are
// rejected, a 3xx is a failure and its Location is never followed, a 5xx body is cut to 4 KiB,
// 20 consecutive failures open the breaker, and the origin's breaker settings reach it.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';
import { sleep, startEdge, startSubscriber, waitFor } from './lib/harness.mjs';
import { deliveries, delivery, postBatch, send, subscriberSpec, subscriberStatus, tally } from './lib/edge_client.mjs';

let edge;
before(async () => {
  edge = await startEdge();
});
after(async () => {
  await edge?.stop();
});

test('429 Retry-After: 2 pauses the subscriber for 2 s: calls deferred `paused`, nothing sent, then sent again', async () => {
  const sub = await startSubscriber((_req, all) => (all.length === 1 ? { status: 429, headers: { 'retry-after': '2' }, body: 'slow down' } : 200));
  try {
    const spec = subscriberSpec(`${sub.url}/hook`);
    const [first] = await send(edge, spec, [delivery()]);
    assert.equal(first.outcome, 'failed', JSON.stringify(first));
    assert.equal(first.status, 429);
    assert.equal(first.retry_after_ms, 2000);
    assert.equal(first.response_body, 'slow down');
    const pausedAt = sub.requests[0].time; // the pause starts no earlier than this

    const st = await subscriberStatus(edge, spec.id);
    assert.equal(st.status, 200, st.text);
    assert.equal(st.json.id, spec.id);
    assert.ok(st.json.paused_until_ms >= pausedAt + 2000, `paused_until_ms ${st.json.paused_until_ms} vs ${pausedAt}`);
    assert.ok(st.json.paused_until_ms <= Date.now() + 2000, `paused_until_ms ${st.json.paused_until_ms}`);

    // Every call during the pause is deferred `paused`, with the time left until it ends.
    let calls = 0;
    let lastWait = 0;
    while (Date.now() < pausedAt + 1800) {
      const t = Date.now();
      const results = await send(edge, spec, deliveries(3));
      calls += 1;
      for (const r of results) {
        assert.equal(r.outcome, 'deferred', JSON.stringify(r));
        assert.equal(r.reason, 'paused');
        assert.ok(r.retry_after_ms > 0 && r.retry_after_ms <= st.json.paused_until_ms - t + 5, JSON.stringify(r));
      }
      lastWait = results[0].retry_after_ms;
      await sleep(50); // pacing between calls, not waiting for anything
    }
    assert.ok(calls >= 5, `only ${calls} calls during the pause`);
    assert.equal(sub.requests.length, 1, 'the subscriber received nothing while paused');

    // Obey the last advertised wait: then it is sent again.
    await sleep(lastWait);
    const again = await send(edge, spec, deliveries(2));
    assert.deepEqual(tally(again), { delivered: 2 }, JSON.stringify(again));
    assert.equal(sub.requests.length, 3);
    assert.ok(sub.requests[1].time - pausedAt >= 1995, `resent ${sub.requests[1].time - pausedAt} ms after the 429`);
    const after = await subscriberStatus(edge, spec.id);
    assert.equal(after.json.paused_until_ms ?? null, null, after.text);
  } finally {
    await sub.close();
  }
});

test('503 with an HTTP-date Retry-After pauses too; a 500 or 503 without one does not', async () => {
  const answers = {
    '/date': () => ({ status: 503, headers: { 'retry-after': new Date(Date.now() + 5_000).toUTCString() } }),
    '/plain503': () => 503,
    '/plain500': () => 500,
  };
  const sub = await startSubscriber((req) => answers[req.path]());
  try {
    const dated = subscriberSpec(`${sub.url}/date`);
    const [r] = await send(edge, dated, [delivery()]);
    assert.equal(r.outcome, 'failed');
    assert.equal(r.status, 503);
    // HTTP-dates have 1 s resolution: between 3 and 5 s from now.
    assert.ok(r.retry_after_ms > 3_000 && r.retry_after_ms <= 5_000, JSON.stringify(r));
    const next = await send(edge, dated, deliveries(2));
    assert.deepEqual(tally(next), { 'deferred:paused': 2 });

    for (const p of ['/plain503', '/plain500']) {
      const spec = subscriberSpec(`${sub.url}${p}`);
      const [f] = await send(edge, spec, [delivery()]);
      assert.equal(f.outcome, 'failed');
      assert.equal(f.retry_after_ms, undefined);
      const [g] = await send(edge, spec, [delivery()]);
      assert.equal(g.outcome, 'failed', `${p}: not paused`);
    }
    assert.equal(sub.requests.length, 1 + 4);
  } finally {
    await sub.close();
  }
});

/** A subscriber that never answers; counts requests that are open right now, and the peak. */
async function hangingServer() {
  const state = { open: 0, maxOpen: 0, received: 0, closed: 0 };
  const sockets = new Set();
  const server = http.createServer((req, res) => {
    state.received += 1;
    state.open += 1;
    state.maxOpen = Math.max(state.maxOpen, state.open);
    req.resume();
    let done = false;
    const close = () => {
      if (done) return;
      done = true;
      state.open -= 1;
      state.closed += 1;
    };
    // Open until the client goes away: `res` closes with its connection (never answered).
    // (Not `req`'s 'close': that fires once the request body has been read.)
    res.on('close', close);
    req.socket.on('close', close);
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    state,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

test('a hanging subscriber: `failed` with `timeout`; max_in_flight 2 holds under concurrent calls', async (tc) => {
  const hang = await hangingServer();
  try {
    const spec = subscriberSpec(`${hang.url}/hook`, { timeout_ms: 1000, max_in_flight: 2 });

    // One delivery: it times out after timeout_ms, not sooner, not much later.
    const t0 = Date.now();
    const [r] = await send(edge, spec, [delivery()]);
    const took = Date.now() - t0;
    assert.equal(r.outcome, 'failed', JSON.stringify(r));
    assert.equal(r.error, 'timeout');
    assert.equal(r.status, undefined);
    assert.ok(took >= 950 && took < 5_000, `call took ${took} ms`);
    assert.ok(r.latency_ms >= 950 && r.latency_ms < 5_000, JSON.stringify(r));
    // The abort closed the connection: the subscriber sees no open request afterwards.
    await waitFor(() => hang.state.open === 0, 5_000, { message: 'aborted request closed' });

    // Two rounds of concurrent calls: the cap holds in each, and aborted requests do not leak
    // past it (a leaked connection would show up as a third open request in round two).
    for (const round of [1, 2]) {
      const before = hang.state.received;
      const calls = Array.from({ length: 4 }, () => send(edge, spec, deliveries(3)));
      // While they hang, the status view shows both slots taken.
      const st = await waitFor(async () => {
        const s = await subscriberStatus(edge, spec.id);
        return s.json?.in_flight === 2 ? s : null;
      }, 900, { intervalMs: 20, message: 'in_flight 2 in the status view' });
      assert.equal(st.status, 200);
      // ... and the subscriber does have two requests open at once.
      await waitFor(() => hang.state.open === 2, 900, { message: 'two open requests at the subscriber' });
      const results = (await Promise.all(calls)).flat();
      const t = tally(results);
      tc.diagnostic(`round ${round}: ${JSON.stringify(t)}, peak open ${hang.state.maxOpen}`);
      const sent = hang.state.received - before;
      assert.equal(t.failed, sent, `round ${round}: ${JSON.stringify(t)}, sent ${sent}`);
      assert.ok(sent >= 2, `round ${round}: both slots used (${sent})`);
      assert.ok(t['deferred:in_flight'] >= 6, `round ${round}: in_flight deferrals ${JSON.stringify(t)}`);
      assert.equal((t.failed ?? 0) + (t['deferred:in_flight'] ?? 0), 12, JSON.stringify(t));
      for (const x of results) {
        if (x.outcome === 'failed') assert.equal(x.error, 'timeout');
        else assert.equal(x.retry_after_ms, 250, JSON.stringify(x));
      }
      assert.ok(hang.state.maxOpen <= 2, `round ${round}: the subscriber saw ${hang.state.maxOpen} open requests`);
      await waitFor(() => hang.state.open === 0, 5_000, { message: 'aborted requests closed' });
    }
    assert.equal(hang.state.maxOpen, 2);
    const st = await subscriberStatus(edge, spec.id);
    assert.equal(st.json.in_flight, 0, st.text);
  } finally {
    await hang.close();
  }
});

test('a delivery that has its answer frees its in-flight slot at once, while its batch-mate still hangs', async () => {
  let release;
  const held = new Promise((resolve) => {
    release = resolve;
  });
  const sub = await startSubscriber((req) => (req.body.includes('"hold":true') ? held.then(() => 200) : 200));
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { timeout_ms: 20_000, max_in_flight: 2 });
    const slow = delivery({ body: JSON.stringify({ hold: true }) });
    let firstDone = false;
    const first = send(edge, spec, [slow, delivery()]).then((r) => {
      firstDone = true;
      return r;
    });
    await waitFor(() => sub.requests.length === 2, 5_000, { message: 'both deliveries of the first call sent' });

    // The quick one was answered: its slot is free for the next call although its batch is not
    // done. (If slots were freed only when a whole batch ends, every call here would be
    // deferred `in_flight` until the held request times out 20 s later.)
    let deferred = 0;
    const next = await waitFor(async () => {
      const [r] = await send(edge, spec, [delivery()]);
      if (r.outcome === 'deferred') {
        assert.equal(r.reason, 'in_flight', JSON.stringify(r));
        deferred += 1;
        return null;
      }
      return r;
    }, 5_000, { intervalMs: 20, message: 'a later call delivered while the held request is open' });
    assert.equal(next.outcome, 'delivered', JSON.stringify(next));
    assert.equal(firstDone, false, 'the first call is still waiting for its held delivery');
    const st = await subscriberStatus(edge, spec.id);
    assert.equal(st.json.in_flight, 1, st.text);

    release();
    const results = await first;
    assert.deepEqual(
      results.map((r) => r.outcome),
      ['delivered', 'delivered'],
    );
    assert.equal(sub.requests.length, 3, `the ${deferred} deferred call(s) sent nothing`);
    assert.equal((await subscriberStatus(edge, spec.id)).json.in_flight, 0);
  } finally {
    release();
    await sub.close();
  }
});

test('404 and 410 are rejected; 3xx is failed and Location is never followed; 5xx body cut to 4 KiB', async () => {
  const target = await startSubscriber(() => 200);
  const big = Array.from({ length: 10 * 1024 }, (_, i) => String.fromCharCode(97 + (i % 26))).join('');
  const answers = {
    '/gone': () => ({ status: 410, body: 'gone for good' }),
    '/missing': () => 404,
    '/moved': () => ({ status: 302, headers: { location: `${target.url}/stolen` } }),
    '/temp': () => ({ status: 307, headers: { location: `${target.url}/stolen` } }),
    '/broken': () => ({ status: 500, body: big }),
  };
  const sub = await startSubscriber((req) => answers[req.path]());
  try {
    const one = async (p) => {
      const [r] = await send(edge, subscriberSpec(`${sub.url}${p}`), [delivery()]);
      return r;
    };
    const gone = await one('/gone');
    assert.equal(gone.outcome, 'rejected', JSON.stringify(gone));
    assert.equal(gone.status, 410);
    assert.equal(gone.reason, 'gone');

    const missing = await one('/missing');
    assert.equal(missing.outcome, 'rejected', JSON.stringify(missing));
    assert.equal(missing.status, 404);

    for (const [p, status] of [
      ['/moved', 302],
      ['/temp', 307],
    ]) {
      const r = await one(p);
      assert.equal(r.outcome, 'failed', JSON.stringify(r));
      assert.equal(r.status, status);
    }
    assert.equal(target.requests.length, 0, 'the Location target received nothing');

    const broken = await one('/broken');
    assert.equal(broken.outcome, 'failed', JSON.stringify(broken).slice(0, 300));
    assert.equal(broken.status, 500);
    assert.equal(broken.response_body.length, 4096);
    assert.equal(broken.response_body, big.slice(0, 4096));

    assert.deepEqual(
      sub.requests.map((r) => r.path),
      ['/gone', '/missing', '/moved', '/temp', '/broken'],
    );
    // Still nothing at the target, after everything else finished.
    assert.equal(target.requests.length, 0);
  } finally {
    await Promise.all([sub.close(), target.close()]);
  }
});

test('a closed port: `failed` with `connect`', async () => {
  const gone = await startSubscriber(() => 200);
  const url = gone.url;
  await gone.close();
  const [r] = await send(edge, subscriberSpec(`${url}/hook`), [delivery()]);
  assert.equal(r.outcome, 'failed', JSON.stringify(r));
  assert.equal(r.error, 'connect');
});

test('breaker: 20 consecutive failures open it; later calls deferred `breaker_open`; status shows it', async () => {
  const sub = await startSubscriber(() => ({ status: 500, body: 'down' }));
  try {
    const spec = subscriberSpec(`${sub.url}/hook`);
    const first = await send(edge, spec, deliveries(19));
    assert.deepEqual(tally(first), { failed: 19 });
    let st = await subscriberStatus(edge, spec.id);
    assert.equal(st.json.breaker.state, 'closed', st.text);
    assert.equal(st.json.breaker.consecutive_failures, 19);

    const t = Date.now();
    const twentieth = await send(edge, spec, [delivery()]);
    assert.deepEqual(tally(twentieth), { failed: 1 });
    assert.equal(sub.requests.length, 20);

    const blocked = await send(edge, spec, deliveries(5));
    assert.deepEqual(tally(blocked), { 'deferred:breaker_open': 5 }, JSON.stringify(blocked));
    for (const r of blocked) {
      assert.ok(r.retry_after_ms > 25_000 && r.retry_after_ms <= 30_000, JSON.stringify(r));
    }
    assert.equal(sub.requests.length, 20, 'nothing sent while the breaker is open');

    st = await subscriberStatus(edge, spec.id);
    assert.equal(st.json.breaker.state, 'open', st.text);
    assert.equal(st.json.breaker.consecutive_failures, 20);
    assert.ok(st.json.breaker.open_until_ms >= t + 29_000 && st.json.breaker.open_until_ms <= Date.now() + 30_000, st.text);
  } finally {
    await sub.close();
  }
});

test("breaker: the origin's settings reach the edge: threshold 3 opens it after 3 failures, for its 5 s cooldown", async () => {
  const sub = await startSubscriber(() => ({ status: 500, body: 'down' }));
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { max_in_flight: 1, breaker: { threshold: 3, cooldown_ms: 5000 } });
    const t = Date.now();
    for (let i = 0; i < 3; i++) {
      assert.deepEqual(tally(await send(edge, spec, [delivery()])), { failed: 1 }, `attempt ${i + 1}`);
    }
    const blocked = await send(edge, spec, deliveries(2));
    assert.deepEqual(tally(blocked), { 'deferred:breaker_open': 2 }, JSON.stringify(blocked));
    for (const r of blocked) {
      assert.ok(r.retry_after_ms > 0 && r.retry_after_ms <= 5_000, JSON.stringify(r));
    }
    assert.equal(sub.requests.length, 3, 'nothing sent while the breaker is open');
    const st = await subscriberStatus(edge, spec.id);
    assert.equal(st.json.breaker.state, 'open', st.text);
    assert.ok(st.json.breaker.open_until_ms >= t + 4_000 && st.json.breaker.open_until_ms <= Date.now() + 5_000, st.text);
  } finally {
    await sub.close();
  }
});

test('breaker: settings outside the origin\'s bounds are refused (400), nothing sent', async () => {
  const sub = await startSubscriber(() => 200);
  try {
    for (const breaker of [{ threshold: 0, cooldown_ms: 5000 }, { threshold: 3, cooldown_ms: 86_400_000 }, { threshold: 3 }]) {
      const r = await postBatch(edge, subscriberSpec(`${sub.url}/hook`, { breaker }), [delivery()]);
      assert.equal(r.status, 400, `${JSON.stringify(breaker)}: ${r.text}`);
    }
    assert.equal(sub.requests.length, 0);
  } finally {
    await sub.close();
  }
});

test('breaker: a success resets the count, so 19 + 1 ok + 19 failures keep it closed', async () => {
  let n = 0;
  const sub = await startSubscriber(() => (++n === 20 ? 200 : 500));
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { max_in_flight: 1 });
    // max_in_flight 1 keeps the order of attempts (and of outcomes folded in) sequential.
    for (let i = 0; i < 39; i++) {
      const [r] = await send(edge, spec, [delivery()]);
      assert.equal(r.outcome, i === 19 ? 'delivered' : 'failed', `attempt ${i + 1}: ${JSON.stringify(r)}`);
    }
    const st = await subscriberStatus(edge, spec.id);
    assert.equal(st.json.breaker.state, 'closed', st.text);
    assert.equal(st.json.breaker.consecutive_failures, 19);
  } finally {
    await sub.close();
  }
});
