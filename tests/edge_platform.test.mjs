// The edge under Cloudflare's real limits (issue 9): at most MAX_OPEN_SENDS sends open per call,
// each with its own timeout; response bodies never read past what is kept (a 2xx body not at
// all); the plan's subrequest limit; a Durable Object that throws gives a retryable 503.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { after, before, test } from 'node:test';
import {
  ROOT,
  freePort,
  rawSubscriber,
  startEdge,
  startOrigin,
  startSubscriber,
  streamBody,
  waitFor,
  wranglerDevArgs,
  wranglerEnv,
} from './lib/harness.mjs';
import { deliveries, postBatch, send, subscriberSpec, subscriberStatus, tally } from './lib/edge_client.mjs';

let edge;
before(async () => {
  edge = await startEdge();
});
after(async () => {
  await edge?.stop();
});

/** Resident memory of the edge's workerd processes, bytes. */
function workerdRss(pgid) {
  let total = 0;
  for (const ent of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(ent)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${ent}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      if (!/workerd/.test(stat.slice(stat.indexOf('(') + 1, close))) continue;
      if (Number(stat.slice(close + 2).split(' ')[2]) !== pgid) continue;
      const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${ent}/status`, 'utf8'));
      if (m) total += Number(m[1]) * 1024;
    } catch {
      /* gone */
    }
  }
  return total;
}

test('a batch of 100 to a subscriber answering in 1 s, timeout 3 s: all delivered, never more than 6 open at once', async (tc) => {
  const sub = await rawSubscriber((_req, res) => {
    setTimeout(() => res.end('ok'), 1_000);
  });
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { timeout_ms: 3_000, max_in_flight: 1_000, rate_per_sec: 1_000, burst: 1_000 });
    const t0 = Date.now();
    const results = await send(edge, spec, deliveries(100));
    const took = Date.now() - t0;
    tc.diagnostic(`${JSON.stringify(tally(results))} in ${took} ms, peak open ${sub.state.maxOpen}`);
    assert.deepEqual(tally(results), { delivered: 100 });
    assert.equal(sub.state.received, 100);
    assert.equal(sub.state.maxOpen, 6, 'six sends open at once, never more');
    // Each delivery's latency is its own exchange (about 1 s), not its wait for a slot.
    for (const r of results) assert.ok(r.latency_ms >= 950 && r.latency_ms < 2_500, JSON.stringify(r));
    // 17 waves of 6 (100 = 16 × 6 + 4), 1 s each.
    assert.ok(took >= 16_500, `the call took ${took} ms`);
    assert.equal((await subscriberStatus(edge, spec.id)).json.in_flight, 0);
  } finally {
    await sub.close();
  }
});

test('a 200 whose body dribbles on: `delivered` once, at once, and its body is cancelled', async () => {
  const sub = await rawSubscriber((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    const tick = setInterval(() => {
      if (res.destroyed) return clearInterval(tick);
      res.write('.');
    }, 100);
    res.on('close', () => clearInterval(tick));
  });
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { timeout_ms: 4_000 });
    const t0 = Date.now();
    const [r] = await send(edge, spec, deliveries(1));
    const took = Date.now() - t0;
    assert.equal(r.outcome, 'delivered', JSON.stringify(r));
    assert.equal(r.status, 200);
    assert.ok(took < 2_000, `answered after ${took} ms (timeout_ms is 4000)`);
    assert.ok(r.latency_ms < 1_500, JSON.stringify(r));
    // The edge let go of the body: the connection closes well before the timeout would have.
    await waitFor(() => sub.state.open === 0, 3_000, { message: 'the dribbling response was closed by the edge' });
    assert.equal(sub.state.received, 1, 'sent once');
    // A second delivery, sent after the first was let go, marks the time: once it has been
    // received and let go, a second copy of the first would have arrived too.
    const [marker] = await send(edge, spec, deliveries(1));
    assert.equal(marker.outcome, 'delivered', JSON.stringify(marker));
    await waitFor(() => sub.state.open === 0, 3_000, { message: 'the marker was closed by the edge' });
    assert.equal(sub.state.received, 2, 'each sent once: the first was not sent again');
  } finally {
    await sub.close();
  }
});

test('a 200 that declares a short body and dribbles it: `delivered` at once; the slot is let go by its timeout', async () => {
  const sub = await rawSubscriber((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '20' });
    const tick = setInterval(() => (res.destroyed ? clearInterval(tick) : res.write('.')), 400);
    res.on('close', () => clearInterval(tick));
  });
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { timeout_ms: 2_000 });
    const t0 = Date.now();
    const [r] = await send(edge, spec, deliveries(1));
    const took = Date.now() - t0;
    assert.equal(r.outcome, 'delivered', JSON.stringify(r));
    assert.ok(took < 1_500, `answered after ${took} ms (timeout_ms is 2000, the body needs 8 s)`);
    await waitFor(() => sub.state.open === 0, 5_000, { message: 'the edge let go of the connection' });
    assert.ok(sub.state.records[0].closedAt - sub.state.records[0].time < 4_000, 'closed by the timeout, not by the body ending');
    assert.equal(sub.state.received, 1);
  } finally {
    await sub.close();
  }
});

test('two 200s and a 500 streaming 64 MiB each: the call is answered, bodies are not read, memory stays flat', async (tc) => {
  const BIG = 64 * 1024 * 1024;
  const sub = await rawSubscriber((req, res, record) => {
    const status = req.url.startsWith('/err') ? 500 : 200;
    res.writeHead(status, { 'content-type': 'application/octet-stream', 'content-length': String(BIG) });
    streamBody(res, record, BIG);
  });
  try {
    const rss0 = workerdRss(edge.process.pid);
    const ok = subscriberSpec(`${sub.url}/ok`, { timeout_ms: 10_000 });
    const err = subscriberSpec(`${sub.url}/err`, { timeout_ms: 10_000 });
    const t0 = Date.now();
    const [oks, errs] = await Promise.all([send(edge, ok, deliveries(2)), send(edge, err, deliveries(1))]);
    const took = Date.now() - t0;
    assert.deepEqual(tally(oks), { delivered: 2 }, JSON.stringify(oks));
    assert.equal(errs[0].outcome, 'failed');
    assert.equal(errs[0].status, 500);
    assert.equal(errs[0].response_body.length, 4096, 'the 500 body is kept to 4 KiB');
    assert.ok(took < 5_000, `the calls took ${took} ms`);
    await waitFor(() => sub.state.open === 0, 5_000, { message: 'every huge response closed by the edge' });
    const written = sub.state.records.map((x) => x.written);
    const rss1 = workerdRss(edge.process.pid);
    tc.diagnostic(`written per response: ${written.map((w) => `${(w / 1048576).toFixed(1)} MiB`).join(', ')}; workerd RSS ${(rss0 / 1048576).toFixed(0)} -> ${(rss1 / 1048576).toFixed(0)} MiB`);
    // What the sockets took before the edge let go (kernel buffers), far from 64 MiB.
    for (const w of written) assert.ok(w < 16 * 1024 * 1024, `a response got ${w} bytes out before it was closed`);
    assert.ok(rss1 - rss0 < 64 * 1024 * 1024, `workerd grew by ${((rss1 - rss0) / 1048576).toFixed(0)} MiB`);
    // And the edge still works.
    const again = await startSubscriber(() => 200);
    try {
      const [r] = await send(edge, subscriberSpec(`${again.url}/h`), deliveries(1));
      assert.equal(r.outcome, 'delivered');
    } finally {
      await again.close();
    }
  } finally {
    await sub.close();
  }
});

test('a non-2xx body that dribbles: `failed` with its status and what arrived, when its own timeout fires', async () => {
  const sub = await rawSubscriber((_req, res) => {
    res.writeHead(503, { 'content-type': 'text/plain' });
    res.write('busy');
    const tick = setInterval(() => (res.destroyed ? clearInterval(tick) : res.write('.')), 200);
    res.on('close', () => clearInterval(tick));
  });
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { timeout_ms: 1_000 });
    const t0 = Date.now();
    const [r] = await send(edge, spec, deliveries(1));
    const took = Date.now() - t0;
    assert.equal(r.outcome, 'failed', JSON.stringify(r));
    assert.equal(r.status, 503);
    assert.ok(r.response_body.startsWith('busy'), JSON.stringify(r));
    assert.ok(took >= 950 && took < 3_000, `took ${took} ms`);
    await waitFor(() => sub.state.open === 0, 3_000, { message: 'closed after the timeout' });
  } finally {
    await sub.close();
  }
});

test('MAX_OPEN_SENDS and SUBREQUEST_LIMIT as vars: 2 open at once; a call makes at most 5 fetches, the rest deferred', async (tc) => {
  const small = await startEdge({ vars: { MAX_OPEN_SENDS: '2', SUBREQUEST_LIMIT: '5' } });
  const sub = await rawSubscriber((_req, res) => setTimeout(() => res.end('ok'), 200));
  try {
    const spec = subscriberSpec(`${sub.url}/hook`, { max_in_flight: 100 });
    const results = await send(small, spec, deliveries(12));
    tc.diagnostic(JSON.stringify(tally(results)));
    assert.deepEqual(tally(results), { delivered: 5, 'deferred:in_flight': 7 });
    assert.deepEqual(
      results.map((r) => r.outcome),
      [...Array(5).fill('delivered'), ...Array(7).fill('deferred')],
    );
    assert.equal(sub.state.received, 5);
    assert.equal(sub.state.maxOpen, 2);
    // The cap is per call: the next call gets its own 5.
    const next = await send(small, spec, deliveries(6));
    assert.deepEqual(tally(next), { delivered: 5, 'deferred:in_flight': 1 });
  } finally {
    await sub.close();
    await small.stop();
  }
});

test('an invalid limit var: every call answers 500 `misconfigured`, nothing is sent', async () => {
  const bad = await startEdge({ vars: { MAX_OPEN_SENDS: 'lots' } });
  const sub = await startSubscriber(() => 200);
  try {
    const r = await postBatch(bad, subscriberSpec(`${sub.url}/h`), deliveries(1));
    assert.equal(r.status, 500, r.text);
    assert.equal(r.json.error.code, 'misconfigured');
    assert.match(r.json.error.message, /MAX_OPEN_SENDS/);
    assert.equal(sub.requests.length, 0);
  } finally {
    await sub.close();
    await bad.stop();
  }
});

/** Runs tests/fixtures/throwing-do under its own `wrangler dev`. */
async function startThrowingDo() {
  const port = await freePort();
  const inspectorPort = await freePort();
  const persistDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-throwing-do-'));
  const config = path.join(ROOT, 'tests', 'fixtures', 'throwing-do', 'wrangler.toml');
  const child = spawn(process.execPath, wranglerDevArgs({ config, port, inspectorPort, persistDir }), {
    cwd: ROOT,
    env: wranglerEnv(persistDir),
    detached: true,
    stdio: 'ignore',
  });
  const stop = async () => {
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
    await fsp.rm(persistDir, { recursive: true, force: true });
  };
  try {
    await waitFor(async () => {
      const r = await fetch(`http://127.0.0.1:${port}/`, { signal: AbortSignal.timeout(5000) });
      await r.text();
      return r.status === 200;
    }, 90_000, { intervalMs: 200, message: 'the throwing Durable Object fixture started' });
  } catch (e) {
    await stop(); // a fixture left running would keep this file's process (and the run) alive
    throw e;
  }
  return { stop };
}

