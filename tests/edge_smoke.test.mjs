// Smoke test: the built Worker starts under `wrangler dev` and answers GET /healthz.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startEdge } from './lib/harness.mjs';

let edge;
before(async () => {
  edge = await startEdge();
});
after(async () => {
  await edge?.stop();
});

test('GET /healthz answers 200', async () => {
  const res = await fetch(`${edge.url}/healthz`);
  await res.arrayBuffer();
  assert.equal(res.status, 200);
});
