// The rate limit under load (the seed's load check): rate 10/s, burst 20. Several callers flood
// the edge for 10 s without obeying anything; the subscriber must see the burst and then the
// sustained rate, never more than `burst + rate × w` in any window of length w; everything else
// comes back deferred `rate` with exact, growing waits; obeying those waits gets it all delivered.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { sleep, startEdge, startSubscriber, worstWindow } from './lib/harness.mjs';
import { deliveries, send, subscriberSpec, subscriberStatus, tally } from './lib/edge_client.mjs';

const RATE = 10; // per second
const BURST = 20;

let edge;
before(async () => {
  edge = await startEdge();
});
after(async () => {
  await edge?.stop();
});

test('a fresh bucket: burst 20 sent, then each deferred delivery gets the exact time of its own token', async () => {
  const sub = await startSubscriber(() => 200);
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { rate_per_sec: RATE, burst: BURST, max_in_flight: 100 });
    const batch = deliveries(25);
    const tCall = Date.now();
    const results = await send(edge, spec, batch);
    assert.deepEqual(tally(results), { delivered: 20, 'deferred:rate': 5 });
    assert.deepEqual(
      results.slice(0, 20).map((r) => r.outcome),
      Array(20).fill('delivered'),
      'the first 20 in order are the ones sent',
    );
    // The bucket is exactly empty: the k-th deferred waits k × 100 ms.
    assert.deepEqual(
      results.slice(20).map((r) => r.retry_after_ms),
      [100, 200, 300, 400, 500],
    );
    assert.equal(sub.requests.length, 20);
    const st = await subscriberStatus(edge, spec.id);
    // Empty when the batch was granted; since then only what accrued at 10/s.
    assert.ok(st.json.tokens <= (RATE * (Date.now() - tCall)) / 1000 + 0.01, st.text);
    assert.equal(st.json.rate_per_sec, RATE);
    assert.equal(st.json.burst, BURST);

    // Obeying the first wait gets that delivery through.
    await sleep(results[20].retry_after_ms);
    const [again] = await send(edge, spec, [batch[20]]);
    assert.equal(again.outcome, 'delivered', JSON.stringify(again));
    assert.equal(sub.requests.length, 21);
  } finally {
    await sub.close();
  }
});

