// Helpers for Fanout's end-to-end tests (node:test). Everything listens on 127.0.0.1 only.
//
//   const edge = await startEdge();            // wrangler dev on a free port, fresh DO state
//   const sub = await startSubscriber(() => ({ status: 200 }));
//   const res = await signedFetch(`${edge.url}/v1/deliveries`, edge.key, JSON.stringify(payload));
//   await waitFor(() => sub.requests.length === 3, 10_000);
//   await edge.stop(); await sub.close();
//
// startEdge uses the Worker already built in build/ (scripts/build-worker.sh; scripts/test.sh
// builds it once): it sets FANOUT_SKIP_BUILD=1 so wrangler's [build] command returns at once.

import { spawn, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

const WRANGLER_JS = path.join(ROOT, 'node_modules', 'wrangler', 'bin', 'wrangler.js');

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** A fresh Standard Webhooks secret: `whsec_` + base64 of `bytes` random bytes. */
export function newSecret(bytes = 32) {
  return `whsec_${crypto.randomBytes(bytes).toString('base64')}`;
}

/** The HMAC key bytes of a `whsec_` secret (base64 after the prefix). */
export function secretBytes(secret) {
  const b64 = secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : secret;
  return Buffer.from(b64, 'base64');
}

/** `v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>` */
export function sign(secret, id, timestamp, body) {
  const mac = crypto
    .createHmac('sha256', secretBytes(secret))
    .update(`${id}.${timestamp}.`)
    .update(typeof body === 'string' ? Buffer.from(body, 'utf8') : Buffer.from(body ?? ''))
    .digest('base64');
  return `v1,${mac}`;
}

/** The three Standard Webhooks headers for `body`, signed with `secret`. */
export function signHeaders(secret, body, { id, timestamp } = {}) {
  const msgId = id ?? `msg_${crypto.randomBytes(12).toString('hex')}`;
  const ts = String(timestamp ?? Math.floor(Date.now() / 1000));
  return {
    'webhook-id': msgId,
    'webhook-timestamp': ts,
    'webhook-signature': sign(secret, msgId, ts, body),
  };
}

/**
 * fetch() signed the way the origin signs calls to the edge.
 * `body` is a string (sent byte for byte) or an object (JSON-encoded). GET/HEAD send no body and
 * sign `"{METHOD} {path}"` in its place (`fanout_core::sign::bodiless_message`). Options: method (default POST, GET when body is null/undefined),
 * headers (merged over the defaults), id/timestamp (override the signed values).
 */
export async function signedFetch(url, key, body, { method, headers = {}, id, timestamp, signal } = {}) {
  const m = (method ?? (body == null ? 'GET' : 'POST')).toUpperCase();
  const hasBody = m !== 'GET' && m !== 'HEAD';
  const text = body == null ? '' : typeof body === 'string' ? body : JSON.stringify(body);
  const signedBody = hasBody ? text : '';
  // A call without a body signs its method and path instead (the edge's status read).
  const signed = hasBody ? text : `${m} ${new URL(url).pathname}`;
  const h = {
    ...(hasBody ? { 'content-type': 'application/json' } : {}),
    ...signHeaders(key, signed, { id, timestamp }),
    ...headers,
  };
  return fetch(url, { method: m, headers: h, body: hasBody ? signedBody : undefined, redirect: 'manual', signal });
}

/** Polls `pred` (sync or async) until it returns a truthy value, which is returned. */
export async function waitFor(pred, timeoutMs = 10_000, { intervalMs = 25, message } = {}) {
  const deadline = Date.now() + timeoutMs;
  let lastError;
  for (;;) {
    try {
      const v = await pred();
      if (v) return v;
    } catch (e) {
      lastError = e;
    }
    if (Date.now() >= deadline) {
      const why = message ?? `condition ${pred.toString().slice(0, 200)}`;
      const err = new Error(`waitFor timed out after ${timeoutMs} ms: ${why}`);
      if (lastError) err.cause = lastError;
      throw err;
    }
    await sleep(intervalMs);
  }
}

/** A TCP port that was free a moment ago on 127.0.0.1. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const ANSI = /\u001b\[[0-9;?]*[ -/]*[@-~]/g;

/** Runs a long-lived child in its own process group, capturing its output as lines. */
function spawnService(name, cmd, args, { env, cwd = ROOT } = {}) {
  const logs = [];
  const child = spawn(cmd, args, {
    cwd,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true, // own process group: stop() also ends grandchildren (workerd)
  });
  const verbose = !!process.env.FANOUT_E2E_VERBOSE;
  for (const stream of [child.stdout, child.stderr]) {
    let buf = '';
    stream.setEncoding('utf8');
    stream.on('data', (chunk) => {
      buf += chunk;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i).replace(ANSI, '').replace(/\r$/, '');
        buf = buf.slice(i + 1);
        logs.push(line);
        if (verbose) process.stderr.write(`[${name}] ${line}\n`);
      }
    });
    stream.on('end', () => {
      if (buf) logs.push(buf.replace(ANSI, ''));
      buf = '';
    });
  }
  let exited = null;
  const exitPromise = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exited = { code, signal };
      resolve(exited);
    });
    child.on('error', (err) => {
      logs.push(`spawn error: ${err.message}`);
      exited = { code: -1, signal: null };
      resolve(exited);
    });
  });

  const killGroup = (sig) => {
    try {
      process.kill(-child.pid, sig);
    } catch {
      /* already gone */
    }
  };
  // Never leave a service behind if the test process dies without calling stop().
  const onExit = () => killGroup('SIGKILL');
  process.on('exit', onExit);

  async function stop({ graceMs = 5_000 } = {}) {
    process.off('exit', onExit);
    if (!exited) {
      killGroup('SIGTERM');
      const t = sleep(graceMs).then(() => 'timeout');
      if ((await Promise.race([exitPromise, t])) === 'timeout') {
        killGroup('SIGKILL');
        await exitPromise;
      }
    }
    // The group may still hold children after the leader exited.
    killGroup('SIGKILL');
  }

  return { child, logs, stop, exitPromise, exited: () => exited };
}