test('a Durable Object that throws (overloaded, reset, unreachable): 503 `object_unavailable` with Retry-After, nothing sent', async () => {
  const fixture = await startThrowingDo();
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-edge-orphan-'));
  const config = path.join(dir, 'wrangler.toml');
  // Everything started is stopped whatever fails, the start of the next part included: a
  // process left running would keep this file's process, and so the whole run, from ending.
  let orphan;
  let sub;
  try {
    // The project's Worker (build/), its SUBSCRIBER binding pointed at the fixture's class.
    await fsp.writeFile(
      config,
      [
        'name = "fanout-edge-throwing-do"',
        `main = ${JSON.stringify(path.join(ROOT, 'build', 'index.js'))}`,
        'compatibility_date = "2026-04-26"',
        '[[durable_objects.bindings]]',
        'name = "SUBSCRIBER"',
        'class_name = "SubscriberDO"',
        'script_name = "fanout-throwing-do"',
        '',
      ].join('\n'),
    );
    orphan = await startEdge({ config });
    sub = await startSubscriber(() => 200);
    const r = await waitFor(async () => {
      const x = await postBatch(orphan, subscriberSpec(`${sub.url}/h`), deliveries(2));
      // wrangler's dev registry answers its own 503 until it has seen the fixture.
      return x.json?.error ? x : null;
    }, 30_000, { intervalMs: 500, message: 'the edge reached the throwing object' });
    assert.equal(r.status, 503, r.text);
    assert.equal(r.json.error.code, 'object_unavailable', r.text);
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal(sub.requests.length, 0);

    // The origin keeps such a batch pending and spends no attempt on it.
    const origin = await startOrigin({ edge: orphan });
    try {
      const created = await origin.api('/v1/subscribers', {
        body: { id: 'sub_behind_broken_do', url: `${sub.url}/o`, event_types: ['video.*'], rate_per_sec: 100, burst: 10, max_in_flight: 8, lane: 'edge' },
      });
      assert.equal(created.status, 201, await created.text());
      const ev = await origin.api('/v1/events', { body: { id: 'evt_broken_do_1', type: 'video.trending' } });
      assert.equal(ev.status, 202, await ev.text());
      await waitFor(() => origin.logs.some((l) => /edge call failed/.test(l) && /object_unavailable/.test(l)), 20_000, {
        message: 'the origin saw the edge answer object_unavailable',
      });
      // The delivery goes back to `pending` after each such answer and out again once the
      // edge's `Retry-After: 1` has passed: wait to observe it pending (on a slow machine the
      // first read may land while it is already `in_flight` again), never dead or sent, and
      // with no attempt spent at any read.
      let seen;
      await waitFor(async () => {
        const list = await (await origin.api('/v1/deliveries?subscriber=sub_behind_broken_do')).json();
        assert.equal(list.deliveries.length, 1, JSON.stringify(list));
        seen = list.deliveries[0];
        assert.ok(['pending', 'in_flight'].includes(seen.status), JSON.stringify(seen));
        assert.equal(seen.attempt_count, 0, JSON.stringify(seen));
        return seen.status === 'pending';
      }, 20_000, { intervalMs: 50, message: 'the delivery seen pending again' });
      assert.equal(seen.attempt_count, 0, JSON.stringify(seen));
      assert.equal(sub.requests.length, 0);
    } finally {
      await origin.stop();
    }
  } finally {
    await sub?.close();
    await orphan?.stop();
    await fixture.stop();
    await fsp.rm(dir, { recursive: true, force: true });
  }
});
