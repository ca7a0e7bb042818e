// Fanout customer portal. Plain JavaScript, no build step, served by `fanout serve` at /portal.
//
// Rules this file keeps: the link's token arrives in the URL fragment (#token=…, never sent to
// a server), is removed from the address bar at once and kept in this tab only (memory and
// sessionStorage, no cookie); it goes out as `Authorization: Bearer` to the same /v1 routes as
// any client, which answer for this customer alone. Every value from the API reaches the page
// through textContent / text nodes, never innerHTML: a response body is shown as text.
'use strict';

(() => {
  const TOKEN_KEY = 'fanout.portal.token';

  // The helpers this page shares with the console (/common.js).
  const { $, h, request, parseJsonBox, filterText, fmtTime } = window.FanoutPage;
  const STATUS_LABEL = { dead: 'failed', pending: 'retrying', sent: 'delivered', in_flight: 'sending' };
  const badge = (status) => window.FanoutPage.badge(status, STATUS_LABEL[status] ?? status);

  // ------------------------------------------------------------------------------------------
  // The token: from the fragment once, then from this tab's storage.

  let bearer = null;
  function storage() {
    try {
      return window.sessionStorage;
    } catch {
      return null; // storage refused (a strict embedding): the token stays in memory
    }
  }
  function takeToken() {
    const m = /(?:^|&)token=([^&]+)/.exec(location.hash.slice(1));
    if (m) {
      bearer = decodeURIComponent(m[1]);
      storage()?.setItem(TOKEN_KEY, bearer);
      history.replaceState(null, '', location.pathname + location.search);
    } else {
      bearer = storage()?.getItem(TOKEN_KEY) ?? null;
    }
  }
  /** What the token says about itself (customer, expiry), for display only; the daemon decides. */
  function claims() {
    try {
      const payload = bearer.slice(4).split('.')[0].replace(/-/g, '+').replace(/_/g, '/');
      return JSON.parse(atob(payload));
    } catch {
      return null;
    }
  }

  /** One API call with the link's token; a refused token (401) ends the page. */
  async function call(method, path, body) {
    try {
      return await request(method, path, body, bearer, 'The service');
    } catch (e) {
      if (e.status === 401) fatal(e.apiMessage ?? 'This link is not valid.');
      throw e;
    }
  }

  function fatal(message) {
    bearer = null;
    storage()?.removeItem(TOKEN_KEY);
    for (const id of ['endpoints-view', 'deliveries-view', 'detail']) $(`#${id}`).hidden = true;
    $('#fatal-message').textContent = message;
    $('#fatal').hidden = false;
  }

  const flash = window.FanoutPage.flasher('#flash', 'ok', () => 6000);
  const report = (e) => flash(e.message, 'error');

  // ------------------------------------------------------------------------------------------
  // Endpoints

  /** One line on an endpoint's health, from what the API says about it. */
  function health(s, now) {
    const st = s.stats ?? {};
    if (s.disabled) return { key: 'disabled', text: `Paused — ${s.disabled_reason ?? 'disabled'}` };
    if (st.breaker?.state === 'open') return { key: 'breaker', text: 'Failing: deliveries held back after repeated errors' };
    if (st.paused_until_ms && st.paused_until_ms > now)
      return { key: 'paused', text: `Asked us to wait (Retry-After) until ${fmtTime(st.paused_until_ms)}` };
    if (s.failing_since_ms) return { key: 'failing', text: `Failing since ${fmtTime(s.failing_since_ms)}` };
    return { key: 'ok', text: 'Delivering' };
  }

  let endpoints = [];
  async function loadEndpoints() {
    const data = await call('GET', '/v1/subscribers?stats=true');
    endpoints = data.subscribers;
    // Ordered endpoints: the keys a failing delivery holds back (GET …/held).
    await Promise.all(endpoints.filter((s) => s.ordering && s.ordering !== 'none').map(async (s) => {
      s.held = (await call('GET', `/v1/subscribers/${encodeURIComponent(s.id)}/held`)).keys ?? [];
    }));
    const now = Date.now();
    const box = $('#endpoints');
    box.replaceChildren(
      ...endpoints.map((s) => {
        const hl = health(s, now);
        const st = s.stats ?? {};
        return h(
          'article',
          { class: 'card endpoint', 'data-endpoint': s.id },
          h('div', { class: 'endpoint-head' }, h('strong', null, s.id), h('span', { class: `health ${hl.key}`, 'data-health': hl.key }, hl.text)),
          h('div', { class: 'url muted' }, s.url),
          h('div', { class: 'muted small', 'data-field': 'payload' }, s.payload === 'thin' ? 'Thin payloads: id, type, time and link' : 'Full payloads'),
          s.propagate_trace ? h('div', { class: 'muted small', 'data-field': 'propagate_trace' }, 'Webhooks carry the sender\'s traceparent (W3C Trace Context)') : null,
          h(
            'div',
            { class: 'counts' },
            h('span', null, 'failed ', h('b', { 'data-field': 'dead' }, st.dead ?? 0)),
            h('span', null, 'retrying ', h('b', { 'data-field': 'pending' }, st.pending ?? 0)),
            h('span', null, 'delivered ', h('b', { 'data-field': 'sent' }, st.sent ?? 0)),
          ),
          st.last_error ? h('div', { class: 'muted small' }, `Last error: ${st.last_error}`) : null,
          s.ordering && s.ordering !== 'none'
            ? h('div', { class: 'muted small', 'data-field': 'ordering' },
              s.ordering === 'key' ? `In order per ${s.ordering_key}` : 'In order, one at a time',
              ...(s.held ?? []).map((k) => h('div', { 'data-field': 'held' },
                `${k.ordering_key != null ? `Key ${k.ordering_key}` : 'All'}: ${k.held} waiting since ${fmtTime(k.held_since_ms)} behind `,
                k.head ? h('a', { href: '#', onclick: (ev) => { ev.preventDefault(); openDelivery(k.head.id); } }, k.head.id) : k.next,
                k.head?.last_error ? ` (${k.head.last_error})` : '')))
            : null,
          filterEditor(s),
          signatureEditor(s),
          batchEditor(s),
          h(
            'div',
            { class: 'actions' },
            s.disabled
              ? h('button', { type: 'button', class: 'resume', onclick: () => setDisabled(s.id, false) }, 'Resume')
              : h('button', { type: 'button', class: 'pause quiet', onclick: () => setDisabled(s.id, true) }, 'Pause'),
            h('button', { type: 'button', class: 'rotate quiet', onclick: () => rotate(s.id) }, 'Rotate signing secret'),
            h('span', { class: 'muted small' }, `${s.active_secrets} signing secret${s.active_secrets === 1 ? '' : 's'} active`),
          ),
        );
      }),
    );
    if (!endpoints.length) box.append(h('p', { class: 'muted' }, 'No endpoint yet.'));
    const sel = $('#f-endpoint');
    const chosen = sel.value;
    sel.replaceChildren(h('option', { value: '' }, 'All endpoints'), ...endpoints.map((s) => h('option', { value: s.id }, s.id)));
    sel.value = endpoints.some((s) => s.id === chosen) ? chosen : '';
  }

  /** The endpoint's filters: the operator's (`filter`, shown, not editable here: it decides
   *  which events this endpoint may receive at all) and the customer's own (`customer_filter`,
   *  edited with a test against an event: PATCH {"customer_filter"}; emptied, it is removed).
   *  An event is delivered only when it matches both. */
  function filterEditor(s) {
    const box = h('textarea', { class: 'filter-text', rows: 3, spellcheck: 'false', 'aria-label': `Your filter of ${s.id}`,
      placeholder: '{"amount": {"$gt": 100}}' });
    box.value = s.customer_filter ? JSON.stringify(s.customer_filter, null, 2) : '';
    const error = h('p', { class: 'error small', role: 'alert', hidden: true });
    async function save() {
      try {
        const filter = parseJsonBox(box.value, 'The filter');
        await call('PATCH', `/v1/subscribers/${encodeURIComponent(s.id)}`, { customer_filter: filter });
        flash(filter == null ? `${s.id} now gets every event the operator routes to it.` : `${s.id}'s filter is saved: it applies to events from now on.`);
        await loadEndpoints();
      } catch (e) {
        error.textContent = e.message;
        error.hidden = false;
      }
    }
    return h('details', { class: 'filter-edit' },
      h('summary', null, 'Filter: ', h('code', { 'data-field': 'customer_filter' }, s.customer_filter ? filterText(s.customer_filter) : 'none (every event)')),
      s.filter
        ? h('p', { class: 'muted small' }, 'Set by the operator (events must match it too): ', h('code', { 'data-field': 'filter' }, filterText(s.filter)))
        : null,
      h('label', null, 'Deliver only events matching (JSON; empty: every event)', box),
      window.FanoutPage.filterTester(call, () => box),
      error,
      h('div', { class: 'actions' }, h('button', { type: 'button', class: 'save-filter', onclick: save }, 'Save filter')));
  }

  /** The endpoint's signature scheme, changed in place (PATCH {"signature"}), and the Ed25519
   *  public key its receiver verifies `v1a` signatures with. */
  function signatureEditor(s) {
    const pick = h('select', { class: 'signature', 'aria-label': `Signature of ${s.id}`,
      onchange: () => setSignature(s.id, pick.value) },
      h('option', { value: 'hmac' }, 'HMAC (v1): the signing secret'),
      h('option', { value: 'ed25519' }, 'Ed25519 (v1a): the public key'),
      h('option', { value: 'both' }, 'Both (v1 and v1a)'));
    pick.value = s.signature;
    return h('div', { class: 'signature-edit small' },
      h('label', null, 'Signatures ', pick),
      s.public_key && s.signature !== 'hmac'
        ? h('div', { class: 'muted' }, 'Public key: ', h('code', { class: 'key', 'data-field': 'public_key' }, s.public_key))
        : null);
  }

  /** The endpoint's batching (PATCH {"batch"}): several events per request, `{"events": […]}`,
   *  one request against its rate; empty events per request: one event per request. */
  function batchEditor(s) {
    const num = (cls, label, min, max, value, placeholder) => {
      const input = h('input', { class: cls, type: 'number', min, max, step: 1, placeholder, 'aria-label': `${label} of ${s.id}` });
      input.value = value ?? '';
      return input;
    };
    const events = num('batch-events', 'Events per request', 1, 1000, s.batch?.max_events, 'one per request');
    const bytes = num('batch-bytes', 'Most bytes per request', 64, 1048576, s.batch?.max_bytes, '1048576');
    const wait = num('batch-wait', 'Most wait in ms', 0, 10000, s.batch?.max_wait_ms, '0');
    const error = h('p', { class: 'error small', role: 'alert', hidden: true });
    async function save() {
      try {
        let batch = null;
        if (events.value.trim() !== '') {
          batch = { max_events: Number(events.value) };
          if (bytes.value.trim() !== '') batch.max_bytes = Number(bytes.value);
          if (wait.value.trim() !== '') batch.max_wait_ms = Number(wait.value);
        }
        await call('PATCH', `/v1/subscribers/${encodeURIComponent(s.id)}`, { batch });
        flash(batch ? `${s.id} now gets batches of up to ${batch.max_events} events.` : `${s.id} now gets one event per request.`);
        await loadEndpoints();
      } catch (e) {
        error.textContent = e.message;
        error.hidden = false;
      }
    }
    return h('details', { class: 'batch-edit' },
      h('summary', null, 'Batches: ', h('code', { 'data-field': 'batch' },
        s.batch ? `up to ${s.batch.max_events} events, ${s.batch.max_bytes} bytes, wait ${s.batch.max_wait_ms} ms` : 'off (one event per request)')),
      h('p', { class: 'muted small' }, 'One request carries {"events": [...]}; answer {"failed": ["evt_..."]} with a 2xx to have only those retried.'),
      h('label', null, 'Events per request ', events),
      h('label', null, 'Most bytes ', bytes),
      h('label', null, 'Most wait (ms) ', wait),
      error,
      h('div', { class: 'actions' }, h('button', { type: 'button', class: 'save-batch', onclick: save }, 'Save batching')));
  }

  async function setSignature(id, signature) {
    try {
      await call('PATCH', `/v1/subscribers/${encodeURIComponent(id)}`, { signature });
      flash(`${id} now signs with ${signature}.`);
      await loadEndpoints();
    } catch (e) {
      report(e);
    }
  }

  async function setDisabled(id, disabled) {
    try {
      await call('PATCH', `/v1/subscribers/${encodeURIComponent(id)}`, { disabled });
      flash(disabled ? `${id} paused: deliveries wait until you resume it.` : `${id} resumed.`);
      await loadEndpoints();
    } catch (e) {
      report(e);
    }
  }

  async function rotate(id) {
    if (!confirm(`Rotate the signing secret of ${id}? The new secret is shown once.`)) return;
    try {
      const r = await call('POST', `/v1/subscribers/${encodeURIComponent(id)}/rotate-secret`, {});
      // The cards are redrawn first (hiding any shown secret), then the new one is shown.
      await loadEndpoints().catch(report);
      $('#secret-endpoint').textContent = id;
      $('#new-secret').textContent = r.secret;
      $('#secret-box').hidden = false;
    } catch (e) {
      report(e);
    }
  }

  // ------------------------------------------------------------------------------------------
  // Deliveries

  function localMs(input) {
    if (!input.value) return null;
    const ms = new Date(input.value).getTime();
    return Number.isNaN(ms) ? null : ms;
  }

  /** The filters as API arguments (shared by the list and bulk replay). */
  function filters() {
    const f = {};
    const status = $('#f-status').value;
    const type = $('#f-type').value.trim();
    const sub = $('#f-endpoint').value;
    const since = localMs($('#f-since'));
    const until = localMs($('#f-until'));
    if (status) f.status = status;
    if (type) f.type = type;
    if (sub) f.subscriber = sub;
    if (since != null) f.since = since;
    if (until != null) f.until = until;
    return f;
  }

  /** Failed first, then retrying, then the rest; newest first within each. */
  const RANK = { dead: 0, pending: 1, in_flight: 2, sent: 3 };
  const byConcern = (a, b) => (RANK[a.status] ?? 9) - (RANK[b.status] ?? 9) || b.created_at_ms - a.created_at_ms;

  /** Where each page of the list starts (the API's `next` cursor of the page before it). */
  let pages = [null];
  let page = 0;

  /** One page of deliveries: the filters, the event id searched for, the page size, the cursor. */
  async function loadDeliveries(to = 0) {
    if (to === 0) pages = [null];
    const q = new URLSearchParams({ ...filters(), limit: $('#f-limit').value });
    const event = $('#f-event').value.trim();
    if (event) q.set('event', event);
    if (pages[to]) q.set('after', pages[to]);
    const data = await call('GET', `/v1/deliveries?${q}`);
    page = to;
    pages[to + 1] = data.next ?? null;
    pages.length = to + 2;
    $('#page-prev').disabled = page === 0;
    $('#page-next').disabled = !data.next;
    $('#page-info').textContent = data.deliveries.length ? `page ${page + 1}` : '';
    const rows = data.deliveries.slice().sort(byConcern);
    $('#deliveries tbody').replaceChildren(
      ...rows.map((d) =>
        h(
          'tr',
          { 'data-delivery': d.id, tabindex: 0, onclick: () => openDelivery(d.id), onkeydown: (e) => e.key === 'Enter' && openDelivery(d.id) },
          h('td', { 'data-label': 'Status' }, badge(d.status)),
          h('td', { 'data-label': 'Event' }, h('div', null, d.event_type), h('div', { class: 'muted small' }, d.event_id), h('div', { class: 'muted small', 'data-field': 'sequence' }, `#${d.sequence}`)),
          h('td', { 'data-label': 'Endpoint' }, d.subscriber_id),
          h('td', { 'data-label': 'Attempts' }, d.attempt_count),
          h('td', { 'data-label': 'Created', 'data-field': 'created' }, fmtTime(d.created_at_ms)),
          h('td', { 'data-label': 'Last error', class: 'small' }, d.last_error ?? ''),
        ),
      ),
    );
    $('#deliveries-empty').hidden = rows.length > 0;
  }

  let openId = null;
  async function openDelivery(id) {
    try {
      const d = await call('GET', `/v1/deliveries/${encodeURIComponent(id)}`);
      openId = d.id;
      $('#detail-title').textContent = `${d.event_type} → ${d.subscriber_id}`;
      const fact = (k, v) => [h('dt', null, k), h('dd', { 'data-fact': k }, v)];
      $('#detail-facts').replaceChildren(
        ...fact('Delivery', d.id),
        ...fact('Event', d.event_id),
        ...fact('Sequence', String(d.sequence)),
        ...fact('Status', badge(d.status)),
        ...fact('Attempts', String(d.attempt_count)),
        ...fact('Created', fmtTime(d.created_at_ms)),
        ...(d.next_attempt_at_ms ? fact('Next attempt', fmtTime(d.next_attempt_at_ms)) : []),
        ...(d.held ? fact('Next attempt', 'waiting for the delivery before it (in order)') : []),
        ...(d.ordering_key != null ? fact('Ordering key', d.ordering_key) : []),
        ...(d.previous_sequence != null ? fact('Previous sequence', String(d.previous_sequence)) : []),
      );
      $('#replay-one').hidden = d.status === 'in_flight';
      $('#attempts').replaceChildren(
        ...(d.attempts ?? []).map((a) =>
          h(
            'li',
            { class: 'attempt', 'data-attempt': a.attempt },
            h(
              'div',
              { class: 'attempt-head' },
              h('span', null, `#${a.attempt}`),
              h('span', null, fmtTime(a.at_ms)),
              h('span', { class: `outcome ${a.outcome}` }, a.status != null ? `HTTP ${a.status}` : a.outcome),
              a.latency_ms != null ? h('span', { class: 'muted' }, `${a.latency_ms} ms`) : null,
            ),
            a.error ? h('div', { class: 'error small' }, a.error) : null,
            a.response_body != null && a.response_body !== ''
              ? h('pre', { class: 'body' }, a.response_body)
              : h('div', { class: 'muted small' }, 'No response body.'),
          ),
        ),
      );
      if (!d.attempts?.length) $('#attempts').append(h('li', { class: 'muted' }, 'Not attempted yet.'));
      $('#detail').hidden = false;
      $('#detail').scrollIntoView({ block: 'nearest' });
    } catch (e) {
      report(e);
    }
  }

  async function replayOne() {
    if (!openId) return;
    try {
      await call('POST', `/v1/deliveries/${encodeURIComponent(openId)}/replay`, {});
      flash(`${openId} queued again.`);
      await Promise.all([openDelivery(openId), loadDeliveries(page)]);
    } catch (e) {
      report(e);
    }
  }

  /** Bulk replay takes failed deliveries unless another status is chosen. */
  function bulkFilter() {
    const f = filters();
    if (!f.status) f.status = 'dead';
    return f;
  }

  let counted = null;
  async function bulkCount() {
    try {
      const f = bulkFilter();
      const r = await call('POST', '/v1/replay', { ...f, dry_run: true });
      counted = f;
      $('#bulk-info').textContent = `${r.count} ${r.count === 1 ? 'delivery' : 'deliveries'} would be sent again.`;
      const go = $('#bulk-confirm');
      go.textContent = `Replay ${r.count}`;
      go.dataset.count = String(r.count);
      go.hidden = r.count === 0;
    } catch (e) {
      report(e);
    }
  }

  async function bulkReplay() {
    if (!counted) return;
    try {
      // The daemon replays at most 10,000 per call and says where to go on.
      let replayed = 0;
      for (let r = { more: true }; r.more;) {
        r = await call('POST', '/v1/replay', r.next ? { ...counted, after: r.next } : counted);
        replayed += r.replayed;
      }
      $('#bulk-info').textContent = `${replayed} queued again.`;
      $('#bulk-confirm').hidden = true;
      counted = null;
      await Promise.all([loadDeliveries(page), loadEndpoints()]);
    } catch (e) {
      report(e);
    }
  }

  // ------------------------------------------------------------------------------------------

  async function start() {
    takeToken();
    if (!bearer) {
      fatal('This page opens from a link that carries its access token.');
      return;
    }
    const c = claims();
    if (c) $('#who').textContent = `${c.c} · link valid until ${fmtTime(c.e)}`;
    $('#filters').addEventListener('submit', (e) => {
      e.preventDefault();
      $('#bulk-confirm').hidden = true;
      $('#bulk-info').textContent = '';
      loadDeliveries().catch(report);
    });
    for (const id of ['f-status', 'f-type', 'f-endpoint', 'f-since', 'f-until']) {
      $(`#${id}`).addEventListener('change', () => {
        $('#bulk-confirm').hidden = true;
        $('#bulk-info').textContent = '';
        counted = null;
      });
    }
    $('#page-prev').addEventListener('click', () => loadDeliveries(Math.max(0, page - 1)).catch(report));
    $('#page-next').addEventListener('click', () => loadDeliveries(page + 1).catch(report));
    $('#f-limit').addEventListener('change', () => loadDeliveries().catch(report));
    $('#bulk-count').addEventListener('click', bulkCount);
    $('#bulk-confirm').addEventListener('click', bulkReplay);
    $('#replay-one').addEventListener('click', replayOne);
    $('#detail-close').addEventListener('click', () => {
      $('#detail').hidden = true;
      openId = null;
    });
    $('#secret-done').addEventListener('click', () => {
      $('#new-secret').textContent = '';
      $('#secret-box').hidden = true;
    });
    try {
      await Promise.all([loadEndpoints(), loadDeliveries()]);
      $('#endpoints-view').hidden = false;
      $('#deliveries-view').hidden = false;
      $('#charts-view').hidden = false;
      // This customer's endpoints only: the API scopes the series to the link's customer.
      await window.FanoutCharts.mount($('#charts'), {
        call,
        subscribers: async () => endpoints.map((s) => s.id),
        allLabel: 'all endpoints',
      }).load();
    } catch (e) {
      if (e.status !== 401) report(e);
    }
  }

  document.addEventListener('DOMContentLoaded', start);
})();
