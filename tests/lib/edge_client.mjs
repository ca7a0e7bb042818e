// Small helpers for the edge's end-to-end tests: build delivery batches the way the manual's
// edge API (docs/src/edge.md) spells them, send them signed, and read the answers.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { newSecret, signedFetch } from './harness.mjs';

let seq = 0;
/** A unique id with a readable prefix. */
export function uid(prefix) {
  seq += 1;
  return `${prefix}_${process.pid}_${seq}_${crypto.randomBytes(3).toString('hex')}`;
}

/** A subscriber spec for `url` with generous limits unless overridden. */
export function subscriberSpec(url, overrides = {}) {
  return {
    id: uid('sub'),
    url,
    secrets: [newSecret()],
    rate_per_sec: 1000,
    burst: 1000,
    max_in_flight: 64,
    timeout_ms: 5_000,
    ...overrides,
  };
}

/** One delivery; `body` defaults to a small JSON event. */
export function delivery({ id, eventId, type = 'video.trending', attempt = 1, body } = {}) {
  const event_id = eventId ?? uid('evt');
  return {
    id: id ?? uid('dlv'),
    event_id,
    type,
    attempt,
    body: body ?? JSON.stringify({ id: event_id, type, data: { n: seq } }),
  };
}

/** `n` fresh deliveries. */
export function deliveries(n, opts = {}) {
  return Array.from({ length: n }, () => delivery(opts));
}

/**
 * POST /v1/deliveries signed with the edge key. Returns {status, json, headers, text}.
 * `raw` sends a string body as is (for malformed-input cases).
 */
export async function postBatch(edge, subscriber, dels, opts = {}) {
  const body = opts.raw ?? JSON.stringify({ subscriber, deliveries: dels });
  const res = await signedFetch(`${edge.url}/v1/deliveries`, opts.key ?? edge.key, body, opts);
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, headers: res.headers, text };
}

/**
 * postBatch, then checks the envelope every successful answer must have: one result per
 * delivery, in order, and HTTP 202 exactly when something was deferred. Returns the results.
 */
export async function send(edge, subscriber, dels, opts = {}) {
  const r = await postBatch(edge, subscriber, dels, opts);
  assert.ok(r.status === 200 || r.status === 202, `edge answered ${r.status}: ${r.text}`);
  assert.ok(Array.isArray(r.json?.results), `no results array: ${r.text}`);
  assert.deepEqual(
    r.json.results.map((x) => x.id),
    dels.map((d) => d.id),
    'one result per delivery, in order',
  );
  const anyDeferred = r.json.results.some((x) => x.outcome === 'deferred');
  assert.equal(r.status, anyDeferred ? 202 : 200, `HTTP status vs deferred results: ${r.text}`);
  return r.json.results;
}

/** GET /v1/subscribers/{id}, signed with an empty body. Returns {status, json}. */
export async function subscriberStatus(edge, id, opts = {}) {
  const res = await signedFetch(`${edge.url}/v1/subscribers/${encodeURIComponent(id)}`, opts.key ?? edge.key, null, {
    method: 'GET',
    ...opts,
  });
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text };
}

/** Counts results by outcome (and by reason for deferrals): {delivered: 3, 'deferred:rate': 2}. */
export function tally(results) {
  const out = {};
  for (const r of results) {
    const k = r.outcome === 'deferred' ? `deferred:${r.reason}` : r.outcome;
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}
