// The ceiling for bench/edge.mjs: a Worker that delivers the same webhooks as the edge with
// nothing else around them. POST /?n=N&url=<sink>[&open=6][&signed=0] POSTs the request's body
// (the body text) to the sink N times, at most `open` at once (default 6, like the edge's
// MAX_OPEN_SENDS and the platform's limit of simultaneous connections). Each request carries
// what the edge's does: content-type, user-agent and the Standard Webhooks headers, signed with
// HMAC-SHA256 over "{id}.{timestamp}.{body}" (crypto.subtle, a random key imported once per
// isolate). `signed=0` sends only content-type (the unsigned loop earlier runs measured).
// Response bodies are treated as the edge treats them (a 2xx body declared at most 4 KiB is
// drained, any other cancelled). Answers {"delivered": k, "failed": m}.
// No Durable Object, no limiter, no result bookkeeping, no logging: what the edge does on top of
// this is what bench/edge.mjs prices. Only http://127.0.0.1 targets are accepted.
import { atMostOpen, openOf, signature } from '../lanes.js';

export default {
  async fetch(request) {
    const u = new URL(request.url);
    if (u.pathname === '/healthz') return new Response('ok');
    const n = Math.min(Math.max(Number(u.searchParams.get('n') ?? '1') | 0, 1), 1000);
    const target = u.searchParams.get('url') ?? '';
    if (!target.startsWith('http://127.0.0.1:')) {
      return new Response('url must be http://127.0.0.1:<port>/...', { status: 400 });
    }
    const signed = u.searchParams.get('signed') !== '0';
    const body = await request.text();
    const call = crypto.randomUUID();
    const one = async (i) => {
      const headers = { 'content-type': 'application/json' };
      if (signed) {
        const id = `evt_${call}_${i}`;
        const ts = String(Math.floor(Date.now() / 1000));
        headers['user-agent'] = 'Fanout/1 (+webhooks)';
        headers['webhook-id'] = id;
        headers['webhook-timestamp'] = ts;
        headers['webhook-signature'] = await signature(id, ts, body);
      }
      const resp = await fetch(target, { method: 'POST', headers, body, redirect: 'manual' });
      const ok = resp.status >= 200 && resp.status < 300;
      // As the edge does: a 2xx body declared at most 4 KiB is drained (connection reuse), any
      // other 2xx body cancelled unread.
      if (ok && Number(resp.headers.get('content-length') ?? NaN) > 4096) resp.body?.cancel().catch(() => {});
      else await resp.arrayBuffer();
      return ok;
    };
    const delivered = await atMostOpen(n, openOf(u.searchParams), one);
    return Response.json({ delivered, failed: n - delivered });
  },
};
