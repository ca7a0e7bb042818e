// Ledger-size benchmark (issue 10, "Day 30"): the daemon on a ledger already holding 0, 1 million,
// 10 million (and 50 million) deliveries, measured side by side in one run, ratios against the
// empty ledger. Not a test: it prints numbers. BENCHMARKS.md ("Ledger size") has the reading.
//
//   cargo build --release -p fanout-origin
//   node bench/ledger.mjs [--sizes 0,1000000,10000000] [--ingest-seconds 5] [--keep]
//   node bench/ledger.mjs --paired 10000000     empty vs big served at once: latencies interleaved,
//                                               then rates in alternating rounds [--rate-rounds 3]
//   node bench/ledger.mjs --paired 50000000 --dir D --keep     keeps D/paired-50000000.db;
//   node bench/ledger.mjs --paired 50000000 --reuse D/paired-50000000.db   measures it again
//
// For each size: a fresh ledger made by the release daemon (migrated, five subscribers held at
// 0.001/s pointing at bench/sink), stopped, then filled by direct SQL (the sqlite3 CLI, one
// transaction, journal off): size/5 events spread over the last 24 hours (about 250 bytes each,
// like bench/ingest's), five deliveries each (1% dead, the rest sent), one attempt per delivery.
// The ledger's own triggers keep their counts as the rows go in. Then the daemon starts on it:
//   scrape   GET /metrics, 30 times: median and max
//   stats    GET /v1/subscribers?stats=true, 30 times: median
//   dead     GET /v1/deliveries?status=dead&limit=100, 200 times: p50 and p99
//   series   (--paired) GET /v1/series?window=1h and 1d over the charts' buckets every
//            ledger holds alike (seeded full: 2 h of 10 s and 2 days of 5 min, 5 subscribers)
//   ingest   bench/ingest, 4 connections, batches of 100, fan-out 5, subscribers held: events/s
//   origin   the five subscribers released at once (rate 1e6/s) on the backlog ingest left:
//            origin-lane deliveries/s until bench/sink has received all of it
//   size     database + WAL bytes at the end
//   purge    (sizes above 0) restarted with --retain-sent/--retain-dead 23h, so the seeded day's
//            first hour is past its window: deliveries removed per second by the pass, its
//            longest step, and bench/ingest running meanwhile (events/s, request p99)
// "0, no triggers" is the empty ledger with the count triggers dropped: their write cost.
// The big files are deleted after each size (unless --keep).

import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { ROOT, freePort, sleep } from '../tests/lib/harness.mjs';
import { SINK_DIR, cargoBuild, children, log, startSink } from './lib.mjs';

const { values: opts } = parseArgs({
  options: {
    sizes: { type: 'string', default: '0,1000000,10000000' },
    'ingest-seconds': { type: 'string', default: '5' },
    'no-trigger-baseline': { type: 'boolean', default: false },
    // Latencies only, paired: an empty ledger and one of this many deliveries served at once,
    // requests alternating between them (the machine's load hits both alike).
    paired: { type: 'string' },
    keep: { type: 'boolean', default: false },
    // --paired only: this big ledger (kept by an earlier --keep run) instead of seeding one.
    reuse: { type: 'string' },
    // --paired only: rounds of the rate measurements (ingest, then origin-lane drain).
    'rate-rounds': { type: 'string', default: '3' },
    dir: { type: 'string' },
  },
});
const SIZES = opts.sizes.split(',').map((s) => Math.trunc(Number(s)));
const RATE_ROUNDS = Math.max(0, Math.trunc(Number(opts['rate-rounds'])) || 0);
const INGEST_S = Math.max(1, Math.trunc(Number(opts['ingest-seconds'])) || 5);
const BIN = process.env.FANOUT_BIN ?? path.join(ROOT, 'target', 'release', 'fanout');
const INGEST = path.join(ROOT, 'bench', 'ingest', 'target', 'release', 'ingest');
const TOKEN = 'bench-token-0123456789';
const SUBSCRIBERS = 5;
const WORK = opts.dir ?? (await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-ledger-bench-')));

// ---------- the daemon ----------

async function serve(db, extra = []) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const child = spawn(BIN, ['serve', '--db', db, '--listen', `127.0.0.1:${port}`, '--allow-loopback', ...extra], {
    env: { ...process.env, FANOUT_API_TOKEN: TOKEN, FANOUT_LOG: 'warn' },
    stdio: ['ignore', 'ignore', 'inherit'],
    detached: true,
  });
  children.push(child);
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${url}/healthz`)).status === 200) break;
    } catch {
      /* not yet */
    }
    if (i > 600) throw new Error('the daemon did not start in 60 s');
    await sleep(100);
  }
  const api = (p, { method = 'GET', body } = {}) =>
    fetch(`${url}${p}`, {
      method: body && method === 'GET' ? 'POST' : method,
      headers: { authorization: `Bearer ${TOKEN}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
  };
  return { url, api, stop, pid: child.pid };
}

