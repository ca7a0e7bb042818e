// Shared by bench/bare-worker and bench/probe-worker (each bundles it): a call's fetches, at
// most `open` at once, as the edge keeps at most MAX_OPEN_SENDS of a call open.

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
