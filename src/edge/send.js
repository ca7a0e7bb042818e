// The network half of the Worker, called from Rust (src/edge/send.rs, src/edge/mod.rs) through
// wasm-bindgen.
//
// Rust decides everything: which deliveries are sent, their signed headers, how each result is
// classified and what it does to the limiter. This file only moves bytes, so that a delivery
// costs one call across the wasm boundary (its result) instead of a dozen (building Headers,
// RequestInit and Request, awaiting the fetch and the body, copying the body into wasm).
//
// sendBatch(url, batchJson, timeoutMs, bodyLimit, maxOpen, onDone) -> Promise<void>
//   batchJson  [{"headers": {name: value, ...}, "body": "...", "answer": n?}, ...]: every item is POSTed to url
//              with its headers (all of them, as one plain object: the runtime copies a record
//              faster than it iterates pairs), redirect "manual" (a 3xx is reported as its
//              status, Location never followed).
//   maxOpen    at most this many items are open at once (the platform lets an invocation keep 6
//              connections open; more would queue inside the runtime, their wait counted against
//              their timeouts). The rest wait here, in order, and start as slots free.
//   timeoutMs  per item, from the moment its own fetch starts: when it passes before the status
//              arrived the item is aborted and reported as a timeout; when the status is known
//              and only the body is still coming, it is reported with the body read so far.
//              Items start in order with the same timeout, so their deadlines are in start
//              order: one timer per batch, armed for the oldest open item's deadline, stands in
//              for a timer per item (a timer costs the runtime more than the check).
//   bodyLimit  at most this many bytes of a non-2xx response body are read and handed back
//              (decoded lossily); the rest is never read. A 2xx is reported as soon as its status
//              arrives: the status decides. Its body is cancelled unread, unless it declares a
//              content-length of at most bodyLimit: then it is drained (within the timeout, the
//              slot held meanwhile, the result not waiting) so the connection can be reused. A
//              subscriber that dribbles or streams gigabytes after its 200 costs nothing. An
//              item with `answer` (a batched webhook, whose 2xx may name failed events) has up
//              to that many bytes of its 2xx body read and handed back too.
//   onDone(index, status, retryAfter, body, latencyMs) once per item as soon as it settles:
//              status is the HTTP status, or CONNECT_ERROR / TIMEOUT / BAD_REQUEST below;
//              retryAfter is the raw Retry-After header or null; body is null unless the status
//              is an HTTP status outside 2xx (or the item has `answer`); latencyMs counts from the item's own start. The
//              promise resolves after the last onDone (a draining slot may outlive it) and never
//              rejects.
//
// readLimited(request, limit) -> Promise<Uint8Array | null>
//   The request's body, or null as soon as more than `limit` bytes have arrived (the rest is
//   cancelled, never buffered): a body without content-length is cut while it streams.

const CONNECT_ERROR = 0; // keep in step with send.rs
const TIMEOUT = -1;
const BAD_REQUEST = -2;

const ignore = () => {};

/** Up to `limit` bytes of `stream`, then cancels it; resolves with what was read. */
async function readUpTo(stream, limit, state) {
  const reader = stream.getReader();
  const chunks = [];
  state.reader = reader;
  state.partial = chunks;
  let total = 0;
  try {
    while (total < limit) {
      const { done, value } = await reader.read();
      if (done) break;
      const take = value.subarray(0, limit - total);
      chunks.push(take);
      total += take.length;
    }
  } finally {
    reader.cancel().catch(ignore);
  }
  return chunks;
}

function decode(chunks) {
  const total = chunks.reduce((n, c) => n + c.length, 0);
  const all = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return new TextDecoder().decode(all);
}

/**
 * One item's exchange. `deadline` is when its timeout passes; `expire()` (called by the batch's
 * timer once it has) and the exchange itself both end in `release()`, exactly once.
 */