/** Polls GET {url}/healthz until 200, failing early if the service exits. */
async function waitHealthy(name, url, svc, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let last = 'no answer yet';
  while (Date.now() < deadline) {
    const ex = svc.exited();
    if (ex) {
      throw new Error(
        `${name} exited (code ${ex.code}, signal ${ex.signal}) before answering ${url}/healthz; ` +
          `last output:\n${svc.logs.slice(-40).join('\n')}`,
      );
    }
    try {
      const res = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2_000) });
      await res.arrayBuffer();
      if (res.status === 200) return;
      last = `status ${res.status}`;
    } catch (e) {
      last = e.cause?.code ?? e.message;
    }
    await sleep(100);
  }
  throw new Error(
    `${name} did not answer 200 on ${url}/healthz within ${timeoutMs} ms (${last}); ` +
      `last output:\n${svc.logs.slice(-40).join('\n')}`,
  );
}

/**
 * `node <wrangler> dev` arguments for a Worker on 127.0.0.1:port, its state under persistDir,
 * wrangler's own interactive UI off; `config` defaults to the project's wrangler.toml.
 */
export function wranglerDevArgs({ config, port, inspectorPort, persistDir, vars = {} }) {
  const args = [WRANGLER_JS, 'dev'];
  if (config) args.push('--config', config);
  args.push(
    '--ip',
    '127.0.0.1',
    '--port',
    String(port),
    '--inspector-port',
    String(inspectorPort),
    '--persist-to',
    persistDir,
    '--show-interactive-dev-session=false',
    '--log-level',
    'log',
  );
  for (const [k, v] of Object.entries(vars)) args.push('--var', `${k}:${v}`);
  return args;
}

/** The environment for a wrangler process: no build, off the network, no colour, its debug log
 * under persistDir (kept out of $HOME). */
export function wranglerEnv(persistDir) {
  return {
    ...process.env,
    FANOUT_SKIP_BUILD: '1',
    WRANGLER_SEND_METRICS: 'false',
    CLOUDFLARE_CF_FETCH_ENABLED: 'false',
    NO_COLOR: '1',
    FORCE_COLOR: '0',
    WRANGLER_LOG_PATH: path.join(persistDir, 'wrangler-logs'),
  };
}

/**
 * The project's wrangler.toml for tests, written into `dir`: the same Worker, bindings and vars,
 * `main` as an absolute path to the built Worker, and no `[build]` table. The tests run the Worker
 * scripts/test.sh built once; with `[build]`, wrangler also watches `src/` and restarts the Worker
 * it has just started on a change it believes it saw, and that restart could not bind the port the
 * first start still held (seen once in a clean-clone run: wrangler exited before /healthz answered).
 */
