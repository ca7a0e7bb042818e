// The network half of sending one batch, called from src/edge/send.rs through wasm-bindgen.
//
// Rust decides everything: which deliveries are sent, their signed headers, how each result is
// classified and what it does to the limiter. This file only moves bytes, so that a delivery
// costs one call across the wasm boundary (its result) instead of a dozen (building Headers,
// RequestInit and Request, awaiting the fetch and the body, copying the body into wasm).
//
// sendBatch(url, batchJson, timeoutMs, bodyLimit, onDone) -> Promise<void>
//   batchJson  {"common": [[name, value], ...], "items": [{"headers": [[name, value], ...],
//              "body": "..."}, ...]}: every item is POSTed to url with the common headers and its
//              own, redirect "manual" (a 3xx is reported as its status, Location never followed).
//   timeoutMs  one timer for the whole batch (every delivery starts now): when it fires, whatever
//              is still open is aborted and reported as a timeout.
//   bodyLimit  at most this many bytes of a non-2xx response body are handed back (decoded
//              lossily); a 2xx body is read to the end (so the connection can be reused) and
//              dropped.
//   onDone(index, status, retryAfter, body, latencyMs) once per item as soon as it settles:
//              status is the HTTP status, or CONNECT_ERROR / TIMEOUT / BAD_REQUEST below;
//              retryAfter is the raw Retry-After header or null; body is null unless the status
//              is an HTTP status outside 2xx. The promise resolves after the last onDone and
//              never rejects.

const CONNECT_ERROR = 0; // keep in step with send.rs
const TIMEOUT = -1;
const BAD_REQUEST = -2;

export function sendBatch(url, batchJson, timeoutMs, bodyLimit, onDone) {
  const { common, items } = JSON.parse(batchJson);
  const started = Date.now();
  const controller = new AbortController();
  const settled = new Uint8Array(items.length);
  let open = items.length;
  return new Promise((resolve) => {
    if (open === 0) {
      resolve();
      return;
    }
    let timer;
    const done = (i, status, retryAfter, body) => {
      if (settled[i]) return;
      settled[i] = 1;
      open -= 1;
      try {
        onDone(i, status, retryAfter, body, Date.now() - started);
      } finally {
        if (open === 0) {
          clearTimeout(timer);
          resolve();
        }
      }
    };
    timer = setTimeout(() => {
      controller.abort();
      for (let i = 0; i < items.length; i += 1) done(i, TIMEOUT, null, null);
    }, timeoutMs);
    items.forEach((item, i) => {
      let request;
      try {
        request = new Request(url, {
          method: 'POST',
          headers: common.concat(item.headers),
          body: item.body,
          redirect: 'manual',
          signal: controller.signal,
        });
      } catch {
        done(i, BAD_REQUEST, null, null);
        return;
      }
      fetch(request).then(
        async (resp) => {
          const retryAfter = resp.headers.get('retry-after');
          let body = null;
          try {
            const bytes = new Uint8Array(await resp.arrayBuffer());
            if (resp.status < 200 || resp.status > 299) {
              body = new TextDecoder().decode(bytes.subarray(0, bodyLimit));
            }
          } catch {
            // The status line arrived but the body broke off: keep the status, no body. (When
            // the timer aborted it, the item was already reported as a timeout.)
            body = resp.status < 200 || resp.status > 299 ? '' : null;
          }
          done(i, resp.status, retryAfter, body);
        },
        () => done(i, controller.signal.aborted ? TIMEOUT : CONNECT_ERROR, null, null),
      );
    });
  });
}
