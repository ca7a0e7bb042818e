// What the benchmarks (bench/edge.mjs, bench/origin.mjs, bench/pg.mjs) share: their child processes (each in its own process
// group, all killed when the benchmark exits however it ends), cargo builds of the bench tools,
// and bench/sink (a one-thread Rust HTTP server that answers 200 "ok" and counts requests).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { ROOT, sleep } from '../tests/lib/harness.mjs';

export const SINK_DIR = path.join(ROOT, 'bench', 'sink');

/** Progress and per-window details go to stderr; reports go to stdout. */
export const log = (...a) => process.stderr.write(`${a.join(' ')}\n`);

/** Every long-lived child the benchmark starts; killed (whole process group) at exit. */
export const children = [];
process.on('exit', () => {
  for (const c of children) {
    try {
      process.kill(-c.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(130));

/** `cargo build --release` of a bench tool's own Cargo project. */
export function cargoBuild(dir) {
  log(`building ${path.relative(ROOT, dir)} (cargo build --release)…`);
  const r = spawnSync('cargo', ['build', '--release', '--quiet', '--manifest-path', path.join(dir, 'Cargo.toml')], {
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  if (r.status !== 0) throw new Error(`cargo build of ${path.relative(ROOT, dir)} failed`);
}

/** Starts bench/sink on a free port: {url, pid, count() (requests so far), stop()}. */
export async function startSink() {
  const child = spawn(path.join(SINK_DIR, 'target', 'release', 'sink'), ['0'], {
    stdio: ['pipe', 'pipe', 'inherit'],
    detached: true,
  });
  children.push(child);
  const port = await new Promise((resolve, reject) => {
    let buf = '';
    child.stdout.on('data', (d) => {
      buf += d;
      const m = /listening (\d+)/.exec(buf);
      if (m) resolve(Number(m[1]));
    });
    child.on('exit', (code) => reject(new Error(`sink exited (${code})`)));
    setTimeout(() => reject(new Error('sink did not start in 10 s')), 10_000).unref();
  });
  const url = `http://127.0.0.1:${port}`;
  return {
    url,
    pid: child.pid,
    count: async () => Number(await (await fetch(`${url}/__count`)).text()),
    stop: () => child.stdin.end(),
  };
}

// ---------- CPU accounting from /proc ----------

/** Linux USER_HZ: /proc reports CPU time in these ticks. */
export const CLK_TCK = 100;

/** CPU seconds (user + system) process `pid` has used; 0 once it is gone. */
export function procCpu(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' '); // f[0] = state (field 3)
    return (Number(f[11]) + Number(f[12])) / CLK_TCK; // fields 14, 15: utime, stime
  } catch {
    return 0;
  }
}

/** [busy, total] jiffies of all cores: the share of the machine in use between two readings. */
export function machineBusy() {
  const l = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  const idle = l[3] + l[4];
  const total = l.reduce((s, v) => s + v, 0);
  return [total - idle, total];
}

/** `n` events of about 250 bytes, ids `<prefix>_000000` on. */
export function makeEvents(n, prefix) {
  const pad = 'x'.repeat(160);
  return Array.from({ length: n }, (_, i) => ({
    id: `${prefix}_${String(i).padStart(6, '0')}`,
    type: 'video.trending',
    data: { video: `v_${i}`, views: i, text: pad },
  }));
}

/** Poll `pred` every `intervalMs` until it gives a truthy value (returned) or `limitMs` has
 * passed (null). */
export async function until(pred, limitMs, intervalMs = 25) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > deadline) return null;
    await sleep(intervalMs);
  }
}