function sqlite(db, sql) {
  const r = spawnSync('sqlite3', [db], { input: sql, encoding: 'utf8', maxBuffer: 1 << 26 });
  if (r.status !== 0) throw new Error(`sqlite3: ${r.stderr}`);
  return r.stdout;
}

/** A migrated ledger with five held subscribers, then `deliveries` seeded by SQL. */
async function makeLedger(db, deliveries, sink) {
  const o = await serve(db);
  for (let i = 0; i < SUBSCRIBERS; i++) {
    const res = await o.api('/v1/subscribers', {
      body: { id: `sub_${i}`, url: `${sink.url}/in/${i}`, event_types: ['video.*'], rate_per_sec: 0.001, burst: 1,
        max_in_flight: 100, lane: 'origin' },
    });
    if (res.status !== 201) throw new Error(`subscriber: ${res.status} ${await res.text()}`);
  }
  await o.stop();
  seedSeries(db);
  if (deliveries === 0) return 0;
  const events = Math.ceil(deliveries / SUBSCRIBERS);
  const t0 = Date.now() - 86_400_000;
  const pad = 'x'.repeat(160);
  const started = Date.now();
  sqlite(db, `
    PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -1000000;
    BEGIN;
    WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ${events - 1})
    INSERT INTO events (id, type, body, received_ms)
      SELECT printf('evt_seed_%09d', i), 'video.trending',
        printf('{"id":"evt_seed_%09d","type":"video.trending","data":{"video":"v_%d","views":%d,"text":"${pad}"}}', i, i, i),
        ${t0} + i * 86400000 / ${events} FROM n;
    INSERT INTO deliveries (subscriber_id, event_id, status, attempts, next_attempt_ms, created_ms, updated_ms)
      SELECT 'sub_' || s.k, e.id, CASE WHEN (e.rowid * 5 + s.k) % 100 = 0 THEN 'dead' ELSE 'sent' END, 1,
        e.received_ms, e.received_ms, e.received_ms + 50
      FROM events e CROSS JOIN (SELECT 0 AS k UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
        UNION ALL SELECT 4) s;
    INSERT INTO attempts (delivery_id, attempt, at_ms, lane, outcome, status, latency_ms)
      SELECT id, 1, updated_ms, 'origin', CASE status WHEN 'dead' THEN 'rejected' ELSE 'delivered' END,
        CASE status WHEN 'dead' THEN 404 ELSE 200 END, 30 FROM deliveries;
    COMMIT;
    PRAGMA journal_mode = WAL;
  `);
  return (Date.now() - started) / 1000;
}

/** The charts' buckets of the five subscribers, every one full: two hours of 10 s buckets and
 * two days of 5 min ones (what retention keeps), the same in every ledger whatever its size. */
function seedSeries(db) {
  const hist = JSON.stringify(Array.from({ length: 66 }, (_, i) => (i >= 20 && i < 30 ? 10 : 0)));
  const subs = Array.from({ length: SUBSCRIBERS }, (_, k) => `SELECT ${k} AS k`).join(' UNION ALL ');
  const rows = (res, n) => `
    WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ${n - 1})
    INSERT OR REPLACE INTO series (resolution_ms, bucket_ms, subscriber_id, delivered, failed, deferred, rejected,
      latency, backlog, oldest_age_ms, in_flight, cap, paused, breaker_open)
      SELECT ${res}, (${Date.now()} / ${res} - i) * ${res}, 'sub_' || s.k, 100, 1, 0, 0, '${hist}', 5, 1000, 3, 100, 0, 0
      FROM n CROSS JOIN (${subs}) s;`;
  sqlite(db, `BEGIN; ${rows(10_000, 720)} ${rows(300_000, 576)} COMMIT;`);
}

// ---------- measurements ----------

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

async function timed(n, f) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    const res = await f();
    await res.arrayBuffer();
    if (res.status !== 200) throw new Error(`status ${res.status}`);
    out.push(performance.now() - t);
  }
  return out;
}

