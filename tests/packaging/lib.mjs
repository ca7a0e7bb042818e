// Shared by the packaging tests (deb.mjs, image.mjs; run by scripts/package-test.sh, not by the
// e2e suite): run a shipped binary as a given user, and prove it delivers a signed webhook.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { Webhook } from 'standardwebhooks';

import { ROOT, freePort, startSubscriber, waitFor } from '../lib/harness.mjs';

export { ROOT, freePort, waitFor };

/** Runs a command (argv), returning its stdout; throws with its stderr on failure. */
export function run(argv, { env, input, cwd = ROOT } = {}) {
  return execFileSync(argv[0], argv.slice(1), {
    cwd,
    env: env ?? process.env,
    input,
    encoding: 'utf8',
    stdio: ['pipe', 'pipe', 'pipe'],
    maxBuffer: 64 * 1024 * 1024,
  });
}

/** Like run, but returns {status, out} instead of throwing on a non-zero exit. */
export function tryRun(argv, opts = {}) {
  try {
    return { status: 0, out: run(argv, opts) };
  } catch (e) {
    return { status: e.status ?? 1, out: `${e.stdout ?? ''}${e.stderr ?? ''}` };
  }
}

/**
 * Starts a daemon (argv) with exactly `env` (no inherited variables, as systemd does), waits
 * until `url`/healthz answers 200. Returns {logs, stop()}; stop sends SIGTERM and awaits exit.
 */
export async function startDaemon(argv, { env, cwd = '/', url, timeoutMs = 30_000 }) {
  const logs = [];
  const child = spawn(argv[0], argv.slice(1), { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  for (const s of [child.stdout, child.stderr]) {
    s.setEncoding('utf8');
    s.on('data', (c) => logs.push(...c.split('\n').filter(Boolean)));
  }
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  let done = null;
  exited.then((e) => (done = e));
  const stop = async () => {
    if (done === null) child.kill('SIGTERM');
    return exited;
  };
  try {
    await waitFor(
      async () => {
        if (done !== null) return true; // told apart below
        try {
          return (await fetch(`${url}/healthz`)).status === 200;
        } catch {
          return false;
        }
      },
      timeoutMs,
      { intervalMs: 100, message: `${argv.join(' ')} is healthy` },
    );
    if (done !== null) throw new Error(`${argv.join(' ')} exited ${JSON.stringify(done)}`);
  } catch (e) {
    await stop();
    throw new Error(`${e.message}\n${logs.join('\n')}`);
  }
  return { logs, stop, child };
}

/** Authorized JSON call to a daemon's API; asserts a 2xx answer and returns its JSON. */
export async function api(url, token, p, body) {
  const res = await fetch(`${url}${p}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  assert.ok(res.status < 300, `${p}: ${res.status} ${text}`);
  return JSON.parse(text);
}

/** A receiver on loopback that accepts only what the official standardwebhooks verifier does. */
export async function verifyingReceiver() {
  const ref = { secret: null, verified: [], refused: 0 };
  const sub = await startSubscriber((rec) => {
    try {
      new Webhook(ref.secret).verify(rec.body, rec.headers);
      ref.verified.push(rec);
      return 200;
    } catch {
      ref.refused++;
      return 400;
    }
  });
  return Object.assign(ref, { url: sub.url, close: sub.close });
}

/**
 * One event through a running daemon: registers subscriber `subId` at the receiver (once:
 * pass `secret` to reuse one made before), sends `eventId`, and waits for it to arrive
 * verified. Returns the subscriber's secret.
 */
export async function signedRoundTrip({ url, token, receiver, subId, eventId, secret }) {
  if (!secret) {
    const made = await api(url, token, '/v1/subscribers', {
      id: subId,
      url: `${receiver.url}/${subId}`,
      event_types: ['*'],
    });
    assert.match(made.secret, /^whsec_/);
    secret = made.secret;
  }
  receiver.secret = secret;
  await api(url, token, '/v1/events', { id: eventId, type: 'package.checked', note: eventId });
  await waitFor(() => receiver.verified.some((r) => JSON.parse(r.body).note === eventId), 20_000, {
    message: `${eventId} arrives signed`,
  });
  assert.equal(receiver.refused, 0, 'a webhook failed the standardwebhooks verifier');
  return secret;
}

/** The delivery statuses of `eventId` in the daemon's ledger. */
export async function deliveryStatuses(url, token, eventId) {
  const body = await api(url, token, `/v1/deliveries?${new URLSearchParams({ limit: '1000' })}`);
  const list = Array.isArray(body) ? body : body.deliveries;
  return list.filter((d) => d.event_id === eventId).map((d) => d.status);
}
