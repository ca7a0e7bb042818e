// Fanout admin console. Plain JavaScript, no build step, served by `fanout serve`.
//
// Rules this file keeps: every value that comes from the API reaches the page through
// textContent / text nodes (never innerHTML), links are built only from "#/" plus an encoded
// id, and the API token lives in sessionStorage (this tab only) and goes out as a bearer token.
'use strict';

(() => {
  const TOKEN_KEY = 'fanout.token';
  const PAGE = 200;

  // The helpers this page shares with the portal (/common.js).
  const { $, h, request, parseJsonBox, filterText, fmtTime } = window.FanoutPage;
  const fmtNum = (n, digits = 0) => (n == null ? '' : Number(n).toLocaleString('en-US', { maximumFractionDigits: digits }));
  const badge = (status) => window.FanoutPage.badge(status, status.replace('_', ' '));
  const deliveryLink = (id) => h('a', { href: `#/deliveries/${encodeURIComponent(id)}` }, id);

  // ------------------------------------------------------------------------------------------
  // Token and API calls

  const token = () => sessionStorage.getItem(TOKEN_KEY);

  /** One API call; the JSON answer, or an ApiError carrying the API's `{error:{code,message}}`. */
  const call = (method, path, body, bearer = token()) => request(method, path, body, bearer, 'The daemon');

  /** An API call from a signed-in view: a refused token sends the operator back to sign in. */
  async function api(method, path, body) {
    try {
      return await call(method, path, body);
    } catch (e) {
      if (e.status === 401) {
        signOut('The API token was refused. Sign in again.');
      }
      throw e;
    }
  }

  // ------------------------------------------------------------------------------------------
  // Messages

  const flash = window.FanoutPage.flasher('#flash', 'info', (kind) => (kind === 'error' ? 10_000 : 5_000));

  function showError(el, message) {
    el.textContent = message;
    el.hidden = !message;
  }

  // ------------------------------------------------------------------------------------------
  // Sign in / out and routing

  const VIEWS = ['signin', 'subscribers', 'deliveries', 'delivery', 'charts', 'customers'];
  let pollTimer = null;

  function show(view) {
    clearTimeout(pollTimer);
    pollTimer = null;
    for (const v of VIEWS) $(`#${v}-view`).hidden = v !== view;
    const signedIn = view !== 'signin';
    $('#nav').hidden = !signedIn;
    $('#sign-out').hidden = !signedIn;
    for (const a of document.querySelectorAll('#nav a')) {
      const current = a.dataset.view === view || (view === 'delivery' && a.dataset.view === 'deliveries');
      if (current) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    $('#signin-token').value = '';
    showError($('#signin-error'), message ?? '');
    show('signin');
    $('#signin-token').focus();
  }

  async function onSignIn(ev) {
    ev.preventDefault();
    const candidate = $('#signin-token').value.trim();
    const button = $('#signin-submit');
    button.disabled = true;
    try {
      await call('GET', '/v1/subscribers', undefined, candidate);
      sessionStorage.setItem(TOKEN_KEY, candidate);
      $('#signin-token').value = '';
      showError($('#signin-error'), '');
      if (!location.hash || location.hash === '#/') location.hash = '#/subscribers';
      else route();
    } catch (e) {
      showError(
        $('#signin-error'),
        e.status === 401 ? 'That token was refused: check it and try again.' : `Cannot sign in: ${e.message}`,
      );
    } finally {
      button.disabled = false;
    }
  }

  function route() {
    if (!token()) {
      signOut();
      return;
    }
    const hash = location.hash.replace(/^#/, '') || '/subscribers';
    const [path, query = ''] = hash.split('?');
    const params = new URLSearchParams(query);
    const m = path.match(/^\/deliveries\/([^/]+)$/);
    const run = m
      ? openDelivery(decodeURIComponent(m[1]))
      : path.startsWith('/deliveries')
        ? openDeliveries(params)
        : path === '/charts'
          ? openCharts()
          : path === '/customers'
            ? openCustomers()
            : openSubscribers();
    run.catch((e) => {
      if (e.status !== 401) flash(e.message, 'error');
    });
  }

  // ------------------------------------------------------------------------------------------
  // Subscribers: status table, add, edit, rotate, disable / re-enable, delete

  let subscribers = [];
  let editing = null; // the subscriber being edited, or null when adding

  async function openSubscribers() {
    show('subscribers');
    await loadSubscribers();
  }

  async function loadSubscribers() {
    const [data, retention, outbox] = await Promise.all([
      api('GET', '/v1/subscribers?stats=true'),
      api('GET', '/v1/retention'),
      api('GET', '/v1/outbox'),
    ]);
    if ($('#subscribers-view').hidden) return;
    $('#retention').textContent = retentionText(retention);
    $('#outbox').hidden = !outbox.outbox;
    $('#outbox').textContent = outbox.outbox ? outboxText(outbox) : '';
    subscribers = data.subscribers ?? [];
    // Ordered subscribers: the keys their failing heads hold back (GET …/held).
    await Promise.all(subscribers.filter((s) => s.ordering && s.ordering !== 'none').map(async (s) => {
      s.held = (await api('GET', `/v1/subscribers/${encodeURIComponent(s.id)}/held`)).keys ?? [];
    }));
    if ($('#subscribers-view').hidden) return;
    const body = $('#sub-table tbody');
    body.replaceChildren(...subscribers.map(subscriberRow));
    $('#sub-empty').hidden = subscribers.length > 0;
    $('#sub-table').hidden = subscribers.length === 0;
    // Follow the table while an enabled subscriber has work on its way.
    clearTimeout(pollTimer);
    pollTimer = null;
    const moving = subscribers.some((s) => !s.disabled && ((s.stats?.pending ?? 0) > 0 || (s.stats?.in_flight ?? 0) > 0));
    if (moving) pollTimer = setTimeout(() => loadSubscribers().catch(() => {}), 2000);
  }

  /** The producer's outbox the daemon reads, in one line under the table. */
  function outboxText(o) {
    const state = o.error ? `cannot be read: ${o.error}`
      : o.standby ? 'standby: another daemon reads it'
        : `oldest row ${o.oldest_age_seconds.toFixed(1)} s old`;
    return `Outbox ${o.table} in ${o.outbox}: ${fmtNum(o.rows_read)} rows read, ` +
      `${fmtNum(o.rows_rejected)} rejected, ${fmtNum(o.rounds_failed)} rounds failed; ${state}.`;
  }

  /** What retention keeps and has removed, in one line under the table. */
  function retentionText(r) {
    const oldest = (ms) => (ms == null ? 'none kept' : `oldest ${fmtTime(ms)}`);
    return `Retention: sent kept ${r.retain_sent} (${oldest(r.oldest_sent_at_ms)}), ` +
      `dead kept ${r.retain_dead} (${oldest(r.oldest_dead_at_ms)}); removed ` +
      `${fmtNum(r.removed_sent)} sent, ${fmtNum(r.removed_dead)} dead, ` +
      `${fmtNum(r.removed_attempts)} attempts, ${fmtNum(r.removed_events)} events` +
      (r.last_run_at_ms == null ? '.' : `; last pass ${fmtTime(r.last_run_at_ms)}.`);
  }

  function breakerCell(b) {
    if (!b) return '';
    const label = b.state.replace('_', '-');
    const detail = b.state === 'closed' ? `${b.consecutive_failures} failures in a row` : `until ${fmtTime(b.open_until_ms)}`;
    return h('span', { class: `breaker ${b.state}`, title: detail }, label);
  }

  /** Disabled (badge, reason, since when) or failing (since when), under the subscriber's id;
   *  stalled (the dispatcher's watchdog: due work, nothing sent past the wait it stated). */
  function healthLines(s) {
    const stall = s.stats?.stalled;
    if (stall) {
      const waits = stall.not_before_ms != null ? `; now waiting until ${fmtTime(stall.not_before_ms)}` : '';
      return h('div', { class: 'health' },
        h('span', { class: 'badge stalled', 'data-field': 'stalled', title: `breaker ${stall.breaker.replace('_', '-')}${waits}` }, 'stalled'),
        h('span', { class: 'muted small nowrap' }, `ready, nothing sent since ${fmtTime(stall.since_ms)}`));
    }
    if (s.disabled) {
      return [
        h('div', { class: 'health' },
          h('span', { class: 'badge disabled', 'data-field': 'disabled' }, 'disabled'),
          s.disabled_at_ms != null ? h('span', { class: 'muted small nowrap' }, `since ${fmtTime(s.disabled_at_ms)}`) : null),
        h('div', { class: 'small error-text', 'data-field': 'disabled_reason' }, s.disabled_reason ?? ''),
      ];
    }
    if (s.failing_since_ms != null) {
      return h('div', { class: 'small warn', 'data-field': 'failing_since' }, `failing since ${fmtTime(s.failing_since_ms)}`);
    }
    return null;
  }

  function subscriberRow(s) {
    const st = s.stats ?? {};
    const dead = st.dead
      ? h('a', { href: `#/deliveries?${new URLSearchParams({ subscriber: s.id, status: 'dead' })}` }, fmtNum(st.dead))
      : fmtNum(st.dead ?? 0);
    return h(
      'tr',
      { 'data-subscriber': s.id, class: s.disabled ? 'disabled' : null },
      h('td', null, h('div', { class: 'id' }, s.id), healthLines(s), h('div', { class: 'muted small url' }, s.url),
        h('div', { class: 'muted small' }, s.event_types.join(', ')),
        s.filter ? h('div', { class: 'muted small filter', 'data-field': 'filter', title: 'Content filter (the operator\'s)' }, `filter: ${filterText(s.filter)}`) : null,
        s.customer_filter ? h('div', { class: 'muted small filter', 'data-field': 'customer_filter', title: 'The customer\'s own filter: an event must match both' }, `customer filter: ${filterText(s.customer_filter)}`) : null),
      h('td', null, h('div', null, s.lane), h('div', { class: 'muted small', 'data-field': 'payload' }, `${s.payload} payload`),
        s.ordering && s.ordering !== 'none' ? orderingLines(s) : null,
        s.propagate_trace ? h('div', { class: 'muted small', 'data-field': 'propagate_trace', title: 'Webhooks carry the producer\'s traceparent' }, 'traceparent') : null,
        h('div', { class: 'muted small', 'data-field': 'signature' }, `signs ${s.signature}`),
        s.public_key && s.signature !== 'hmac' ? h('div', { class: 'muted small key', 'data-field': 'public_key', title: 'Ed25519 public key: verifies the v1a signatures' }, s.public_key) : null,
        s.batch ? h('div', { class: 'muted small', 'data-field': 'batch', title: 'Batched webhooks: one request carries several events' }, batchText(s.batch)) : null),
      h('td', { class: 'num' }, fmtNum(s.rate_per_sec, 3)),
      h('td', { class: 'num' }, fmtNum(s.burst)),
      h('td', { class: 'num' }, fmtNum(st.tokens, 1)),
      h('td', null, st.paused_until_ms ? h('span', { class: 'warn' }, fmtTime(st.paused_until_ms)) : ''),
      h('td', null, breakerCell(st.breaker)),
      h('td', { class: 'num', 'data-field': 'pending' }, fmtNum(st.pending ?? 0)),
      h('td', { class: 'num', 'data-field': 'in_flight' }, fmtNum(st.in_flight ?? 0)),
      h('td', { class: 'num', 'data-field': 'sent' }, fmtNum(st.sent ?? 0)),
      h('td', { class: `num ${st.dead ? 'bad' : ''}`, 'data-field': 'dead' }, dead),
      h('td', { class: 'small' }, st.last_error
        ? [h('div', { class: 'error-text' }, st.last_error), h('div', { class: 'muted' }, fmtTime(st.last_error_at_ms))]
        : ''),
      h('td', null, h('div', { class: 'sub-actions' },
        h('button', { type: 'button', class: 'quiet', onclick: () => editSubscriber(s) }, 'Edit'),
        h('button', { type: 'button', class: 'quiet', onclick: () => rotateSecret(s) }, 'Rotate secret'),
        s.disabled
          ? h('button', { type: 'button', 'data-action': 'enable', onclick: (ev) => setDisabled(s, false, ev.currentTarget) }, 'Re-enable')
          : h('button', { type: 'button', class: 'quiet', 'data-action': 'disable', onclick: (ev) => setDisabled(s, true, ev.currentTarget) }, 'Disable'),
        h('button', { type: 'button', class: 'danger', 'data-action': 'delete', onclick: (ev) => deleteSubscriber(s, ev.currentTarget) }, 'Delete'))),
    );
  }

  /** An ordered subscriber's ordering, and each key a head holds back: the head (why), since when. */
  function orderingLines(s) {
    const by = s.ordering === 'key' ? `ordered by ${s.ordering_key}` : 'ordered, one at a time';
    return h('div', { class: 'muted small', 'data-field': 'ordering' }, by,
      ...(s.held ?? []).map((k) => h('div', { class: 'warn', 'data-field': 'held' },
        `${k.ordering_key != null ? `key ${k.ordering_key}` : 'all'}: ${fmtNum(k.held)} held since ${fmtTime(k.held_since_ms)} behind `,
        k.head ? deliveryLink(k.head.id) : k.next,
        k.head ? ` (${k.head.status}, ${fmtNum(k.head.attempt_count)} attempts${k.head.last_error ? `: ${k.head.last_error}` : ''})` : '')));
  }

  // ------------------------------------------------------------------------------------------
  // Charts and customers

  let charts = null;

  async function openCharts() {
    show('charts');
    charts ??= window.FanoutCharts.mount($('#charts'), {
      call: api,
      subscribers: async () => (await api('GET', '/v1/subscribers')).subscribers.map((s) => s.id),
      allLabel: 'all subscribers',
    });
    await charts.load();
    followCharts();
  }

  /** Redraw the charts as each 10 s bucket is flushed, while the page shows them. */
  function followCharts() {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(() => {
      if ($('#charts-view').hidden) return;
      charts.load().catch(() => {}).finally(() => {
        if (!$('#charts-view').hidden) followCharts();
      });
    }, 10_000);
  }

  async function openCustomers() {
    show('customers');
    await loadCustomers();
  }

  /** Each customer with its endpoints and its share of the dispatcher now: its deliveries in
   * flight against all in flight (the fair share, `dispatch/fair.rs`, follows the weights). */
  /** The customers page's form: POST /v1/customers with the fields given. */
  async function onAddCustomer(ev) {
    ev.preventDefault();
    const f = $('#cus-form').elements;
    const body = { id: f.id.value.trim() };
    for (const name of ['weight', 'max_in_flight']) {
      const v = f[name].value.trim();
      if (v !== '') body[name] = Number(v);
    }
    try {
      await api('POST', '/v1/customers', body);
      $('#cus-form').reset();
      showError($('#cus-form-error'), '');
      flash(`Added customer ${body.id}.`);
      await loadCustomers();
    } catch (e) {
      showError($('#cus-form-error'), e.message);
    }
  }

  async function loadCustomers() {
    const [customers, subs] = await Promise.all([api('GET', '/v1/customers'), api('GET', '/v1/subscribers?stats=true')]);
    if ($('#customers-view').hidden) return;
    const all = subs.subscribers ?? [];
    const total = all.reduce((n, s) => n + (s.stats?.in_flight ?? 0), 0);
    const cs = customers.customers ?? [];
    $('#cus-table tbody').replaceChildren(...cs.map((c) => {
      const own = all.filter((s) => s.customer === c.id);
      const inFlight = own.reduce((n, s) => n + (s.stats?.in_flight ?? 0), 0);
      return customerRow(c, own, inFlight, total);
    }));
    $('#cus-empty').hidden = cs.length > 0;
    $('#cus-table').hidden = cs.length === 0;
  }

  function customerRow(c, own, inFlight, total) {
    const share = total ? `${Math.round((100 * inFlight) / total)}%` : '0%';
    return h(
      'tr',
      { 'data-customer': c.id },
      h('td', null, h('div', { class: 'id' }, c.id)),
      h('td', { class: 'num', 'data-field': 'weight' }, fmtNum(c.weight)),
      h('td', { class: 'num', 'data-field': 'cap' }, c.max_in_flight == null ? 'none' : fmtNum(c.max_in_flight)),
      h('td', { class: 'small', 'data-field': 'endpoints' }, own.length ? own.map((s) => h('div', { class: 'id' }, s.id)) : h('span', { class: 'muted' }, 'none')),
      h('td', { class: 'num', 'data-field': 'share' }, h('div', null, share), h('div', { class: 'muted small' }, `${fmtNum(inFlight)} of ${fmtNum(total)} in flight`)),
      h('td', null, h('div', { class: 'sub-actions' },
        h('button', { type: 'button', 'data-action': 'portal-link', onclick: (ev) => issueLink(c, ev.currentTarget) }, 'Portal link'),
        h('button', { type: 'button', class: 'danger', 'data-action': 'revoke-links', onclick: (ev) => revokeLinks(c, ev.currentTarget) }, 'Revoke portal links'))),
    );
  }

  /** POST …/portal: a link to this customer's portal, shown once. */
  async function issueLink(c, button) {
    button.disabled = true;
    try {
      const link = await api('POST', `/v1/customers/${encodeURIComponent(c.id)}/portal`, {});
      $('#portal-link-for').textContent = c.id;
      $('#portal-link-until').textContent = fmtTime(link.expires_at_ms);
      $('#portal-link-url').textContent = link.url;
      $('#portal-link-box').hidden = false;
    } catch (e) {
      if (e.status !== 401) flash(e.message, 'error');
    } finally {
      button.disabled = false;
    }
  }

  /** POST …/portal/revoke: every link issued for this customer so far stops working. */
  async function revokeLinks(c, button) {
    if (!confirm(`Revoke every portal link issued for ${c.id}? They stop working at once; new links work.`)) return;
    button.disabled = true;
    try {
      await api('POST', `/v1/customers/${encodeURIComponent(c.id)}/portal/revoke`, {});
      flash(`Every portal link issued for ${c.id} so far is revoked.`);
    } catch (e) {
      if (e.status !== 401) flash(e.message, 'error');
    } finally {
      button.disabled = false;
    }
  }

  const plural = (n, one, many) => `${fmtNum(n)} ${n === 1 ? one : many}`;

  /** PATCH {"disabled": …}: disabling asks first; re-enabling sends what waited. */
  async function setDisabled(s, disabled, button) {
    const pending = s.stats?.pending ?? 0;
    if (disabled && !confirm(
      `Disable ${s.id}? Nothing is sent to it until it is re-enabled; its deliveries, and those of new events, wait as pending.`,
    )) return;
    button.disabled = true;
    try {
      await api('PATCH', `/v1/subscribers/${encodeURIComponent(s.id)}`, { disabled });
      flash(disabled || !pending
        ? `${disabled ? 'Disabled' : 'Re-enabled'} ${s.id}.`
        : `Re-enabled ${s.id}: ${plural(pending, 'pending delivery goes', 'pending deliveries go')} out now.`);
      await loadSubscribers();
    } catch (e) {
      button.disabled = false;
      if (e.status !== 401) flash(e.message, 'error');
    }
  }

  /** DELETE the subscriber: its pending and in-flight deliveries become dead (replayable). */
  async function deleteSubscriber(s, button) {
    const open = (s.stats?.pending ?? 0) + (s.stats?.in_flight ?? 0);
    const fate = open
      ? ` Its ${plural(open, 'delivery not yet sent becomes', 'deliveries not yet sent become')} dead (replayable if it is added again).`
      : '';
    if (!confirm(`Delete ${s.id}? It is sent nothing more.${fate}`)) return;
    button.disabled = true;
    try {
      const r = await api('DELETE', `/v1/subscribers/${encodeURIComponent(s.id)}`);
      flash(`Deleted ${s.id}${r.deliveries_dead ? `: ${plural(r.deliveries_dead, 'delivery', 'deliveries')} dead` : ''}.`);
      if (editing?.id === s.id) {
        $('#sub-form').hidden = true;
        editing = null;
      }
      await loadSubscribers();
    } catch (e) {
      button.disabled = false;
      if (e.status !== 401) flash(e.message, 'error');
    }
  }

  /** "batches of up to 100 events, 1 MiB, 500 ms": a subscriber's batching in a few words. */
  function batchText(b) {
    const bytes = b.max_bytes >= 1048576 && b.max_bytes % 1048576 === 0 ? `${b.max_bytes / 1048576} MiB`
      : b.max_bytes >= 1024 && b.max_bytes % 1024 === 0 ? `${b.max_bytes / 1024} KiB` : `${b.max_bytes} B`;
    return `batches of up to ${b.max_events} events, ${bytes}${b.max_wait_ms ? `, wait ${b.max_wait_ms} ms` : ''}`;
  }

  /**
   * The customer picker: none and the subscriber's own at once (a save before the list arrives
   * keeps it), then every customer, the choice made meanwhile kept.
   */
  async function fillCustomers(select, chosen) {
    const option = (id) => h('option', { value: id }, id);
    select.replaceChildren(h('option', { value: '' }, 'none'), ...(chosen ? [option(chosen)] : []));
    select.value = chosen ?? '';
    const list = (await api('GET', '/v1/customers')).customers ?? [];
    const now = select.value;
    select.replaceChildren(h('option', { value: '' }, 'none'), ...list.map((c) => option(c.id)));
    select.value = now;
  }

  function openForm(sub) {
    editing = sub;
    const form = $('#sub-form');
    form.reset();
    fillCustomers(form.elements.customer, sub?.customer).catch((e) => showError($('#sub-form-error'), e.message));
    showError($('#sub-form-error'), '');
    $('#sub-form-title').textContent = sub ? `Edit ${sub.id}` : 'Add subscriber';
    form.elements.id.disabled = !!sub;
    // A subscriber is created enabled and its secret changes only by rotation: each of those
    // fields shows only where the API takes it.
    for (const el of form.querySelectorAll('[data-when]')) el.hidden = el.dataset.when !== (sub ? 'editing' : 'adding');
    if (sub) {
      form.elements.id.value = sub.id;
      form.elements.url.value = sub.url;
      form.elements.event_types.value = sub.event_types.join(', ');
      form.elements.rate_per_sec.value = sub.rate_per_sec;
      form.elements.burst.value = sub.burst;
      form.elements.max_in_flight.value = sub.max_in_flight;
      form.elements.timeout_ms.value = sub.timeout_ms;
      form.elements.lane.value = sub.lane;
      form.elements.legacy_signature.checked = sub.legacy_signature;
      form.elements.filter.value = sub.filter ? JSON.stringify(sub.filter, null, 2) : '';
      form.elements.customer_filter.value = sub.customer_filter ? JSON.stringify(sub.customer_filter, null, 2) : '';
      form.elements.payload.value = sub.payload;
      form.elements.propagate_trace.checked = sub.propagate_trace;
      form.elements.signature.value = sub.signature;
      form.elements.batch_max_events.value = sub.batch ? sub.batch.max_events : '';
      form.elements.batch_max_bytes.value = sub.batch ? sub.batch.max_bytes : '';
      form.elements.batch_max_wait_ms.value = sub.batch ? sub.batch.max_wait_ms : '';
      form.elements.ordering.value = sub.ordering;
      form.elements.ordering_key.value = sub.ordering_key ?? '';
      form.elements.disabled.checked = !!sub.disabled;
    }
    form.hidden = false;
    (sub ? form.elements.url : form.elements.id).focus();
  }

  const editSubscriber = (s) => openForm(s);

  function formBody(form) {
    const f = form.elements;
    const body = {
      url: f.url.value.trim(),
      event_types: f.event_types.value.split(/[\s,]+/).filter(Boolean),
      lane: f.lane.value,
      legacy_signature: f.legacy_signature.checked,
      payload: f.payload.value,
      propagate_trace: f.propagate_trace.checked,
      signature: f.signature.value,
      ordering: f.ordering.value,
    };
    if (!editing) body.id = f.id.value.trim();
    // A secret of one's own when adding (empty: generated); `disabled` only when it changes.
    if (!editing && f.secret.value.trim()) body.secret = f.secret.value.trim();
    if (editing && f.disabled.checked !== !!editing.disabled) body.disabled = f.disabled.checked;
    // The customer: none is `null` when editing (detached), left out when adding.
    if (f.customer.value || editing) body.customer = f.customer.value || null;
    if (f.ordering.value === 'key') body.ordering_key = f.ordering_key.value.trim();
    // Emptied while editing: `null` removes the filter.
    const filter = parseJsonBox(f.filter.value, 'The filter');
    if (filter != null || editing) body.filter = filter;
    const own = parseJsonBox(f.customer_filter.value, "The customer's filter");
    if (own != null || editing) body.customer_filter = own;
    for (const name of ['rate_per_sec', 'burst', 'max_in_flight', 'timeout_ms']) {
      const v = f[name].value.trim();
      if (v !== '') body[name] = Number(v);
    }
    // Batching: the events per request turn it on; emptied while editing, `null` turns it off.
    const events = f.batch_max_events.value.trim();
    if (events !== '') {
      body.batch = { max_events: Number(events) };
      for (const name of ['max_bytes', 'max_wait_ms']) {
        const v = f[`batch_${name}`].value.trim();
        if (v !== '') body.batch[name] = Number(v);
      }
    } else if (editing) {
      body.batch = null;
    }
    return body;
  }

  async function onSaveSubscriber(ev) {
    ev.preventDefault();
    const form = $('#sub-form');
    const save = $('#sub-save');
    save.disabled = true;
    try {
      const body = formBody(form);
      if (editing) {
        await api('PATCH', `/v1/subscribers/${encodeURIComponent(editing.id)}`, body);
        flash(`Saved ${editing.id}.`);
      } else {
        const created = await api('POST', '/v1/subscribers', body);
        showSecret(created.id, created.secret, '', created.signature !== 'hmac' ? created.public_key : null);
      }
      form.hidden = true;
      editing = null;
      await loadSubscribers();
    } catch (e) {
      showError($('#sub-form-error'), e.message);
    } finally {
      save.disabled = false;
    }
  }

  /** A secret shown once, with the public key beside it when the subscriber signs with Ed25519. */
  function showSecret(id, secret, note, publicKey) {
    $('#secret-for').textContent = id;
    $('#secret-value').textContent = secret;
    $('#secret-public-key').textContent = publicKey ?? '';
    $('#secret-key').hidden = !publicKey;
    $('#secret-note').textContent = note;
    $('#secret-box').hidden = false;
  }

  async function rotateSecret(s) {
    const ok = confirm(
      `Rotate the signing secret of ${s.id}? The current secret keeps signing alongside the new one for the grace period.`,
    );
    if (!ok) return;
    try {
      const r = await api('POST', `/v1/subscribers/${encodeURIComponent(s.id)}/rotate-secret`);
      showSecret(r.id, r.secret, `Previous secrets stop signing at ${fmtTime(r.previous_secrets_expire_at_ms)}.`,
        s.signature !== 'hmac' ? r.public_key : null);
      await loadSubscribers();
    } catch (e) {
      if (e.status !== 401) flash(e.message, 'error');
    }
  }

  // ------------------------------------------------------------------------------------------
  // Dead letters: filtered list, replay one, bulk replay

  let listQuery = null;
  let listNext = null;
  let listHash = '#/deliveries';

  /** datetime-local value (local time) -> RFC 3339, or '' */
  const toRfc3339 = (v) => (v ? new Date(v).toISOString() : '');
  /** RFC 3339 or unix ms -> datetime-local value in local time, or '' */
  function toLocalInput(v) {
    if (!v) return '';
    const d = new Date(/^\d+$/.test(v) ? Number(v) : v);
    if (Number.isNaN(d.getTime())) return '';
    const pad = (n) => String(n).padStart(2, '0');
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  async function fillSubscriberOptions(selected) {
    const data = await api('GET', '/v1/subscribers');
    const select = $('#dl-filter').elements.subscriber;
    const ids = (data.subscribers ?? []).map((s) => s.id);
    if (selected && !ids.includes(selected)) ids.push(selected);
    select.replaceChildren(h('option', { value: '' }, 'any'), ...ids.map((id) => h('option', { value: id }, id)));
    select.value = selected ?? '';
  }

  async function openDeliveries(params) {
    show('deliveries');
    listHash = location.hash || '#/deliveries';
    const f = $('#dl-filter').elements;
    const status = params.has('status') ? params.get('status') : 'dead';
    await fillSubscriberOptions(params.get('subscriber') ?? '');
    f.status.value = status;
    f.since.value = toLocalInput(params.get('since'));
    f.until.value = toLocalInput(params.get('until'));
    listQuery = {
      status,
      subscriber: params.get('subscriber') ?? '',
      since: params.get('since') ?? '',
      until: params.get('until') ?? '',
    };
    $('#deliveries-view h1').textContent = status === 'dead' ? 'Dead letters' : 'Deliveries';
    $('#dl-bulk').textContent = status === 'dead' || status === '' ? 'Replay all matching' : `Replay all matching (${status.replace('_', ' ')})`;
    $('#dl-bulk').disabled = status === 'in_flight';
    await loadDeliveries(false);
  }

  function filterQuery(q) {
    const out = new URLSearchParams();
    for (const [k, v] of Object.entries(q)) if (v) out.set(k, v);
    return out;
  }

  async function loadDeliveries(more) {
    const q = filterQuery(listQuery);
    q.set('limit', String(PAGE));
    if (more && listNext) q.set('after', listNext);
    const data = await api('GET', `/v1/deliveries?${q}`);
    const rows = (data.deliveries ?? []).map(deliveryRow);
    const body = $('#dl-table tbody');
    if (more) body.append(...rows);
    else body.replaceChildren(...rows);
    listNext = data.next ?? null;
    $('#dl-more').hidden = !listNext;
    $('#dl-empty').hidden = body.children.length > 0;
  }

  function deliveryRow(d) {
    const replay = h('button', { type: 'button', class: 'quiet' }, 'Replay');
    replay.disabled = d.status === 'in_flight';
    const row = h(
      'tr',
      { 'data-delivery': d.id },
      h('td', null, deliveryLink(d.id), h('div', { class: 'muted small', 'data-field': 'sequence' }, `#${d.sequence}`)),
      h('td', null, d.subscriber_id),
      h('td', { class: 'small' }, d.event_id),
      h('td', { class: 'small' }, d.event_type),
      h('td', { 'data-field': 'status' }, badge(d.status)),
      h('td', { class: 'num' }, fmtNum(d.attempt_count)),
      h('td', { class: 'small error-text' }, d.last_error ?? ''),
      h('td', { class: 'small', 'data-field': 'updated' }, fmtTime(d.updated_at_ms)),
      h('td', { class: 'row-actions' }, replay),
    );
    replay.addEventListener('click', async () => {
      replay.disabled = true;
      try {
        await api('POST', `/v1/deliveries/${encodeURIComponent(d.id)}/replay`);
        flash(`${d.id} is queued again.`);
        row.querySelector('[data-field=status]').replaceChildren(badge('pending'));
      } catch (e) {
        replay.disabled = false;
        if (e.status !== 401) flash(e.message, 'error');
      }
    });
    return row;
  }

  function onFilter(ev) {
    ev.preventDefault();
    const f = $('#dl-filter').elements;
    const q = new URLSearchParams({ status: f.status.value });
    if (f.subscriber.value) q.set('subscriber', f.subscriber.value);
    if (f.since.value) q.set('since', toRfc3339(f.since.value));
    if (f.until.value) q.set('until', toRfc3339(f.until.value));
    const target = `#/deliveries?${q}`;
    if (location.hash === target) route();
    else location.hash = target;
  }

  async function onBulkReplay() {
    const f = $('#dl-filter').elements;
    const body = { status: f.status.value || 'dead' };
    if (f.subscriber.value) body.subscriber = f.subscriber.value;
    if (f.since.value) body.since = toRfc3339(f.since.value);
    if (f.until.value) body.until = toRfc3339(f.until.value);
    const scope = [
      `every ${body.status.replace('_', ' ')} delivery`,
      body.subscriber ? `of ${body.subscriber}` : 'of every subscriber',
      body.since ? `created since ${body.since}` : '',
      body.until ? `created before ${body.until}` : '',
    ].filter(Boolean).join(' ');
    if (!confirm(`Replay ${scope}?`)) return;
    try {
      // The daemon replays at most 10,000 per call and says where to go on.
      let replayed = 0;
      for (let r = { more: true }; r.more;) {
        r = await api('POST', '/v1/replay', r.next ? { ...body, after: r.next } : body);
        replayed += r.replayed;
      }
      flash(`${replayed} ${replayed === 1 ? 'delivery' : 'deliveries'} queued again.`);
      await loadDeliveries(false);
    } catch (e) {
      if (e.status !== 401) flash(e.message, 'error');
    }
  }

  // ------------------------------------------------------------------------------------------
  // One delivery: fields, every attempt with its response body, replay

  let current = null;

  async function openDelivery(id) {
    show('delivery');
    current = id;
    $('#dv-id').textContent = id;
    await loadDelivery(id);
  }

  async function loadDelivery(id) {
    const d = await api('GET', `/v1/deliveries/${encodeURIComponent(id)}`);
    if (current !== id || $('#delivery-view').hidden) return;
    const field = (label, value, name) => [h('dt', null, label), h('dd', name ? { 'data-field': name } : null, value)];
    $('#dv-fields').replaceChildren(
      ...field('Status', badge(d.status), 'status'),
      ...field('Subscriber', d.subscriber_id),
      ...field('Event', `${d.event_id} (${d.event_type})`),
      ...field('Sequence', fmtNum(d.sequence), 'sequence'),
      ...field('Attempts', fmtNum(d.attempt_count), 'attempt_count'),
      ...field('Next attempt', d.held ? 'held behind its key’s head' : d.next_attempt_at_ms != null ? fmtTime(d.next_attempt_at_ms) : '—', 'next_attempt'),
      ...(d.ordering_key != null ? field('Ordering key', d.ordering_key, 'ordering_key') : []),
      ...(d.previous_sequence != null ? field('Previous sequence', fmtNum(d.previous_sequence), 'previous_sequence') : []),
      ...field('Last error', d.last_error ?? '—'),
      ...field('Created', fmtTime(d.created_at_ms), 'created'),
      ...field('Updated', fmtTime(d.updated_at_ms), 'updated'),
    );
    $('#dv-replay').disabled = d.status === 'in_flight';
    const attempts = d.attempts ?? [];
    $('#dv-attempts').replaceChildren(
      ...(attempts.length
        ? attempts.map((a, i) => attemptCard(a, i, i > 0 && a.attempt <= attempts[i - 1].attempt))
        : [h('p', { class: 'muted' }, 'No attempt yet.')]),
    );
    // Follow the delivery while it is on its way.
    if (d.status === 'pending' || d.status === 'in_flight') {
      clearTimeout(pollTimer);
      pollTimer = setTimeout(() => loadDelivery(id).catch(() => {}), 1000);
    }
  }

  /** One attempt; `replayed` when a replay restarted the count just before it. */
  function attemptCard(a, index, replayed) {
    const ok = a.outcome === 'delivered';
    return h(
      'article',
      { class: `card attempt ${ok ? 'ok' : 'failed'}`, 'data-index': index, 'data-outcome': a.outcome },
      h('header', null,
        h('strong', null, `#${a.attempt}`),
        replayed ? h('span', { class: 'muted' }, 'after a replay') : null,
        h('span', { class: `badge ${ok ? 'sent' : 'dead'}` }, a.outcome),
        h('span', null, fmtTime(a.at_ms)),
        h('span', { class: 'muted' }, `${a.lane} lane`),
        a.status != null ? h('span', null, `HTTP ${a.status}`) : null,
        a.latency_ms != null ? h('span', { class: 'muted' }, `${fmtNum(a.latency_ms)} ms`) : null),
      a.error ? h('p', { class: 'error-text' }, a.error) : null,
      a.response_body != null
        ? h('details', { open: true }, h('summary', null, 'Response body (first 4 KiB)'), h('pre', null, a.response_body))
        : h('p', { class: 'muted small' }, 'No response body recorded.'),
    );
  }

  async function onReplayCurrent() {
    const id = current;
    const button = $('#dv-replay');
    button.disabled = true;
    try {
      await api('POST', `/v1/deliveries/${encodeURIComponent(id)}/replay`);
      flash(`${id} is queued again.`);
      await loadDelivery(id);
    } catch (e) {
      button.disabled = false;
      if (e.status !== 401) flash(e.message, 'error');
    }
  }

  // ------------------------------------------------------------------------------------------

  function start() {
    $('#signin-form').addEventListener('submit', onSignIn);
    $('#sign-out').addEventListener('click', () => signOut());
    $('#sub-add').addEventListener('click', () => openForm(null));
    $('#sub-refresh').addEventListener('click', () => loadSubscribers().catch((e) => flash(e.message, 'error')));
    $('#sub-form').addEventListener('submit', onSaveSubscriber);
    $('#sub-filter-test').replaceChildren(window.FanoutPage.filterTester(api, () => $('#sub-form').elements.filter));
    $('#sub-cancel').addEventListener('click', () => {
      $('#sub-form').hidden = true;
      editing = null;
    });
    $('#secret-dismiss').addEventListener('click', () => {
      $('#secret-value').textContent = '';
      $('#secret-box').hidden = true;
    });
    $('#charts-refresh').addEventListener('click', () => charts?.load().catch((e) => flash(e.message, 'error')));
    $('#cus-refresh').addEventListener('click', () => loadCustomers().catch((e) => flash(e.message, 'error')));
    $('#cus-form').addEventListener('submit', onAddCustomer);
    $('#portal-link-dismiss').addEventListener('click', () => {
      $('#portal-link-url').textContent = '';
      $('#portal-link-box').hidden = true;
    });
    $('#dl-filter').addEventListener('submit', onFilter);
    $('#dl-bulk').addEventListener('click', onBulkReplay);
    $('#dl-more').addEventListener('click', () => loadDeliveries(true).catch((e) => flash(e.message, 'error')));
    $('#dv-replay').addEventListener('click', onReplayCurrent);
    $('#dv-back').addEventListener('click', () => {
      location.hash = listHash;
    });
    window.addEventListener('hashchange', route);
    route();
  }

  start();
})();
