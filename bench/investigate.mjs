// Where does the edge's time go? (BENCHMARKS.md, "Where the time goes".) Builds variants of the
// Worker from a scratch copy of this checkout (src/ itself is never touched), then runs
// bench/edge.mjs at batch 100, 10 subscribers (by default with the dev inspector off,
// --runner api; pass --runner cli for wrangler dev), side by side with:
//   edge            the real build/ (as `npm run bench:edge` measures it)
//   edge[nolog]     the same code without the call's console.log
//   edge[nosign]    the same code with a fixed signature instead of the per-delivery HMAC
//   bare            bench/bare-worker (the ceiling)
//   probe[...]      bench/probe-worker: the bare fetch loop plus one edge cost at a time, in JS
//
//   node bench/investigate.mjs [--keep] [extra bench/edge.mjs flags, e.g. --rounds 3]
// The variants are made by text substitution in src/edge/*.rs; if src/ has moved on and a
// substitution no longer applies, it stops with a message saying which.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { ROOT } from '../tests/lib/harness.mjs';

const args = process.argv.slice(2);
const keep = args.includes('--keep');
const passThrough = args.filter((a) => a !== '--keep');
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'fanout-variants-'));
const targetDir = path.join(scratch, 'target');

const LOG = `        worker::console_log!("{}", logrec::lines(&sub.id, &batch.deliveries, &results));`;
const NO_LOG = `        let _ = logrec::lines; // variant: no console.log`;
const SIGN = `            let signed = sign::sign_headers(target.secrets, &d.event_id, now_secs, body);`;
const NO_SIGN = `            // variant: no HMAC
            let _ = sign::sign_headers;
            let signed = sign::SignedHeaders {
                id: d.event_id.clone(),
                timestamp: now_secs.to_string(),
                signature: "v1,unsigned".to_string(),
            };`;

const variants = {
  nolog: [['src/edge/subscriber.rs', LOG, NO_LOG]],
  nosign: [['src/edge/send.rs', SIGN, NO_SIGN]],
};

function copyCheckout(dest) {
  for (const f of ['Cargo.toml', 'Cargo.lock', 'wrangler.toml', 'src', 'scripts', 'origin']) {
    fs.cpSync(path.join(ROOT, f), path.join(dest, f), {
      recursive: true,
      filter: (p) => !p.includes(`${path.sep}target`),
    });
  }
  fs.symlinkSync(path.join(ROOT, 'node_modules'), path.join(dest, 'node_modules'));
}

function apply(dir, [file, from, to]) {
  const p = path.join(dir, file);
  const s = fs.readFileSync(p, 'utf8');
  const i = s.indexOf(from);
  if (i < 0) throw new Error(`variant patch no longer applies: ${file} has no\n${from}`);
  fs.writeFileSync(p, s.slice(0, i) + to + s.slice(i + from.length));
}

try {
  const flags = [];
  for (const [name, patches] of Object.entries(variants)) {
    const dir = path.join(scratch, name);
    copyCheckout(dir);
    for (const pt of patches) apply(dir, pt);
    process.stderr.write(`building variant ${name} in ${dir}…\n`);
    const r = spawnSync('bash', ['scripts/build-worker.sh'], {
      cwd: dir,
      stdio: ['ignore', 'inherit', 'inherit'],
      env: { ...process.env, FANOUT_FORCE_BUILD: '1', CARGO_TARGET_DIR: targetDir },
    });
    if (r.status !== 0) throw new Error(`building variant ${name} failed`);
    flags.push('--variant', `${name}=${path.join(dir, 'wrangler.toml')}`);
  }
  const probes = {
    do: 'do=1',
    dosqlhdr: 'do=1&sql=1&headers=1',
    log: 'log=1',
    logbatch: 'log=2',
    all: 'do=1&sql=1&headers=1&log=2&sign=1&timeout=1',
  };
  for (const [k, q] of Object.entries(probes)) flags.push('--probe', `${k}=${q}`);
  const r = spawnSync(
    process.execPath,
    [path.join(ROOT, 'bench', 'edge.mjs'), '--runner', 'api', '--subscribers', '10', '--batches', '100', ...flags, ...passThrough],
    { cwd: ROOT, stdio: 'inherit' },
  );
  process.exitCode = r.status ?? 1;
} finally {
  if (!keep) fs.rmSync(scratch, { recursive: true, force: true });
}
