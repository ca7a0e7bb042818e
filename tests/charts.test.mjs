// The charts and the customers page in headless Chromium (Debian's /usr/bin/chromium driven by
// playwright-core) against the real daemon and real recording subscribers:
// - the daemon keeps the series in its ledger (they are there after a restart); the console's
//   charts (uPlot canvases) are drawn with data, read back pixel by pixel; the portal's charts
//   show its customer's endpoints only (another customer's endpoint answers 404);
// - the customers page shows each customer's weight, cap, endpoints and share, and issues a
//   portal link with a button;
// - every page prints times in one format, the reader's local time (`2026-12-08 05:45:34`,
//   the pages run in Asia/Kolkata): tables, a delivery, the charts' legends, the portal;
// - at 1280 px the row buttons of the subscribers and deliveries tables sit inside their table;
//   at 390, 1280 and 1920 px no page of the console or the portal (`everyPage`) is wider than
//   the screen or raises a script error.
// Screenshots go to $FANOUT_SCREENSHOT_DIR (default /tmp) and are checked in the test (pixels).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { chromium } from 'playwright-core';

import { startOrigin, startSubscriber, waitFor } from './lib/harness.mjs';

const CHROMIUM = process.env.FANOUT_CHROMIUM ?? '/usr/bin/chromium';
const SHOTS = process.env.FANOUT_SCREENSHOT_DIR ?? '/tmp';

async function launch() {
  assert.ok(fs.existsSync(CHROMIUM), `${CHROMIUM} is missing: run bash scripts/setup.sh`);
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

// The pages run in a time zone that is not UTC and not this process's, so a page that prints
// UTC, or the time without its date, or a locale's own format, is told apart.
const ZONE = 'Asia/Kolkata';

/** Unix ms in the pages' one time format, in ZONE: `2026-12-03 14:30:00`. */
function localTime(ms) {
  return new Intl.DateTimeFormat('sv-SE', {
    timeZone: ZONE, year: 'numeric', month: '2-digit', day: '2-digit',
    hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23',
  }).format(new Date(ms));
}

async function openPage(browser, viewport) {
  const context = await browser.newContext({ viewport, timezoneId: ZONE });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/^Failed to load resource/.test(m.text())) problems.push(`console error: ${m.text()}`);
  });
  page.on('dialog', (d) => d.accept());
  return { page, problems };
}

async function must(origin, p, opts, status) {
  const res = await origin.api(p, opts);
  const text = await res.text();
  assert.equal(res.status, status, `${p}: ${text}`);
  return text ? JSON.parse(text) : null;
}

const total = (view, field) => view.points.reduce((n, p) => n + p[field], 0);

/** How many pixels of each chart canvas are close to `rgb` (the series' colour). */
function pixelsOf(page, root, rgb) {
  return page.evaluate(([sel, [r, g, b]]) => [...document.querySelectorAll(`${sel} .chart`)].map((box) => {
    const canvas = box.querySelector('canvas');
    if (!canvas || !canvas.width) return -1;
    const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] > 200 && Math.abs(d[i] - r) < 40 && Math.abs(d[i + 1] - g) < 40 && Math.abs(d[i + 2] - b) < 40) n++;
    }
    return n;
  }), [root, rgb]);
}

/** Save a screenshot and check it: a PNG of the viewport's width, not one colour. */
async function shot(page, name) {
  const file = path.join(SHOTS, `fanout-charts-${name}.png`);
  const png = await page.screenshot({ path: file, fullPage: true });
  assert.equal(png.readUInt32BE(16), page.viewportSize().width, `${name}: the screenshot is as wide as the screen`);
  assert.ok(png.length > 5_000, `${name}: the screenshot holds more than a blank page`);
  return file;
}

async function noOverflow(page, what) {
  const over = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(over <= 0, `${what}: the page is ${over}px wider than the screen`);
}

/** Every button of the table's rows lies inside the table's visible box. */
async function buttonsInside(page, table) {
  const out = await page.evaluate((sel) => {
    const box = document.querySelector(sel).closest('.scroll').getBoundingClientRect();
    return [...document.querySelectorAll(`${sel} tbody button`)]
      .map((b) => b.getBoundingClientRect())
      .filter((r) => r.right > box.right + 0.5 || r.left < box.left - 0.5)
      .map((r) => `${r.left}..${r.right} outside ${box.left}..${box.right}`);
  }, table);
  assert.deepEqual(out, [], `${table}: row buttons outside the table`);
}

