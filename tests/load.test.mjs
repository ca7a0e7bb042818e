// `fanout load` against the real Worker in workerd: eight workers flood POST /v1/deliveries for
// one subscriber (rate 10/s, burst 20) for about five seconds; the edge's limiter must cap what
// reaches the subscriber at burst + rate x elapsed and hand the rest back as deferred.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';

import { originBinary, startEdge, startSubscriber } from './lib/harness.mjs';

/** Runs the origin binary to completion (bounded by `timeoutMs`); {code, stdout, stderr}. */
function runFanout(args, { env = {}, timeoutMs = 60_000 } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(originBinary(), args, {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (c) => (stdout += c));
    child.stderr.setEncoding('utf8').on('data', (c) => (stderr += c));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`fanout ${args.join(' ')} ran over ${timeoutMs} ms; stderr:\n${stderr}`));
    }, timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

test('fanout load: the edge caps one subscriber at burst + rate x elapsed', { timeout: 180_000 }, async (t) => {
  const edge = await startEdge();
  const sink = await startSubscriber();
  t.after(async () => {
    await sink.close();
    await edge.stop();
  });
  const [rate, burst, seconds] = [10, 20, 5];
  const { code, stdout, stderr } = await runFanout(
    [
      'load',
      '--edge-url', edge.url,
      '--sink', `${sink.url}/hooks`,
      '--rate', String(rate),
      '--burst', String(burst),
      '--workers', '8',
      '--duration', `${seconds}s`,
      '--json',
    ],
    { env: { FANOUT_EDGE_KEY: edge.key } },
  );
  assert.equal(code, 0, `fanout load failed:\n${stderr}\n${stdout}`);
  assert.equal(stderr, '', 'no progress bar when stderr is not a terminal');
  const r = JSON.parse(stdout);
  t.diagnostic(
    `calls ${r.requests}, delivered ${r.accepted}, deferred ${r.throttled} ` +
      `(${JSON.stringify(r.deferred_by_reason)}), elapsed ${r.elapsed_secs}s, ` +
      `${r.accepted_per_sec}/s; ceiling ${r.ceiling}`,
  );
  assert.equal(r.mode, 'edge');
  assert.equal(r.errors, 0, `first error: ${r.first_error}`);
  assert.equal(r.failed, 0);
  // The limiter's ceiling over the whole run, plus one token of clock slack.
  assert.ok(r.accepted <= burst + rate * r.elapsed_secs + 1, `delivered ${r.accepted} > ceiling ${r.ceiling}`);
  assert.ok(r.accepted <= burst + rate * seconds + 10, `delivered ${r.accepted} for a ${seconds}s run`);
  // Eight workers never let the bucket sit full: nearly every token is spent.
  assert.ok(r.accepted >= burst + rate * (seconds - 2), `delivered only ${r.accepted}`);
  assert.ok(r.throttled > 0, 'the flood was throttled');
  assert.equal(r.deferred_by_reason.rate > 0, true, JSON.stringify(r.deferred_by_reason));
  assert.equal(r.requests, r.accepted + r.throttled, 'one delivery per call, each answered');
  // What the edge called delivered is what the subscriber received, signed.
  assert.equal(sink.requests.length, r.accepted);
  assert.ok(sink.requests.every((q) => q.path === '/hooks' && q.headers['webhook-signature']?.startsWith('v1,')));
});
