// The operators' view of the real Worker in workerd. `fanout load`: eight workers flood
// POST /v1/deliveries for one subscriber (rate 10/s, burst 20) for about five seconds; the edge's
// limiter must cap what reaches the subscriber at burst + rate x elapsed and hand the rest back as
// deferred. And the origin's /metrics after deliveries by the edge lane.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';

import { originBinary, startEdge, startOrigin, startSubscriber, waitFor } from './lib/harness.mjs';

let edge;
before(async () => {
  edge = await startEdge();
});
after(async () => {
  await edge?.stop();
});

/** Runs the origin binary to completion (bounded by `timeoutMs`); {code, stdout, stderr}. */
function runFanout(args, { env = {}, timeoutMs = 60_000 } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(originBinary(), args, {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (c) => (stdout += c));
    child.stderr.setEncoding('utf8').on('data', (c) => (stderr += c));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`fanout ${args.join(' ')} ran over ${timeoutMs} ms; stderr:\n${stderr}`));
    }, timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

test('fanout load: the edge caps one subscriber at burst + rate x elapsed', { timeout: 120_000 }, async (t) => {
  const sink = await startSubscriber();
  t.after(() => sink.close());
  const [rate, burst, seconds] = [10, 20, 5];
  const { code, stdout, stderr } = await runFanout(
    [
      'load',
      '--edge-url', edge.url,
      '--sink', `${sink.url}/hooks`,
      '--rate', String(rate),
      '--burst', String(burst),
      '--workers', '8',
      '--duration', `${seconds}s`,
      '--json',
    ],
    { env: { FANOUT_EDGE_KEY: edge.key } },
  );
  assert.equal(code, 0, `fanout load failed:\n${stderr}\n${stdout}`);
  assert.equal(stderr, '', 'no progress bar when stderr is not a terminal');
  const r = JSON.parse(stdout);
  t.diagnostic(
    `calls ${r.requests}, delivered ${r.accepted}, deferred ${r.throttled} ` +
      `(${JSON.stringify(r.deferred_by_reason)}), elapsed ${r.elapsed_secs}s, ` +
      `${r.accepted_per_sec}/s; ceiling ${r.ceiling}`,
  );
  assert.equal(r.mode, 'edge');
  assert.equal(r.errors, 0, `first error: ${r.first_error}`);
  assert.equal(r.failed, 0);
  // The limiter's ceiling over the whole run, plus one token of clock slack.
  assert.ok(r.accepted <= burst + rate * r.elapsed_secs + 1, `delivered ${r.accepted} > ceiling ${r.ceiling}`);
  assert.ok(r.accepted <= burst + rate * seconds + 10, `delivered ${r.accepted} for a ${seconds}s run`);
  // Eight workers never let the bucket sit full: nearly every token is spent.
  assert.ok(r.accepted >= burst + rate * (seconds - 2), `delivered only ${r.accepted}`);
  assert.ok(r.throttled > 0, 'the flood was throttled');
  assert.equal(r.deferred_by_reason.rate > 0, true, JSON.stringify(r.deferred_by_reason));
  assert.equal(r.requests, r.accepted + r.throttled, 'one delivery per call, each answered');
  // What the edge called delivered is what the subscriber received, signed.
  assert.equal(sink.requests.length, r.accepted);
  assert.ok(sink.requests.every((q) => q.path === '/hooks' && q.headers['webhook-signature']?.startsWith('v1,')));
});

/** `name{labels}` → value, for every sample line of a Prometheus exposition. */
function samples(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

test('/metrics counts the edge lane: results, latencies, deferrals, gauges', { timeout: 120_000 }, async (t) => {
  const origin = await startOrigin({ edge });
  const sink = await startSubscriber();
  t.after(async () => {
    await sink.close();
    await origin.stop();
  });
  const spec = {
    id: 'm_edge', url: `${sink.url}/m`, event_types: ['video.*'],
    rate_per_sec: 10, burst: 20, max_in_flight: 8, lane: 'edge',
  };
  assert.equal((await origin.api('/v1/subscribers', { body: spec })).status, 201);
  const n = 40;
  const events = Array.from({ length: n }, (_, i) => ({ id: `evt_me_${i}`, type: 'video.trending' }));
  assert.equal((await origin.api('/v1/events', { body: events })).status, 202);
  await waitFor(async () => {
    const res = await origin.api('/v1/deliveries?subscriber=m_edge&status=sent&limit=1000');
    return (await res.json()).deliveries.length === n;
  }, 60_000);

  const res = await fetch(`${origin.url}/metrics`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  const m = samples(await res.text());
  const get = (key) => {
    assert.ok(m.has(key), `${key} missing`);
    return m.get(key);
  };
  const result = (outcome) => m.get(`fanout_delivery_results_total{subscriber="m_edge",lane="edge",outcome="${outcome}"}`) ?? 0;
  t.diagnostic(`edge lane: delivered ${result('delivered')}, deferred ${result('deferred')}`);
  assert.equal(result('delivered'), n);
  assert.equal(result('failed') + result('rejected'), 0);
  assert.equal(get('fanout_attempt_latency_seconds_count{lane="edge"}'), n);
  assert.equal(get('fanout_attempt_latency_seconds_bucket{lane="edge",le="+Inf"}'), n);
  const deferrals = ['rate', 'in_flight', 'paused', 'breaker_open']
    .map((r) => get(`fanout_edge_deferrals_total{reason="${r}"}`))
    .reduce((a, b) => a + b, 0);
  assert.equal(deferrals, result('deferred'), 'every edge deferral is counted by reason');
  assert.equal(get('fanout_subscriber_sent{subscriber="m_edge"}'), n);
  assert.equal(get('fanout_subscriber_pending{subscriber="m_edge"}'), 0);
  assert.equal(get('fanout_oldest_pending_age_seconds{subscriber="m_edge"}'), 0);
  assert.ok(sink.requests.length >= n);
});