function runIngest(o) {
  return new Promise((resolve, reject) => {
    const c = spawn(INGEST, [o.url, TOKEN, '4', String(INGEST_S), '100', `evt_bench_${Date.now()}`], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    c.stdout.on('data', (d) => (out += d));
    c.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(`ingest exited ${code}`))));
  });
}

function fileBytes(db) {
  const size = (p) => (fs.existsSync(p) ? fs.statSync(p).size : 0);
  return size(db) + size(`${db}-wal`);
}

async function measure(label, deliveries, sink, { dropTriggers = false } = {}) {
  const db = path.join(WORK, `ledger-${label.replace(/\W+/g, '_')}.db`);
  log(`${label}: building the ledger (${deliveries.toLocaleString('en-US')} deliveries)…`);
  const seedS = await makeLedger(db, deliveries, sink);
  if (dropTriggers) {
    sqlite(db, 'DROP TRIGGER delivery_counts_insert; DROP TRIGGER delivery_counts_update; DROP TRIGGER delivery_counts_delete;');
  }
  const seededBytes = fileBytes(db);
  log(`${label}: seeded in ${seedS.toFixed(0)} s, ${(seededBytes / 1e9).toFixed(2)} GB; measuring…`);
  const o = await serve(db);
  try {
    await timed(3, () => fetch(`${o.url}/metrics`)); // warm the page cache a little
    const scrape = await timed(30, () => fetch(`${o.url}/metrics`));
    const stats = await timed(30, () => o.api('/v1/subscribers?stats=true'));
    const dead = await timed(200, () => o.api('/v1/deliveries?status=dead&limit=100'));
    // The backlog ingest leaves, drained: counted at the sink (the ledger's own figures are off
    // when the count triggers are dropped), from before ingest (a held subscriber still has a
    // burst of one).
    const sink0 = await sink.count();
    const ing = await runIngest(o);
    const backlog = ing.deliveries;
    const t = performance.now();
    await Promise.all(
      Array.from({ length: SUBSCRIBERS }, (_, i) =>
        o.api(`/v1/subscribers/sub_${i}`, { method: 'PATCH', body: { rate_per_sec: 1_000_000, burst: 1_000_000 } })),
    );
    for (;;) {
      const got = (await sink.count()) - sink0;
      if (got >= backlog) break;
      if (performance.now() - t > 300_000) throw new Error(`drain timed out at ${got} of ${backlog}`);
      await sleep(50);
    }
    const drainS = (performance.now() - t) / 1000;
    await o.stop();
    // Purge: restart with 23h windows, so the seeded day's first hour is past them; ingest runs
    // (subscribers at full speed) while the pass removes it, step by step.
    let purge = null;
    if (deliveries > 0) {
      const started = Date.now();
      const p = await serve(db, ['--retain-sent', '23h', '--retain-dead', '23h']);
      try {
        const ingestRun = runIngest(p);
        let r;
        for (;;) {
          r = await (await p.api('/v1/retention')).json();
          if ((r.last_run_at_ms ?? 0) >= started) break;
          if (Date.now() - started > 600_000) throw new Error('the purge pass took over 10 minutes');
          await sleep(100);
        }
        // From the pass's start (its cut-off time) to when it was seen complete (100 ms polls).
        const purgeS = (Date.now() - r.last_run_at_ms) / 1000;
        const during = await ingestRun;
        purge = {
          removed: r.removed_sent + r.removed_dead,
          perS: (r.removed_sent + r.removed_dead) / purgeS,
          longestStepMs: r.longest_step_ms,
          ingestP99Ms: during.p99_ms,
          ingestPerS: during.events / during.elapsed_s,
        };
      } finally {
        await p.stop();
      }
    }
    return {
      purge,
      label,
      deliveries,
      seedS,
      scrapeMs: pct(scrape, 50),
      scrapeMaxMs: Math.max(...scrape),
      statsMs: pct(stats, 50),
      deadP50Ms: pct(dead, 50),
      deadP99Ms: pct(dead, 99),
      ingestPerS: ing.events / ing.elapsed_s,
      ingestP99Ms: ing.p99_ms,
      originPerS: backlog / drainS,
      backlog,
      bytes: fileBytes(db),
    };
  } finally {
    await o.stop().catch(() => {});
    if (!opts.keep) for (const f of [db, `${db}-wal`, `${db}-shm`]) await fsp.rm(f, { force: true });
  }
}

