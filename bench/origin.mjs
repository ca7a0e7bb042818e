// Origin daemon benchmark (issue 3, "Performance"). Not a test: it prints numbers and ratios
// measured side by side in one run. Everything runs on 127.0.0.1; every loop is bounded in time.
// BENCHMARKS.md ("Origin daemon") has the commands, the reading and the results.
//
//   npm run bench:origin          builds the release daemon, then runs this
//   FANOUT_BIN=target/release/fanout node bench/origin.mjs [--rounds 3] [--only ingest,story,lanes]
//       [--ingest-seconds 5] [--batch-connections 4] [--single-connections 16]
//       [--story-events 12000] [--no-story-alone] [--origin-events 10000] [--edge-events 4000]
//       [--json out.json] [--filtered] [--order-events 20000] [--order-keys 10000]
//   --only ordering: one subscriber's deliveries unordered vs ordered by key (the ratio).
//   --only batches: one subscriber answering in 20 ms with max_in_flight 4, one event per
//     request vs batches of 100 (issue 25: batches ≥ 20× the events/s).
//   FANOUT_BIN=target/release/fanout node bench/origin.mjs --only signatures [--rounds 3]
//
// Three parts, each with a fresh daemon (release binary, fresh SQLite file) per measurement:
//   ingest  POST /v1/events, fan-out to 5 subscribers, from bench/ingest (a Rust HTTP/1.1 client,
//           one thread): batches of 100 vs single events. Twice each: with the dispatcher
//           delivering to the sink at full speed (real life), and with it held (every subscriber
//           at 0.001/s, so the dispatcher has nothing to do): the cost of ingest alone.
//   story   the manual's story (docs/src/introduction.md) through the edge lane (the real Worker under `wrangler dev`):
//           12,000 video.trending events x 5 subscribers, the partner (10/s, burst 20, answers
//           429 Retry-After: 120 past that) and four fast ones. Time for the four to drain,
//           deliveries/s, the daemon's peak RSS (VmHWM), database size, the partner's 429s and
//           how many it got. By default also the same burst without the partner, for the ratio.
//   lanes   deliveries/s of the origin lane and of the edge lane on the same backlog shape
//           (5 subscribers, a fast local sink), and the sink alone under bench/sink's `load`
//           client. The backlog is ingested while the subscribers are held (0.001/s), then all
//           five are released at once (PATCH rate 1e6/s); the clock stops when the ledger (GET
//           /metrics, fanout_deliveries{status="sent"}) has recorded every delivery as sent.
//   signatures  the lanes part's origin-lane measurement for subscribers signing with HMAC (v1)
//           and with Ed25519 (v1a), in alternating order: deliveries/s and daemon CPU µs per
//           delivery of each, and the ed25519 ÷ hmac ratio (target ≥ 0.8×; issue 25).
// With --filtered, every ingest measurement is made twice, in alternating order: with the five
// subscribers unfiltered and with each holding a content filter of 5 conditions that every event
// matches (so both make the same deliveries), for the filtered ÷ unfiltered ratio.
// Rounds interleave the configurations so drift on the shared machine hits them alike; tables
// show medians.

import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { ROOT, freePort, newSecret, originBinary, sleep, startEdge, startOrigin, strictPartner } from '../tests/lib/harness.mjs';
import { SINK_DIR, cargoBuild, children, log, machineBusy, procCpu, startSink, makeEvents, until } from './lib.mjs';

const { values: opts } = parseArgs({
  options: {
    rounds: { type: 'string', default: '3' },
    only: { type: 'string', default: 'ingest,story,lanes' },
    'ingest-seconds': { type: 'string', default: '5' },
    'batch-connections': { type: 'string', default: '4' },
    'single-connections': { type: 'string', default: '16' },
    'story-events': { type: 'string', default: '12000' },
    'no-story-alone': { type: 'boolean', default: false },
    // Story runs with and without the partner, in alternating order (the edge is the bottleneck
    // and the machine's load drifts over minutes).
    'story-rounds': { type: 'string', default: '1' },
    'origin-events': { type: 'string', default: '10000' },
    'edge-events': { type: 'string', default: '4000' },
    // --only ordering: one subscriber's delivery, unordered and ordered by a key over
    // --order-keys keys, in alternating order (issue 24: ordered ≥ 0.8× unordered).
    'order-events': { type: 'string', default: '20000' },
    'order-keys': { type: 'string', default: '10000' },
    // --only batches: events per run, one per request and in batches of 100.
    'single-events': { type: 'string', default: '2000' },
    'batch-events': { type: 'string', default: '40000' },
    // Another `fanout` binary (e.g. an older commit's release build) measured beside this one in
    // the ingest and lanes parts, in alternating order, for a before/after ratio.
    baseline: { type: 'string' },
    // cli: the edge under `wrangler dev` (tests/lib/harness.mjs startEdge); api: through
    // bench/start-worker.mjs (wrangler's programmatic API, dev inspector off; see the edge section).
    'edge-runner': { type: 'string', default: 'cli' },
    json: { type: 'string' },
    filtered: { type: 'boolean', default: false },
  },
});
const clampInt = (v, lo, hi) => Math.min(Math.max(Math.trunc(Number(v)) || lo, lo), hi);
const ROUNDS = clampInt(opts.rounds, 1, 7);
const ONLY = new Set(opts.only.split(','));
const INGEST_S = clampInt(opts['ingest-seconds'], 1, 30);
const BATCH_CONNS = clampInt(opts['batch-connections'], 1, 64);
const SINGLE_CONNS = clampInt(opts['single-connections'], 1, 256);
const STORY_EVENTS = clampInt(opts['story-events'], 100, 50_000);
const STORY_ROUNDS = clampInt(opts['story-rounds'], 1, 5);
const ORIGIN_EVENTS = clampInt(opts['origin-events'], 100, 100_000);
const EDGE_EVENTS = clampInt(opts['edge-events'], 100, 100_000);
const SUBSCRIBERS = 5;
const BASELINE = opts.baseline ? path.resolve(opts.baseline) : null;
const EDGE_RUNNER = opts['edge-runner'] === 'api' ? 'api' : 'cli';
const DRAIN_LIMIT_MS = 300_000; // no drain is waited for longer than this

