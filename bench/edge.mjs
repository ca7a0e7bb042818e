// Edge throughput benchmark (issue 2, "Performance"). Not a test: it prints numbers and ratios
// measured side by side in one run. Everything runs on 127.0.0.1 and every loop is bounded in time.
// BENCHMARKS.md has the commands, the reading and the results.
//
//   npm run bench:edge                      builds the Worker (if stale) and the sink, then runs
//   node bench/edge.mjs [--duration 5] [--warmup 1] [--prime 5] [--concurrency 8] [--rounds 3]
//                       [--runner cli|api] [--subscribers 1,10,100] [--batches 1,10,100]
//                       [--variant name=path/to/wrangler.toml ...] [--probe name=query ...]
//                       [--unsigned] [--json out.json]
//
// In one run it starts:
//   - the sink (bench/sink, Rust/hyper, one thread): answers 200 "ok"; its own capacity is
//     measured first with bench/sink's `load` client;
//   - the real edge (build/; with --runner cli, the default, through tests/lib/harness.mjs
//     startEdge, i.e. `wrangler dev`), with ALLOW_LOOPBACK_HTTP so it may deliver to the sink;
//   - the bare Worker (bench/bare-worker, JS): the same signed webhooks the edge sends (the same
//     headers, HMAC-SHA256 through crypto.subtle), 6 open at a time, and nothing else (no Durable
//     Object, no limiter, no result bookkeeping, no logging), under its own `wrangler dev` on
//     another port: the ceiling the edge is measured against. --unsigned adds a row for the same
//     Worker sending one header and no signature (`signed=0`, the ceiling of earlier runs).
// --runner api starts both through bench/start-worker.mjs instead (wrangler's programmatic API
// with the dev inspector off); --variant adds other builds of the edge and --probe adds
// bench/probe-worker with switches, both for investigation.
//
// Then, for each configuration, `concurrency` callers call back to back for `duration` seconds
// (after `warmup` seconds that are not counted). Before the first round every configuration is
// driven once for `prime` seconds, not counted either: the first seconds of a Worker pay one-time
// costs (V8 compiling the edge's 0.8 MB of wasm to optimised code on the same two cores,
// Durable Objects created with their SQLite files, connection pools), which in 1 s windows made
// the edge's first round read 0.55–0.6 of its later ones in two runs out of three. A configuration's rate is the deliveries that
// came back `delivered` (bare: fetches that got a 2xx) divided by the time from the start of the
// measured window until the last call in it returned. Rounds interleave edge and bare runs so
// that drift in the (shared, noisy) machine hits both alike, and alternate which goes first (odd
// rounds the bare Worker, even rounds the edge); the table shows the median, and the
// ratios are also given round by round (each from two windows run back to back) with their
// median. Each window starts once every Worker's processes have gone quiet (see settle()): the
// bare Worker's `wrangler dev` tooling is still logging its last window's inspector messages for
// 6–12 s after its calls end, and that work used to run inside the edge's window.
// Every edge subscriber has rate 1e6/s, burst 1e6 and max_in_flight 1e6, so nothing should be
// deferred; deferrals, failures and call errors are counted and printed.
//
// Besides the rate it reads, from /proc, the CPU time the Worker's process group spent (workerd
// and wrangler's Node process separately) per delivery that reached the sink.

import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { parseArgs } from 'node:util';

import { ROOT, freePort, newSecret, signedFetch, sleep, startEdge, wranglerDevArgs, wranglerEnv } from '../tests/lib/harness.mjs';
import { CLK_TCK, SINK_DIR, cargoBuild, children, log, machineBusy, procCpu, startSink } from './lib.mjs';