/** Scrape, stats and dead-list latencies of an empty ledger and an `n` one, interleaved. */
async function paired(n, sink) {
  const reuse = opts.reuse && fs.existsSync(opts.reuse);
  const dbs = [path.join(WORK, 'paired-0.db'), reuse ? opts.reuse : path.join(WORK, `paired-${n}.db`)];
  log(`paired: building the ledgers (0 and ${n.toLocaleString('en-US')} deliveries)…`);
  for (const db of reuse ? dbs.slice(0, 1) : dbs) for (const f of [db, `${db}-wal`, `${db}-shm`]) await fsp.rm(f, { force: true });
  await makeLedger(dbs[0], 0, sink);
  let seedS = 0;
  if (reuse) {
    // A big ledger kept by an earlier run (--keep), used in place: this run's ingest adds a few
    // hundred thousand deliveries to it.
    log(`paired: reusing ${opts.reuse}`);
  } else {
    seedS = await makeLedger(dbs[1], n, sink);
    if (opts.keep) log(`paired: ${dbs[1]} kept (--reuse it next time)`);
  }
  log(`paired: ${(fileBytes(dbs[1]) / 1e9).toFixed(2)} GB; measuring…`);
  const daemons = [await serve(dbs[0]), await serve(dbs[1])];
  const kinds = {
    scrape: (o) => fetch(`${o.url}/metrics`),
    stats: (o) => o.api('/v1/subscribers?stats=true'),
    dead: (o) => o.api('/v1/deliveries?status=dead&limit=100'),
    'series 1h': (o) => o.api('/v1/series?window=1h'),
    'series 1d': (o) => o.api('/v1/series?window=1d'),
  };
  const times = Object.fromEntries(Object.keys(kinds).map((k) => [k, [[], []]]));
  const rates = { ingest: [[], []], ingestP99: [[], []], origin: [[], []] };
  const setRate = (o, rate) =>
    Promise.all(Array.from({ length: SUBSCRIBERS }, (_, i) =>
      o.api(`/v1/subscribers/sub_${i}`, { method: 'PATCH', body: { rate_per_sec: rate, burst: rate > 1 ? rate : 1 } })));
  try {
    for (const o of daemons) for (const f of Object.values(kinds)) await timed(3, () => f(o));
    for (let i = 0; i < 200; i++) {
      for (const [k, f] of Object.entries(kinds)) {
        for (const d of i % 2 ? [1, 0] : [0, 1]) times[k][d].push(...(await timed(1, () => f(daemons[d]))));
      }
    }
    // Rates, paired the same way: rounds alternating which ledger goes first; in each, ingest
    // (subscribers held) for INGEST_S seconds, then the backlog drained at full speed and the
    // subscribers held again.
    for (let r = 0; r < RATE_ROUNDS; r++) {
      for (const d of r % 2 ? [1, 0] : [0, 1]) {
        const o = daemons[d];
        const sink0 = await sink.count();
        const ing = await runIngest(o);
        rates.ingest[d].push(ing.events / ing.elapsed_s);
        rates.ingestP99[d].push(ing.p99_ms);
        const t = performance.now();
        await setRate(o, 1_000_000);
        for (;;) {
          const got = (await sink.count()) - sink0;
          if (got >= ing.deliveries) break;
          if (performance.now() - t > 300_000) throw new Error(`drain timed out at ${got} of ${ing.deliveries}`);
          await sleep(20);
        }
        rates.origin[d].push(ing.deliveries / ((performance.now() - t) / 1000));
        await setRate(o, 0.001);
        log(`paired rates, round ${r + 1}, ${d ? 'big' : 'empty'}: ingest ${rates.ingest[d].at(-1).toFixed(0)} ` +
          `events/s, origin lane ${rates.origin[d].at(-1).toFixed(0)} deliveries/s`);
      }
    }
  } finally {
    for (const o of daemons) await o.stop();
  }
  const bytes = fileBytes(dbs[1]);
  if (!opts.keep && !reuse) for (const db of dbs) for (const f of [db, `${db}-wal`, `${db}-shm`]) await fsp.rm(f, { force: true });
  console.log(`paired, 200 rounds alternating: empty ledger vs ${n.toLocaleString('en-US')} deliveries ` +
    `(${(bytes / 1e9).toFixed(2)} GB, seeded in ${seedS.toFixed(0)} s)`);
  console.log('| request | empty p50 | big p50 | ratio | empty p99 | big p99 | ratio |');
  console.log('| --- | --: | --: | --: | --: | --: | --: |');
  for (const [k, [a, b]] of Object.entries(times)) {
    const [a50, b50, a99, b99] = [pct(a, 50), pct(b, 50), pct(a, 99), pct(b, 99)];
    console.log(`| ${k} | ${a50.toFixed(2)} | ${b50.toFixed(2)} | ${(b50 / a50).toFixed(2)}× | ${a99.toFixed(2)} | ` +
      `${b99.toFixed(2)} | ${(b99 / a99).toFixed(2)}× |`);
  }
  if (RATE_ROUNDS === 0) return;
  console.log(`\nrates, ${RATE_ROUNDS} rounds alternating (medians; per round in brackets):`);
  console.log('| rate | empty | big | ratio |');
  console.log('| --- | --: | --: | --: |');
  for (const [k, name] of [['ingest', 'ingest events/s (held)'], ['ingestP99', 'ingest request p99 (ms)'],
    ['origin', 'origin lane deliveries/s']]) {
    const [a, b] = rates[k];
    const f = (xs) => `${pct(xs, 50).toFixed(0)} [${xs.map((x) => x.toFixed(0)).join(', ')}]`;
    console.log(`| ${name} | ${f(a)} | ${f(b)} | ${(pct(b, 50) / pct(a, 50)).toFixed(2)}× |`);
  }
}