const INGEST_DIR = path.join(ROOT, 'bench', 'ingest');

// ---------- child processes ----------

/** Runs a bench binary to completion; resolves with its stdout. */
function runTool(bin, args, timeoutMs) {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    const t = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('exit', (code) => {
      clearTimeout(t);
      if (code === 0) resolve(out);
      else reject(new Error(`${path.basename(bin)} exited ${code}: ${err.slice(0, 500)}`));
    });
  });
}

// ---------- /proc ----------

/**
 * Threads of `pid` by name, from /proc/<pid>/task/<tid>/schedstat: {name: {cpu, wait}} in
 * seconds — time on a CPU, and time runnable but waiting for one (the machine's contention).
 */
function threadCpu(pid) {
  const out = {};
  let tids = [];
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const tid of tids) {
    try {
      const name = fs.readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim();
      const [cpu, wait] = fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').trim().split(/\s+/).map(Number);
      const t = (out[name] ??= { cpu: 0, wait: 0 });
      t.cpu += cpu / 1e9;
      t.wait += wait / 1e9;
    } catch {
      /* thread gone */
    }
  }
  return out;
}
function threadDelta(a, b) {
  const d = {};
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    d[k] = { cpu: (b[k]?.cpu ?? 0) - (a[k]?.cpu ?? 0), wait: (b[k]?.wait ?? 0) - (a[k]?.wait ?? 0) };
  }
  return d;
}
/** Daemon CPU split: writer (the ledger's one writing thread) and the rest (tokio: HTTP, API). */
function split(threads) {
  const w = threads['fanout-ledger'] ?? { cpu: 0, wait: 0 };
  let cpu = 0;
  let wait = 0;
  for (const t of Object.values(threads)) {
    cpu += t.cpu;
    wait += t.wait;
  }
  return { writerCpu: w.cpu, writerWait: w.wait, cpu, wait };
}
function vm(pid, field) {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : NaN;
  } catch {
    return NaN;
  }
}
function dbBytes(db) {
  const size = (p) => {
    try {
      return fs.statSync(p).size;
    } catch {
      return 0;
    }
  };
  return { db: size(db), wal: size(`${db}-wal`), shm: size(`${db}-shm`) };
}

/** The edge through bench/start-worker.mjs (wrangler's programmatic API, dev inspector off). */
async function startEdgeApi() {
  const key = newSecret();
  const port = await freePort();
  const persist = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-bench-edge-'));
  const child = spawn(
    process.execPath,
    [path.join(ROOT, 'bench', 'start-worker.mjs'), path.join(ROOT, 'wrangler.toml'), String(port), persist,
      `EDGE_SIGNING_KEY=${key}`, 'ALLOW_LOOPBACK_HTTP=true'],
    {
      cwd: ROOT,
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, FANOUT_SKIP_BUILD: '1', WRANGLER_SEND_METRICS: 'false', NO_COLOR: '1',
        WRANGLER_LOG_PATH: path.join(persist, 'wrangler-logs') },
    },
  );
  children.push(child);
  child.stderr.resume();
  const url = await new Promise((resolve, reject) => {
    let buf = '';
    child.stdout.on('data', (d) => {
      buf += d;
      const m = /ready (\S+)/.exec(buf);
      if (m) resolve(m[1]);
    });
    child.on('exit', (code) => reject(new Error(`start-worker exited (${code})`)));
    setTimeout(() => reject(new Error('the edge did not start in 90 s')), 90_000).unref();
  });
  child.stdout.resume();
  const stop = async () => {
    child.stdin.end();
    await sleep(500);
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
    await fsp.rm(persist, { recursive: true, force: true });
  };
  return { url, key, stop };
}

// ---------- the daemon ----------

/** `fanout serve` from `bin` (default: FANOUT_BIN / harness's choice), fresh ledger. */
async function origin({ edge = null, bin = null } = {}) {
  const saved = process.env.FANOUT_BIN;
  if (bin) process.env.FANOUT_BIN = bin;
  let o;
  try {
    o = await startOrigin({ edge, env: { FANOUT_LOG: 'warn' } });
  } finally {
    if (bin) {
      if (saved === undefined) delete process.env.FANOUT_BIN;
      else process.env.FANOUT_BIN = saved;
    }
  }
  o.pid = o.process.pid;
  return o;
}

async function addSubscriber(o, spec) {
  const res = await o.api('/v1/subscribers', { body: spec });
  const text = await res.text();
  if (res.status !== 201) throw new Error(`POST /v1/subscribers ${spec.id}: ${res.status} ${text}`);
}

async function patchSubscriber(o, id, body) {
  const res = await o.api(`/v1/subscribers/${id}`, { method: 'PATCH', body });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`PATCH /v1/subscribers/${id}: ${res.status} ${text}`);
}