export async function builtWorkerConfig(dir) {
  const lines = (await fsp.readFile(path.join(ROOT, 'wrangler.toml'), 'utf8')).split('\n');
  const out = [];
  let inBuild = false;
  for (const line of lines) {
    const table = line.match(/^\s*\[+([^\]]+)\]+\s*$/);
    if (table) inBuild = table[1].trim() === 'build';
    if (inBuild) continue;
    if (/^main\s*=/.test(line)) {
      out.push(`main = ${JSON.stringify(path.join(ROOT, 'build', 'index.js'))}`);
    } else {
      out.push(line);
    }
  }
  const file = path.join(dir, 'wrangler.toml');
  await fsp.writeFile(file, out.join('\n'));
  return file;
}

/**
 * Starts the Worker under `wrangler dev` on free ports with fresh Durable Object state.
 * Options: vars ({NAME: value}, passed as --var, overriding the defaults), key (the
 * EDGE_SIGNING_KEY, default a new secret), port (default a free one), timeoutMs (startup deadline),
 * persistDir (an existing --persist-to directory to reuse, e.g. to restart with the same Durable
 * Object state; the caller owns it and stop() leaves it in place), config (another wrangler.toml,
 * default the project's, without its `[build]`: see builtWorkerConfig).
 * Returns {url, port, key, logs, persistDir, stop()}. `logs` fills with wrangler's output lines
 * (the Worker's console output included) for the whole life of the process.
 */
export async function startEdge({ vars = {}, key, port: fixedPort, timeoutMs = 90_000, persistDir: reuseDir, config } = {}) {
  if (!fs.existsSync(path.join(ROOT, 'build', 'index.js'))) {
    throw new Error('build/index.js is missing: run `bash scripts/build-worker.sh` (scripts/test.sh does) first');
  }
  if (!fs.existsSync(WRANGLER_JS)) {
    throw new Error('wrangler is not installed: run `bash scripts/setup.sh` first');
  }
  const edgeKey = key ?? vars.EDGE_SIGNING_KEY ?? newSecret();
  const allVars = { ALLOW_LOOPBACK_HTTP: 'true', ...vars, EDGE_SIGNING_KEY: edgeKey };
  const port = fixedPort ?? (await freePort());
  const inspectorPort = await freePort();
  const persistDir = reuseDir ?? (await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-edge-')));
  const edgeConfig = config ?? (await builtWorkerConfig(persistDir));
  const args = wranglerDevArgs({ config: edgeConfig, port, inspectorPort, persistDir, vars: allVars });
  const env = wranglerEnv(persistDir);
  const svc = spawnService('edge', process.execPath, args, { env });
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    await svc.stop();
    if (!reuseDir) await fsp.rm(persistDir, { recursive: true, force: true });
  };
  try {
    await waitHealthy('wrangler dev', url, svc, timeoutMs);
  } catch (e) {
    await stop();
    throw e;
  }
  return { url, port, key: edgeKey, logs: svc.logs, persistDir, stop, process: svc.child };
}

/** Path of the origin binary: $FANOUT_BIN, else target/debug/fanout, else target/release/fanout. */
export function originBinary() {
  if (process.env.FANOUT_BIN) return process.env.FANOUT_BIN;
  for (const p of ['target/debug/fanout', 'target/release/fanout']) {
    const abs = path.join(ROOT, p);
    if (fs.existsSync(abs)) return abs;
  }
  throw new Error('origin binary not found: run `cargo build -p fanout-origin` (scripts/test.sh does) or set FANOUT_BIN');
}

/**
 * Starts `fanout serve` on a free port with a fresh ledger.
 * Options: edge ({url, key} from startEdge, or null for origin lane only), apiToken,
 * db (default a fresh temp file), args (extra CLI args), env (extra environment),
 * timeoutMs. Returns {url, port, token, db, logs, stop({keepDb}), kill()}.
 */
