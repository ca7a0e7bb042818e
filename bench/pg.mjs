// PostgreSQL ledger benchmark (issue 11, "Performance"). Not a test: it prints numbers and ratios
// measured side by side in one run. Everything runs on 127.0.0.1; every wait is bounded.
// BENCHMARKS.md ("PostgreSQL ledger") has the commands, the reading and the results.
//
//   cargo build --release -p fanout-origin
//   FANOUT_BIN=target/release/fanout node bench/pg.mjs [--rounds 2] [--events 10000]
//   # a configuration named NAME@before runs the binary given by --before-bin (an older
//   # build, for a before/after comparison in the same run), e.g.
//   #   --configs sqlite-1,pg-1@before,pg-1,pg-2 --before-bin /tmp/fanout-before
//   # where PostgreSQL's time goes: --statements (pg_stat_statements over each drain, per
//   # delivery), --explain-ms N (auto_explain: plans of statements slower than N ms, in the
//   # server's log), --keep-log FILE (that log, copied out before the server goes)
//
// Configurations, interleaved per round so drift on the shared machine hits them alike:
//   sqlite-1  one daemon on a fresh SQLite file (the default)
//   pg-1/2/3  one, two or three daemons on one fresh PostgreSQL database (a throwaway server
//             started here, default settings: fsync and synchronous_commit on)
// Each: 5 origin-lane subscribers of one bench/sink (max_in_flight 100 each, or
// --max-in-flight), held (0.001/s) while `--events` events are ingested (batches of 100 over 4
// connections, spread over the daemons: events/s), then all five
// released at once (PATCH to 1e6/s on the first daemon; the others hear it by NOTIFY) and the
// clock runs until the ledger records every delivery `sent` (deliveries/s). CPU (user + system,
// /proc) of the daemons and of every PostgreSQL process over each phase, per event and per
// delivery. While the deliveries go out, progress is read from the sink's request count (a
// counter in the sink's memory); the ledger's own count (GET /metrics, which asks the database)
// is polled only once the sink has seen them all, so the observer's queries do not weigh on
// the CPU measured.

import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { sleep, startOrigin, startPostgres } from '../tests/lib/harness.mjs';
import { CLK_TCK, SINK_DIR, cargoBuild, log, machineBusy, procCpu, startSink, makeEvents, until } from './lib.mjs';

const { values: opts } = parseArgs({
  options: {
    rounds: { type: 'string', default: '2' },
    events: { type: 'string', default: '10000' },
    configs: { type: 'string', default: 'sqlite-1,pg-1,pg-2,pg-3' },
    'before-bin': { type: 'string' },
    'max-in-flight': { type: 'string', default: '100' },
    statements: { type: 'boolean', default: false },
    'explain-ms': { type: 'string' },
    'keep-log': { type: 'string' },
  },
});
const ROUNDS = Math.min(Math.max(Number(opts.rounds) || 1, 1), 5);
const EVENTS = Math.min(Math.max(Number(opts.events) || 1000, 100), 100_000);
const CONFIGS = opts.configs.split(',');
const SUBSCRIBERS = 5;
const MAX_IN_FLIGHT = Math.min(Math.max(Number(opts['max-in-flight']) || 100, 1), 10_000);
const TOKEN = 'bench-token-0123456789';
const DRAIN_LIMIT_MS = 300_000;

const FAST = { rate_per_sec: 1_000_000, burst: 1_000_000 };
const HELD = { rate_per_sec: 0.001, burst: 1 };

/** CPU seconds of PostgreSQL: the postmaster (with the backends it has reaped) and the live
 * backends. */
