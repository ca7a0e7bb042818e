// Fanout page helpers shared by the admin console (/) and the customer portal (/portal). Plain
// JavaScript, no build step, served once by `fanout serve` at /common.js and loaded by both
// pages before their own script. It defines one global, `FanoutPage`, and touches nothing else.
//
// Rules every helper keeps: values reach the page as text nodes or attributes, never innerHTML;
// API calls carry the caller's bearer token and no cookie, and are never cached.
'use strict';

window.FanoutPage = (() => {
  const $ = (sel) => document.querySelector(sel);

  /** Build an element. Strings and numbers become text nodes; props set attributes or handlers. */
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props ?? {})) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c == null || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  /** A refused call: the HTTP status, the API's error code and message (`apiMessage`: the
   * message the API gave, if it gave one). */
  class ApiError extends Error {
    constructor(status, code, message, apiMessage) {
      super(message);
      this.status = status;
      this.code = code;
      this.apiMessage = apiMessage;
    }
  }

  /** One API call; the JSON answer, or an ApiError carrying the API's `{error:{code,message}}`.
   * `who` names the server in the message when it does not answer at all. */
  async function request(method, path, body, bearer, who) {
    const headers = { authorization: `Bearer ${bearer ?? ''}`, accept: 'application/json' };
    if (body !== undefined) headers['content-type'] = 'application/json';
    let res;
    try {
      res = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: 'no-store',
        credentials: 'omit',
      });
    } catch (e) {
      throw new ApiError(0, 'network', `${who} did not answer (${e.message}).`);
    }
    const text = await res.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      /* not JSON: reported below */
    }
    if (!res.ok) {
      const err = data?.error;
      throw new ApiError(res.status, err?.code ?? 'http', err?.message ?? `HTTP ${res.status}`, err?.message);
    }
    return data;
  }

  /** A function that shows a message in the element `sel` (its class is the message's kind)
   * and hides it after `msFor(kind)` milliseconds. */
  function flasher(sel, defaultKind, msFor) {
    let timer = null;
    return (message, kind = defaultKind) => {
      const el = $(sel);
      el.textContent = message;
      el.className = kind;
      el.hidden = false;
      clearTimeout(timer);
      timer = setTimeout(() => {
        el.hidden = true;
      }, msFor(kind));
    };
  }

  const pad2 = (n) => String(n).padStart(2, '0');

  /** Unix ms as the pages' one time format: the reader's local time, 24-hour,
   * `2026-12-03 10:00:00`; with `clock`, only its time of day `10:00:00` (chart axes). '' for
   * none, the value itself when it is not a time. The CLI and the API speak RFC 3339 UTC. */
  function fmtTime(ms, { clock = false } = {}) {
    if (ms == null) return '';
    const d = new Date(ms);
    if (Number.isNaN(d.getTime())) return String(ms);
    const time = `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
    return clock ? time : `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${time}`;
  }

  /** A delivery status as a badge (styled by its status, read by tests through data-status). */
  const badge = (status, label) => h('span', { class: `badge ${status}`, 'data-status': status }, label);

  /** The JSON a text box holds: null when it is empty; an Error naming `what` when it is not JSON. */
  function parseJsonBox(text, what) {
    const t = text.trim();
    if (!t) return null;
    try {
      return JSON.parse(t);
    } catch (e) {
      throw new Error(`${what} is not JSON: ${e.message}`);
    }
  }

  /** A content filter as one line of text ('' for none). */
  const filterText = (f) => (f == null ? '' : JSON.stringify(f));

  /** "Does my filter match this event?": an event box, a button and the answer, asking
   * POST /v1/filters/test through `call(method, path, body)`; `filterBox()` is the filter's text
   * box (an empty one tests no filter: every event matches). */
  function filterTester(call, filterBox) {
    const event = h('textarea', {
      class: 'filter-event', rows: 4, spellcheck: 'false', 'aria-label': 'An event to test the filter against',
      placeholder: '{"id": "evt_1", "type": "invoice.paid", "amount": 250}',
    });
    const result = h('span', { class: 'filter-result', 'data-field': 'filter-result', role: 'status' });
    async function run() {
      try {
        const filter = parseJsonBox(filterBox().value, 'The filter') ?? {};
        const ev = parseJsonBox(event.value, 'The event');
        if (ev == null) throw new Error('Paste an event to test the filter against.');
        const r = await call('POST', '/v1/filters/test', { filter, event: ev });
        result.dataset.matches = String(r.matches);
        result.textContent = r.matches ? 'Matches: this event would be delivered.' : 'No match: this event would not be delivered.';
      } catch (e) {
        result.dataset.matches = 'error';
        result.textContent = e.message;
      }
    }
    return h('div', { class: 'filter-tester' },
      h('label', null, 'Test against an event', event),
      h('div', { class: 'actions' }, h('button', { type: 'button', class: 'quiet filter-test', onclick: run }, 'Test filter'), result));
  }

  return Object.freeze({ $, h, ApiError, request, flasher, fmtTime, badge, parseJsonBox, filterText, filterTester });
})();