test('load: 4 callers flood for 10 s; never more than burst + rate × w; the rest deferred `rate`; obeying delivers all', async (t) => {
  const sub = await startSubscriber(() => 200);
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { rate_per_sec: RATE, burst: BURST, max_in_flight: 1000 });
    const CALLERS = 4;
    const PER_CALLER = 40; // 160 deliveries: ~120 fit in 10 s, the rest wait for the obeying phase
    const BATCH = 5;
    const FLOOD_MS = 10_000;
    const pools = Array.from({ length: CALLERS }, () => deliveries(PER_CALLER));
    const all = pools.flat();
    const delivered = new Set();
    const lastResult = new Map(); // delivery id -> its latest result
    let calls = 0;
    let multiDeferredCalls = 0;
    const problems = [];

    const record = (results) => {
      for (const r of results) {
        lastResult.set(r.id, r);
        if (r.outcome === 'delivered') {
          if (delivered.has(r.id)) problems.push(`delivered twice: ${r.id}`);
          delivered.add(r.id);
        } else if (!(r.outcome === 'deferred' && r.reason === 'rate')) {
          problems.push(`unexpected result ${JSON.stringify(r)}`);
        }
      }
      // Within one call the deferred waits are exact and grow by one token's time (100 ms).
      const waits = results.filter((r) => r.outcome === 'deferred').map((r) => r.retry_after_ms);
      if (waits.length > 0 && !(waits[0] > 0 && waits[0] <= 1000 / RATE)) {
        problems.push(`first wait ${waits[0]} not in (0, 100]`);
      }
      if (waits.length >= 2) multiDeferredCalls += 1;
      for (let k = 1; k < waits.length; k++) {
        const step = waits[k] - waits[k - 1];
        if (!(waits[k] > waits[0] && step >= 1000 / RATE - 1 && step <= 1000 / RATE + 1)) {
          problems.push(`waits in one call not growing by 100 ms: ${waits.join(',')}`);
          break;
        }
      }
    };

    // Phase 1: flood. Each caller resends its undelivered deliveries as fast as answers come,
    // ignoring retry_after_ms.
    const t0 = Date.now();
    const floodEnd = t0 + FLOOD_MS;
    await Promise.all(
      pools.map(async (pool) => {
        while (Date.now() < floodEnd) {
          const pending = pool.filter((d) => !delivered.has(d.id)).slice(0, BATCH);
          if (pending.length === 0) break;
          record(await send(edge, spec, pending));
          calls += 1;
        }
      }),
    );
    const floodMs = Date.now() - t0;
    const floodDelivered = delivered.size;
    t.diagnostic(`flood: ${calls} calls in ${floodMs} ms, ${floodDelivered} delivered, ${multiDeferredCalls} calls with 2+ deferrals`);
    assert.deepEqual(problems, []);
    assert.ok(calls > 200, `the callers flooded: ${calls} calls in ${floodMs} ms`);
    assert.ok(multiDeferredCalls > 50, `calls with several deferrals: ${multiDeferredCalls}`);
    // Burst, then the sustained rate: no more than the allowance, and no stall either (a denied
    // request must still store the refill, or a flooded subscriber gets only its burst).
    const allowance = BURST + (RATE * floodMs) / 1000;
    assert.ok(floodDelivered <= allowance + 1, `delivered ${floodDelivered} in ${floodMs} ms > ${allowance}`);
    assert.ok(floodDelivered >= BURST + 0.8 * RATE * (FLOOD_MS / 1000), `only ${floodDelivered} delivered in ${floodMs} ms`);
    assert.ok(all.length - floodDelivered > 0, 'some deliveries are left for the obeying phase');
    const st = await subscriberStatus(edge, spec.id);
    assert.ok(st.json.tokens < 2, `bucket drained by the flood: ${st.text}`);

    // Phase 2: obey. Every deferred delivery is resent after its own retry_after_ms.
    const deadline = Date.now() + ((all.length - floodDelivered) / RATE) * 1000 + 15_000;
    const dueAt = new Map();
    for (const d of all) {
      // Never tried yet (callers send 5 at a time): due now.
      if (!delivered.has(d.id)) dueAt.set(d.id, Date.now() + (lastResult.get(d.id)?.retry_after_ms ?? 0));
    }
    await Promise.all(
      pools.map(async (pool) => {
        for (;;) {
          const pending = pool.filter((d) => !delivered.has(d.id));
          if (pending.length === 0) return;
          assert.ok(Date.now() < deadline, `obeying phase did not finish; ${pending.length} left`);
          const next = Math.min(...pending.map((d) => dueAt.get(d.id)));
          if (next > Date.now()) await sleep(next - Date.now());
          const due = pending.filter((d) => dueAt.get(d.id) <= Date.now());
          if (due.length === 0) continue; // a timer may fire a millisecond early
          const results = await send(edge, spec, due);
          const at = Date.now();
          record(results);
          for (const r of results) if (r.outcome === 'deferred') dueAt.set(r.id, at + r.retry_after_ms);
        }
      }),
    );
    assert.deepEqual(problems, []);
    assert.equal(delivered.size, all.length, 'all delivered');
    t.diagnostic(`obeying phase: ${all.length - floodDelivered} delivered in ${Date.now() - t0 - floodMs} ms`);

    // The subscriber got each event exactly once ...
    const got = sub.requests.map((r) => r.headers['webhook-id']);
    assert.equal(got.length, all.length);
    assert.deepEqual(new Set(got), new Set(all.map((d) => d.event_id)));
    // ... the burst first ...
    const times = sub.requests.map((r) => r.time).sort((a, b) => a - b);
    assert.ok(times[BURST - 1] - times[0] < 1000, `the burst of ${BURST} took ${times[BURST - 1] - times[0]} ms`);
    // ... and never more than burst + rate × w in any window [t, t + w] (1 of slack for clocks).
    const { worst, at } = worstWindow(times, RATE, BURST);
    assert.ok(worst <= 1, `window over the allowance by ${worst.toFixed(2)}: ${JSON.stringify(at)}`);
    // The sustained part runs at the rate: from 2 s in to the end of the flood, about 10/s.
    const from = times[0] + 2_000;
    const to = t0 + floodMs;
    const sustained = times.filter((t) => t >= from && t < to).length;
    const expected = (RATE * (to - from)) / 1000;
    assert.ok(sustained <= expected + 2 && sustained >= expected * 0.8, `sustained ${sustained} vs ${expected}`);
  } finally {
    await sub.close();
  }
});

test('control: the window check does catch a subscriber sent more than its rate', () => {
  // 20 at once, then 5 within the next 200 ms: 25 > 20 + 10 × 0.2 + 1.
  const times = [...Array(20).fill(0), 40, 80, 120, 160, 200];
  assert.ok(worstWindow(times, RATE, BURST).worst > 1);
  const fine = [...Array(20).fill(0), ...Array.from({ length: 30 }, (_, i) => 100 * (i + 1))];
  assert.ok(worstWindow(fine, RATE, BURST).worst <= 0);
});