/** Prometheus text → {name{labels}: value} for the samples we read. */
async function scrape(o) {
  const text = await (await fetch(`${o.url}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}
const sentTotal = (m) => m['fanout_deliveries{status="sent"}'] ?? 0;

/** Posts `events` in batches of `batch` over `conns` concurrent fetches. */
async function postEvents(o, events, batch = 100, conns = 4) {
  let next = 0;
  await Promise.all(
    Array.from({ length: conns }, async () => {
      while (next < events.length) {
        const slice = events.slice(next, next + batch);
        next += batch;
        const res = await o.api('/v1/events', { body: slice });
        const text = await res.text();
        if (res.status !== 202) throw new Error(`POST /v1/events: ${res.status} ${text.slice(0, 300)}`);
      }
    }),
  );
}

// ---------- part 1: ingest ----------

const FAST = { rate_per_sec: 1_000_000, burst: 1_000_000 };
/** A content filter every bench/ingest event matches: 5 conditions, nested, of four kinds. */
const BENCH_FILTER = {
  type: 'video.trending',
  data: { views: { $gte: 0 }, video: { $startsWith: 'v_' }, text: { $exist: true }, $not: [{ views: { $lt: 0 } }] },
};
const HELD = { rate_per_sec: 0.001, burst: 1 };

async function ingestOnce(sink, { batch, held, build = 'current', bin = null, filtered = false }) {
  const o = await origin({ bin });
  try {
    for (let i = 0; i < SUBSCRIBERS; i++) {
      await addSubscriber(o, {
        id: `sub_${i}`,
        url: `${sink.url}/in/${i}`,
        event_types: ['video.*'],
        ...(held ? HELD : FAST),
        max_in_flight: 100,
        lane: 'origin',
        ...(filtered ? { filter: BENCH_FILTER } : {}),
      });
    }
    const conns = batch > 1 ? BATCH_CONNS : SINGLE_CONNS;
    const sink0 = await sink.count();
    const th0 = threadCpu(o.pid);
    const m0 = machineBusy();
    const out = await runTool(
      path.join(INGEST_DIR, 'target', 'release', 'ingest'),
      [o.url, o.token, String(conns), String(INGEST_S), String(batch), `evt_b${batch}${held ? 'h' : 'd'}`],
      (INGEST_S + 30) * 1000,
    );
    const r = JSON.parse(out);
    const t = split(threadDelta(th0, threadCpu(o.pid)));
    const m1 = machineBusy();
    const dispatched = (await sink.count()) - sink0;
    if (r.errors) log(`  ingest errors: ${r.errors} (${r.first_error})`);
    if (r.deliveries !== r.events * SUBSCRIBERS) log(`  !! ${r.deliveries} deliveries for ${r.events} events`);
    const res = {
      build,
      batch,
      held,
      filtered,
      conns,
      events: r.events,
      deliveries: r.deliveries,
      rate: r.events / r.elapsed_s,
      elapsed: r.elapsed_s,
      p50: r.p50_ms,
      p99: r.p99_ms,
      errors: r.errors,
      dispatchedPerS: dispatched / r.elapsed_s,
      daemonCores: t.cpu / r.elapsed_s,
      writerCores: t.writerCpu / r.elapsed_s,
      // Share of the window the writer thread was runnable (on a CPU or waiting for one).
      writerRunnable: (t.writerCpu + t.writerWait) / r.elapsed_s,
      writerWaitShare: t.writerWait / (t.writerCpu + t.writerWait || 1),
      daemonUsPerEvent: (t.cpu / r.events) * 1e6,
      writerUsPerEvent: (t.writerCpu / r.events) * 1e6,
      machine: (m1[0] - m0[0]) / (m1[1] - m0[1]),
      rssMax: vm(o.pid, 'VmHWM'),
    };
    log(
      `  ${build === 'baseline' ? '[baseline] ' : ''}${filtered ? '[filtered] ' : ''}ingest batch=${batch} ${held ? 'held    ' : 'dispatch'}: ${res.rate.toFixed(0).padStart(6)} events/s ` +
        `(${r.events} in ${r.elapsed_s}s, ${conns} conns, p50 ${r.p50_ms} ms, p99 ${r.p99_ms} ms; ` +
        `sink got ${res.dispatchedPerS.toFixed(0)}/s meanwhile; daemon ${res.daemonCores.toFixed(2)} cores, ` +
        `writer ${res.writerCores.toFixed(2)} (runnable ${(res.writerRunnable * 100).toFixed(0)}% of the time, ` +
        `${(res.writerWaitShare * 100).toFixed(0)}% of that waiting for a CPU); ` +
        `${res.daemonUsPerEvent.toFixed(1)} µs daemon CPU/event, writer ${res.writerUsPerEvent.toFixed(1)}; ` +
        `machine ${(res.machine * 100).toFixed(0)}% busy)`,
    );
    return res;
  } finally {
    await o.stop();
  }
}

// ---------- part 2: the story through the edge ----------

/** latency_ms of the first `n` delivered results the edge logged for `subscriber`. */
function edgeLatencies(edge, subscriber, n) {
  const out = [];
  for (const line of edge.logs ?? []) {
    if (!line.includes(`"subscriber_id":"${subscriber}"`)) continue;
    const i = line.indexOf('{');
    try {
      const rec = JSON.parse(line.slice(i));
      if (rec.outcome === 'delivered' || rec.outcome === 'failed') out.push(rec.latency_ms ?? null);
    } catch {
      /* not a record */
    }
    if (out.length >= n) break;
  }
  return out;
}

function maxInWindow(times, ms) {
  const t = [...times].sort((x, y) => x - y);
  let best = 0;
  for (let i = 0, j = 0; j < t.length; j++) {
    while (t[j] - t[i] >= ms) i++;
    best = Math.max(best, j - i + 1);
  }
  return best;
}

const FAST_SPEC = { rate_per_sec: 5000, burst: 1000, max_in_flight: 100 };

async function story(edge, { withPartner, run = 0 }) {
  const label = withPartner ? 'story' : 'alone';
  // Ids unique per run: the edge keeps each subscriber's limiter state (and a Retry-After
  // pause) in its Durable Object for the life of the edge process.
  const fastId = (i) => `fast_${run}_${i}`;
  const partnerId = `partner_${run}`;
  const o = await origin({ edge });
  const sinks = [];
  let partner = null;
  try {
    for (let i = 0; i < 4; i++) {
      const s = await startSink();
      sinks.push(s);
      await addSubscriber(o, {
        id: fastId(i),
        url: `${s.url}/in`,
        event_types: ['video.trending'],
        ...FAST_SPEC,
        lane: 'edge',
      });
    }
    if (withPartner) {
      partner = await strictPartner(10, 20);
      await addSubscriber(o, {
        id: partnerId,
        url: `${partner.url}/hooks`,
        event_types: ['video.*'],
        rate_per_sec: 10,
        burst: 20,
        max_in_flight: 8,
        lane: 'edge',
      });
    }
    const events = makeEvents(STORY_EVENTS, `evt_${label}`);
    const cpu0 = procCpu(o.pid);
    const started = performance.now();
    await postEvents(o, events, 100, 4);
    const ingestMs = performance.now() - started;
    const expected = STORY_EVENTS * 4;
    let rssMid = 0;
    const drained = await until(async () => {
      rssMid = Math.max(rssMid, vm(o.pid, 'VmRSS'));
      const counts = await Promise.all(sinks.map((s) => s.count()));
      return counts.reduce((a, b) => a + b, 0) >= expected ? counts : null;
    }, DRAIN_LIMIT_MS, 50);
    const sinkMs = performance.now() - started;
    // The four fast subscribers' deliveries, as the ledger records them.
    let m = await scrape(o);
    const fastSent = (mm) => [0, 1, 2, 3].reduce((n, i) => n + (mm[`fanout_subscriber_sent{subscriber="${fastId(i)}"}`] ?? 0), 0);
    const recorded = await until(async () => {
      m = await scrape(o);
      return fastSent(m) >= expected;
    }, 30_000, 20);
    const drainMs = performance.now() - started;
    const cpu = procCpu(o.pid) - cpu0;
    const partnerGot = partner ? partner.requests.length : 0;
    const totalSent = sentTotal(m);
    const res = {
      label,
      withPartner,
      events: STORY_EVENTS,
      drained: !!drained && !!recorded,
      sinkCounts: drained ?? (await Promise.all(sinks.map((s) => s.count()))),
      ingestMs,
      sinkMs,
      drainMs,
      fastRate: expected / (drainMs / 1000),
      deliveriesPerS: totalSent / (drainMs / 1000),
      totalSent,
      partnerGot,
      partner429: partner ? partner.stats.throttled : 0,
      // The most requests the partner saw in any 1 s window (its limit: burst 20, then 10/s).
      partnerMaxPerS: partner ? maxInWindow(partner.requests.map((r) => r.time), 1000) : 0,
      partnerPending: m[`fanout_subscriber_pending{subscriber="${partnerId}"}`] ?? 0,
      partnerRefusals: partner ? partner.stats.refusals : [],
      // The edge's own latency for the partner's first deliveries (its log lines), to tell
      // arrival jitter from sending too fast.
      partnerEdgeLatencies: partner ? edgeLatencies(edge, partnerId, 40) : [],
      dead: m['fanout_deliveries{status="dead"}'] ?? 0,
      deferrals: Object.entries(m)
        .filter(([k]) => k.startsWith('fanout_edge_deferrals_total'))
        .reduce((n, [, v]) => n + v, 0),
      edgeCallFailures: m.fanout_edge_call_failures_total ?? 0,
      rssPeak: vm(o.pid, 'VmHWM'),
      rssNow: vm(o.pid, 'VmRSS'),
      db: dbBytes(o.db),
      daemonCores: cpu / (drainMs / 1000),
    };
    log(
      `  ${label}: 4 fast subscribers drained ${expected} in ${(drainMs / 1000).toFixed(2)} s ` +
        `(ingest ${(ingestMs / 1000).toFixed(2)} s; ${res.fastRate.toFixed(0)}/s) — ledger sent ${totalSent}` +
        (partner ? `, partner got ${partnerGot} (429s: ${res.partner429})` : '') +
        `; peak RSS ${(res.rssPeak / 2 ** 20).toFixed(1)} MiB; db ${((res.db.db + res.db.wal) / 2 ** 20).toFixed(1)} MiB`,
    );
    return res;
  } finally {
    await o.stop();
    for (const s of sinks) s.stop();
    if (partner) await partner.close();
  }
}

// ---------- part 3: origin lane vs edge lane vs the sink alone ----------

async function laneOnce(sink, edge, lane, events, { build = 'current', bin = null, signature = 'hmac' } = {}) {
  const o = await origin({ edge: lane === 'edge' ? edge : null, bin });
  try {
    const ids = [];
    for (let i = 0; i < SUBSCRIBERS; i++) {
      const id = `${lane}_${i}`;
      ids.push(id);
      await addSubscriber(o, {
        id,
        url: `${sink.url}/lane/${i}`,
        event_types: ['video.*'],
        ...HELD,
        max_in_flight: lane === 'edge' ? 500 : 100,
        lane,
        ...(signature === 'hmac' ? {} : { signature }),
      });
    }
    await postEvents(o, makeEvents(events, `evt_${lane}`), 100, 4);
    const expected = events * SUBSCRIBERS;
    // Held subscribers had a burst of 1: up to one delivery each may already be out.
    await sleep(500);
    const before = sentTotal(await scrape(o));
    const sink0 = await sink.count();
    const th0 = threadCpu(o.pid);
    const m0 = machineBusy();
    const started = performance.now();
    await Promise.all(ids.map((id) => patchSubscriber(o, id, FAST)));
    const reached = await until(async () => (await sink.count()) - sink0 >= expected - before, DRAIN_LIMIT_MS, 20);
    let m = null;
    const recorded = await until(async () => {
      m = await scrape(o);
      return sentTotal(m) >= expected;
    }, 30_000, 10);
    const secs = (performance.now() - started) / 1000;
    const t = split(threadDelta(th0, threadCpu(o.pid)));
    const m1 = machineBusy();
    const got = (await sink.count()) - sink0;
    const res = {
      build,
      lane,
      signature,
      expected,
      drained: !!reached && !!recorded,
      recorded: sentTotal(m) - before,
      received: got,
      seconds: secs,
      rate: (sentTotal(m) - before) / secs,
      dead: m['fanout_deliveries{status="dead"}'] ?? 0,
      deferrals: Object.entries(m)
        .filter(([k]) => k.startsWith('fanout_edge_deferrals_total'))
        .reduce((n, [, v]) => n + v, 0),
      daemonCores: t.cpu / secs,
      writerCores: t.writerCpu / secs,
      writerRunnable: (t.writerCpu + t.writerWait) / secs,
      daemonWaitShare: t.wait / (t.cpu + t.wait || 1),
      daemonUsPerDelivery: (t.cpu / Math.max(1, sentTotal(m) - before)) * 1e6,
      writerUsPerDelivery: (t.writerCpu / Math.max(1, sentTotal(m) - before)) * 1e6,
      machine: (m1[0] - m0[0]) / (m1[1] - m0[1]),
      rssPeak: vm(o.pid, 'VmHWM'),
    };
    log(
      `  ${build === 'baseline' ? '[baseline] ' : ''}${lane} lane${signature === 'hmac' ? '' : ` (${signature})`}: ${res.rate.toFixed(0).padStart(6)} deliveries/s (${res.recorded} recorded sent, ${got} at the sink, ` +
        `in ${secs.toFixed(2)} s; daemon ${res.daemonCores.toFixed(2)} cores, writer ${res.writerCores.toFixed(2)}; ` +
        `${res.daemonUsPerDelivery.toFixed(1)} µs daemon CPU/delivery, writer ${res.writerUsPerDelivery.toFixed(1)}; ` +
        `daemon threads waited for a CPU ${(res.daemonWaitShare * 100).toFixed(0)}% of their runnable time; ` +
        `machine ${(res.machine * 100).toFixed(0)}% busy)${res.drained ? '' : ' — DID NOT DRAIN'}`,
    );
    return res;
  } finally {
    await o.stop();
  }
}

async function sinkAlone(sink) {
  const out = await runTool(path.join(SINK_DIR, 'target', 'release', 'load'), [`${sink.url}/load`, '64', '5'], 60_000);
  const [n, secs, rate] = out.trim().split(/\s+/).map(Number);
  log(`  sink alone: ${rate.toFixed(0)} requests/s (${n} in ${secs} s, 64 connections)`);
  return { n, secs, rate };
}

// ---------- part 4: ordered by key vs unordered, one subscriber ----------

/** A held subscriber `id` with `events` queued is released (its rate unlimited) and timed
 *  until the ledger records them all sent: {drained, rate (sent/s), seconds}. */
async function releaseAndDrain(o, id, events) {
  await sleep(500); // a burst of 1: one delivery may already be out
  const before = sentTotal(await scrape(o));
  const started = performance.now();
  await patchSubscriber(o, id, FAST);
  let m = null;
  const drained = await until(async () => {
    m = await scrape(o);
    return sentTotal(m) >= events;
  }, DRAIN_LIMIT_MS, 10);
  const seconds = (performance.now() - started) / 1000;
  return { drained: !!drained, rate: (sentTotal(m) - before) / seconds, seconds };
}

/** One subscriber on the origin lane drains `events` (over `keys` keys at `/data/key`),
 *  unordered or ordered by that key: deliveries/s recorded sent. */
async function orderingOnce(sink, ordered, events, keys) {
  const o = await origin();
  try {
    const id = ordered ? 'ordered' : 'unordered';
    await addSubscriber(o, {
      id,
      url: `${sink.url}/order/${id}`,
      event_types: ['video.*'],
      ...HELD,
      max_in_flight: 100,
      lane: 'origin',
      ...(ordered ? { ordering: 'key', ordering_key: '/data/key' } : {}),
    });
    const evs = makeEvents(events, `evt_${id}`).map((e, i) => ({ ...e, data: { ...e.data, key: `k${i % keys}` } }));
    await postEvents(o, evs, 100, 4);
    const res = { ordered, events, keys, ...(await releaseAndDrain(o, id, events)) };
    log(`  ${ordered ? `ordered by key (${keys} keys)` : 'unordered'}: ${res.rate.toFixed(0).padStart(6)} deliveries/s ` +
      `(${events} in ${res.seconds.toFixed(2)} s)${res.drained ? '' : ' — DID NOT DRAIN'}`);
    return res;
  } finally {
    await o.stop();
  }
}

// ---------- part 5: batched webhooks vs one event per request, one slow receiver ----------

/** A receiver that answers 200 after `ms`, counting the events it got (a batch's elements). */
async function slowReceiver(ms) {
  const http = await import('node:http');
  const seen = { events: 0, requests: 0 };
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      seen.requests += 1;
      seen.events += body.startsWith('{"events":[') ? JSON.parse(body).events.length : 1;
      setTimeout(() => res.end('ok'), ms);
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${server.address().port}`, seen, close: () => new Promise((r) => server.close(r)) };
}

/** One subscriber on the origin lane, `max_in_flight` 4, its receiver answering in 20 ms:
 *  `events` queued while it is held, then drained one per request or in batches of 100
 *  (events/s recorded sent). */
async function batchesOnce(batched, events) {
  const o = await origin();
  const rx = await slowReceiver(20);
  try {
    const id = batched ? 'batched' : 'single';
    await addSubscriber(o, {
      id,
      url: rx.url,
      event_types: ['video.*'],
      ...HELD,
      max_in_flight: 4,
      lane: 'origin',
      ...(batched ? { batch: { max_events: 100 } } : {}),
    });
    await postEvents(o, makeEvents(events, `evt_${id}`), 100, 4);
    const res = { batched, events, ...(await releaseAndDrain(o, id, events)), requests: rx.seen.requests };
    log(`  ${batched ? 'batches of 100' : 'one per request'}: ${res.rate.toFixed(0).padStart(6)} events/s ` +
      `(${events} in ${res.seconds.toFixed(2)} s, ${rx.seen.requests} requests)${res.drained ? '' : ' — DID NOT DRAIN'}`);
    return res;
  } finally {
    await o.stop();
    await rx.close();
  }
}

// ---------- main ----------

const median = (xs) => {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  if (!s.length) return NaN;
  const k = Math.floor(s.length / 2);
  return s.length % 2 ? s[k] : (s[k - 1] + s[k]) / 2;
};
const fmt = (v, d = 0) => (Number.isFinite(v) ? v.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d }) : 'n/a');
const mib = (b) => `${(b / 2 ** 20).toFixed(1)} MiB`;
const verdict = (ok) => (ok ? 'MET' : 'MISSED');

