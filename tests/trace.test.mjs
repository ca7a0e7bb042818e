// OpenTelemetry on the edge lane (issue 26): the real daemon hands its deliveries to the real
// Worker with each one's `traceparent` on the wire, and the Worker sends it as a header only
// to a subscriber with `"propagate_trace": true`. With an OTLP endpoint set the header's parent
// is the origin's attempt span (exported to a receiver here, over http/protobuf); its trace
// id is the producer's either way.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';

import { startEdge, startOrigin, startSubscriber, waitFor } from './lib/harness.mjs';

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const PARENT = '00f067aa0ba902b7';
const PRODUCER = `00-${TRACE}-${PARENT}-01`;

/** An OTLP/HTTP receiver keeping each `POST /v1/traces` body's bytes. */
async function startReceiver() {
  const bodies = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      if (req.url === '/v1/traces' && req.headers['content-type'] === 'application/x-protobuf') {
        bodies.push(Buffer.concat(chunks));
      }
      res.writeHead(200, { 'content-type': 'application/x-protobuf' });
      res.end();
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  return { url, bodies, close: () => new Promise((resolve) => server.close(resolve)) };
}

test('through the edge: traceparent in the producer trace to propagate_trace subscribers only', async (t) => {
  const edge = await startEdge();
  const receiver = await startReceiver();
  const origin = await startOrigin({
    edge,
    env: {
      OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
      OTEL_BSP_SCHEDULE_DELAY: '50',
    },
  });
  const traced = await startSubscriber();
  const plain = await startSubscriber();
  t.after(async () => {
    await origin.stop();
    await edge.stop();
    await traced.close();
    await plain.close();
    await receiver.close();
  });
  for (const [id, sub, propagate] of [['traced', traced, true], ['plain', plain, false]]) {
    const res = await origin.api('/v1/subscribers', {
      body: { id, url: `${sub.url}/private-path`, event_types: ['*'], lane: 'edge', propagate_trace: propagate },
    });
    const body = await res.json();
    assert.equal(res.status, 201, JSON.stringify(body));
    assert.equal(body.propagate_trace, propagate);
  }
  const res = await origin.api('/v1/events', {
    body: [{ id: 'evt_e1', type: 'a' }, { id: 'evt_e2', type: 'a' }],
    headers: { traceparent: PRODUCER },
  });
  assert.equal(res.status, 202, await res.text());
  await waitFor(() => traced.requests.length === 2 && plain.requests.length === 2, 30_000, {
    message: 'both events to both subscribers',
  });
  for (const r of traced.requests) {
    const tp = r.headers.traceparent;
    assert.match(tp ?? '', /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/, `traceparent: ${tp}`);
    assert.equal(tp.split('-')[1], TRACE, 'the producer trace');
    assert.notEqual(tp.split('-')[2], PARENT, "the origin's attempt span is the parent");
  }
  for (const r of plain.requests) assert.equal(r.headers.traceparent, undefined);

  // The attempt spans reach the receiver: protobuf holding the producer's trace id as bytes,
  // marked as edge attempts, and no subscriber URL path.
  const traceBytes = Buffer.from(TRACE, 'hex');
  await waitFor(
    () => receiver.bodies.some((b) => b.includes(traceBytes) && b.includes('fanout.lane') && b.includes('edge')),
    30_000,
    { message: 'the edge attempts exported in the producer trace' },
  );
  for (const b of receiver.bodies) assert.ok(!b.includes('private-path'), 'no URL path exported');
});
