// `fanout listen` with scripts/dev.sh's shape: the real daemon with the real Worker in workerd as
// its edge. With `--lane auto` the daemon picks the edge, and the Worker (ALLOW_LOOPBACK_HTTP)
// reaches the listener's receiver on 127.0.0.1: the webhook arrives verified by the edge lane.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import readline from 'node:readline';

import { originBinary, startEdge, startOrigin, waitFor } from './lib/harness.mjs';

test('fanout listen receives through the local edge, verified, and Ctrl-C removes its subscriber', async (t) => {
  const edge = await startEdge();
  const origin = await startOrigin({ edge });
  const child = spawn(originBinary(), ['listen', '--port', '0', '--lane', 'auto', '--server', origin.url], {
    env: { ...process.env, FANOUT_API_TOKEN: origin.token },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  t.after(async () => {
    // Ctrl-C before the daemon stops, so the listener removes its subscriber itself (its
    // reaper, which shares its stderr, then has nothing to do).
    if (child.exitCode === null) child.kill('SIGINT');
    await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 5_000))]);
    child.stdout.destroy();
    child.stderr.destroy();
    await origin.stop();
    await edge.stop();
  });
  const out = [];
  const err = [];
  readline.createInterface({ input: child.stdout }).on('line', (l) => out.push(l));
  readline.createInterface({ input: child.stderr }).on('line', (l) => err.push(l));
  await waitFor(() => err.some((l) => l.startsWith('Ready.')), 15_000, { message: "the listener says it is ready" });
  const id = err[0].split(/\s+/)[7];
  assert.match(id, /^listen_/);

  const res = await origin.api('/v1/events', { body: { id: 'evt_edge_1', type: 'video.trending', video: 'v_42' } });
  assert.equal(res.status, 202, await res.text());
  await waitFor(() => out.some((l) => l.includes('evt_edge_1')), 20_000, { message: 'the webhook arrives' });
  const line = out.find((l) => l.includes('evt_edge_1'));
  assert.match(line, /evt_edge_1 {2}video\.trending {2}seq \S+ {2}200 {2}verified$/);

  // The daemon records the attempt once the edge has answered it.
  const list = await (await origin.api(`/v1/deliveries?subscriber=${id}`)).json();
  const attempts = await waitFor(
    async () => {
      const one = await (await origin.api(`/v1/deliveries/${list.deliveries[0].id}`)).json();
      return one.attempts?.length ? one.attempts : null;
    },
    10_000,
    { message: 'the attempt is recorded' },
  );
  assert.deepEqual(attempts.map((a) => [a.lane, a.status]), [['edge', 200]]);

  child.kill('SIGINT');
  assert.equal(await exited, 0, err.join('\n'));
  assert.equal((await origin.api(`/v1/subscribers/${id}`)).status, 404);
});
