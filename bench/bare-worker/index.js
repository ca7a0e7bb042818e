// The ceiling for bench/edge.mjs: POST /?n=N&url=<sink> fetches the sink N times concurrently,
// each a POST of the same small JSON body the edge sends (the body text is the request body), reads
// every response body (the edge reads them too), and answers {"delivered": k, "failed": m}.
// Only http://127.0.0.1 targets are accepted (it is a local benchmark tool).
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
      await resp.arrayBuffer();
      return resp.status >= 200 && resp.status < 300;
    };
    const settled = await Promise.allSettled(Array.from({ length: n }, one));
    const delivered = settled.filter((s) => s.status === 'fulfilled' && s.value).length;
    return Response.json({ delivered, failed: n - delivered });
  },
};
