// Shared by bench/bare-worker and bench/probe-worker (each bundles it): a call's fetches, at
// most `open` at once, as the edge keeps at most MAX_OPEN_SENDS of a call open, and the
// Standard Webhooks signature the edge puts on each of them.

const enc = new TextEncoder();
let hmacKey; // the import of one random key per isolate, started on first use

/**
 * `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, the edge's `webhook-signature`,
 * through crypto.subtle (how a JavaScript Worker signs).
 */
export async function signature(id, timestamp, body) {
  hmacKey ??= crypto.subtle.importKey('raw', crypto.getRandomValues(new Uint8Array(32)), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  const mac = new Uint8Array(await crypto.subtle.sign('HMAC', await hmacKey, enc.encode(`${id}.${timestamp}.${body}`)));
  let s = '';
  for (const b of mac) s += String.fromCharCode(b);
  return `v1,${btoa(s)}`;
}

/** The query's `open` (default 6, between 1 and 1000). */
export function openOf(searchParams) {
  return Math.min(Math.max(Number(searchParams.get('open') ?? '6') | 0, 1), 1000);
}

/**
 * Runs `one(i)` for i = 0..n-1, at most `open` at once, each starting as another ends; resolves
 * with how many answered true (one that throws counts as not).
 */
export async function atMostOpen(n, open, one) {
  let next = 0;
  let delivered = 0;
  const lane = async () => {
    while (next < n) {
      const i = next++;
      try {
        if (await one(i)) delivered += 1;
      } catch {
        /* counted as failed */
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(open, n) }, lane));
  return delivered;
}