const { values: opts } = parseArgs({
  options: {
    duration: { type: 'string', default: '5' },
    warmup: { type: 'string', default: '1' },
    prime: { type: 'string', default: '5' },
    concurrency: { type: 'string', default: '8' },
    rounds: { type: 'string', default: '3' },
    runner: { type: 'string', default: 'cli' },
    subscribers: { type: 'string', default: '1,10,100' },
    batches: { type: 'string', default: '1,10,100' },
    // name=path/to/wrangler.toml: another build of the edge, measured alongside (investigation).
    variant: { type: 'string', multiple: true, default: [] },
    // name=query: bench/probe-worker with switches (e.g. do=1&log=1), measured like the bare Worker.
    probe: { type: 'string', multiple: true, default: [] },
    // Also measure the bare Worker unsigned (one header, no signature).
    unsigned: { type: 'boolean', default: false },
    json: { type: 'string' },
  },
});
const clamp = (v, lo, hi) => Math.min(Math.max(v, lo), hi);
const DURATION_S = clamp(Number(opts.duration), 1, 30);
const WARMUP_S = clamp(Number(opts.warmup), 0, 10);
const PRIME_S = clamp(Number(opts.prime), 0, 60);
const CONCURRENCY = clamp(Math.trunc(Number(opts.concurrency)), 1, 256);
const ROUNDS = clamp(Math.trunc(Number(opts.rounds)), 1, 10);
// cli: both Workers under `npx wrangler dev` (the edge through tests/lib/harness.mjs startEdge).
// api: both through bench/start-worker.mjs (wrangler's unstable_startWorker, dev inspector off).
const RUNNER = opts.runner === 'api' ? 'api' : 'cli';
const list = (v) => v.split(',').map((x) => clamp(Math.trunc(Number(x)), 1, 500)).filter(Number.isFinite);
const SUBSCRIBERS = list(opts.subscribers);
const BATCHES = list(opts.batches);
// The body every delivery (edge) and every fetch (bare) carries.
const BODY = JSON.stringify({ id: 'evt_bench', type: 'bench.event', data: { n: 1, text: 'x'.repeat(64) } });

// ---------- child processes ----------

function sinkCapacity(url, connections, seconds) {
  const bin = path.join(SINK_DIR, 'target', 'release', 'load');
  const r = spawnSync(bin, [`${url}/load`, String(connections), String(seconds)], { encoding: 'utf8', timeout: 60_000 });
  if (r.status !== 0) throw new Error(`load failed: ${r.stderr}`);
  const [n, secs, rate] = r.stdout.trim().split(/\s+/).map(Number);
  return { n, secs, rate };
}

/**
 * Runs a Worker in its own process group, waits for /healthz and returns {url, pgid, logs, stop}.
 * mode 'cli': `wrangler dev --config <config>` (the flags tests/lib/harness.mjs uses);
 * mode 'api': bench/start-worker.mjs (unstable_startWorker with the dev inspector off).
 */
async function startWorker(mode, config, vars = {}) {
  const port = await freePort();
  const persistDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-bench-'));
  let args;
  if (mode === 'cli') {
    const inspectorPort = await freePort();
    args = wranglerDevArgs({ config, port, inspectorPort, persistDir, vars });
  } else {
    args = [path.join(ROOT, 'bench', 'start-worker.mjs'), config, String(port), persistDir];
    for (const [k, v] of Object.entries(vars)) args.push(`${k}=${v}`);
  }
  const child = spawn(process.execPath, args, {
    cwd: ROOT,
    detached: true,
    stdio: ['pipe', 'pipe', 'pipe'],
    env: wranglerEnv(persistDir),
  });
  children.push(child);
  const logs = [];
  for (const stream of [child.stdout, child.stderr]) {
    let buf = '';
    stream.setEncoding('utf8');
    stream.on('data', (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        logs.push(buf.slice(0, i));
        buf = buf.slice(i + 1);
      }
    });
  }
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 90_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`${config} exited:\n${logs.slice(-30).join('\n')}`);
    try {
      const r = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2000) });
      await r.arrayBuffer();
      if (r.status === 200) break;
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) throw new Error(`${config} did not start:\n${logs.slice(-30).join('\n')}`);
    await sleep(100);
  }
  const stop = async () => {
    child.stdin.end();
    try {
      process.kill(-child.pid, 'SIGTERM');
    } catch {
      /* gone */
    }
    await sleep(1000);
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
    await fsp.rm(persistDir, { recursive: true, force: true });
  };
  return { url, pgid: child.pid, logs, stop };
}

// ---------- CPU accounting from /proc ----------

