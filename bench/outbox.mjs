// The producer's outbox benchmark (issue 24, "Performance"). Not a test: it prints numbers and
// their ratios to the targets, measured in one run. Everything runs on 127.0.0.1; every wait is
// bounded. BENCHMARKS.md ("The producer's outbox") has the command, the reading and the results.
//
//   cargo build --release -p fanout-origin
//   FANOUT_BIN=target/release/fanout node bench/outbox.mjs [--events 50000] [--commits 300]
//
// 1. Outbox to ledger (events/s), PostgreSQL and SQLite outbox: `--events` rows are committed
//    by a producer in batched inserts (1,000 rows per transaction) while the daemon is stopped,
//    then one daemon (a fresh SQLite ledger with five held subscribers, as bench/origin.mjs's
//    ingest: each event fans out to five pending deliveries) starts with `--outbox`, and the
//    clock runs from its first healthy answer until its
//    fanout_outbox_rows_read_total reaches `--events` and the outbox is empty.
//    Beside them, the same events by POST /v1/events (batches of 1,000 over 4 connections) into
//    the same kind of ledger: the ledger's own ingest rate, which the outbox cannot exceed.
// 2. Commit to first delivery (PostgreSQL outbox, origin lane, one subscriber): `--commits`
//    single-row transactions, one every 20 ms, each payload holding the server's
//    clock_timestamp() at insert; latency = the subscriber's arrival time minus that (one
//    machine, one clock). p50 and p99.

import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { originBinary, startOrigin, startPostgres, startSubscriber } from '../tests/lib/harness.mjs';
import { log, until } from './lib.mjs';

const { values: opts } = parseArgs({
  options: {
    events: { type: 'string', default: '50000' },
    commits: { type: 'string', default: '300' },
  },
});
const EVENTS = Math.min(Math.max(Number(opts.events) || 50_000, 1000), 1_000_000);
const COMMITS = Math.min(Math.max(Number(opts.commits) || 300, 20), 5000);
const TARGET_RATE = 20_000;
const TARGET_P50_MS = 50;
const TARGET_P99_MS = 250;
const LIMIT_MS = 300_000;

const PSQL = (() => {
  const root = '/usr/lib/postgresql';
  const v = fs.existsSync(root)
    ? fs.readdirSync(root).filter((d) => fs.existsSync(`${root}/${d}/bin/psql`)).sort((a, b) => Number(a) - Number(b)).pop()
    : null;
  return v ? `${root}/${v}/bin/psql` : 'psql';
})();

function run(cmd, args, input) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', input, maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}
/** `psql` without blocking this process (the subscriber answers meanwhile). */
function psqlAsync(db, sql) {
  return new Promise((resolve, reject) => {
    const child = spawn(PSQL, [db, '-XAtq', '-v', 'ON_ERROR_STOP=1'], { stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`psql: ${err}`))));
    child.stdin.end(sql);
  });
}
const psql = (db, sql) => run(PSQL, [db, '-XAtq', '-v', 'ON_ERROR_STOP=1'], sql);
const sqlite = (file, sql) => run('sqlite3', [file], sql);
const fanout = (...args) => run(originBinary(), args);

/** `EVENTS` rows in transactions of 1,000 (the producer's batched inserts), as SQL. */
function fillSql(kind) {
  const parts = [];
  for (let from = 0; from < EVENTS; from += 1000) {
    const to = Math.min(from + 1000, EVENTS) - 1;
    parts.push(
      kind === 'pg'
        ? `BEGIN; INSERT INTO fanout_outbox (payload) SELECT json_build_object('id', 'evt_' || g, 'type', 'bench.outbox', 'n', g) FROM generate_series(${from}, ${to}) g; COMMIT;`
        : `BEGIN; WITH RECURSIVE s(g) AS (SELECT ${from} UNION ALL SELECT g + 1 FROM s WHERE g < ${to}) INSERT INTO fanout_outbox (payload) SELECT json_object('id', 'evt_' || g, 'type', 'bench.outbox', 'n', g) FROM s; COMMIT;`,
    );
  }
  return parts.join('\n');
}

