// The edge's logs: one JSON record per delivery outcome, from the allowlist only. Deliveries whose
// payload carries emails, to a URL with a token in its query and an IP address in it, whose
// subscriber answers with a recognisable body: the captured workerd output has a record for each
// and none of the payload, URL, secrets or response body.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';
import { newSecret, startEdge, startSubscriber, waitFor } from './lib/harness.mjs';
import { delivery, send, subscriberSpec } from './lib/edge_client.mjs';

let edge;
before(async () => {
  edge = await startEdge();
});
after(async () => {
  await edge?.stop();
});

const ALLOWED = new Set([
  'delivery_id',
  'event_id',
  'event_type',
  'subscriber_id',
  'outcome',
  'status',
  'latency_ms',
  'attempt',
]);

/** JSON objects with a delivery_id among the captured lines (wrangler may prefix a line). */
function deliveryRecords(lines) {
  const out = [];
  for (const line of lines) {
    const i = line.indexOf('{');
    if (i < 0) continue;
    try {
      const obj = JSON.parse(line.slice(i));
      if (obj && typeof obj === 'object' && 'delivery_id' in obj) out.push(obj);
    } catch {
      /* not a record */
    }
  }
  return out;
}

test('delivery logs are allowlisted records and leak no payload, URL, IP, secret or response body', async () => {
  const EMAILS = ['jane.doe@example.com', 'ceo+vip@bigcorp.example'];
  const TOKEN = 'SECRET123';
  const MARKER = 'RESPONSE_BODY_MARKER_7f3a';
  const answers = {
    '/ok': () => ({ status: 200, body: `${MARKER} ok` }),
    '/fail': () => ({ status: 500, body: `${MARKER} stack trace at 10.1.2.3` }),
    '/gone': () => ({ status: 410, body: `${MARKER} gone` }),
    '/limited': () => ({ status: 429, headers: { 'retry-after': '60' }, body: `${MARKER} slow down` }),
  };
  const sub = await startSubscriber((req) => answers[req.path.split('?')[0]]());
  const secret = newSecret();
  try {
    const payload = (id) =>
      JSON.stringify({ id, type: 'user.signup', user: { email: EMAILS[0], cc: EMAILS[1], token: TOKEN } });
    const mk = (p, extra = {}) =>
      subscriberSpec(`${sub.url}${p}?token=${TOKEN}&email=${encodeURIComponent(EMAILS[0])}`, {
        secrets: [secret],
        legacy_signature: true,
        ...extra,
      });
    const sent = []; // [delivery, subscriber spec, result]
    const ports = [sub.port];
    for (const [p, outcome] of [
      ['/ok', 'delivered'],
      ['/fail', 'failed'],
      ['/gone', 'rejected'],
    ]) {
      const spec = mk(p);
      const ds = [delivery({ eventId: `evt_log_${p.slice(1)}` }), delivery()].map((d) => ({ ...d, body: payload(d.event_id) }));
      const results = await send(edge, spec, ds);
      for (const [d, r] of ds.map((d, i) => [d, results[i]])) {
        assert.equal(r.outcome, outcome, JSON.stringify(r));
        sent.push([d, spec, r]);
      }
    }
    // 429 then a deferral (paused), and a rate deferral.
    const limited = mk('/limited');
    for (let i = 0; i < 2; i++) {
      const d = { ...delivery(), body: payload(`evt_lim_${i}`) };
      const [r] = await send(edge, limited, [d]);
      sent.push([d, limited, r]);
    }
    assert.deepEqual(
      sent.slice(-2).map(([, , r]) => r.outcome),
      ['failed', 'deferred'],
    );
    const tight = mk('/ok', { rate_per_sec: 1, burst: 1 });
    const pair = [delivery(), delivery()].map((d) => ({ ...d, body: payload(d.event_id) }));
    const pr = await send(edge, tight, pair);
    assert.deepEqual(
      pr.map((r) => r.outcome),
      ['delivered', 'deferred'],
    );
    pair.forEach((d, i) => sent.push([d, tight, pr[i]]));
    assert.ok(sub.requests.length >= 8);

    // Transport failures: a hanging endpoint (timeout) and a closed port (connect error), both
    // with the token and an IP in the URL; workerd's own diagnostics must not print them either.
    const hang = http.createServer(() => {});
    await new Promise((resolve) => hang.listen(0, '127.0.0.1', resolve));
    const closed = await startSubscriber(() => 200);
    await closed.close();
    const hangPort = hang.address().port;
    try {
      for (const [url, error] of [
        [`http://127.0.0.1:${hangPort}/h?token=${TOKEN}`, 'timeout'],
        [`${closed.url}/h?token=${TOKEN}`, 'connect'],
      ]) {
        const spec = subscriberSpec(url, { secrets: [secret], timeout_ms: 300 });
        const d = { ...delivery(), body: payload('evt_transport') };
        const [r] = await send(edge, spec, [d]);
        assert.equal(r.outcome, 'failed', JSON.stringify(r));
        assert.equal(r.error, error);
        sent.push([d, spec, r]);
      }
    } finally {
      hang.closeAllConnections();
      hang.close();
    }
    ports.push(hangPort, closed.port);

    // The Worker's console output reaches the captured lines asynchronously: wait for every record.
    const ids = sent.map(([d]) => d.id);
    await waitFor(() => {
      const have = new Set(deliveryRecords(edge.logs).map((r) => r.delivery_id));
      return ids.every((id) => have.has(id));
    }, 10_000, { message: 'a log record for every delivery' });

    const records = deliveryRecords(edge.logs);
    for (const [d, spec, r] of sent) {
      const mine = records.filter((x) => x.delivery_id === d.id);
      assert.equal(mine.length, 1, `one record for ${d.id}`);
      const rec = mine[0];
      for (const k of Object.keys(rec)) assert.ok(ALLOWED.has(k), `field ${k} is not on the allowlist`);
      assert.equal(rec.event_id, d.event_id);
      assert.equal(rec.event_type, d.type);
      assert.equal(rec.subscriber_id, spec.id);
      assert.equal(rec.outcome, r.outcome);
      assert.equal(rec.attempt, d.attempt);
      if (r.status !== undefined) assert.equal(rec.status, r.status);
    }

    // Nothing sensitive anywhere in the captured output (wrangler's own lines included).
    const text = edge.logs.join('\n');
    const forbidden = [
      ...EMAILS,
      encodeURIComponent(EMAILS[0]),
      TOKEN,
      MARKER,
      ...ports.flatMap((p) => [`127.0.0.1:${p}`, `localhost:${p}`, `:${p}/`]),
      sub.url,
      '/ok?',
      '10.1.2.3',
      secret,
      secret.slice('whsec_'.length),
      edge.key,
      edge.key.slice('whsec_'.length),
      'user.signup', // the payload's event type (the records carry the delivery's type)
      '"user":{',
    ];
    for (const f of forbidden) {
      const hit = edge.logs.find((l) => l.includes(f));
      assert.equal(hit, undefined, `the logs contain ${JSON.stringify(f)}: ${hit}`);
    }
    // Also no signature header value (legacy or Standard Webhooks) from the deliveries.
    for (const req of sub.requests) {
      assert.ok(!text.includes(req.headers['webhook-signature'].slice(3, 30)), 'a signature leaked');
      assert.ok(!text.includes(req.headers['x-fanout-signature'].slice(7, 40)), 'a legacy signature leaked');
    }
  } finally {
    await sub.close();
  }
});