/** {comm: cpu seconds} summed over the processes of process group `pgid`. */
function groupCpu(pgid) {
  const out = {};
  for (const ent of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(ent)) continue;
    let stat;
    try {
      stat = fs.readFileSync(`/proc/${ent}/stat`, 'utf8');
    } catch {
      continue;
    }
    const close = stat.lastIndexOf(')');
    const comm = stat.slice(stat.indexOf('(') + 1, close);
    const f = stat.slice(close + 2).split(' '); // f[0] = state (field 3)
    if (Number(f[2]) !== pgid) continue; // field 5: pgrp
    const secs = (Number(f[11]) + Number(f[12])) / CLK_TCK; // fields 14, 15: utime, stime
    const key = /workerd/.test(comm) ? 'workerd' : comm === 'node' || comm.startsWith('MainThread') ? 'node' : comm;
    out[key] = (out[key] ?? 0) + secs;
  }
  return out;
}
function cpuDelta(a, b) {
  const d = {};
  // A process that went away (a Worker restart) makes the sum fall: report NaN, not a negative.
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    const v = (b[k] ?? 0) - (a[k] ?? 0);
    d[k] = v < 0 ? NaN : v;
  }
  return d;
}

// ---------- load generation ----------

/**
 * Runs `concurrency` callers back to back: `warmup` seconds uncounted, then `duration` seconds
 * counted. `call(seq)` returns {delivered, deferred, failed, other, error?}.
 */
async function drive(call, beforeMeasuring, warmupS = WARMUP_S, durationS = DURATION_S) {
  let seq = 0;
  const run = async (seconds, counted) => {
    const tot = { calls: 0, delivered: 0, deferred: 0, failed: 0, other: 0, errors: 0, firstError: null, lat: [] };
    const start = performance.now();
    const end = start + seconds * 1000;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (performance.now() < end) {
          const t = performance.now();
          let r;
          try {
            r = await call(seq++);
          } catch (e) {
            r = { error: e.cause?.code ?? e.message };
          }
          tot.calls++;
          tot.lat.push(performance.now() - t);
          if (r.error) {
            tot.errors++;
            tot.firstError ??= r.error;
            await sleep(10); // don't spin on a broken target
            continue;
          }
          tot.delivered += r.delivered;
          tot.deferred += r.deferred ?? 0;
          tot.failed += r.failed ?? 0;
          tot.other += r.other ?? 0;
        }
      }),
    );
    tot.elapsed = (performance.now() - start) / 1000;
    return tot;
  };
  if (warmupS > 0) await run(warmupS, false);
  await beforeMeasuring();
  return run(durationS, true);
}

function edgeCaller(edge, sinkUrl, subscribers, batch, secret) {
  const subs = Array.from({ length: subscribers }, (_, i) => ({
    id: `bench_s${subscribers}_b${batch}_${i}`,
    url: `${sinkUrl}/hook/${i}`,
    secrets: [secret],
    rate_per_sec: 1_000_000,
    burst: 1_000_000,
    max_in_flight: 1_000_000,
    timeout_ms: 10_000,
  }));
  let nonce = 0;
  return async (seq) => {
    const subscriber = subs[seq % subs.length];
    const call = nonce++;
    const deliveries = Array.from({ length: batch }, (_, j) => ({
      id: `dlv_${call}_${j}`,
      event_id: `evt_${call}_${j}`,
      type: 'bench.event',
      attempt: 1,
      body: BODY,
    }));
    const res = await signedFetch(`${edge.url}/v1/deliveries`, edge.key, JSON.stringify({ subscriber, deliveries }));
    const text = await res.text();
    if (res.status !== 200 && res.status !== 202) return { error: `HTTP ${res.status}: ${text.slice(0, 200)}` };
    const r = { delivered: 0, deferred: 0, failed: 0, other: 0 };
    for (const x of JSON.parse(text).results) {
      if (x.outcome === 'delivered') r.delivered++;
      else if (x.outcome === 'deferred') r.deferred++;
      else if (x.outcome === 'failed') r.failed++;
      else r.other++;
    }
    return r;
  };
}

function bareCaller(bare, sinkUrl, n, query = '') {
  const url = `${bare.url}/?n=${n}&url=${encodeURIComponent(`${sinkUrl}/hook/bare`)}${query ? `&${query}` : ''}`;
  return async (seq) => {
    // Probe calls with do=1 spread over 10 Durable Objects (a query `key`), like 10 subscribers.
    const res = await fetch(query ? `${url}&key=k${seq % 10}` : url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: BODY });
    const text = await res.text();
    if (res.status !== 200) return { error: `HTTP ${res.status}: ${text.slice(0, 200)}` };
    const j = JSON.parse(text);
    return { delivered: j.delivered, failed: j.failed };
  };
}