/**
 * Every page at `viewport`: the console's sign-in, subscribers (with the subscriber form open),
 * dead letters, a delivery, charts and customers; the portal with its charts, deliveries and a
 * delivery, and without a token. Each is no wider than the screen and gets a screenshot; the
 * answer is the script errors seen.
 */
async function everyPage(browser, origin, portalUrl, viewport) {
  const w = viewport.width;
  const { page, problems } = await openPage(browser, viewport);
  const check = async (what) => {
    await noOverflow(page, `${what} at ${w} px`);
    await shot(page, `console-${what.replace(/\W+/g, '-')}-${w}`);
  };
  await page.goto(`${origin.url}/`);
  await page.locator('#signin-view:not([hidden])').waitFor();
  await check('sign-in');
  await page.fill('#signin-token', origin.token);
  await page.click('#signin-submit');
  await page.locator('#sub-table tr[data-subscriber="acme_orders"]').waitFor();
  await check('subscribers');
  await page.click('#sub-add');
  await page.locator('#sub-form:not([hidden])').waitFor();
  await check('the subscriber form');
  await page.click('#sub-cancel');
  for (const view of ['deliveries', 'customers', 'charts']) {
    await page.click(`#nav a[data-view=${view}]`);
    await page.locator(`#${view}-view:not([hidden])`).waitFor();
    if (view === 'charts') await page.locator('#charts[data-loaded]').waitFor();
    if (view === 'deliveries') await page.locator('#dl-table tbody tr').first().waitFor();
    await check(view);
  }
  await page.click('#nav a[data-view=deliveries]');
  await page.locator('#dl-table tbody tr a').first().click();
  await page.locator('#delivery-view:not([hidden]) #dv-fields [data-field=created]').waitFor();
  await check('a delivery');

  const portal = await openPage(browser, viewport);
  const portalCheck = async (what) => {
    await noOverflow(portal.page, `the portal${what} at ${w} px`);
    await shot(portal.page, `portal${what.replace(/\W+/g, '-')}-${w}`);
  };
  await portal.page.goto(portalUrl);
  await portal.page.locator('#charts[data-loaded="90"]').waitFor();
  await portal.page.locator('#deliveries tbody tr').first().waitFor();
  await portalCheck('');
  await portal.page.locator('#deliveries tbody tr').first().click();
  await portal.page.locator('#detail:not([hidden]) [data-fact=Created]').waitFor();
  await portalCheck(' with a delivery open');
  const bare = await openPage(browser, viewport);
  await bare.page.goto(`${origin.url}/portal`);
  await bare.page.locator('#fatal:not([hidden])').waitFor();
  await noOverflow(bare.page, `the portal without a token at ${w} px`);
  await Promise.all([page, portal.page, bare.page].map((p) => p.context().close()));
  return [...problems, ...portal.problems, ...bare.problems];
}