function startOne(url, item, bodyLimit, report, release, open, timeoutMs) {
  const started = Date.now();
  const controller = new AbortController();
  // status: set once the status line arrived; partial: the body chunks read so far.
  const state = { status: null, retryAfter: null, partial: [], reader: null };
  const send = { deadline: started + timeoutMs, expire: null };
  let reported = false;
  let released = false;
  const free = () => {
    if (released) return;
    released = true;
    open.delete(send);
    release();
  };
  const tell = (status, retryAfter, body) => {
    if (reported) return;
    reported = true;
    report(status, retryAfter, body, Date.now() - started);
  };
  const done = (status, retryAfter, body) => {
    try {
      tell(status, retryAfter, body);
    } finally {
      free();
    }
  };
  send.expire = () => {
    if (reported) {
      // Only the drain of a short 2xx body was left: let the connection go.
      controller.abort();
      free();
    } else if (state.status === null) {
      controller.abort();
      done(TIMEOUT, null, null);
    } else {
      // The status is in; only a slow error body is left: keep what arrived.
      state.reader?.cancel().catch(ignore);
      controller.abort();
      done(state.status, state.retryAfter, decode(state.partial));
    }
  };
  open.add(send);
  let pending;
  try {
    pending = fetch(url, {
      method: 'POST',
      headers: item.headers,
      body: item.body,
      redirect: 'manual',
      signal: controller.signal,
    });
  } catch {
    done(BAD_REQUEST, null, null);
    return;
  }
  pending.then(
    (resp) => {
      state.status = resp.status;
      state.retryAfter = resp.headers.get('retry-after');
      const success = resp.status >= 200 && resp.status <= 299;
      if (success && resp.body && item.answer) {
        // A batch's answer: its body may name the events that failed.
        readUpTo(resp.body, item.answer, state).then(
          (chunks) => done(resp.status, state.retryAfter, decode(chunks)),
          () => done(resp.status, state.retryAfter, decode(state.partial)),
        );
        return;
      }
      if (success && resp.body) {
        // The status decides, now. A short declared body (the usual "ok") is still drained,
        // within the item's timeout and without holding up the result, so that the
        // connection can be reused; any other body is cancelled unread.
        tell(resp.status, state.retryAfter, null);
        const declared = Number(resp.headers.get('content-length') ?? NaN);
        if (declared <= bodyLimit) resp.arrayBuffer().then(free, free);
        else {
          resp.body.cancel().catch(ignore);
          free();
        }
        return;
      }
      if (!resp.body) {
        done(resp.status, state.retryAfter, success ? null : '');
        return;
      }
      readUpTo(resp.body, bodyLimit, state).then(
        (chunks) => done(resp.status, state.retryAfter, decode(chunks)),
        // The body broke off: keep the status and what arrived of the body.
        () => done(resp.status, state.retryAfter, decode(state.partial)),
      );
    },
    () => done(controller.signal.aborted ? TIMEOUT : CONNECT_ERROR, null, null),
  );
}

export function sendBatch(url, batchJson, timeoutMs, bodyLimit, maxOpen, onDone) {
  const items = JSON.parse(batchJson);
  // The URL is the same for every item: one that the runtime refuses is refused once, here.
  let refused = false;
  try {
    new Request(url, { method: 'POST', redirect: 'manual' });
  } catch {
    refused = true;
  }
  let next = 0;
  let left = items.length;
  let running = 0;
  // The items open now, in start order (= deadline order), and the batch's one timer.
  const open = new Set();
  let timer = null;
  const arm = () => {
    if (timer !== null || open.size === 0) return;
    const first = open.values().next().value;
    timer = setTimeout(expire, Math.max(1, first.deadline - Date.now()));
  };
  const expire = () => {
    timer = null;
    const now = Date.now();
    for (const send of open) {
      if (send.deadline > now) break;
      send.expire(); // removes it from `open`
    }
    arm();
  };
  // The batch is done when every item is reported, even if a slot is still draining a body.
  return new Promise((resolve) => {
    const finish = () => {
      if (timer !== null && open.size === 0) {
        clearTimeout(timer);
        timer = null;
      }
    };
    if (left === 0) {
      resolve();
      return;
    }
    const reportOne = (i) => (status, retryAfter, body, latency) => {
      try {
        onDone(i, status, retryAfter, body, latency);
      } finally {
        left -= 1;
        if (left === 0) resolve();
      }
    };
    // Each freed slot takes the next waiting item.
    const release = () => {
      running -= 1;
      fill();
      finish();
    };
    const fill = () => {
      while (running < maxOpen && next < items.length) {
        const i = next;
        next += 1;
        running += 1;
        if (refused) {
          reportOne(i)(BAD_REQUEST, null, null, 0);
          running -= 1;
          continue;
        }
        try {
          startOne(url, items[i], bodyLimit, reportOne(i), release, open, timeoutMs);
        } catch {
          /* startOne reports and releases every item itself */
        }
      }
      arm();
    };
    fill();
  });
}

export async function readLimited(request, limit) {
  if (!request.body) return new Uint8Array(0);
  const reader = request.body.getReader();
  const chunks = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.length;
    if (total > limit) {
      reader.cancel().catch(ignore);
      return null;
    }
    chunks.push(value);
  }
  const all = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return all;
}