export async function startOrigin({ edge = null, apiToken, db, args = [], env = {}, timeoutMs = 30_000 } = {}) {
  const bin = originBinary();
  const port = await freePort();
  const dir = db ? null : await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-origin-'));
  const dbPath = db ?? path.join(dir, 'fanout.db');
  const token = apiToken ?? `tok_${crypto.randomBytes(16).toString('hex')}`;
  const argv = ['serve', '--db', dbPath, '--listen', `127.0.0.1:${port}`, '--api-token', token, '--allow-loopback'];
  if (edge) argv.push('--edge-url', edge.url, '--edge-key', edge.key);
  argv.push(...args);
  const svc = spawnService('origin', bin, argv, { env: { ...process.env, ...env } });
  const url = `http://127.0.0.1:${port}`;
  const stop = async ({ keepDb = false } = {}) => {
    await svc.stop();
    if (dir && !keepDb) await fsp.rm(dir, { recursive: true, force: true });
  };
  try {
    await waitHealthy('fanout serve', url, svc, timeoutMs);
  } catch (e) {
    await stop();
    throw e;
  }
  /** Authorized fetch against the origin API (JSON body when given an object). */
  const api = (p, { method, body, headers = {} } = {}) =>
    fetch(`${url}${p}`, {
      method: method ?? (body === undefined ? 'GET' : 'POST'),
      headers: {
        authorization: `Bearer ${token}`,
        ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
        ...headers,
      },
      body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    });
  // kill(): SIGKILL with no grace, for crash-safety tests (the ledger is kept).
  const kill = async () => {
    try {
      process.kill(-svc.child.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
    await svc.exitPromise;
  };
  return { url, port, token, db: dbPath, logs: svc.logs, api, stop, kill, process: svc.child };
}

/**
 * An HTTP subscriber on 127.0.0.1:<free port> that records every request as
 * {method, path, headers, body, time} in `requests` (in arrival order) before answering.
 * `handler(record, requests)` (optional, may be async) returns the answer: a status number, or
 * {status = 200, headers = {}, body = ''}; undefined means 200 "ok". It may also await to
 * simulate a slow endpoint. Returns {url, port, requests, close()}.
 */
export async function startSubscriber(handler) {
  const requests = [];
  const sockets = new Set();
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const record = {
        method: req.method,
        path: req.url,
        headers: req.headers,
        body: Buffer.concat(chunks).toString('utf8'),
        time: Date.now(),
      };
      requests.push(record);
      let answer;
      try {
        answer = handler ? await handler(record, requests) : undefined;
      } catch (e) {
        answer = { status: 500, body: String(e?.message ?? e) };
      }
      if (typeof answer === 'number') answer = { status: answer };
      const { status = 200, headers = {}, body = answer === undefined ? 'ok' : '' } = answer ?? {};
      if (res.destroyed) return;
      res.writeHead(status, headers);
      res.end(body);
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port } = server.address();
  const close = () =>
    new Promise((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    });
  return { url: `http://127.0.0.1:${port}`, port, requests, close, server };
}

/**
 * A subscriber that enforces its advertised limit itself (token bucket, rate/s, burst) and
 * answers 429 Retry-After: 120 past it, as the partner dashboard in the design story does.
 * Like any real limiter that sees arrival times (not send times), it tolerates `slack` requests
 * (default 1) of clock granularity: capacity burst + slack, refill at exactly `rate`. `latency`, when given, is
 * called per request for a number of milliseconds the request takes to reach the limiter (a
 * network or proxy in front of it whose delay varies); `arrivals` holds the times the limiter
 * saw. `stats`: requests `n`, `ok`, `throttled`, and for each refusal which request it was,
 * how long after the first, and how short of a token the bucket was.
 */
export async function strictPartner(rate, burst, { latency, slack = 1 } = {}) {
  const capacity = burst + slack;
  let tokens = capacity;
  let last = Date.now();
  const arrivals = [];
  const stats = { throttled: 0, ok: 0, first: 0, n: 0, refusals: [] };
  const sub = await startSubscriber(async () => {
    if (latency) await new Promise((resolve) => setTimeout(resolve, latency()));
    const now = Date.now();
    arrivals.push(now);
    stats.first ||= now;
    stats.n++;
    tokens = Math.min(capacity, tokens + ((now - last) * rate) / 1000);
    last = now;
    if (tokens < 1) {
      stats.throttled++;
      stats.refusals.push({ request: stats.n, after_ms: now - stats.first, tokens: Number(tokens.toFixed(2)) });
      return { status: 429, headers: { 'retry-after': '120' }, body: 'slow down' };
    }
    tokens -= 1;
    stats.ok++;
    return 200;
  });
  return Object.assign(sub, { stats, arrivals });
}

/**
 * Largest excess over the allowance in any window of the arrival times `times` (sorted ms):
 * max over i ≤ j of (j - i + 1) - (burst + rate × (t_j - t_i) / 1000). ≤ 0 means never exceeded.
 * `at` says where (ms from the first arrival) and how many.
 */
export function worstWindow(times, rate, burst) {
  let worst = -Infinity;
  let at = null;
  for (let i = 0; i < times.length; i++) {
    for (let j = i; j < times.length; j++) {
      const excess = j - i + 1 - (burst + (rate * (times[j] - times[i])) / 1000);
      if (excess > worst) {
        worst = excess;
        at = { from: times[i] - times[0], to: times[j] - times[0], count: j - i + 1 };
      }
    }
  }
  return { worst, at };
}

/**
 * A throwaway PostgreSQL server (as origin/tests/common/pg.rs): initdb into a temp dir, a free
 * port on 127.0.0.1, its unix socket in the same dir; as root, the files belong to `postgres`
 * and the server runs through `runuser -u postgres --` (PostgreSQL refuses root). `options` are
 * extra `-c name=value` settings. Returns {port, url(db), createDatabase(name), postmasterPid(),
 * stop()} — stop() stops it and removes its files.
 */
export async function startPostgres({ options = [] } = {}) {
  const bin =
    process.env.FANOUT_PG_BIN ??
    fs
      .readdirSync('/usr/lib/postgresql')
      .filter((v) => fs.existsSync(`/usr/lib/postgresql/${v}/bin/postgres`))
      .sort((a, b) => Number(a) - Number(b))
      .map((v) => `/usr/lib/postgresql/${v}/bin`)
      .pop();
  if (!bin) throw new Error('no /usr/lib/postgresql/*/bin/postgres: run scripts/setup.sh');
  const root = process.getuid?.() === 0;
  const run = (prog, args) => {
    const [cmd, argv] = root ? ['runuser', ['-u', 'postgres', '--', path.join(bin, prog), ...args]] : [path.join(bin, prog), args];
    const r = spawnSync(cmd, argv, { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`${prog} failed: ${r.stdout}${r.stderr}`);
  };
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'fanout-pg-'));
  const data = path.join(dir, 'data');
  const sock = path.join(dir, 'sock');
  await fsp.mkdir(sock);
  if (root) spawnSync('chown', ['-R', 'postgres:postgres', dir]);
  run('initdb', ['-D', data, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--locale=C', '--no-sync']);
  const port = await freePort();
  const opts = [`-p ${port}`, `-k ${sock}`, '-c listen_addresses=127.0.0.1', '-c max_connections=300', ...options.map((o) => `-c ${o}`)];
  run('pg_ctl', ['-D', data, '-l', path.join(dir, 'log'), '-w', '-t', '60', '-o', opts.join(' '), 'start']);
  const url = (db) => `postgres://postgres@127.0.0.1:${port}/${db}`;
  return {
    port,
    url,
    /** The server's log file (gone once stopped). */
    log: path.join(dir, 'log'),
    createDatabase: (name) => {
      run('createdb', ['-h', '127.0.0.1', '-p', String(port), '-U', 'postgres', name]);
      return url(name);
    },
    postmasterPid: () => Number(fs.readFileSync(path.join(data, 'postmaster.pid'), 'utf8').split('\n')[0]),
    stop: async () => {
      try {
        run('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop']);
      } finally {
        await fsp.rm(dir, { recursive: true, force: true });
      }
    },
  };
}

/**
 * A subscriber written at the socket level, for what a well-behaved one never does. Every
 * request is handled by `respond(req, res, record)` (it may write the head and then stream,
 * dribble or hang). Counts requests open right now (received, connection not yet closed and
 * response not finished) and the peak: `state.open`, `state.maxOpen`, `state.received`, and per
 * request `record.written` (body bytes accepted by the socket) and `record.closedAt`.
 */
export async function rawSubscriber(respond) {
  const state = { open: 0, maxOpen: 0, received: 0, records: [] };
  const sockets = new Set();
  const server = http.createServer((req, res) => {
    const record = { time: Date.now(), headers: req.headers, body: '', written: 0, closedAt: null };
    state.records.push(record);
    state.received += 1;
    state.open += 1;
    state.maxOpen = Math.max(state.maxOpen, state.open);
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      state.open -= 1;
      record.closedAt = Date.now();
    };
    res.on('finish', end);
    res.on('close', end);
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      record.body = Buffer.concat(chunks).toString('utf8');
      respond(req, res, record);
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    state,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** Writes `total` bytes of body to `res` as fast as the reader takes them (backpressure), counting
 * them in `record.written`; stops when the connection closes. */
export function streamBody(res, record, total, chunkBytes = 64 * 1024) {
  const chunk = Buffer.alloc(chunkBytes, 120);
  const pump = () => {
    while (!res.destroyed && record.written < total) {
      const n = Math.min(chunk.length, total - record.written);
      record.written += n;
      if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) {
        res.once('drain', pump);
        return;
      }
    }
    if (!res.destroyed) res.end();
  };
  pump();
}
