// The customer portal in headless Chromium (Debian's /usr/bin/chromium driven by playwright-core)
// against the real daemon and real recording subscribers, two customers side by side:
// - click-through: customer A opens its link, finds its failed delivery, reads the response
//   body (shown as text), clicks Replay and its endpoint receives it again; a bulk replay of a
//   time range, counted first, sends again exactly the failed deliveries in that range; pause,
//   resume, a secret rotation (the secret shown once verifies the next webhook with the npm
//   standardwebhooks verifier), a content filter tried against an event and saved; desktop and phone screenshots;
// - the page's token (from the URL fragment) sees nothing of B: B's delivery, endpoint and
//   customer ids, edited in by hand, answer 404 (403 for routes outside the portal) and nothing
//   of B changes; the admin token never reaches the page; no cookie is set;
// - an expired link, a link with one character changed, and a link whose customer was removed
//   are refused;
// - framed by an allowed origin the portal loads; framed by another origin Chromium refuses it;
//   the operator console refuses every frame.
// The click-through runs twice: on a SQLite ledger and on a PostgreSQL one.
// Screenshots go to $FANOUT_SCREENSHOT_DIR (default /tmp).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

import { chromium } from 'playwright-core';
import { Webhook } from 'standardwebhooks';

import { sleep, startOrigin, startPostgres, startSubscriber, waitFor } from './lib/harness.mjs';

const CHROMIUM = process.env.FANOUT_CHROMIUM ?? '/usr/bin/chromium';
const SHOTS = process.env.FANOUT_SCREENSHOT_DIR ?? '/tmp';

/** A payload that would run script if the portal ever rendered data as HTML. */
const HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>';

async function launch() {
  assert.ok(fs.existsSync(CHROMIUM), `${CHROMIUM} is missing: run bash scripts/setup.sh`);
  return chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}

/** A page that records script errors, every request it makes, and accepts every confirm(). */
async function openPage(browser, viewport = { width: 1280, height: 900 }) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  const problems = [];
  const requests = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/^Failed to load resource/.test(m.text())) problems.push(`console error: ${m.text()}`);
  });
  page.on('request', (r) => requests.push({ url: r.url(), headers: r.headers() }));
  page.on('dialog', (d) => d.accept());
  return { context, page, problems, requests };
}