async function main() {
  const bin = originBinary();
  log(`daemon: ${bin}${/release/.test(bin) ? '' : '  (!! not a release build: set FANOUT_BIN=target/release/fanout)'}`);
  cargoBuild(SINK_DIR);
  cargoBuild(INGEST_DIR);
  const needEdge = ONLY.has('story') || ONLY.has('lanes');
  if (needEdge && !fs.existsSync(path.join(ROOT, 'build', 'index.js'))) {
    log('building the Worker (scripts/build-worker.sh)…');
    const r = spawnSync('bash', ['scripts/build-worker.sh'], { cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit'] });
    if (r.status !== 0) throw new Error('Worker build failed');
  }
  const sink = await startSink();
  const edge = needEdge ? (EDGE_RUNNER === 'api' ? await startEdgeApi() : await startEdge()) : null;
  if (edge) log(`edge: ${EDGE_RUNNER === 'api' ? 'unstable_startWorker (inspector off)' : 'wrangler dev'} at ${edge.url}`);
  // With --baseline, both builds in every round, in alternating order.
  const builds = (round) => {
    if (!BASELINE) return [{ build: 'current', bin: null }];
    const both = [{ build: 'current', bin: null }, { build: 'baseline', bin: BASELINE }];
    return round % 2 ? both.reverse() : both;
  };
  const results = { baseline: BASELINE, edgeRunner: EDGE_RUNNER, ingest: [], story: [], lanes: [], sink: [], ordering: [], signatures: [], batches: [], when: new Date().toISOString(), cpus: (await import('node:os')).cpus().length };
  try {
    if (ONLY.has('ingest')) {
      log(`\n== ingest: ${INGEST_S} s per measurement, ${ROUNDS} round(s)`);
      for (let r = 0; r < ROUNDS; r++) {
        for (const [batch, held] of [[100, false], [1, false], [100, true], [1, true]]) {
          for (const b of builds(r)) {
            const variants = !opts.filtered ? [false] : r % 2 ? [true, false] : [false, true];
            for (const filtered of variants) results.ingest.push(await ingestOnce(sink, { batch, held, filtered, ...b }));
          }
        }
      }
    }
    if (ONLY.has('lanes')) {
      log(`\n== lanes: origin ${ORIGIN_EVENTS} x ${SUBSCRIBERS}, edge ${EDGE_EVENTS} x ${SUBSCRIBERS} deliveries, ${ROUNDS} round(s)`);
      for (let r = 0; r < ROUNDS; r++) {
        results.sink.push(await sinkAlone(sink));
        for (const b of builds(r)) results.lanes.push(await laneOnce(sink, edge, 'origin', ORIGIN_EVENTS, b));
        results.lanes.push(await laneOnce(sink, edge, 'edge', EDGE_EVENTS));
      }
    }
    if (ONLY.has('ordering')) {
      const n = clampInt(opts['order-events'], 100, 1_000_000);
      const keys = clampInt(opts['order-keys'], 1, 1_000_000);
      log(`\n== ordering: ${n} deliveries to one subscriber, unordered vs ordered by key over ${keys} keys, ${ROUNDS} round(s)`);
      for (let r = 0; r < ROUNDS; r++) {
        for (const ordered of r % 2 ? [true, false] : [false, true]) results.ordering.push(await orderingOnce(sink, ordered, n, keys));
      }
    }
    if (ONLY.has('batches')) {
      const single = clampInt(opts['single-events'], 100, 100_000);
      const batched = clampInt(opts['batch-events'], 100, 1_000_000);
      log(`\n== batches: one subscriber (20 ms answers, max_in_flight 4), ${single} events one per request vs ${batched} in batches of 100, ${ROUNDS} round(s)`);
      for (let r = 0; r < ROUNDS; r++) {
        for (const b of r % 2 ? [true, false] : [false, true]) results.batches.push(await batchesOnce(b, b ? batched : single));
      }
    }
    if (ONLY.has('signatures')) {
      log(`\n== signatures: origin lane, ${ORIGIN_EVENTS} x ${SUBSCRIBERS} deliveries signed v1 (hmac) vs v1a (ed25519), ${ROUNDS} round(s)`);
      for (let r = 0; r < ROUNDS; r++) {
        for (const signature of r % 2 ? ['ed25519', 'hmac'] : ['hmac', 'ed25519']) {
          results.signatures.push(await laneOnce(sink, null, 'origin', ORIGIN_EVENTS, { signature }));
        }
      }
    }
    if (ONLY.has('story')) {
      log(`\n== story: ${STORY_EVENTS} events x 5 subscribers through the edge`);
      for (let r = 0; r < STORY_ROUNDS; r++) {
        const order = opts['no-story-alone'] ? [true] : r % 2 ? [true, false] : [false, true];
        for (const withPartner of order) results.story.push(await story(edge, { withPartner, run: results.story.length }));
      }
    }
  } finally {
    if (edge) await edge.stop();
    sink.stop();
  }
  report(results);
  if (opts.json) fs.writeFileSync(opts.json, `${JSON.stringify(results, null, 2)}\n`);
}

function report(results) {
  const p = (s = '') => process.stdout.write(`${s}\n`);
  p(`\nOrigin daemon benchmark — ${results.when}, ${results.cpus} CPUs, medians of ${ROUNDS} round(s), ` +
    `edge under ${results.edgeRunner === 'api' ? 'unstable_startWorker (inspector off)' : 'wrangler dev'}\n`);
  if (results.ingest.length) {
    const pick = (batch, held, k, build = 'current', filtered = false) =>
      median(results.ingest.filter((r) => r.build === build && r.batch === batch && r.held === held && r.filtered === filtered).map((r) => r[k]));
    p(`Ingest, POST /v1/events, fan-out to ${SUBSCRIBERS} subscribers (events/s; ${INGEST_S} s each)`);
    p('| dispatcher                 | batches of 100 | single events | batch ÷ single |');
    p('|----------------------------|---------------:|--------------:|---------------:|');
    for (const held of [false, true]) {
      const b = pick(100, held, 'rate');
      const s = pick(1, held, 'rate');
      p(`| ${(held ? 'held (ingest cost alone)' : 'delivering (real life)').padEnd(26)} | ${fmt(b).padStart(14)} | ${fmt(s).padStart(13)} | ${fmt(b / s, 1).padStart(13)}× |`);
    }
    const bd = pick(100, false, 'rate');
    const bh = pick(100, true, 'rate');
    p(`  delivering ÷ held, batches: ${fmt(bd / bh, 2)}×; single: ${fmt(pick(1, false, 'rate') / pick(1, true, 'rate'), 2)}×`);
    p(`  while ingesting batches the sink received ${fmt(pick(100, false, 'dispatchedPerS'))} deliveries/s ` +
      `(single: ${fmt(pick(1, false, 'dispatchedPerS'))}/s)`);
    p('  daemon CPU per event (µs), all threads / the ledger writer thread; writer runnable share of the window:');
    for (const held of [false, true]) {
      for (const batch of [100, 1]) {
        p(`    ${held ? 'held      ' : 'delivering'} ${batch === 100 ? 'batches' : 'single '}: ` +
          `${fmt(pick(batch, held, 'daemonUsPerEvent'), 1)} / ${fmt(pick(batch, held, 'writerUsPerEvent'), 1)} µs; ` +
          `writer runnable ${fmt(pick(batch, held, 'writerRunnable') * 100)}% (waiting for a CPU ${fmt(pick(batch, held, 'writerWaitShare') * 100)}% of that); ` +
          `daemon ${fmt(pick(batch, held, 'daemonCores'), 2)} cores; machine ${fmt(pick(batch, held, 'machine') * 100)}% busy`);
      }
    }
    p(`  connections: ${BATCH_CONNS} for batches, ${SINGLE_CONNS} for single events; latency p50/p99 batches ` +
      `${fmt(pick(100, false, 'p50'), 1)}/${fmt(pick(100, false, 'p99'), 1)} ms, single ${fmt(pick(1, false, 'p50'), 1)}/${fmt(pick(1, false, 'p99'), 1)} ms`);
    p(`  target ≥ 20,000 events/s batched (delivering): ${verdict(bd >= 20_000)} (${fmt(bd)})\n`);
    if (results.ingest.some((r) => r.filtered)) {
      p(`Content filters: the same ${SUBSCRIBERS} subscribers, each with a 5-condition filter every event matches`);
      p('| measurement               | unfiltered | filtered | filtered ÷ unfiltered | writer µs/event unfiltered / filtered |');
      p('|---------------------------|-----------:|---------:|----------------------:|--------------------------------------:|');
      const ratios = [];
      for (const held of [false, true]) {
        for (const batch of [100, 1]) {
          const [u, f] = [pick(batch, held, 'rate'), pick(batch, held, 'rate', 'current', true)];
          ratios.push(f / u);
          const w = `${fmt(pick(batch, held, 'writerUsPerEvent'), 1)} / ${fmt(pick(batch, held, 'writerUsPerEvent', 'current', true), 1)}`;
          p(`| ${`${batch === 100 ? 'batches' : 'single '} ${held ? 'held' : 'delivering'}`.padEnd(25)} | ${fmt(u).padStart(10)} | ${fmt(f).padStart(8)} | ${`${fmt(f / u, 2)}×`.padStart(21)} | ${w.padStart(37)} |`);
        }
      }
      p(`  target filtered ≥ 0.9× unfiltered: ${verdict(ratios.every((x) => x >= 0.9))}\n`);
    }
  }
  if (results.lanes.length) {
    const lane = (l, k = 'rate', build = 'current') =>
      median(results.lanes.filter((r) => r.build === build && r.lane === l).map((r) => r[k]));
    const sinkRate = median(results.sink.map((r) => r.rate));
    const o = lane('origin');
    const e = lane('edge');
    p(`Delivery lanes, ${SUBSCRIBERS} subscribers → one local sink (deliveries/s recorded sent in the ledger)`);
    p('| path                                     | deliveries/s | ÷ sink alone | daemon cores | daemon CPU µs/delivery (writer) |');
    p('|------------------------------------------|-------------:|-------------:|-------------:|--------------------------------:|');
    p(`| sink alone (bench/sink load, 64 conns)   | ${fmt(sinkRate).padStart(12)} | ${'1.00×'.padStart(12)} | ${'—'.padStart(12)} | ${'—'.padStart(31)} |`);
    for (const [l, name] of [['origin', 'origin lane (daemon → sink)'], ['edge', 'edge lane (daemon → Worker → sink)']]) {
      const v = lane(l);
      p(`| ${name.padEnd(40)} | ${fmt(v).padStart(12)} | ${`${fmt(v / sinkRate, 3)}×`.padStart(12)} | ` +
        `${fmt(lane(l, 'daemonCores'), 2).padStart(12)} | ${`${fmt(lane(l, 'daemonUsPerDelivery'), 1)} (${fmt(lane(l, 'writerUsPerDelivery'), 1)})`.padStart(31)} |`);
    }
    p(`  origin ÷ edge: ${fmt(o / e, 1)}×; every run drained and recorded: ${results.lanes.every((r) => r.drained && r.recorded >= r.expected - SUBSCRIBERS) ? 'yes' : 'NO'}; ` +
      `dead: ${results.lanes.reduce((n, r) => n + r.dead, 0)}; edge deferrals: ${results.lanes.reduce((n, r) => n + r.deferrals, 0)}`);
    p(`  origin lane: peak RSS ${mib(lane('origin', 'rssPeak'))}; writer ${fmt(lane('origin', 'writerCores'), 2)} cores; ` +
      `daemon threads waited for a CPU ${fmt(lane('origin', 'daemonWaitShare') * 100)}% of their runnable time; machine ${fmt(lane('origin', 'machine') * 100)}% busy`);
    p(`  target origin lane ≥ 10,000 deliveries/s: ${verdict(o >= 10_000)} (${fmt(o)})\n`);
  }
  if (results.ordering.length) {
    const rate = (ordered) => median(results.ordering.filter((r) => r.ordered === ordered).map((r) => r.rate));
    const [u, k] = [rate(false), rate(true)];
    const { events, keys } = results.ordering[0];
    p(`Ordered delivery, one subscriber on the origin lane, ${events} deliveries (max_in_flight 100)`);
    p('| delivery                          | deliveries/s |');
    p('|-----------------------------------|-------------:|');
    p(`| unordered                         | ${fmt(u).padStart(12)} |`);
    p(`| ordered by key (${String(keys).padEnd(6)} keys)       | ${fmt(k).padStart(12)} |`);
    p(`  ordered ÷ unordered: ${fmt(k / u, 2)}×; target ≥ 0.8×: ${verdict(k / u >= 0.8)}; every run drained: ${results.ordering.every((r) => r.drained) ? 'yes' : 'NO'}\n`);
  }
  if (results.batches.length) {
    const rate = (b) => median(results.batches.filter((r) => r.batched === b).map((r) => r.rate));
    const [one, many] = [rate(false), rate(true)];
    p('Batched webhooks, one subscriber on the origin lane answering in 20 ms, max_in_flight 4');
    p('| requests            | events/s |');
    p('|---------------------|---------:|');
    p(`| one event each      | ${fmt(one).padStart(8)} |`);
    p(`| batches of 100      | ${fmt(many).padStart(8)} |`);
    p(`  batches ÷ single: ${fmt(many / one, 1)}×; target ≥ 20×: ${verdict(many / one >= 20)}; every run drained: ${results.batches.every((r) => r.drained) ? 'yes' : 'NO'}\n`);
  }
  if (results.signatures.length) {
    const sig = (s, k = 'rate') => median(results.signatures.filter((r) => r.signature === s).map((r) => r[k]));
    p(`Signatures, origin lane, ${SUBSCRIBERS} subscribers → one local sink (deliveries/s recorded sent)`);
    p('| signature          | deliveries/s | daemon CPU µs/delivery |');
    p('|--------------------|-------------:|-----------------------:|');
    for (const s of ['hmac', 'ed25519']) {
      p(`| ${`${s} (${s === 'hmac' ? 'v1' : 'v1a'})`.padEnd(18)} | ${fmt(sig(s)).padStart(12)} | ${fmt(sig(s, 'daemonUsPerDelivery'), 1).padStart(22)} |`);
    }
    const ratio = sig('ed25519') / sig('hmac');
    p(`  ed25519 ÷ hmac: ${fmt(ratio, 2)}×; every run drained: ${results.signatures.every((r) => r.drained) ? 'yes' : 'NO'}`);
    p(`  target ≥ 0.8×: ${verdict(ratio >= 0.8)}\n`);
  }
  if (results.baseline) {
    p(`This build ÷ baseline (${results.baseline}), same rounds, alternating order`);
    p('| measure                                   | baseline | this build | ratio |');
    p('|-------------------------------------------|---------:|-----------:|------:|');
    const cmp = (name, get, d = 0) => {
      const [b, c] = [get('baseline'), get('current')];
      if (Number.isFinite(b) && Number.isFinite(c)) p(`| ${name.padEnd(41)} | ${fmt(b, d).padStart(8)} | ${fmt(c, d).padStart(10)} | ${fmt(c / b, 2).padStart(4)}× |`);
    };
    const ing = (batch, held, k) => (b) =>
      median(results.ingest.filter((r) => r.build === b && r.batch === batch && r.held === held && !r.filtered).map((r) => r[k]));
    const ln = (l, k) => (b) => median(results.lanes.filter((r) => r.build === b && r.lane === l).map((r) => r[k]));
    cmp('ingest batches, delivering (events/s)', ing(100, false, 'rate'));
    cmp('ingest single, delivering (events/s)', ing(1, false, 'rate'));
    cmp('ingest batches, held (events/s)', ing(100, true, 'rate'));
    cmp('ingest single, held (events/s)', ing(1, true, 'rate'));
    cmp('writer CPU µs/event, batches held', ing(100, true, 'writerUsPerEvent'), 1);
    cmp('writer CPU µs/event, single held', ing(1, true, 'writerUsPerEvent'), 1);
    cmp('origin lane (deliveries/s)', ln('origin', 'rate'));
    cmp('origin lane daemon CPU µs/delivery', ln('origin', 'daemonUsPerDelivery'), 1);
    cmp('origin lane writer CPU µs/delivery', ln('origin', 'writerUsPerDelivery'), 1);
    p();
  }
  if (results.story.length) {
    // Medians over the story rounds, per field (each row is one measure).
    const agg = (runs) => {
      if (!runs.length) return null;
      const m = { withPartner: runs[0].withPartner, db: {}, n: runs.length };
      for (const k of Object.keys(runs[0])) {
        if (typeof runs[0][k] === 'number') m[k] = median(runs.map((r) => r[k]));
      }
      for (const k of ['db', 'wal', 'shm']) m.db[k] = median(runs.map((r) => r.db[k]));
      m.partner429 = Math.max(...runs.map((r) => r.partner429));
      m.partnerMaxPerS = Math.max(...runs.map((r) => r.partnerMaxPerS));
      m.rssPeak = Math.max(...runs.map((r) => r.rssPeak));
      m.dead = Math.max(...runs.map((r) => r.dead));
      return m;
    };
    const s = agg(results.story.filter((r) => r.withPartner));
    const a = agg(results.story.filter((r) => !r.withPartner));
    p(`The story through the edge lane (${results.edgeRunner === 'api' ? 'inspector off' : 'wrangler dev'}): ${STORY_EVENTS} video.trending events × 5 subscribers` +
      ` (median of ${STORY_ROUNDS} run(s) each; peak RSS, 429s, dead: the worst run)`);
    p('| measure                                  | with the partner | without it |');
    p('|------------------------------------------|-----------------:|-----------:|');
    const row = (name, f) => p(`| ${name.padEnd(40)} | ${(s ? f(s) : 'n/a').padStart(16)} | ${(a ? f(a) : 'n/a').padStart(10)} |`);
    row('four fast subscribers drained (s)', (r) => fmt(r.drainMs / 1000, 2));
    row('  of which ingest of the burst (s)', (r) => fmt(r.ingestMs / 1000, 2));
    row('deliveries/s (all recorded sent ÷ drain)', (r) => fmt(r.deliveriesPerS));
    row('daemon peak RSS (VmHWM)', (r) => mib(r.rssPeak));
    row('database file + WAL', (r) => `${mib(r.db.db)} + ${mib(r.db.wal)}`);
    row('partner: received / 429s', (r) => (r.withPartner ? `${r.partnerGot} / ${r.partner429}` : '—'));
    row('partner: most requests in any 1 s', (r) => (r.withPartner ? String(r.partnerMaxPerS) : '—'));
    row('dead / edge deferrals', (r) => `${r.dead} / ${r.deferrals}`);
    row('daemon cores during the drain', (r) => fmt(r.daemonCores, 2));
    if (s && a) p(`  drain with the partner ÷ without: ${fmt(s.drainMs / a.drainMs, 2)}×`);
    for (const r of results.story.filter((x) => x.partner429 > 0)) {
      p(`  partner 429 in run ${results.story.indexOf(r)}: ${JSON.stringify(r.partnerRefusals)}; ` +
        `edge latency of its first deliveries (ms): ${r.partnerEdgeLatencies.join(' ')}`);
    }
    if (s) {
      p(`  target peak RSS ≤ 100 MB: ${verdict(s.rssPeak <= 100e6)} (${fmt(s.rssPeak / 1e6, 1)} MB); partner 429s = 0: ${verdict(s.partner429 === 0)}`);
    }
  }
}

main().catch((e) => {
  log(e.stack ?? String(e));
  process.exit(1);
});