// Process groups of every Worker started (the edge, its variants, bare, probe): see settle().
const workerGroups = [];
const groupTotal = (pgid) => Object.values(groupCpu(pgid)).reduce((a, b) => a + b, 0);
const cpuOf = (groups) => groups.reduce((t, g) => t + groupTotal(g), 0);
const othersCpu = (pgid) => cpuOf(workerGroups.filter((g) => g !== pgid));

/**
 * Waits until no Worker's processes are busy (under 0.1 of a core over 0.5 s; at most 30 s).
 * wrangler dev's tooling works through a backlog of inspector messages after its Worker's calls
 * end (its Node process logs every one), and without this that backlog ran in the next window,
 * taking up to half of the machine from whichever Worker was measured there.
 */
async function settle() {
  const started = performance.now();
  let before = cpuOf(workerGroups);
  for (;;) {
    await sleep(500);
    const now = cpuOf(workerGroups);
    if (now - before < 0.05) break;
    before = now;
    if (performance.now() - started > 30_000) {
      log('  (the Workers did not go quiet within 30 s; measuring anyway)');
      break;
    }
  }
  return (performance.now() - started) / 1000;
}

async function measure(name, call, { sink, pgid, logs }) {
  const settledS = await settle();
  // Snapshots taken after the warmup: CPU, sink count and log lines cover the measured window.
  let cpu0, sink0, sinkCpu0, m0, logs0, others0;
  const r = await drive(call, async () => {
    sink0 = await sink.count();
    cpu0 = groupCpu(pgid);
    others0 = othersCpu(pgid);
    sinkCpu0 = procCpu(sink.pid);
    m0 = machineBusy();
    logs0 = logs?.length ?? 0;
  });
  const m1 = machineBusy();
  const cpu = cpuDelta(cpu0, groupCpu(pgid));
  // CPU the other Workers' processes used during this window (what settle() keeps near zero).
  const others = othersCpu(pgid) - others0;
  const sinkSeen = (await sink.count()) - sink0;
  const sinkCpu = procCpu(sink.pid) - sinkCpu0;
  const lat = r.lat.sort((a, b) => a - b);
  const res = {
    name,
    rate: r.delivered / r.elapsed,
    delivered: r.delivered,
    deferred: r.deferred,
    failed: r.failed,
    other: r.other,
    errors: r.errors,
    firstError: r.firstError,
    calls: r.calls,
    elapsed: r.elapsed,
    p50ms: lat[Math.floor(lat.length / 2)] ?? NaN,
    sinkSeen,
    // CPU seconds over the measured window (the sink saw `sinkSeen` requests in it).
    cpu,
    sinkCpu,
    others,
    settledS,
    machineBusyPct: (100 * (m1[0] - m0[0])) / (m1[1] - m0[1]),
    logLines: logs ? logs.length - logs0 : 0,
  };
  log(
    `  ${name.padEnd(22)} ${res.rate.toFixed(0).padStart(6)} deliveries/s  (${r.delivered} in ${r.elapsed.toFixed(2)} s, ` +
      `${r.calls} calls, p50 ${res.p50ms.toFixed(1)} ms, deferred ${r.deferred}, failed ${r.failed}, errors ${r.errors}` +
      `${r.firstError ? ` [${r.firstError}]` : ''}, cpu ${Object.entries(cpu).map(([k, v]) => `${k} ${v.toFixed(2)}s`).join(' ')}, ` +
      `other Workers ${others.toFixed(2)}s (settled ${settledS.toFixed(1)} s before), machine ${res.machineBusyPct.toFixed(0)}% busy)`,
  );
  return res;
}

// ---------- main ----------

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const fmt = (x) => (Number.isFinite(x) ? x.toFixed(0) : '-');
const ratio = (a, b) => (b > 0 ? a / b : NaN);