async function metric(origin, name) {
  const text = await (await fetch(`${origin.url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name));
  return line ? Number(line.split(' ').pop()) : 0;
}

/** Five subscribers held (0.001/s), as bench/origin.mjs's ingest: every event fans out to
 * five deliveries that stay pending, so a drain measures ingest with its fan-out. */
async function holdFive(origin) {
  for (let i = 0; i < 5; i++) {
    const r = await origin.api('/v1/subscribers', {
      body: { id: `held_${i}`, url: 'http://127.0.0.1:9/', event_types: ['bench.*'], rate_per_sec: 0.001, burst: 1, max_in_flight: 1, lane: 'origin' },
    });
    if (r.status !== 201) throw new Error(`subscriber: ${r.status} ${await r.text()}`);
  }
}

/** The same events by `POST /v1/events` (batches of 1,000 over 4 connections) into a fresh
 * ledger with the same five held subscribers: the ledger's own ingest rate, for the ratio. */
async function posted() {
  const origin = await startOrigin();
  try {
    await holdFive(origin);
    const batches = [];
    for (let from = 0; from < EVENTS; from += 1000) {
      const n = Math.min(1000, EVENTS - from);
      batches.push(JSON.stringify(Array.from({ length: n }, (_, i) => ({ id: `evt_${from + i}`, type: 'bench.outbox', n: from + i }))));
    }
    const t0 = performance.now();
    let next = 0;
    await Promise.all(
      Array.from({ length: 4 }, async () => {
        while (next < batches.length) {
          const r = await origin.api('/v1/events', { body: batches[next++] });
          if (r.status !== 202) throw new Error(`POST /v1/events: ${r.status}`);
          await r.arrayBuffer();
        }
      }),
    );
    return (EVENTS / (performance.now() - t0)) * 1000;
  } finally {
    await origin.stop();
  }
}

/** Outbox → ledger: events/s of one daemon draining `EVENTS` committed rows. */
async function drain(kind, pg) {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-outbox-bench-'));
  try {
    let outbox;
    if (kind === 'pg') {
      outbox = pg.createDatabase(`shop_${Date.now()}`);
    } else {
      outbox = path.join(dir, 'shop.db');
    }
    fanout('outbox', 'init', '--db', outbox);
    const ledger = path.join(dir, 'fanout.db');
    const setup = await startOrigin({ db: ledger });
    await holdFive(setup);
    await setup.stop();
    if (kind === 'pg') psql(outbox, fillSql('pg'));
    else sqlite(outbox, `PRAGMA journal_mode=WAL;\n${fillSql('sqlite')}`);
    const origin = await startOrigin({ db: ledger, args: ['--outbox', outbox] });
    try {
      const t0 = performance.now();
      const done = await until(
        async () => (await metric(origin, 'fanout_outbox_rows_read_total')) >= EVENTS,
        LIMIT_MS,
      );
      const ms = performance.now() - t0;
      if (!done) throw new Error(`${kind}: the outbox did not drain within ${LIMIT_MS} ms`);
      const left = kind === 'pg' ? psql(outbox, 'SELECT count(*) FROM fanout_outbox') : sqlite(outbox, 'SELECT count(*) FROM fanout_outbox;');
      if (Number(left.trim()) !== 0) throw new Error(`${kind}: ${left.trim()} rows left in the outbox`);
      return (EVENTS / ms) * 1000;
    } finally {
      await origin.stop();
    }
  } finally {
    await fsp.rm(dir, { recursive: true, force: true });
  }
}

/** Commit → first delivery on a PostgreSQL outbox: the latencies in ms. */
async function latency(pg) {
  const outbox = pg.createDatabase(`latency_${Date.now()}`);
  fanout('outbox', 'init', '--db', outbox);
  const sub = await startSubscriber();
  const origin = await startOrigin({ args: ['--outbox', outbox] });
  try {
    const r = await origin.api('/v1/subscribers', {
      body: { id: 'lat', url: sub.url, event_types: ['bench.*'], rate_per_sec: 10_000, burst: 10_000, max_in_flight: 64, lane: 'origin' },
    });
    if (r.status !== 201) throw new Error(`subscriber: ${r.status} ${await r.text()}`);
    // One session commits COMMITS single-row transactions, 20 ms apart (a DO block with COMMIT).
    await psqlAsync(
      outbox,
      `DO $$ BEGIN FOR i IN 1..${COMMITS} LOOP
         INSERT INTO fanout_outbox (payload) VALUES (json_build_object('id', 'lat_' || i, 'type', 'bench.latency',
           't', extract(epoch FROM clock_timestamp()) * 1000));
         COMMIT;
         PERFORM pg_sleep(0.02);
       END LOOP; END $$;`,
    );
    await until(() => new Set(sub.requests.map((q) => q.headers['webhook-id'])).size >= COMMITS, 60_000);
    const first = new Map();
    for (const q of sub.requests) {
      const id = q.headers['webhook-id'];
      if (!first.has(id)) first.set(id, q.time - JSON.parse(q.body).t);
    }
    return [...first.values()].sort((a, b) => a - b);
  } finally {
    await origin.stop();
    await sub.close();
  }
}

const pct = (xs, p) => xs[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];

log(`outbox bench: ${EVENTS} events per drain, ${COMMITS} commits for latency; binary ${originBinary()}`);
const pg = await startPostgres();
try {
  const pgRate = await drain('pg', pg);
  const sqliteRate = await drain('sqlite', pg);
  const postRate = await posted();
  const lat = await latency(pg);
  const p50 = pct(lat, 50);
  const p99 = pct(lat, 99);
  const row = (what, value, unit, target, better) =>
    `${what.padEnd(38)} ${value.toFixed(1).padStart(10)} ${unit.padEnd(9)} target ${String(target).padStart(6)}  ratio ${(better === 'higher' ? value / target : target / value).toFixed(2)}`;
  console.log(row('outbox → ledger, PostgreSQL outbox', pgRate, 'events/s', TARGET_RATE, 'higher'));
  console.log(row('outbox → ledger, SQLite outbox', sqliteRate, 'events/s', TARGET_RATE, 'higher'));
  console.log(`${'POST /v1/events, batches of 1,000'.padEnd(38)} ${postRate.toFixed(1).padStart(10)} events/s  (the ledger's own ingest: outbox ÷ it = ${(pgRate / postRate).toFixed(2)} PostgreSQL, ${(sqliteRate / postRate).toFixed(2)} SQLite)`);
  console.log(row('PG commit → first delivery p50', p50, 'ms', TARGET_P50_MS, 'lower'));
  console.log(row('PG commit → first delivery p99', p99, 'ms', TARGET_P99_MS, 'lower'));
  console.log('(ratio ≥ 1: the target is met)');
} finally {
  await pg.stop();
}