// ---------- main ----------

if (!fs.existsSync(BIN)) throw new Error(`no ${BIN}: cargo build --release -p fanout-origin`);
if (!fs.existsSync(INGEST)) cargoBuild(path.join(ROOT, 'bench', 'ingest'));
if (!fs.existsSync(path.join(SINK_DIR, 'target', 'release', 'sink'))) cargoBuild(SINK_DIR);
const sink = await startSink();
if (opts.paired) {
  await paired(Math.trunc(Number(opts.paired)), sink);
  sink.stop();
  if (!opts.dir) await fsp.rm(WORK, { recursive: true, force: true });
  process.exit(0);
}
const results = [];
for (const n of SIZES) {
  results.push(await measure(n.toLocaleString('en-US'), n, sink));
  if (n === 0 && !opts['no-trigger-baseline']) {
    results.push(await measure('0, no triggers', 0, sink, { dropTriggers: true }));
  }
  log(JSON.stringify(results.at(-1)));
}
sink.stop();

const base = results[0];
const ratio = (v, b) => (b ? `${(v / b).toFixed(2)}×` : '');
const rows = [
  ['deliveries in the ledger', (r) => r.label],
  ['seeded in (s)', (r) => r.seedS.toFixed(0)],
  ['file size (MB)', (r) => (r.bytes / 1e6).toFixed(0)],
  ['ingest events/s', (r) => `${r.ingestPerS.toFixed(0)} (${ratio(r.ingestPerS, base.ingestPerS)})`],
  ['ingest request p99 (ms)', (r) => r.ingestP99Ms.toFixed(1)],
  ['origin lane deliveries/s', (r) => `${r.originPerS.toFixed(0)} (${ratio(r.originPerS, base.originPerS)})`],
  ['dead list p99 (ms)', (r) => `${r.deadP99Ms.toFixed(2)} (${ratio(r.deadP99Ms, base.deadP99Ms)})`],
  ['dead list p50 (ms)', (r) => r.deadP50Ms.toFixed(2)],
  ['/metrics scrape median (ms)', (r) => `${r.scrapeMs.toFixed(2)} (${ratio(r.scrapeMs, base.scrapeMs)})`],
  ['/metrics scrape max (ms)', (r) => r.scrapeMaxMs.toFixed(2)],
  ['?stats=true median (ms)', (r) => `${r.statsMs.toFixed(2)} (${ratio(r.statsMs, base.statsMs)})`],
  ['purge: deliveries removed (first hour)', (r) => (r.purge ? String(r.purge.removed) : '-')],
  ['purge: deliveries/s', (r) => (r.purge ? r.purge.perS.toFixed(0) : '-')],
  ['purge: longest step (ms)', (r) => (r.purge ? r.purge.longestStepMs.toFixed(1) : '-')],
  ['ingest during purge: events/s', (r) => (r.purge ? r.purge.ingestPerS.toFixed(0) : '-')],
  ['ingest during purge: p99 (ms)', (r) => (r.purge ? r.purge.ingestP99Ms.toFixed(1) : '-')],
];
const table = rows.map(([name, f]) => [name, ...results.map(f)]);
const widths = table[0].map((_, c) => Math.max(...table.map((r) => String(r[c]).length)));
for (const r of table) console.log(`| ${r.map((v, c) => String(v).padEnd(widths[c])).join(' | ')} |`);
if (!opts.dir) await fsp.rm(WORK, { recursive: true, force: true });
process.exit(0);
