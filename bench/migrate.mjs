// How long a schema migration takes on an existing ledger (issue 8: migration 5 rebuilds the
// deliveries table). Not a test: it prints numbers. bench/HISTORY.md ("Single events: keyed by
// event…") has the command and the result.
//
//   node bench/migrate.mjs --from-bin OLD_FANOUT --to-bin NEW_FANOUT [--seconds 12]
//
// OLD_FANOUT (a build before the migration) creates a fresh ledger with 5 held subscribers and
// takes batches of 100 events from bench/ingest for --seconds (5 deliveries per event); then
// NEW_FANOUT starts on the same file, migrating it, and the time until it answers is printed
// with its log lines about the migration and the delivery counts before and after.
import { parseArgs } from 'node:util';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { startOrigin } from '../tests/lib/harness.mjs';

const { values: opts } = parseArgs({
  options: {
    'from-bin': { type: 'string' },
    'to-bin': { type: 'string' },
    seconds: { type: 'string', default: '12' },
  },
});
if (!opts['from-bin'] || !opts['to-bin']) {
  console.error('usage: node bench/migrate.mjs --from-bin OLD_FANOUT --to-bin NEW_FANOUT [--seconds 12]');
  process.exit(2);
}
const INGEST = new URL('./ingest/target/release/ingest', import.meta.url).pathname;
if (!fs.existsSync(INGEST)) {
  console.error(`${INGEST} is missing: cargo build --release --manifest-path bench/ingest/Cargo.toml`);
  process.exit(2);
}
const token = 'tok_bench_migrate_1234567890';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fanout-migrate-'));
const db = path.join(dir, 'ledger.db');
// On a connection of its own (fetch would reuse a kept-alive one the daemon has closed).
const counts = (o) =>
  new Promise((resolve, reject) => {
    http
      .get(`${o.url}/metrics`, { agent: false }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c) => (body += c));
        res.on('end', () =>
          resolve(body.split('\n').filter((l) => l.startsWith('fanout_deliveries{')).join(', ')),
        );
      })
      .on('error', reject);
  });

try {
  process.env.FANOUT_BIN = opts['from-bin'];
  let o = await startOrigin({ apiToken: token, db, env: { FANOUT_LOG: 'warn' } });
  for (let i = 0; i < 5; i++) {
    const r = await o.api('/v1/subscribers', {
      body: { id: `s${i}`, url: `http://127.0.0.1:9/x${i}`, event_types: ['video.*'], rate_per_sec: 0.001, burst: 1, max_in_flight: 10, lane: 'origin' },
    });
    if (r.status !== 201) throw new Error(`creating a subscriber: ${r.status} ${await r.text()}`);
  }
  const url = `http://127.0.0.1:${new URL(o.url).port}`;
  const run = spawnSync(INGEST, [url, token, '4', opts.seconds, '100', 'm'], { encoding: 'utf8' });
  if (run.status !== 0) throw new Error(`bench/ingest failed: ${run.stderr}`);
  const before = await counts(o);
  await o.stop();
  console.log(`ledger made by ${opts['from-bin']}: ${JSON.parse(run.stdout).deliveries} deliveries, ` +
    `${(fs.statSync(db).size / 1e6).toFixed(0)} MB`);
  console.log(`  counts: ${before}`);

  process.env.FANOUT_BIN = opts['to-bin'];
  const started = Date.now();
  o = await startOrigin({ apiToken: token, db, env: { FANOUT_LOG: 'info' } });
  const lines = o.logs;
  const secs = (Date.now() - started) / 1000;
  const after = await counts(o);
  await o.stop({ keepDb: true });
  console.log(`${opts['to-bin']} answered after ${secs.toFixed(1)} s`);
  console.log(`  counts: ${after}${after === before ? ' (unchanged)' : ' (CHANGED)'}`);
  for (const l of lines.filter((l) => l.includes('schema'))) console.log(`  log: ${l.trim()}`);
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
