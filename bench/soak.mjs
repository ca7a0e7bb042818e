// Retention soak (issue 10): steady traffic against a daemon with a short retention, for several
// retention windows. Not a test: it prints a time series and a verdict. BENCHMARKS.md ("Ledger
// size", soak) has the reading.
//
//   cargo build --release -p fanout-origin
//   node bench/soak.mjs [--window-seconds 60] [--windows 5] [--rate 100]
//
// The daemon runs with --retain-sent and --retain-dead set to the window. Five subscribers on
// bench/sink (200 at once) take every `video.*` event; a sixth answers 404 to `audit.*` events
// (1 in 50), which go dead at once. A producer posts `rate` events/s in batches of 10 every
// 100 ms and times every request. Every 5 s: database + WAL size, the daemon's RSS, what
// retention removed and its longest step. Verdict: after the first window, file size and RSS
// within ±10% of their mean, and no ingest request slower than 100 ms.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { ROOT, freePort, sleep } from '../tests/lib/harness.mjs';
import { SINK_DIR, cargoBuild, children, log, startSink } from './lib.mjs';

const { values: opts } = parseArgs({
  options: {
    'window-seconds': { type: 'string', default: '60' },
    windows: { type: 'string', default: '5' },
    rate: { type: 'string', default: '100' },
  },
});
const WINDOW_S = Math.max(5, Number(opts['window-seconds']));
const WINDOWS = Math.max(2, Number(opts.windows));
const RATE = Math.max(10, Number(opts.rate));
const BIN = process.env.FANOUT_BIN ?? path.join(ROOT, 'target', 'release', 'fanout');
const TOKEN = 'soak-token-0123456789';

if (!fs.existsSync(path.join(SINK_DIR, 'target', 'release', 'sink'))) cargoBuild(SINK_DIR);
const sink = await startSink();
const gone = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => res.writeHead(404).end('gone'));
});
await new Promise((r) => gone.listen(0, '127.0.0.1', r));
const goneUrl = `http://127.0.0.1:${gone.address().port}/audit`;

const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-soak-'));
const db = path.join(dir, 'fanout.db');
const port = await freePort();
const url = `http://127.0.0.1:${port}`;
const window = `${WINDOW_S}s`;
const child = spawn(BIN, ['serve', '--db', db, '--listen', `127.0.0.1:${port}`, '--allow-loopback',
  '--retain-sent', window, '--retain-dead', window, '--max-attempts', '1'], {
  env: { ...process.env, FANOUT_API_TOKEN: TOKEN, FANOUT_LOG: 'warn' },
  stdio: ['ignore', 'ignore', 'inherit'],
  detached: true,
});
children.push(child);
const api = (p, body, method = body ? 'POST' : 'GET') =>
  fetch(`${url}${p}`, {
    method,
    headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
    body: body ? JSON.stringify(body) : undefined,
  });
for (let i = 0; ; i++) {
  try {
    if ((await fetch(`${url}/healthz`)).status === 200) break;
  } catch {
    /* not yet */
  }
  if (i > 300) throw new Error('the daemon did not start');
  await sleep(100);
}
for (let i = 0; i < 5; i++) {
  const r = await api('/v1/subscribers', { id: `sub_${i}`, url: `${sink.url}/in/${i}`, event_types: ['video.*'],
    rate_per_sec: 100_000, burst: 100_000, max_in_flight: 64, lane: 'origin' });
  if (r.status !== 201) throw new Error(await r.text());
}
{
  const r = await api('/v1/subscribers', { id: 'sub_gone', url: goneUrl, event_types: ['audit.*'],
    rate_per_sec: 100_000, burst: 100_000, max_in_flight: 8, lane: 'origin' });
  if (r.status !== 201) throw new Error(await r.text());
}

const rss = () => {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${child.pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : NaN;
};
const size = (p) => (fs.existsSync(p) ? fs.statSync(p).size : 0);
const pad = 'x'.repeat(160);

// The producer: RATE events/s, batches of 10 every 10/RATE s, each request timed.
const latencies = [];
let sentEvents = 0;
let stop = false;
const producer = (async () => {
  const every = 10_000 / RATE;
  let next = performance.now();
  let n = 0;
  while (!stop) {
    const batch = Array.from({ length: 10 }, () => {
      n += 1;
      return { id: `evt_soak_${n}`, type: n % 50 === 0 ? 'audit.denied' : 'video.trending', data: { n, text: pad } };
    });
    const t = performance.now();
    const r = await api('/v1/events', batch);
    await r.arrayBuffer();
    latencies.push({ at: Date.now(), ms: performance.now() - t });
    if (r.status !== 202) log(`ingest answered ${r.status}`);
    sentEvents += 10;
    next += every;
    const wait = next - performance.now();
    if (wait > 0) await sleep(wait);
  }
})();

const start = Date.now();
const samples = [];
const total = WINDOW_S * WINDOWS * 1000;
while (Date.now() - start < total) {
  await sleep(5000);
  const ret = await (await api('/v1/retention')).json();
  const s = {
    t: (Date.now() - start) / 1000,
    bytes: size(db) + size(`${db}-wal`),
    db: size(db),
    rss: rss(),
    events: sentEvents,
    removed: ret.removed_sent + ret.removed_dead,
    longestStepMs: ret.longest_step_ms,
  };
  samples.push(s);
  log(`t=${s.t.toFixed(0)}s file ${(s.bytes / 1e6).toFixed(1)} MB (db ${(s.db / 1e6).toFixed(1)}) rss ${(s.rss / 1e6).toFixed(1)} MB events ${s.events} removed ${s.removed} longest step ${s.longestStepMs} ms`);
}
stop = true;
await producer;
child.kill('SIGTERM');
await new Promise((r) => child.once('exit', r));
sink.stop();
gone.close();

const after = samples.filter((s) => s.t > WINDOW_S * 1.5);
const band = (xs) => {
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  return { mean, lo: Math.min(...xs) / mean - 1, hi: Math.max(...xs) / mean - 1 };
};
const f = band(after.map((s) => s.bytes));
const m = band(after.map((s) => s.rss));
const slow = latencies.filter((l) => l.ms > 100);
const sorted = latencies.map((l) => l.ms).sort((a, b) => a - b);
const last = samples.at(-1);
console.log(`window ${WINDOW_S}s × ${WINDOWS}, ${RATE} events/s (fan-out 5, 2% dead), ${latencies.length} ingest requests`);
console.log(`file size after the first window: mean ${(f.mean / 1e6).toFixed(1)} MB, ${(f.lo * 100).toFixed(1)}% / +${(f.hi * 100).toFixed(1)}%`);
console.log(`RSS after the first window: mean ${(m.mean / 1e6).toFixed(1)} MB, ${(m.lo * 100).toFixed(1)}% / +${(m.hi * 100).toFixed(1)}%`);
console.log(`ingest request latency: p50 ${sorted[Math.floor(sorted.length / 2)].toFixed(1)} ms, p99 ${sorted[Math.floor(sorted.length * 0.99)].toFixed(1)} ms, max ${sorted.at(-1).toFixed(1)} ms; over 100 ms: ${slow.length}`);
console.log(`retention removed ${last.removed} deliveries; longest step ${last.longestStepMs} ms`);
await fsp.rm(dir, { recursive: true, force: true });
process.exit(0);