function pgCpu(postmaster) {
  let total = 0;
  try {
    const stat = fs.readFileSync(`/proc/${postmaster}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    total += (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) / CLK_TCK;
  } catch {
    return 0;
  }
  for (const task of fs.readdirSync(`/proc/${postmaster}/task`)) {
    let kids = '';
    try {
      kids = fs.readFileSync(`/proc/${postmaster}/task/${task}/children`, 'utf8');
    } catch {
      continue;
    }
    for (const pid of kids.trim().split(/\s+/).filter(Boolean)) total += procCpu(pid);
  }
  return total;
}

/** `psql` of the newest installed PostgreSQL (the server the harness starts). */
const PSQL = (() => {
  const root = '/usr/lib/postgresql';
  const v = fs.existsSync(root)
    ? fs.readdirSync(root).filter((d) => fs.existsSync(`${root}/${d}/bin/psql`)).sort((a, b) => Number(a) - Number(b)).pop()
    : null;
  return v ? `${root}/${v}/bin/psql` : null;
})();

/** WAL written so far (bytes), transactions committed in `db` (a postgres:// URL), and the
 * time (ms) spent in PL/pgSQL functions there — the ledger's triggers (the server runs with
 * `track_functions = pl`). */
function pgCounters(db) {
  if (!PSQL) return { wal: 0, commits: 0, functionsMs: 0 };
  const r = spawnSync(
    PSQL,
    [
      db,
      '-XAtc',
      "SELECT pg_current_wal_lsn() - '0/0', xact_commit, (SELECT COALESCE(SUM(total_time), 0) FROM pg_stat_user_functions) FROM pg_stat_database WHERE datname = current_database()",
    ],
    { encoding: 'utf8' },
  );
  const [wal, commits, functionsMs] = r.stdout.trim().split('|').map(Number);
  return { wal: wal || 0, commits: commits || 0, functionsMs: functionsMs || 0 };
}

function psql(db, sql) {
  const r = spawnSync(PSQL, [db, '-XAtc', sql], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`psql: ${r.stderr}`);
  return r.stdout;
}

/** With --statements: where PostgreSQL's time went over the drain (executing and planning), per statement
 * (pg_stat_statements, nested statements — the triggers' — included), per delivery. */
function statements(db, delivered, what = 'delivery') {
  const rows = psql(
    db,
    `SELECT calls, total_exec_time, total_plan_time, rows, regexp_replace(left(query, 110), '\\s+', ' ', 'g')
     FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
     ORDER BY total_exec_time + total_plan_time DESC LIMIT 14`,
  );
  const us = (ms) => ((Number(ms) * 1000) / Math.max(1, delivered)).toFixed(1).padStart(6);
  log(`    statement time per ${what} (µs): executing, planning; calls, rows, statement:`);
  for (const line of rows.trim().split('\n')) {
    const [calls, ms, planMs, n, q] = line.split('|');
    log(`    ${us(ms)} ${us(planMs)} ${calls.padStart(6)} ${n.padStart(7)}  ${q}`);
  }
}

async function sentTotal(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = /^fanout_deliveries\{status="sent"\} (\d+)/m.exec(text);
  return m ? Number(m[1]) : 0;
}

async function call(o, p, body, method) {
  const res = await o.api(p, { body, method });
  const text = await res.text();
  if (res.status >= 300) throw new Error(`${method ?? 'POST'} ${p}: ${res.status} ${text.slice(0, 300)}`);
  return text;
}

async function once(config, sink, pg, round) {
  const [name, variant] = config.split('@');
  const [kind, n] = name.split('-');
  const bin = variant === 'before' ? opts['before-bin'] : process.env.FANOUT_BIN;
  if (!bin) throw new Error(`${config}: no binary (FANOUT_BIN, or --before-bin for @before)`);
  const daemons = Number(n);
  let db = null;
  let dir = null;
  if (kind === 'pg') {
    db = pg.createDatabase(`bench_${round}_${daemons}_${variant ?? 'now'}`);
    if (opts.statements) psql(db, 'CREATE EXTENSION pg_stat_statements');
  } else {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-bench-'));
    db = path.join(dir, 'fanout.db');
  }
  const origins = [];
  try {
    const saved = process.env.FANOUT_BIN;
    process.env.FANOUT_BIN = bin; // read by startOrigin
    try {
      for (let k = 0; k < daemons; k++) {
        origins.push(await startOrigin({ db, apiToken: TOKEN, env: { FANOUT_LOG: 'warn' } }));
      }
    } finally {
      process.env.FANOUT_BIN = saved;
    }
    const first = origins[0];
    const ids = [];
    for (let i = 0; i < SUBSCRIBERS; i++) {
      const id = `s${i}`;
      ids.push(id);
      await call(first, '/v1/subscribers', {
        id,
        url: `${sink.url}/lane/${i}`,
        event_types: ['video.*'],
        ...HELD,
        max_in_flight: MAX_IN_FLIGHT,
        lane: 'origin',
      });
    }
    await sleep(300); // the other daemons hear of the subscribers (NOTIFY)
    const cpu = () => ({
      daemons: origins.reduce((s, o) => s + procCpu(o.process.pid), 0),
      pg: kind === 'pg' ? pgCpu(pg.postmasterPid()) : 0,
    });
    // Ingest, spread over the daemons.
    const events = makeEvents(EVENTS, `r${round}`);
    if (kind === 'pg' && opts.statements) psql(db, 'SELECT pg_stat_statements_reset()');
    const c0 = cpu();
    const t0 = performance.now();
    let next = 0;
    await Promise.all(
      Array.from({ length: 4 }, async (_, conn) => {
        const o = origins[conn % origins.length];
        while (next < events.length) {
          const slice = events.slice(next, next + 100);
          next += 100;
          await call(o, '/v1/events', slice);
        }
      }),
    );
    const ingestS = (performance.now() - t0) / 1000;
    const c1 = cpu();
    if (kind === 'pg' && opts.statements) statements(db, EVENTS, 'ingested event');
    // Held subscribers had a burst of 1: up to one delivery each may already be out.
    await sleep(300);
    const expected = EVENTS * SUBSCRIBERS;
    const before = await sentTotal(first.url);
    const sunk = await sink.count();
    const m0 = machineBusy();
    const c2 = cpu();
    const p2 = kind === 'pg' ? pgCounters(db) : null;
    if (kind === 'pg' && opts.statements) psql(db, 'SELECT pg_stat_statements_reset()');
    const t1 = performance.now();
    await Promise.all(ids.map((id) => call(first, `/v1/subscribers/${id}`, FAST, 'PATCH')));
    // The sink's counter first (up to one held delivery per subscriber may have been out,
    // unrecorded, when it was read), then the ledger's.
    const deadline = Date.now() + DRAIN_LIMIT_MS;
    await until(async () => (await sink.count()) - sunk >= expected - before - SUBSCRIBERS, DRAIN_LIMIT_MS, 10);
    const drained = await until(
      async () => (await sentTotal(first.url)) >= expected,
      Math.max(0, deadline - Date.now()),
      20,
    );
    const drainS = (performance.now() - t1) / 1000;
    const c3 = cpu();
    const m1 = machineBusy();
    // The statistics collector publishes a backend's counts when it is idle (within a second).
    if (kind === 'pg') await sleep(1200);
    const p3 = kind === 'pg' ? pgCounters(db) : null;
    const delivered = (await sentTotal(first.url)) - before;
    if (kind === 'pg' && opts.statements) statements(db, delivered);
    const res = {
      config,
      round,
      ingestRate: EVENTS / ingestS,
      ingestDaemonUs: ((c1.daemons - c0.daemons) / EVENTS) * 1e6,
      ingestPgUs: ((c1.pg - c0.pg) / EVENTS) * 1e6,
      rate: delivered / drainS,
      drained,
      daemonUs: ((c3.daemons - c2.daemons) / Math.max(1, delivered)) * 1e6,
      pgUs: ((c3.pg - c2.pg) / Math.max(1, delivered)) * 1e6,
      daemonCores: (c3.daemons - c2.daemons) / drainS,
      pgCores: (c3.pg - c2.pg) / drainS,
      machine: (m1[0] - m0[0]) / (m1[1] - m0[1]),
      walBytes: p3 ? (p3.wal - p2.wal) / Math.max(1, delivered) : 0,
      perCommit: p3 ? delivered / Math.max(1, p3.commits - p2.commits) : 0,
      triggerUs: p3 ? ((p3.functionsMs - p2.functionsMs) / Math.max(1, delivered)) * 1e3 : 0,
    };
    log(
      `  ${config.padEnd(8)} round ${round}: ingest ${res.ingestRate.toFixed(0)} events/s ` +
        `(${res.ingestDaemonUs.toFixed(0)} µs daemon + ${res.ingestPgUs.toFixed(0)} µs PostgreSQL CPU/event); ` +
        `${res.rate.toFixed(0)} deliveries/s (${delivered} in ${drainS.toFixed(2)} s; ` +
        `${res.daemonUs.toFixed(1)} µs daemon + ${res.pgUs.toFixed(1)} µs PostgreSQL CPU/delivery; ` +
        `daemons ${res.daemonCores.toFixed(2)} cores, PostgreSQL ${res.pgCores.toFixed(2)}; ` +
        `machine ${(res.machine * 100).toFixed(0)}% busy` +
        (p3
          ? `; ${res.walBytes.toFixed(0)} WAL bytes/delivery, ${res.perCommit.toFixed(0)} deliveries/commit, ` +
            `${res.triggerUs.toFixed(1)} µs/delivery in triggers`
          : '') +
        `)${drained ? '' : ' — DID NOT DRAIN'}`,
    );
    return res;
  } finally {
    for (const o of origins) await o.stop();
    if (dir) await fsp.rm(dir, { recursive: true, force: true });
  }
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

async function main() {
  if (CONFIGS.some((c) => c.endsWith('@before')) && !opts['before-bin']) throw new Error('@before needs --before-bin');
  if (!fs.existsSync(path.join(SINK_DIR, 'target', 'release', 'sink'))) cargoBuild(SINK_DIR);
  const sink = await startSink();
  const pgOptions = ['track_functions=pl'];
  if (opts.statements) pgOptions.push('shared_preload_libraries=pg_stat_statements', 'pg_stat_statements.track=all', 'pg_stat_statements.track_planning=on');
  if (opts['explain-ms']) {
    pgOptions.push(
      `shared_preload_libraries=${opts.statements ? 'pg_stat_statements,' : ''}auto_explain`,
      `auto_explain.log_min_duration=${Number(opts['explain-ms'])}`,
      'auto_explain.log_analyze=on',
      'auto_explain.log_buffers=on',
      'auto_explain.log_nested_statements=on',
    );
  }
  const pg = await startPostgres({ options: pgOptions });
  const results = [];
  try {
    for (let round = 1; round <= ROUNDS; round++) {
      const order = round % 2 ? CONFIGS : [...CONFIGS].reverse();
      for (const config of order) results.push(await once(config, sink, pg, round));
    }
  } finally {
    if (opts['keep-log']) fs.copyFileSync(pg.log, opts['keep-log']);
    await pg.stop();
    sink.stop();
  }
  const base = median(results.filter((r) => r.config === CONFIGS[0]).map((r) => r.rate));
  const baseIngest = median(results.filter((r) => r.config === CONFIGS[0]).map((r) => r.ingestRate));
  console.log(`\n${EVENTS} events x ${SUBSCRIBERS} subscribers (max_in_flight ${MAX_IN_FLIGHT}), ${ROUNDS} rounds, medians; ratios against ${CONFIGS[0]}\n`);
  console.log('| ledger | ingest events/s | ratio | deliveries/s | ratio | daemon CPU/delivery | PostgreSQL CPU/delivery | daemon CPU/event (ingest) | PostgreSQL CPU/event (ingest) | WAL/delivery | deliveries/commit | PostgreSQL time in triggers/delivery |');
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const config of CONFIGS) {
    const rs = results.filter((r) => r.config === config);
    const m = (k) => median(rs.map((r) => r[k]));
    const drained = rs.every((r) => r.drained) ? '' : ' (not all drained)';
    console.log(
      `| ${config}${drained} | ${m('ingestRate').toFixed(0)} | ${(m('ingestRate') / baseIngest).toFixed(2)} | ` +
        `${m('rate').toFixed(0)} | ${(m('rate') / base).toFixed(2)} | ${m('daemonUs').toFixed(1)} µs | ` +
        `${m('pgUs').toFixed(1)} µs | ${m('ingestDaemonUs').toFixed(0)} µs | ${m('ingestPgUs').toFixed(0)} µs | ` +
        `${config.startsWith('pg') ? `${m('walBytes').toFixed(0)} B | ${m('perCommit').toFixed(0)} | ${m('triggerUs').toFixed(1)} µs` : '– | – | –'} |`,
    );
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