async function shot(page, name) {
  const file = path.join(SHOTS, `fanout-portal-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

async function json(res) {
  const text = await res.text();
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

async function must(origin, p, opts, status) {
  const res = await origin.api(p, opts);
  const body = await json(res);
  assert.equal(res.status, status, `${p}: ${JSON.stringify(body)}`);
  return body;
}

async function deliveriesOf(origin, query) {
  return (await must(origin, `/v1/deliveries?${new URLSearchParams(query)}`, {}, 200)).deliveries;
}

/** A datetime-local value (the browser's and this process's time zone are the same). */
function localInput(ms) {
  const d = new Date(ms);
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** Two customers, one endpoint each, every endpoint failing until told otherwise. */
async function twoCustomers(origin) {
  const state = { aFails: true };
  const a = await startSubscriber(() => (state.aFails ? { status: 500, body: `upstream exploded ${HOSTILE}` } : { status: 200, body: 'thanks' }));
  const b = await startSubscriber(() => ({ status: 500, body: 'globex is down' }));
  for (const id of ['acme', 'globex']) await must(origin, '/v1/customers', { body: { id } }, 201);
  const spec = (id, url, customer) => ({ id, url: `${url}/hooks`, event_types: ['order.*'], rate_per_sec: 50, lane: 'origin', customer });
  await must(origin, '/v1/subscribers', { body: spec('acme_orders', a.url, 'acme') }, 201);
  await must(origin, '/v1/subscribers', { body: spec('globex_orders', b.url, 'globex') }, 201);
  return { a, b, state };
}

async function link(origin, customer, ttl_secs) {
  return must(origin, `/v1/customers/${customer}/portal`, { body: ttl_secs ? { ttl_secs } : {} }, 201);
}

/**
 * The click-through against a daemon on `ledger`: its own SQLite file, or a database on a
 * throwaway PostgreSQL server.
 */
async function clickThrough(t, ledger) {
  const pg = ledger === 'postgres' ? await startPostgres() : null;
  let origin = null;
  t.after(async () => {
    await origin?.stop();
    await pg?.stop();
  });
  origin = await startOrigin({ db: pg?.createDatabase('portal'), args: ['--max-attempts', '1'] });
  const browser = await launch();
  const { a, b, state } = await twoCustomers(origin);
  t.after(async () => {
    await browser.close();
    await a.close();
    await b.close();
  });

  // e0 fails before the time range of the bulk replay; e1 is the one replayed by hand.
  await must(origin, '/v1/events', { body: [{ id: 'evt_0', type: 'order.created', n: 0 }, { id: 'evt_1', type: 'order.paid', n: 1 }] }, 202);
  await waitFor(async () => (await deliveriesOf(origin, { status: 'dead' })).length === 4 || null, 15_000);
  const bDead = await deliveriesOf(origin, { subscriber: 'globex_orders' });
  const bBefore = await Promise.all(bDead.map((d) => must(origin, `/v1/deliveries/${d.id}`, {}, 200)));

  const { url, token } = await link(origin, 'acme');
  assert.ok(url.startsWith(`${origin.url}/portal#token=`), url);
  const { context, page, problems, requests } = await openPage(browser);
  await page.goto(url);
  await page.locator('#deliveries-view').waitFor();
  // The token left the address bar at once and was never sent in a URL.
  assert.equal(new URL(page.url()).hash, '');
  assert.match(await page.locator('#who').textContent(), /^acme · link valid until/);

  // Only A's endpoint and deliveries.
  await page.locator('[data-endpoint="acme_orders"]').waitFor();
  assert.equal(await page.locator('[data-endpoint]').count(), 1);
  assert.equal(await page.locator('[data-endpoint="acme_orders"] [data-field=dead]').textContent(), '2');
  const aDead = await deliveriesOf(origin, { subscriber: 'acme_orders', event: 'evt_1' });
  const row = page.locator(`#deliveries tr[data-delivery="${aDead[0].id}"]`);
  await row.waitFor();
  assert.equal(await page.locator('#deliveries tbody tr').count(), 2);
  assert.doesNotMatch(await page.locator('#deliveries').textContent(), /globex/);

  // The failed delivery: its attempt's status and response body, as text.
  await row.click();
  const attempt = page.locator('#attempts .attempt').first();
  await attempt.waitFor();
  assert.match(await attempt.locator('.attempt-head').textContent(), /HTTP 500/);
  assert.equal(await attempt.locator('pre.body').textContent(), `upstream exploded ${HOSTILE}`);
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  console.log(`screenshot: ${await shot(page, 'desktop')}`);

  // Replay it: the endpoint (now healthy) receives it again.
  state.aFails = false;
  const before = a.requests.length;
  await page.click('#replay-one');
  await waitFor(() => a.requests.length > before || null, 15_000);
  assert.equal(a.requests.at(-1).headers['webhook-id'], 'evt_1');
  await waitFor(async () => (await must(origin, `/v1/deliveries/${aDead[0].id}`, {}, 200)).status === 'sent' || null, 15_000);

  // Bulk replay of a time range: two more failures inside it, e0 before it stays failed.
  state.aFails = true;
  const startSec = Math.ceil((Date.now() + 1) / 1000) * 1000;
  await sleep(startSec - Date.now() + 20);
  await must(origin, '/v1/events', { body: [{ id: 'evt_2', type: 'order.created' }, { id: 'evt_3', type: 'order.created' }] }, 202);
  await waitFor(async () => (await deliveriesOf(origin, { subscriber: 'acme_orders', status: 'dead' })).length === 3 || null, 15_000);
  state.aFails = false;
  await page.fill('#f-since', localInput(startSec));
  await page.fill('#f-until', localInput(Date.now() + 120_000));
  await page.click('#apply');
  await page.click('#bulk-count');
  await page.locator('#bulk-confirm:not([hidden])').waitFor();
  assert.match(await page.locator('#bulk-info').textContent(), /^2 deliveries would be sent again/);
  const beforeBulk = a.requests.length;
  await page.click('#bulk-confirm');
  await waitFor(() => a.requests.length >= beforeBulk + 2 || null, 15_000);
  // Both replayed deliveries are recorded sent: the replay has been carried out. A replay that
  // took e0 too would have made it pending (or sent) by now, and sent it with these.
  for (const event of ['evt_2', 'evt_3']) {
    await waitFor(async () => (await deliveriesOf(origin, { subscriber: 'acme_orders', event }))[0]?.status === 'sent' || null, 15_000);
  }
  const resent = a.requests.slice(beforeBulk).map((r) => r.headers['webhook-id']).sort();
  assert.deepEqual(resent, ['evt_2', 'evt_3']);
  const e0 = await deliveriesOf(origin, { subscriber: 'acme_orders', event: 'evt_0' });
  assert.equal(e0[0].status, 'dead');

  // Pause and resume; a new secret, shown once, which signs what the endpoint receives next.
  await page.click('[data-endpoint="acme_orders"] button.pause');
  await page.locator('[data-endpoint="acme_orders"] [data-health=disabled]').waitFor();
  const paused = await must(origin, '/v1/subscribers/acme_orders', {}, 200);
  assert.equal(paused.disabled_reason, 'disabled by the customer');
  await page.click('[data-endpoint="acme_orders"] button.resume');
  await page.locator('[data-endpoint="acme_orders"] [data-health=ok]').waitFor();
  assert.doesNotMatch(await page.content(), /whsec_/);
  await page.click('[data-endpoint="acme_orders"] button.rotate');
  await page.locator('#secret-box:not([hidden])').waitFor();
  const rotated = await page.locator('#new-secret').textContent();
  assert.match(rotated, /^whsec_/);
  await page.click('#secret-done');
  assert.doesNotMatch(await page.content(), /whsec_/);
  const beforeNext = a.requests.length;
  await must(origin, '/v1/events', { body: { id: 'evt_after_rotation', type: 'order.created' } }, 202);
  const next = await waitFor(() => a.requests.slice(beforeNext).find((r) => r.headers['webhook-id'] === 'evt_after_rotation') || null, 15_000);
  new Webhook(rotated).verify(next.body, next.headers);
  const bSecret = (await must(origin, '/v1/subscribers/globex_orders/secret', {}, 200)).secrets[0].secret;
  assert.throws(() => new Webhook(bSecret).verify(next.body, next.headers), /signature/i);

  // The same token, used by hand against B's ids: 404; outside the portal's routes: 403.
  const attacks = await page.evaluate(
    async ({ token, bIds }) => {
      const out = {};
      const call = async (method, p, body) => {
        const r = await fetch(p, {
          method,
          headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
        out[`${method} ${p}`] = r.status;
      };
      for (const id of bIds) {
        await call('GET', `/v1/deliveries/${id}`);
        await call('POST', `/v1/deliveries/${id}/replay`, {});
      }
      await call('GET', '/v1/subscribers/globex_orders');
      await call('PATCH', '/v1/subscribers/globex_orders', { disabled: true });
      await call('POST', '/v1/subscribers/globex_orders/rotate-secret', {});
      await call('GET', '/v1/subscribers/globex_orders/secret');
      await call('POST', '/v1/subscribers/globex_orders/test', {});
      await call('POST', '/v1/replay', { subscriber: 'globex_orders' });
      await call('GET', '/v1/customers/globex');
      await call('POST', '/v1/customers/globex/portal', {});
      await call('GET', '/v1/customers');
      await call('POST', '/v1/events', { id: 'x', type: 'order.x' });
      return out;
    },
    { token, bIds: bDead.map((d) => d.id) },
  );
  for (const [call, status] of Object.entries(attacks)) {
    // The portal's routes (docs/src/customers.md): the stored secret and test events are the operator's (403).
    const operatorOnly = call.includes('/v1/customers') || call.startsWith('POST /v1/events') || call.endsWith('/secret') || call.endsWith('/test');
    const expected = operatorOnly ? 403 : 404;
    assert.equal(status, expected, `${call}: ${status}`);
  }
  const bAfter = await Promise.all(bDead.map((d) => must(origin, `/v1/deliveries/${d.id}`, {}, 200)));
  assert.deepEqual(bAfter, bBefore, "nothing of B's deliveries changed");
  const bSub = await must(origin, '/v1/subscribers/globex_orders', {}, 200);
  assert.equal(bSub.disabled, false);
  assert.equal(bSub.active_secrets, 1);
  // B's endpoint got each of its events once (its own first attempts), nothing replayed.
  await waitFor(() => b.requests.some((r) => r.headers['webhook-id'] === 'evt_after_rotation') || null, 15_000);
  const bIds = b.requests.map((r) => r.headers['webhook-id']);
  assert.deepEqual(bIds.slice().sort(), ['evt_0', 'evt_1', 'evt_2', 'evt_3', 'evt_after_rotation']);

  // The endpoint's content filter: tried against an event, saved; an event it refuses makes no
  // delivery for this endpoint (B, unfiltered, gets both).
  const card = page.locator('[data-endpoint="acme_orders"]');
  await card.locator('.filter-edit summary').click();
  await card.locator('.filter-text').fill('{"n": {"$gte": 10}}');
  await card.locator('.filter-event').fill('{"id": "x", "type": "order.created", "n": 3}');
  await card.locator('.filter-test').click();
  await card.locator('[data-field=filter-result][data-matches=false]').waitFor();
  await card.locator('.save-filter').click();
  await page.locator('[data-endpoint="acme_orders"] [data-field=customer_filter]', { hasText: '{"n":{"$gte":10}}' }).waitFor();
  const filtered = await must(origin, '/v1/subscribers/acme_orders', {}, 200);
  assert.deepEqual([filtered.customer_filter, filtered.filter], [{ n: { $gte: 10 } }, null]);
  // The signature scheme: the customer switches its endpoint to Ed25519 and sees the public key.
  await card.locator('select.signature').selectOption('ed25519');
  const signed = page.locator('[data-endpoint="acme_orders"] [data-field=public_key]');
  await signed.waitFor();
  const acme = await must(origin, '/v1/subscribers/acme_orders', {}, 200);
  assert.equal(acme.signature, 'ed25519');
  assert.equal((await signed.textContent()).trim(), acme.public_key);
  // Batching: the customer turns it on for its endpoint, then off again.
  await card.locator('.batch-edit summary').click();
  await card.locator('.batch-events').fill('50');
  await card.locator('.batch-wait').fill('200');
  await card.locator('.save-batch').click();
  await card.locator('[data-field=batch]', { hasText: 'up to 50 events' }).waitFor();
  assert.deepEqual((await must(origin, '/v1/subscribers/acme_orders', {}, 200)).batch, { max_events: 50, max_bytes: 1048576, max_wait_ms: 200 });
  await card.locator('.batch-edit summary').click();
  await card.locator('.batch-events').fill('');
  await card.locator('.save-batch').click();
  await card.locator('[data-field=batch]', { hasText: 'off' }).waitFor();
  assert.equal((await must(origin, '/v1/subscribers/acme_orders', {}, 200)).batch, null);
  const made = await must(origin, '/v1/events', { body: [{ id: 'evt_small', type: 'order.created', n: 3 }, { id: 'evt_big', type: 'order.created', n: 12 }] }, 202);
  assert.deepEqual(made.events.map((e) => e.deliveries), [1, 2]);
  assert.deepEqual((await deliveriesOf(origin, { subscriber: 'acme_orders', event: 'evt_small' })), []);

  // Paged (a page size, the API's cursor) and searched by event id, its customer's only.
  await must(origin, '/v1/events', { body: Array.from({ length: 30 }, (_, i) => ({ id: `evt_p${i}`, type: 'order.created', n: 20 })) }, 202);
  const mine = await deliveriesOf(origin, { subscriber: 'acme_orders' });
  assert.ok(mine.length > 25 && mine.length <= 50, `${mine.length} deliveries of acme`);
  const rows = () => page.locator('#deliveries tbody tr').count();
  await page.fill('#f-since', '');
  await page.fill('#f-until', '');
  await page.selectOption('#f-limit', '25');
  await waitFor(async () => (await rows()) === 25 || null, 5_000);
  await page.click('#page-next');
  await page.locator('#page-info', { hasText: 'page 2' }).waitFor();
  assert.equal(await rows(), mine.length - 25);
  assert.ok(await page.isDisabled('#page-next'), 'the last page');
  await page.click('#page-prev');
  await page.locator('#page-info', { hasText: 'page 1' }).waitFor();
  await page.fill('#f-event', 'evt_p7');
  await page.click('#apply');
  await waitFor(async () => (await rows()) === 1 || null, 5_000);
  assert.equal((await deliveriesOf(origin, { event: 'evt_p7' })).length, 2, 'both customers got evt_p7');
  assert.doesNotMatch(await page.locator('#deliveries').textContent(), /globex/);
  await page.fill('#f-event', '');
  await page.click('#apply');

  // The admin token never reached the page; the portal token only went in Authorization; no
  // cookie exists.
  for (const r of requests) {
    assert.ok(!JSON.stringify(r).includes(origin.token), `admin token seen in ${r.url}`);
    assert.ok(!r.url.includes(token), `portal token in a URL: ${r.url}`);
    if (r.url.includes('/v1/')) assert.equal(r.headers.authorization, `Bearer ${token}`);
  }
  assert.ok(!(await page.content()).includes(origin.token));
  assert.deepEqual(await context.cookies(), []);
  assert.equal(await page.evaluate(() => document.cookie), '');

  // A phone.
  const phone = await openPage(browser, { width: 390, height: 844 });
  const second = await link(origin, 'acme');
  await phone.page.goto(second.url);
  await phone.page.locator('[data-endpoint="acme_orders"]').waitFor();
  await phone.page.locator('#deliveries tbody tr').first().waitFor();
  const overflow = await phone.page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than a phone`);
  console.log(`screenshot: ${await shot(phone.page, 'phone')}`);
  assert.deepEqual([...problems, ...phone.problems], []);
}

test('portal: customer A finds its failed delivery, reads the body, replays it, bulk-replays a time range; nothing of B', (t) =>
  clickThrough(t, 'sqlite'));

test('portal on a PostgreSQL ledger: the same click-through, the same scope', (t) => clickThrough(t, 'postgres'));

test('portal: an expired link, a changed link and a removed customer\'s link are refused', async (t) => {
  const origin = await startOrigin();
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await origin.stop();
  });
  await must(origin, '/v1/customers', { body: { id: 'acme' } }, 201);
  const { page } = await openPage(browser);
  const refused = async (url) => {
    await page.goto('about:blank');
    await page.goto(url);
    await page.locator('#fatal:not([hidden])').waitFor();
    assert.ok(await page.locator('#endpoints-view').isHidden());
    return page.locator('#fatal-message').textContent();
  };
  const good = await link(origin, 'acme');
  await page.goto(good.url);
  await page.locator('#endpoints-view:not([hidden])').waitFor();

  const short = await link(origin, 'acme', 1);
  await sleep(Math.max(0, short.expires_at_ms - Date.now()) + 100);
  assert.match(await refused(short.url), /expired/);

  for (const at of [good.url.indexOf('fpt_') + 6, good.url.length - 1, good.url.length - 20]) {
    const c = good.url[at] === 'A' ? 'B' : 'A';
    assert.match(await refused(good.url.slice(0, at) + c + good.url.slice(at + 1)), /signature|not a portal token/);
  }
  assert.match(await refused(`${origin.url}/portal`), /link that carries its access token/);

  await must(origin, '/v1/customers/acme', { method: 'DELETE' }, 200);
  assert.match(await refused(good.url), /no longer exists/);
});

/** A page on `host:port` that frames `src`. */
async function hostPage(host, src) {
  const server = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(`<!doctype html><title>host</title><iframe id="f" src="${src}" width="900" height="600"></iframe>`);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://${host}:${server.address().port}/`, close: () => new Promise((r) => server.close(r)) };
}

test('portal: framed by an allowed origin it loads, by another origin the browser refuses it; the console never', async (t) => {
  // The allowed host page is on 127.0.0.1:<p>; the other on localhost:<q> (another origin).
  const allowed = await hostPage('127.0.0.1', 'about:blank');
  const origin = await startOrigin({ args: ['--portal-frame-ancestors', new URL(allowed.url).origin] });
  await allowed.close();
  const browser = await launch();
  const servers = [];
  t.after(async () => {
    await browser.close();
    await origin.stop();
    for (const s of servers) await s.close();
  });
  await must(origin, '/v1/customers', { body: { id: 'acme' } }, 201);
  const { url } = await link(origin, 'acme');
  // The same port as the allowed origin, now serving the framing page.
  const port = new URL(allowed.url).port;
  const good = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(`<!doctype html><title>host</title><iframe id="f" src="${url}" width="900" height="600"></iframe>`);
  });
  await new Promise((resolve) => good.listen(Number(port), '127.0.0.1', resolve));
  servers.push({ close: () => new Promise((r) => good.close(r)) });
  const other = await hostPage('localhost', url);
  servers.push(other);
  const consoleHost = await hostPage('127.0.0.1', `${origin.url}/`);
  servers.push(consoleHost);

  const framedBy = async (hostUrl, expectLoaded, marker) => {
    const { page } = await openPage(browser);
    const refusals = [];
    page.on('console', (m) => /frame-ancestors|X-Frame-Options/.test(m.text()) && refusals.push(m.text()));
    await page.goto(hostUrl);
    await page.locator('#f').waitFor();
    const frame = await (await page.$('#f')).contentFrame();
    if (expectLoaded) {
      await frame.locator(marker).waitFor({ timeout: 15_000 });
      assert.deepEqual(refusals, []);
    } else {
      await waitFor(() => refusals.length > 0 || null, 10_000);
      assert.equal(await frame.locator(marker).count(), 0, 'nothing of the framed page rendered');
    }
    return page;
  };
  const loaded = await framedBy(allowed.url, true, '#endpoints-view:not([hidden])');
  console.log(`screenshot: ${await shot(loaded, 'framed')}`);
  await framedBy(other.url, false, '.brand');
  await framedBy(consoleHost.url, false, '.brand');

  // The headers themselves: the portal names its ancestor; the console stays unframeable.
  const portalRes = await fetch(`${origin.url}/portal`);
  assert.match(portalRes.headers.get('content-security-policy'), new RegExp(`frame-ancestors ${new URL(allowed.url).origin}$`));
  assert.equal(portalRes.headers.get('x-frame-options'), null);
  assert.equal(portalRes.headers.get('set-cookie'), null);
  const consoleRes = await fetch(`${origin.url}/`);
  assert.equal(consoleRes.headers.get('x-frame-options'), 'DENY');
  assert.match(consoleRes.headers.get('content-security-policy'), /frame-ancestors 'none'/);
});

test('portal: without --portal-frame-ancestors nobody may frame it', async (t) => {
  const origin = await startOrigin();
  t.after(() => origin.stop());
  const res = await fetch(`${origin.url}/portal`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-security-policy'), /frame-ancestors 'none'/);
  assert.equal(res.headers.get('x-frame-options'), 'DENY');
  assert.match(res.headers.get('content-security-policy'), /script-src 'self'/);
  assert.doesNotMatch(res.headers.get('content-security-policy'), /unsafe-inline/);
});