async function main() {
  if (!fs.existsSync(path.join(ROOT, 'build', 'index_bg.wasm'))) {
    throw new Error('build/ is missing: run `bash scripts/build-worker.sh` first (npm run bench:edge does)');
  }
  const wasm = fs.readFileSync(path.join(ROOT, 'build', 'index_bg.wasm'));
  const wasmGz = zlib.gzipSync(wasm, { level: 9 }).length;

  cargoBuild(SINK_DIR);
  const sink = await startSink();
  log(`sink ${sink.url}; measuring its own capacity (bench/sink load, 64 connections, 3 s)…`);
  const cap = sinkCapacity(sink.url, 64, 3);
  log(`  sink alone: ${cap.rate.toFixed(0)} req/s`);

  const bareConfig = path.join(ROOT, 'bench', 'bare-worker', 'wrangler.toml');
  const edges = []; // {label, url, key, pgid, logs, stop}
  try {
    if (RUNNER === 'cli') {
      log('starting the edge (harness startEdge: wrangler dev, build/) and the bare Worker (wrangler dev, bench/bare-worker)…');
      const e = await startEdge();
      edges.push({ ...e, label: 'edge', pgid: e.process.pid });
    } else {
      log('starting the edge and the bare Worker through bench/start-worker.mjs (dev inspector off)…');
      const key = newSecret();
      const vars = { EDGE_SIGNING_KEY: key, ALLOW_LOOPBACK_HTTP: 'true' };
      edges.push({ ...(await startWorker('api', path.join(ROOT, 'wrangler.toml'), vars)), key, label: 'edge' });
    }
    for (const v of opts.variant) {
      const [name, config] = v.split('=');
      log(`starting edge variant ${name} (${config})…`);
      const key = newSecret();
      const vars = { EDGE_SIGNING_KEY: key, ALLOW_LOOPBACK_HTTP: 'true' };
      edges.push({ ...(await startWorker(RUNNER, path.resolve(config), vars)), key, label: `edge[${name}]` });
    }
  } catch (e) {
    for (const x of edges) await x.stop();
    throw e;
  }
  const bare = await startWorker(RUNNER, bareConfig);
  const probes = [];
  let probe = null;
  if (opts.probe.length) {
    probe = await startWorker(RUNNER, path.join(ROOT, 'bench', 'probe-worker', 'wrangler.toml'));
    for (const v of opts.probe) {
      const i = v.indexOf('=');
      probes.push({ label: `probe[${v.slice(0, i)}]`, query: v.slice(i + 1) });
    }
  }
  workerGroups.push(...edges.map((e) => e.pgid), bare.pgid, ...(probe ? [probe.pgid] : []));
  const secret = newSecret();
  log(`${edges.map((e) => `${e.label} ${e.url}`).join(', ')}, bare ${bare.url}; ${CONCURRENCY} concurrent calls, ` +
    `${WARMUP_S} s warmup + ${DURATION_S} s per configuration, ${ROUNDS} round(s)`);

  const results = {}; // name -> [runs]
  const push = (r) => (results[r.name] ??= []).push(r);
  const edgeName = (e, s, b) => `${e.label} subs=${s} batch=${b}`;
  // What is measured at each batch size: the ceilings (the bare Worker, its unsigned row, the
  // probes), then each edge at 1, 10, 100 subscribers.
  const configurations = BATCHES.map((b) => ({
    ceilings: [
      { name: `bare N=${b}`, call: bareCaller(bare, sink.url, b), pgid: bare.pgid },
      ...(opts.unsigned ? [{ name: `bare unsigned N=${b}`, call: bareCaller(bare, sink.url, b, 'signed=0'), pgid: bare.pgid }] : []),
      ...probes.map((pr) => ({ name: `${pr.label} N=${b}`, call: bareCaller(probe, sink.url, b, pr.query), pgid: probe.pgid, logs: probe.logs })),
    ],
    edges: edges.flatMap((e) =>
      SUBSCRIBERS.map((s) => ({ name: edgeName(e, s, b), call: edgeCaller(e, sink.url, s, b, secret), pgid: e.pgid, logs: e.logs })),
    ),
  }));
  try {
    if (PRIME_S > 0) {
      log(`priming every configuration for ${PRIME_S} s (not counted)`);
      for (const { ceilings, edges: atB } of configurations) {
        for (const c of [...ceilings, ...atB]) await drive(c.call, async () => {}, 0, PRIME_S);
      }
    }
    for (let round = 1; round <= ROUNDS; round++) {
      log(`round ${round}/${ROUNDS}`);
      // Interleave, batch size by batch size; odd rounds run the ceilings first, even rounds the
      // edges.
      for (const { ceilings, edges: atB } of configurations) {
        for (const c of round % 2 === 1 ? [...ceilings, ...atB] : [...atB, ...ceilings]) {
          push(await measure(c.name, c.call, { sink, pgid: c.pgid, logs: c.logs }));
        }
      }
    }
  } finally {
    for (const e of edges) await e.stop();
    await bare.stop();
    await probe?.stop();
    sink.stop();
  }

  // ---------- report ----------
  const rate = (name) => (results[name] ? median(results[name].map((r) => r.rate)) : NaN);
  const sum = (name, f) => (results[name] ?? []).reduce((s, r) => s + f(r), 0);
  const cpuPer = (name, key) => {
    const keys = key ? [key] : ['workerd', 'node'];
    return (1e6 * sum(name, (r) => keys.reduce((t, k) => t + (r.cpu[k] ?? 0), 0))) / Math.max(1, sum(name, (r) => r.sinkSeen));
  };
  const lines = [];
  const p = (s = '') => lines.push(s);
  const [bLo, bHi] = [BATCHES[0], BATCHES[BATCHES.length - 1]];
  const rows = [{ label: 'bare Worker (ceiling)', names: BATCHES.map((b) => `bare N=${b}`) }];
  if (opts.unsigned) rows.push({ label: 'bare Worker, unsigned', names: BATCHES.map((b) => `bare unsigned N=${b}`) });
  for (const pr of probes) rows.push({ label: `${pr.label} (${pr.query})`, names: BATCHES.map((b) => `${pr.label} N=${b}`) });
  for (const e of edges) {
    for (const s of SUBSCRIBERS) {
      rows.push({ label: `${e.label}, ${s} sub${s > 1 ? 's' : ''}`, names: BATCHES.map((b) => edgeName(e, s, b)) });
    }
  }
  const w = Math.max(...rows.map((r) => r.label.length));
  p(`Edge throughput, deliveries/s (runner ${RUNNER}: ${RUNNER === 'cli' ? 'wrangler dev' : 'unstable_startWorker, inspector off'}; ` +
    `median of ${ROUNDS} round(s); ${CONCURRENCY} concurrent calls; ${DURATION_S} s each after ${WARMUP_S} s warmup)`);
  p(`machine: ${os.cpus().length} cores, ${os.cpus()[0]?.model ?? '?'}, load avg ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
  p(`sink alone (bench/sink load, 64 conns): ${fmt(cap.rate)} req/s`);
  p('');
  const multi = BATCHES.length > 1;
  p(`| ${'target'.padEnd(w)} | ${BATCHES.map((b) => `batch/N=${b}`).join(' | ')} |${multi ? ` ${bHi} ÷ ${bLo} |` : ''}`);
  p(`| ${'-'.repeat(w)} | ${BATCHES.map(() => '---:').join(' | ')} |${multi ? ' ---: |' : ''}`);
  for (const r of rows) {
    const v = r.names.map(rate);
    p(`| ${r.label.padEnd(w)} | ${v.map(fmt).join(' | ')} |${multi ? ` ${ratio(v[v.length - 1], v[0]).toFixed(2)}× |` : ''}`);
  }
  p('');
  const bareHi = rate(`bare N=${bHi}`);
  const bareHiCpu = cpuPer(`bare N=${bHi}`);
  p(`Ratios (targets: ${multi ? `batch ${bHi} ÷ batch ${bLo} ≥ 4×; ` : ''}edge ÷ bare at ${bHi} ≥ 0.90). "by CPU" = the same ratio computed from CPU`);
  p('per delivery (workerd + wrangler\'s node), i.e. the throughput ratio on a CPU-bound machine; far less noisy than the rates:');
  for (const e of edges) {
    for (const s of SUBSCRIBERS) {
      const up = ratio(rate(edgeName(e, s, bHi)), rate(edgeName(e, s, bLo)));
      const upCpu = ratio(cpuPer(edgeName(e, s, bLo)), cpuPer(edgeName(e, s, bHi)));
      const vsBare = ratio(rate(edgeName(e, s, bHi)), bareHi);
      const byCpu = ratio(bareHiCpu, cpuPer(edgeName(e, s, bHi)));
      const batching = bHi !== bLo
        ? `batch ${bHi} ÷ ${bLo} = ${up.toFixed(2)}× ${up >= 4 ? 'PASS' : 'MISS'} (by CPU ${upCpu.toFixed(2)}×); `
        : '';
      p(
        `  ${`${e.label}, ${s} sub${s > 1 ? 's' : ''}`.padEnd(w)}: ${batching}` +
          `edge ÷ bare at ${bHi} = ${vsBare.toFixed(2)} ${vsBare >= 0.9 ? 'PASS' : 'MISS'} (by CPU ${byCpu.toFixed(2)})`,
      );
      // The same ratios round by round, each from windows run back to back (so a change in
      // what else the machine is doing hits both sides of a pair alike), and their median.
      const paired = (num, den) => (results[num] ?? []).map((r, i) => ratio(r.rate, results[den]?.[i]?.rate ?? NaN));
      const show = (xs) => `median ${median(xs).toFixed(2)} (rounds: ${xs.map((x) => x.toFixed(2)).join(', ')})`;
      p(`  ${''.padEnd(w)}  paired by round: edge ÷ bare at ${bHi} ${show(paired(edgeName(e, s, bHi), `bare N=${bHi}`))}` +
        (bHi !== bLo ? `; batch ${bHi} ÷ ${bLo} ${show(paired(edgeName(e, s, bHi), edgeName(e, s, bLo)))}` : ''));
      if (opts.unsigned) {
        const u = `bare unsigned N=${bHi}`;
        p(`  ${''.padEnd(w)}  against the unsigned bare Worker: edge ÷ bare at ${bHi} = ${ratio(rate(edgeName(e, s, bHi)), rate(u)).toFixed(2)}` +
          ` (by CPU ${ratio(cpuPer(u), cpuPer(edgeName(e, s, bHi))).toFixed(2)}), paired ${show(paired(edgeName(e, s, bHi), u))}`);
      }
    }
  }
  p('');
  const all = Object.values(results).flat();
  const deferred = all.reduce((s, r) => s + r.deferred, 0);
  const failed = all.reduce((s, r) => s + r.failed + r.other, 0);
  const errors = all.reduce((s, r) => s + r.errors, 0);
  const mismatch = all.filter((r) => r.sinkSeen !== r.delivered);
  p(`deferred: ${deferred}, failed/rejected: ${failed}, call errors: ${errors}` +
    `${mismatch.length ? `; the sink count differs from "delivered" in ${mismatch.length} run(s)` : '; every delivered request reached the sink'}`);
  const firstErr = all.find((r) => r.firstError);
  if (firstErr) {
    p(`first call error (${firstErr.name}): ${firstErr.firstError}`);
    p('(wrangler dev restarts the edge whenever anything under src/ changes; call errors mean the run is not valid: rerun it)');
  }
  p('');
  p('CPU per delivery, µs: workerd (the Worker runtime) + node (wrangler\'s own process), summed over all rounds:');
  p(`| ${'target'.padEnd(w)} | ${BATCHES.map((b) => `batch/N=${b}`).join(' | ')} |`);
  p(`| ${'-'.repeat(w)} | ${BATCHES.map(() => '---:').join(' | ')} |`);
  for (const r of rows) {
    p(`| ${r.label.padEnd(w)} | ${r.names.map((n) => `${cpuPer(n, 'workerd').toFixed(0)} + ${cpuPer(n, 'node').toFixed(0)}`).join(' | ')} |`);
  }
  const logLines = all.reduce((s, r) => s + r.logLines, 0);
  const edgeDelivered = all.filter((r) => r.name.startsWith('edge')).reduce((s, r) => s + r.sinkSeen, 0);
  // (probe rows with log=1 add their lines too)
  p(`edge output lines captured from the Worker processes: ${logLines} for ${edgeDelivered} deliveries`);
  p('');
  p(`Worker wasm (build/index_bg.wasm): ${wasm.length} bytes, gzipped ${wasmGz} bytes = ${(wasmGz / 1048576).toFixed(3)} MiB ` +
    `${wasmGz < 1048576 ? 'PASS' : 'MISS'} (target < 1 MiB)`);
  process.stdout.write(`${lines.join('\n')}\n`);
  if (opts.json) {
    const strip = (k, v) => (k === 'lat' ? undefined : v);
    const meta = { runner: RUNNER, DURATION_S, WARMUP_S, CONCURRENCY, ROUNDS, SUBSCRIBERS, BATCHES, variants: opts.variant, probes: opts.probe };
    fs.writeFileSync(opts.json, JSON.stringify({ meta, sink: cap, wasm: { bytes: wasm.length, gzip: wasmGz }, results }, strip, 2));
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    log(`bench failed: ${e.stack ?? e}`);
    process.exit(1);
  },
);
