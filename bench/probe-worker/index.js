// Investigation Worker for bench/edge.mjs `--probe`: POST /?n=N&url=<sink>&<switches> fetches the
// sink N times, at most `open` (default 6) at once, like bench/bare-worker, with switches that add one cost of the real
// edge each (all off = the bare Worker):
//   do=1       run the fetch loop inside a Durable Object (one DO round trip per call, like the edge)
//   sql=1      (with do=1) one SQLite upsert before and one after the loop, like the edge's limiter
//   log=1      one console.log of a small JSON record per fetch
//   log=2      the same records, but one console.log per call (the lines joined by "\n")
//   sign=1     one HMAC-SHA256 (crypto.subtle) of "{id}.{ts}.{body}" per fetch, as a header
//   timeout=1  an AbortController and a setTimeout race per fetch
//   headers=1  the edge's five request headers on every fetch
// Only http://127.0.0.1 targets. Answers {"delivered": k, "failed": m}.
import { DurableObject } from 'cloudflare:workers';

import { atMostOpen, openOf, signature } from '../lanes.js';

async function run(u, body) {
  const n = Math.min(Math.max(Number(u.searchParams.get('n') ?? '1') | 0, 1), 1000);
  const target = u.searchParams.get('url') ?? '';
  if (!target.startsWith('http://127.0.0.1:')) throw new Error('url must be http://127.0.0.1:<port>/...');
  const on = (k) => u.searchParams.get(k) === '1';
  const [log, sign, timeout, headers] = ['log', 'sign', 'timeout', 'headers'].map(on);
  const logBatch = u.searchParams.get('log') === '2';
  const lines = [];
  const one = async (i) => {
    const started = Date.now();
    const h = { 'content-type': 'application/json' };
    if (headers) {
      h['user-agent'] = 'Fanout/1 (+webhooks)';
      h['webhook-id'] = `evt_${i}`;
      h['webhook-timestamp'] = String(Math.floor(started / 1000));
    }
    if (sign) {
      h['webhook-signature'] = await signature(`evt_${i}`, Math.floor(started / 1000), body);
    }
    let ok;
    if (timeout) {
      const ctl = new AbortController();
      let timer;
      const t = new Promise((resolve) => (timer = setTimeout(() => resolve('timeout'), 10_000)));
      const work = fetch(target, { method: 'POST', headers: h, body, redirect: 'manual', signal: ctl.signal }).then(async (r) => {
        await r.arrayBuffer();
        return r.status;
      });
      const status = await Promise.race([work, t]);
      clearTimeout(timer);
      if (status === 'timeout') ctl.abort();
      ok = typeof status === 'number' && status >= 200 && status < 300;
    } else {
      const r = await fetch(target, { method: 'POST', headers: h, body, redirect: 'manual' });
      await r.arrayBuffer();
      ok = r.status >= 200 && r.status < 300;
    }
    if (log || logBatch) {
      const line = JSON.stringify({ delivery_id: `dlv_${i}`, event_id: `evt_${i}`, event_type: 'bench.event', subscriber_id: 'sub', outcome: ok ? 'delivered' : 'failed', status: 200, latency_ms: Date.now() - started, attempt: 1 });
      if (logBatch) lines.push(line);
      else console.log(line);
    }
    return ok;
  };
  // At most `open` fetches at once (default 6), as the edge and bench/bare-worker do.
  const delivered = await atMostOpen(n, openOf(u.searchParams), one);
  if (lines.length) console.log(lines.join('\n'));
  return { delivered, failed: n - delivered };
}

export class ProbeDO extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec('CREATE TABLE IF NOT EXISTS s (id INTEGER PRIMARY KEY, v TEXT)');
  }
  async fetch(request) {
    const u = new URL(request.url);
    const body = await request.text();
    const sql = u.searchParams.get('sql') === '1';
    const save = () => this.sql.exec('INSERT INTO s (id, v) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET v = excluded.v', JSON.stringify({ t: Date.now() }));
    if (sql) save();
    const r = await run(u, body);
    if (sql) save();
    return Response.json(r);
  }
}

export default {
  async fetch(request, env) {
    const u = new URL(request.url);
    if (u.pathname === '/healthz') return new Response('ok');
    try {
      if (u.searchParams.get('do') === '1') {
        const key = u.searchParams.get('key') ?? 'probe';
        const stub = env.PROBE.get(env.PROBE.idFromName(key));
        return stub.fetch(request);
      }
      return Response.json(await run(u, await request.text()));
    } catch (e) {
      return new Response(String(e?.message ?? e), { status: 400 });
    }
  },
};