test('charts: the series survive a restart, are drawn in the console and scoped in the portal; customers; layouts at 390, 1280 and 1920 px', async (t) => {
  let n = 0;
  const sub = await startSubscriber(() => (++n % 4 === 0 ? { status: 500, body: 'no' } : { status: 200 }));
  const dir = fs.mkdtempSync('/tmp/fanout-charts-');
  const db = path.join(dir, 'fanout.db');
  let origin = await startOrigin({ db, args: ['--max-attempts', '1'] });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await origin.stop();
    await sub.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  await must(origin, '/v1/customers', { body: { id: 'acme', weight: 3, max_in_flight: 5 } }, 201);
  await must(origin, '/v1/customers', { body: { id: 'globex' } }, 201);
  for (const [id, customer] of [['acme_orders', 'acme'], ['globex_hooks', 'globex']]) {
    await must(origin, '/v1/subscribers', {
      body: { id, url: `${sub.url}/${id}`, event_types: ['*'], rate_per_sec: 200, lane: 'origin', customer },
    }, 201);
  }
  const events = Array.from({ length: 40 }, (_, i) => ({ id: `evt_${i}`, type: 'order.created', n: i }));
  await must(origin, '/v1/events', { body: events }, 202);
  // Both subscribers got every event (80 results), and a flush (every 10 s) wrote them.
  await waitFor(() => sub.requests.length >= 80 || null, 15_000);
  const seen = await waitFor(async () => {
    const v = await must(origin, '/v1/series?window=1h', {}, 200);
    return total(v, 'delivered') + total(v, 'failed') >= 80 ? v : null;
  }, 25_000, { message: 'the series hold every result' });
  assert.equal(seen.bucket_ms, 10_000);
  assert.equal(seen.points.length, 360);
  assert.equal(total(seen, 'delivered'), 60);
  assert.equal(total(seen, 'failed'), 20);
  assert.ok(seen.points.some((p) => p.p50_ms > 0 && p.p99_ms >= p.p50_ms), 'latency percentiles');
  assert.ok(seen.points.some((p) => p.cap >= 16), 'the caps');

  // Kept in the ledger: the same after a restart.
  await origin.stop({ keepDb: true });
  origin = await startOrigin({ db, apiToken: origin.token, args: ['--max-attempts', '1'] });
  const again = await must(origin, '/v1/series?window=1h', {}, 200);
  assert.equal(total(again, 'delivered') + total(again, 'failed'), 80);
  const day = await must(origin, '/v1/series?window=1d&subscriber=acme_orders', {}, 200);
  assert.equal(day.bucket_ms, 300_000);
  assert.equal(day.points.length, 288);
  await must(origin, '/v1/series?window=1w', {}, 400);

  // The console at 1280 px: charts drawn with data, read back by pixel.
  const { page, problems } = await openPage(browser, { width: 1280, height: 900 });
  await page.goto(`${origin.url}/`);
  await page.fill('#signin-token', origin.token);
  await page.click('#signin-submit');
  await page.locator('#sub-table tr[data-subscriber="acme_orders"]').waitFor();
  await shot(page, 'subscribers-1280');
  await buttonsInside(page, '#sub-table');
  await page.click('#nav a[data-view=deliveries]');
  await page.selectOption('#dl-filter select[name=status]', '');
  await page.click('#dl-apply');
  await page.locator('#dl-table tbody tr').first().waitFor();
  await shot(page, 'deliveries-1280');
  await buttonsInside(page, '#dl-table');
  await noOverflow(page, 'deliveries at 1280 px');
  // One time format in every page: the reader's local time, `YYYY-MM-DD HH:MM:SS`.
  const firstRow = page.locator('#dl-table tbody tr').first();
  const shown = await must(origin, `/v1/deliveries/${await firstRow.getAttribute('data-delivery')}`, {}, 200);
  assert.equal(await firstRow.locator('[data-field=updated]').textContent(), localTime(shown.updated_at_ms));
  await firstRow.locator('a').first().click();
  await page.locator(`#delivery-view:not([hidden]) #dv-fields [data-field=created]`).waitFor();
  assert.equal(await page.locator('#dv-fields [data-field=created]').textContent(), localTime(shown.created_at_ms));
  await noOverflow(page, 'a delivery at 1280 px');
  await shot(page, 'delivery-1280');

  await page.click('#nav a[data-view=charts]');
  // 15 minutes by default: 90 buckets of 10 s.
  await page.locator('#charts[data-loaded="90"]').waitFor();
  assert.equal(await page.locator('#charts .chart canvas').count(), 4);
  // Each legend shows the latest values without a pointer over the chart; the cap is the
  // configured one (acme's 5 and globex's endpoint), never a sum of samples.
  const legend = await page.locator('#charts .chart[data-chart=inflight] .u-legend .u-value').allTextContents();
  assert.deepEqual(legend.slice(0, 1), ['latest'], `the legend: ${legend}`);
  assert.ok(legend.slice(1).every((v) => v !== '--' && v !== ''), `the legend: ${legend}`);
  const seriesView = await must(origin, '/v1/series?window=15m', {}, 200);
  assert.equal(legend[2], String(seriesView.in_flight_cap), 'the cap in the legend');
  assert.match(await page.locator('#charts [data-field=summary]').textContent(), /^last 15 minutes: .* in flight \d+ of at most [1-9]\d*\.$/);
  await page.selectOption('#charts select[data-field=window]', '1h');
  await page.locator('#charts[data-loaded="360"]').waitFor();
  await noOverflow(page, 'charts at 1280 px');
  // The legend names the bucket under the pointer in the same format.
  const over = await page.locator('#charts .chart[data-chart=rate] .u-over').boundingBox();
  await page.mouse.move(over.x + over.width - 3, over.y + over.height / 2);
  const hovered = await page.locator('#charts .chart[data-chart=rate] .u-legend .u-value').first().textContent();
  const hourView = await must(origin, '/v1/series?window=1h', {}, 200);
  assert.ok(hourView.points.slice(-3).some((p) => localTime(p.t_ms) === hovered), `the legend's time: ${hovered}`);
  // The delivered line (#2e7d32) in the first chart, p50/p99 (#1565c0) in the second.
  await shot(page, 'console-charts-1280');
  const green = await pixelsOf(page, '#charts', [0x2e, 0x7d, 0x32]);
  const blue = await pixelsOf(page, '#charts', [0x15, 0x65, 0xc0]);
  assert.ok(green[0] > 20, `the delivered rate is drawn: ${green}`);
  assert.ok(blue[1] > 10, `the latency is drawn: ${blue}`);
  await page.selectOption('#charts select[data-field=subscriber]', 'acme_orders');
  await page.locator('#charts [data-field=summary]').waitFor();
  await page.selectOption('#charts select[data-field=window]', '1d');
  await page.locator('#charts[data-loaded="288"]').waitFor();

  // Customers: weight, cap, endpoints, share; a portal link from a button.
  await page.click('#nav a[data-view=customers]');
  const acme = page.locator('#cus-table tr[data-customer="acme"]');
  await acme.waitFor();
  assert.equal((await acme.locator('[data-field=weight]').textContent()).trim(), '3');
  assert.equal((await acme.locator('[data-field=cap]').textContent()).trim(), '5');
  assert.equal((await acme.locator('[data-field=endpoints]').textContent()).trim(), 'acme_orders');
  assert.match(await acme.locator('[data-field=share]').textContent(), /^\d+%\d+ of \d+ in flight$/);
  await buttonsInside(page, '#cus-table');
  await acme.locator('button[data-action=portal-link]').click();
  await page.locator('#portal-link-box:not([hidden])').waitFor();
  const url = (await page.locator('#portal-link-url').textContent()).trim();
  assert.match(url, /\/portal#/);
  await shot(page, 'customers-1280');

  // Every page at 390, 1280 and 1920 px: nothing wider than the screen, no script error.
  const walked = [];
  for (const viewport of [{ width: 390, height: 844 }, { width: 1280, height: 900 }, { width: 1920, height: 1080 }]) {
    walked.push(...await everyPage(browser, origin, url, viewport));
  }

  // The portal shows its times in the pages' one format too.
  const widePortal = await openPage(browser, { width: 1920, height: 1080 });
  await widePortal.page.goto(url);
  await widePortal.page.locator('#deliveries tbody tr').first().waitFor();
  const portalRow = widePortal.page.locator('#deliveries tbody tr').first();
  const portalShown = await must(origin, `/v1/deliveries/${await portalRow.getAttribute('data-delivery')}`, {}, 200);
  assert.equal(await portalRow.locator('[data-field=created]').textContent(), localTime(portalShown.created_at_ms));
  assert.match(await widePortal.page.locator('#who').textContent(), /^acme · link valid until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$/);

  // The portal link, on a phone: the charts of acme's endpoint only.
  const portal = await openPage(browser, { width: 390, height: 844 });
  await portal.page.goto(url);
  await portal.page.locator('#charts[data-loaded="90"]').waitFor();
  assert.equal(await portal.page.locator('#charts .chart canvas').count(), 4);
  assert.ok((await pixelsOf(portal.page, '#charts', [0x2e, 0x7d, 0x32]))[0] > 20, 'the portal draws its rate');
  await noOverflow(portal.page, 'the portal at 390 px');
  await shot(portal.page, 'portal-390');
  const token = decodeURIComponent(/token=([^&]+)/.exec(new URL(url).hash)[1]);
  const get = (q) => fetch(`${origin.url}/v1/series?${q}`, { headers: { authorization: `Bearer ${token}` } });
  const all = await get('window=1h');
  const scoped = { status: all.status, view: await all.json(), other: (await get('subscriber=globex_hooks')).status };
  assert.equal(scoped.status, 200);
  assert.equal(total(scoped.view, 'delivered') + total(scoped.view, 'failed'), 40, "acme's 40 results, not globex's");
  assert.equal(scoped.other, 404);
  assert.deepEqual([...problems, ...walked, ...widePortal.problems, ...portal.problems], []);
});
