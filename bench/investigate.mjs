// Where does the edge's time go? (BENCHMARKS.md, "Where the time goes".) Builds two variants of
// the Worker from a scratch copy of this checkout (src/ itself is never touched), then runs
// bench/edge.mjs with the dev inspector off (--runner api) at batch 100, side by side with:
//   edge            the real build/ (as `npm run bench:edge` measures it)
//   edge[nolog]     the same code without the per-delivery console.log
//   edge[min]       also without the per-delivery HMAC and without the timeout timer/AbortController
//   edge[textjson]  edge[nolog] whose Durable Object parses the batch with serde_json from the
//                   body text instead of worker's Request::json (JSON.parse + serde_wasm_bindgen)
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

const LOG_LOOP = `        for (d, r) in batch.deliveries.iter().zip(&results) {
            worker::console_log!("{}", LogRecord::new(&sub.id, d, r).to_json());
        }
`;
const NO_LOG = `        let _ = LogRecord::new; // variant: no per-delivery console.log
`;
const SIGN = `    let signed = sign::sign_headers(secrets, &d.event_id, now_ms / 1000, d.body.as_bytes());`;
const NO_SIGN = `    // variant: no HMAC
    let _ = sign::sign_headers;
    let signed = sign::SignedHeaders {
        id: d.event_id.clone(),
        timestamp: (now_ms / 1000).to_string(),
        signature: "v1,unsigned".to_string(),
    };`;
const TIMER_START = '    let elapsed = (now_ms() - started_ms).max(0) as u64;';
const NO_TIMER = `    // variant: no timer, no abort
    let _ = (timeout_ms, started_ms, &controller);
    work.await
}
`;

const JSON_BODY = 'match req.json().await {';
const TEXT_JSON =
  'match req.text().await.map_err(|e| e.to_string()).and_then(|t| serde_json::from_str::<DeliveryBatch>(&t).map_err(|e| e.to_string())) {';

const variants = {
  nolog: [['src/edge/subscriber.rs', LOG_LOOP, NO_LOG]],
  min: [
    ['src/edge/subscriber.rs', LOG_LOOP, NO_LOG],
    ['src/edge/send.rs', SIGN, NO_SIGN],
    ['src/edge/send.rs', TIMER_START, null], // replace from here to the end of exchange()
  ],
  textjson: [
    ['src/edge/subscriber.rs', LOG_LOOP, NO_LOG],
    ['src/edge/subscriber.rs', JSON_BODY, TEXT_JSON],
  ],
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
  let s = fs.readFileSync(p, 'utf8');
  const i = s.indexOf(from);
  if (i < 0) throw new Error(`variant patch no longer applies: ${file} has no\n${from}`);
  if (to === null) {
    // From `from` up to the end of the function: the first line that is exactly "}".
    const end = s.indexOf('\n}\n', i);
    if (end < 0) throw new Error(`variant patch: no end of function after the timer in ${file}`);
    s = s.slice(0, i) + NO_TIMER + s.slice(end + 3);
  } else {
    s = s.slice(0, i) + to + s.slice(i + from.length);
  }
  fs.writeFileSync(p, s);
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
    all: 'do=1&sql=1&headers=1&log=1&sign=1&timeout=1',
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
