// The ceiling for bench/edge.mjs: POST /?n=N&url=<sink>[&open=6] fetches the sink N times, at
// most `open` at once (default 6, like the edge's MAX_OPEN_SENDS and the platform's limit of
// simultaneous connections), each a POST of the same small JSON body the edge sends (the body
// text is the request body), treats response bodies as the edge does (a 2xx body declared at most
// 4 KiB is drained, any other cancelled) and answers {"delivered": k, "failed": m}.
// Only http://127.0.0.1 targets are accepted (it is a local benchmark tool).
import { atMostOpen, openOf } from '../lanes.js';

export default {
  async fetch(request) {
    const u = new URL(request.url);
    if (u.pathname === '/healthz') return new Response('ok');
    const n = Math.min(Math.max(Number(u.searchParams.get('n') ?? '1') | 0, 1), 1000);
    const target = u.searchParams.get('url') ?? '';
    if (!target.startsWith('http://127.0.0.1:')) {
      return new Response('url must be http://127.0.0.1:<port>/...', { status: 400 });
    }
    const body = await request.text();
    const one = async () => {
      const resp = await fetch(target, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
        redirect: 'manual',
      });
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
