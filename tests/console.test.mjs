// The admin console in headless Chromium (Debian's /usr/bin/chromium driven by playwright-core)
// against the real daemon (`fanout serve`, fresh SQLite file) and a real recording subscriber:
// sign in, read the status table, open a dead delivery, replay it and watch it become `sent`;
// add, edit (its content filter too, tried against an event) and rotate a subscriber through the forms; bulk replay from the filtered list; a
// subscriber disabled by a 410 is shown with its reason, re-enabled (what waited is sent),
// disabled by hand and deleted; a customer's portal links revoked; a wrong token is refused;
// the line of the producer's outbox the daemon reads. Screenshots go to $FANOUT_SCREENSHOT_DIR (default /tmp).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { chromium } from 'playwright-core';

import { originBinary, startOrigin, startSubscriber, waitFor } from './lib/harness.mjs';

const CHROMIUM = process.env.FANOUT_CHROMIUM ?? '/usr/bin/chromium';
const SHOTS = process.env.FANOUT_SCREENSHOT_DIR ?? '/tmp';

/** A payload that would run script if the console ever rendered data as HTML. */
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

/** A page that records script errors, CSP violations and dialogs, accepting every confirm(). */
async function openPage(browser) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    // Failed API calls (a refused token, a refused URL) are expected and shown by the page itself.
    if (m.type() === 'error' && !/^Failed to load resource/.test(m.text())) problems.push(`console error: ${m.text()}`);
  });
  const dialogs = [];
  page.on('dialog', (d) => {
    dialogs.push(d.message());
    d.accept();
  });
  return { page, problems, dialogs };
}

async function signIn(page, origin, token = origin.token) {
  await page.goto(`${origin.url}/`);
  await page.locator('#signin-view').waitFor();
  await page.fill('#signin-token', token);
  await page.click('#signin-submit');
}

async function deliveriesOf(origin, query) {
  const res = await origin.api(`/v1/deliveries?${new URLSearchParams(query)}`);
  assert.equal(res.status, 200);
  return (await res.json()).deliveries;
}

async function shot(page, name) {
  const file = path.join(SHOTS, `fanout-console-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

test('console: sign in, find the dead delivery, replay it, see it sent', async (t) => {
  let failing = true;
  const sub = await startSubscriber(() =>
    failing ? { status: 500, body: `upstream exploded ${HOSTILE}` } : { status: 200, body: 'thanks' },
  );
  // A producer's outbox (an empty SQLite one) the console shows a line for.
  const outbox = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'fanout-console-outbox-')), 'shop.db');
  const init = spawnSync(originBinary(), ['outbox', 'init', '--db', outbox], { encoding: 'utf8' });
  assert.equal(init.status, 0, init.stderr);
  const origin = await startOrigin({ args: ['--max-attempts', '1', '--outbox', outbox] });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await origin.stop();
    await sub.close();
  });

  const created = await origin.api('/v1/subscribers', {
    body: { id: 'sub_partner', url: `${sub.url}/hooks`, event_types: ['video.*'], rate_per_sec: 10, burst: 20, lane: 'origin' },
  });
  assert.equal(created.status, 201, await created.text());
  const ingest = await origin.api('/v1/events', {
    body: { id: 'evt_console_1', type: 'video.trending', title: HOSTILE },
  });
  assert.equal(ingest.status, 202, await ingest.text());
  const [dead] = await waitFor(async () => {
    const d = await deliveriesOf(origin, { status: 'dead' });
    return d.length ? d : null;
  }, 15_000);
  assert.equal(sub.requests.length, 1);
  failing = false;

  const { page, problems } = await openPage(browser);
  await signIn(page, origin);

  // The status table: the subscriber with one dead delivery and its last error.
  const row = page.locator('#sub-table tr[data-subscriber="sub_partner"]');
  await row.waitFor();
  assert.equal((await row.locator('[data-field=dead]').textContent()).trim(), '1');
  assert.equal((await row.locator('[data-field=sent]').textContent()).trim(), '0');
  assert.match(await row.textContent(), /HTTP 500/);
  // What retention keeps (the defaults) and has removed (nothing yet), under the table.
  await page.locator('#retention:text-matches("^Retention: sent kept 7d")').waitFor();
  assert.match(await page.locator('#retention').textContent(), /dead kept 30d \(oldest .*\); removed 0 sent, 0 dead/);
  // The outbox the daemon reads, under it.
  await page.locator('#outbox:text-matches("^Outbox fanout_outbox in ")').waitFor();
  assert.match(await page.locator('#outbox').textContent(), /0 rows read, 0 rejected, 0 rounds failed; oldest row 0\.0 s old\.$/);
  console.log(`screenshot: ${await shot(page, 'subscribers')}`);

  // The dead-letter list, then the delivery's detail with the failed attempt's response body.
  await page.click('#nav a[data-view=deliveries]');
  const line = page.locator(`#dl-table tr[data-delivery="${dead.id}"]`);
  await line.waitFor();
  assert.match(await line.textContent(), /evt_console_1/);
  console.log(`screenshot: ${await shot(page, 'dead-letters')}`);
  await line.locator(`a[href="#/deliveries/${dead.id}"]`).click();
  await page.locator('#delivery-view [data-field=status] [data-status=dead]').waitFor();
  const body = page.locator('#dv-attempts [data-index="0"][data-outcome=failed] pre');
  assert.equal(await body.textContent(), `upstream exploded ${HOSTILE}`);

  // Replay: the page follows the delivery until it is sent.
  await page.click('#dv-replay');
  await page.locator('#delivery-view [data-field=status] [data-status=sent]').waitFor({ timeout: 15_000 });
  await page.locator('#dv-attempts [data-index="1"][data-outcome=delivered]').waitFor();
  assert.equal(await page.locator('#dv-attempts article').count(), 2);
  console.log(`screenshot: ${await shot(page, 'delivery')}`);

  // The subscriber really received it again, as the same webhook.
  await waitFor(() => sub.requests.length === 2, 5_000);
  assert.equal(sub.requests[1].headers['webhook-id'], 'evt_console_1');
  assert.equal(sub.requests[1].body, sub.requests[0].body);
  const [after] = await deliveriesOf(origin, { event: 'evt_console_1' });
  assert.equal(after.status, 'sent');

  // Nothing from the ledger was ever interpreted as markup.
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  assert.equal(await page.locator('main img, main script').count(), 0);
  assert.deepEqual(problems, []);
});

test('console: add, edit and rotate a subscriber; bulk replay a time range', async (t) => {
  let failing = true;
  const sub = await startSubscriber(() => (failing ? 503 : 200));
  const origin = await startOrigin({ args: ['--max-attempts', '1'] });
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await origin.stop();
    await sub.close();
  });
  const { page, problems } = await openPage(browser);
  await signIn(page, origin);
  await page.locator('#sub-empty').waitFor();

  // Add: the secret is shown once, then gone from the page.
  await page.click('#sub-add');
  const form = page.locator('#sub-form');
  await form.locator('[name=id]').fill('sub_chat');
  await form.locator('[name=url]').fill(`${sub.url}/relay`);
  await form.locator('[name=event_types]').fill('chat.*, video.trending');
  await form.locator('[name=rate_per_sec]').fill('5');
  await form.locator('[name=lane]').selectOption('origin');
  await page.click('#sub-save');
  await page.locator('#secret-box:not([hidden])').waitFor();
  const secret = (await page.locator('#secret-value').textContent()).trim();
  assert.match(secret, /^whsec_/);
  await page.click('#secret-dismiss');
  assert.equal((await page.locator('#secret-value').textContent()).trim(), '');
  const row = page.locator('#sub-table tr[data-subscriber="sub_chat"]');
  await row.waitFor();
  let view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.deepEqual(
    [view.event_types, view.rate_per_sec, view.burst, view.lane],
    [['chat.*', 'video.trending'], 5, 5, 'origin'],
  );

  // A refused URL is reported in the form, not swallowed.
  await row.getByRole('button', { name: 'Edit' }).click();
  await form.locator('[name=url]').fill('https://10.0.0.1/private');
  await page.click('#sub-save');
  await page.locator('#sub-form-error:not([hidden])').waitFor();
  assert.match(await page.locator('#sub-form-error').textContent(), /url refused/);

  // Edit the limits.
  await form.locator('[name=url]').fill(`${sub.url}/relay`);
  await form.locator('[name=burst]').fill('12');
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.equal(view.burst, 12);

  // A content filter: tried against an event in the form (a bad one names its place), saved and
  // shown in the table; emptied, it is removed.
  await row.getByRole('button', { name: 'Edit' }).click();
  await form.locator('[name=filter]').fill('{"amount": {"$gt": "5"}}');
  await form.locator('.filter-event').fill('{"id": "e", "type": "chat.message", "amount": 9}');
  await form.locator('.filter-test').click();
  await form.locator('[data-field=filter-result][data-matches=error]').waitFor();
  assert.match(await form.locator('[data-field=filter-result]').textContent(), /^filter\/amount\/\$gt: expected a number/);
  await form.locator('[name=filter]').fill('{"amount": {"$gt": 5}}');
  await form.locator('.filter-test').click();
  await form.locator('[data-field=filter-result][data-matches=true]').waitFor();
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.deepEqual(view.filter, { amount: { $gt: 5 } });
  await row.locator('[data-field=filter]', { hasText: '{"amount":{"$gt":5}}' }).waitFor();
  await row.getByRole('button', { name: 'Edit' }).click();
  assert.match(await form.locator('[name=filter]').inputValue(), /"\$gt": 5/);
  await form.locator('[name=filter]').fill('');
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.equal(view.filter, null);

  // The signature scheme: switched to both in the form; the row shows it and the public key.
  await row.getByRole('button', { name: 'Edit' }).click();
  assert.equal(await form.locator('[name=signature]').inputValue(), 'hmac');
  await form.locator('[name=signature]').selectOption('both');
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.equal(view.signature, 'both');
  assert.match(view.public_key, /^whpk_/);
  await row.locator('[data-field=signature]', { hasText: 'signs both' }).waitFor();
  await row.locator('[data-field=public_key]', { hasText: view.public_key }).waitFor();
  assert.ok(!(await page.content()).includes('whsk_'), 'no private key on the page');

  // Batching: on in the form (the row says so), then off again by emptying its events.
  await row.getByRole('button', { name: 'Edit' }).click();
  assert.equal(await form.locator('[name=batch_max_events]').inputValue(), '');
  await form.locator('[name=batch_max_events]').fill('100');
  await form.locator('[name=batch_max_wait_ms]').fill('250');
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.deepEqual(view.batch, { max_events: 100, max_bytes: 1048576, max_wait_ms: 250 });
  await row.locator('[data-field=batch]', { hasText: 'batches of up to 100 events, 1 MiB, wait 250 ms' }).waitFor();
  await row.getByRole('button', { name: 'Edit' }).click();
  assert.equal(await form.locator('[name=batch_max_events]').inputValue(), '100');
  await form.locator('[name=batch_max_events]').fill('');
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.equal(view.batch, null);

  // Rotate: a new secret, shown once, and two secrets sign during the grace period.
  await row.getByRole('button', { name: 'Rotate secret' }).click();
  await page.locator('#secret-box:not([hidden])').waitFor();
  const rotated = (await page.locator('#secret-value').textContent()).trim();
  assert.match(rotated, /^whsec_/);
  assert.notEqual(rotated, secret);
  view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.equal(view.active_secrets, 2);
  // It signs with both: the public key a receiver needs is shown beside the new secret.
  assert.match((await page.locator('#secret-key:not([hidden]) #secret-public-key').textContent()).trim(), /^whpk_/);
  console.log(`screenshot: ${await shot(page, 'rotated')}`);
  await page.click('#secret-dismiss');

  // A customer made on the customers page; the subscriber moved to it with an ordering key in
  // the form, then detached and unordered again.
  await page.click('#nav a[data-view=customers]');
  const cusForm = page.locator('#cus-form');
  await cusForm.locator('[name=id]').fill('acme');
  await cusForm.locator('[name=weight]').fill('2');
  await cusForm.locator('[name=max_in_flight]').fill('7');
  await page.click('#cus-add');
  await page.locator('#cus-table tr[data-customer="acme"]').waitFor();
  const acme = await (await origin.api('/v1/customers/acme')).json();
  assert.deepEqual([acme.weight, acme.max_in_flight], [2, 7]);
  await page.click('#nav a[data-view=subscribers]');
  await row.getByRole('button', { name: 'Edit' }).click();
  await form.locator('[name=customer] option[value="acme"]').waitFor({ state: 'attached' });
  await form.locator('[name=customer]').selectOption('acme');
  await form.locator('[name=ordering]').selectOption('key');
  await form.locator('[name=ordering_key]').fill('/room');
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.deepEqual([view.customer, view.ordering, view.ordering_key], ['acme', 'key', '/room']);
  await row.getByRole('button', { name: 'Edit' }).click();
  assert.equal(await form.locator('[name=customer]').inputValue(), 'acme');
  assert.equal(await form.locator('[name=ordering_key]').inputValue(), '/room');
  await form.locator('[name=customer]').selectOption('');
  await form.locator('[name=ordering]').selectOption('none');
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  view = await (await origin.api('/v1/subscribers/sub_chat')).json();
  assert.deepEqual([view.customer, view.ordering, view.ordering_key], [null, 'none', undefined]);

  // Every field the API takes, through the form: a subscriber added with each one set (its own
  // secret too), read back by the API and by the form; disabled from the form when editing.
  // (`secret` is only for adding: it changes by rotation; `disabled` only for editing: a
  // subscriber is created enabled.)
  const ownSecret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
  await page.click('#sub-add');
  assert.equal(await form.locator('[name=disabled]').isVisible(), false);
  const every = {
    id: 'sub_every', url: `${sub.url}/every`, event_types: 'order.*, refund.issued', rate_per_sec: '7.5',
    burst: '9', max_in_flight: '3', timeout_ms: '2500', ordering_key: '/order_id',
    batch_max_events: '10', batch_max_bytes: '4096', batch_max_wait_ms: '100',
    filter: '{"amount": {"$gt": 1}}', customer_filter: '{"region": "eu"}', secret: ownSecret,
  };
  for (const [name, value] of Object.entries(every)) await form.locator(`[name=${name}]`).fill(value);
  await form.locator('[name=customer] option[value="acme"]').waitFor({ state: 'attached' });
  const chosen = { customer: 'acme', ordering: 'key', lane: 'origin', payload: 'thin', signature: 'both' };
  for (const [name, value] of Object.entries(chosen)) await form.locator(`[name=${name}]`).selectOption(value);
  await form.locator('[name=legacy_signature]').check();
  await form.locator('[name=propagate_trace]').check();
  await page.click('#sub-save');
  await page.locator('#secret-box:not([hidden])').waitFor();
  assert.equal((await page.locator('#secret-value').textContent()).trim(), ownSecret);
  await page.click('#secret-dismiss');
  view = await (await origin.api('/v1/subscribers/sub_every')).json();
  assert.deepEqual(
    [view.url, view.event_types, view.rate_per_sec, view.burst, view.max_in_flight, view.timeout_ms, view.customer,
      view.ordering, view.ordering_key, view.lane, view.payload, view.signature, view.legacy_signature,
      view.propagate_trace, view.batch, view.filter, view.customer_filter, view.disabled],
    [every.url, ['order.*', 'refund.issued'], 7.5, 9, 3, 2500, 'acme', 'key', '/order_id', 'origin', 'thin', 'both', true,
      true, { max_events: 10, max_bytes: 4096, max_wait_ms: 100 }, { amount: { $gt: 1 } }, { region: 'eu' }, false],
  );
  const secrets = await (await origin.api('/v1/subscribers/sub_every/secret')).json();
  assert.deepEqual(secrets.secrets.map((x) => x.secret), [ownSecret]);
  const everyRow = page.locator('#sub-table tr[data-subscriber="sub_every"]');
  await everyRow.getByRole('button', { name: 'Edit' }).click();
  await form.locator('[name=customer] option[value="acme"]').waitFor({ state: 'attached' });
  assert.equal(await form.locator('[name=secret]').isVisible(), false);
  const readBack = {};
  for (const name of [...Object.keys(every), ...Object.keys(chosen)]) {
    if (name !== 'secret') readBack[name] = await form.locator(`[name=${name}]`).inputValue();
  }
  const { secret: _own, ...typed } = every;
  assert.deepEqual(readBack, {
    ...typed, filter: '{\n  "amount": {\n    "$gt": 1\n  }\n}', customer_filter: '{\n  "region": "eu"\n}', ...chosen,
  });
  assert.deepEqual(
    [await form.locator('[name=legacy_signature]').isChecked(), await form.locator('[name=propagate_trace]').isChecked(),
      await form.locator('[name=disabled]').isChecked()],
    [true, true, false],
  );
  await form.locator('[name=disabled]').check();
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  view = await (await origin.api('/v1/subscribers/sub_every')).json();
  assert.equal(view.disabled, true);
  await everyRow.locator('[data-field=disabled]').waitFor();
  await everyRow.getByRole('button', { name: 'Edit' }).click();
  assert.equal(await form.locator('[name=disabled]').isChecked(), true);
  await form.locator('[name=disabled]').uncheck();
  await page.click('#sub-save');
  await form.waitFor({ state: 'hidden' });
  assert.equal((await (await origin.api('/v1/subscribers/sub_every')).json()).disabled, false);
  assert.equal((await origin.api('/v1/subscribers/sub_every', { method: 'DELETE' })).status, 200);

  // Three events die; bulk replay from the filtered list sends them all.
  const res = await origin.api('/v1/events', {
    body: ['a', 'b', 'c'].map((x) => ({ id: `evt_chat_${x}`, type: 'chat.message' })),
  });
  assert.equal(res.status, 202);
  await waitFor(async () => (await deliveriesOf(origin, { status: 'dead' })).length === 3, 15_000);
  failing = false;
  await page.click('#nav a[data-view=deliveries]');
  await page.locator('#dl-table tbody tr').nth(2).waitFor();
  const filter = page.locator('#dl-filter');
  await filter.locator('[name=subscriber]').selectOption('sub_chat');
  await filter.locator('[name=since]').fill(localInput(Date.now() - 3_600_000));
  await filter.locator('[name=until]').fill(localInput(Date.now() + 3_600_000));
  await page.click('#dl-apply');
  await page.waitForFunction(() => location.hash.includes('since='));
  await page.locator('#dl-table tbody tr').nth(2).waitFor();
  await page.click('#dl-bulk');
  // The flash of an earlier step ("Saved sub_chat.") may still be showing: wait for this one's.
  await page.locator('#flash:not([hidden])', { hasText: 'queued again' }).waitFor();
  assert.match(await page.locator('#flash').textContent(), /^3 deliveries queued again/);
  await waitFor(async () => (await deliveriesOf(origin, { status: 'sent' })).length === 3, 15_000);
  await page.click('#nav a[data-view=subscribers]');
  await page.locator('#sub-table tr[data-subscriber="sub_chat"] [data-field=sent]:text-is("3")').waitFor();
  assert.deepEqual(problems, []);
});

test('console: a 410 disables a subscriber, Re-enable sends what waited; disable by hand, delete', async (t) => {
  let gone = true;
  const sub = await startSubscriber(() => (gone ? { status: 410, body: 'gone for good' } : { status: 200, body: 'back' }));
  const origin = await startOrigin();
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await origin.stop();
    await sub.close();
  });
  const subView = async () => {
    const res = await origin.api('/v1/subscribers/sub_orders');
    assert.equal(res.status, 200);
    return res.json();
  };

  const created = await origin.api('/v1/subscribers', {
    body: { id: 'sub_orders', url: `${sub.url}/orders`, event_types: ['order.*'], rate_per_sec: 10, burst: 20, max_in_flight: 1, lane: 'origin' },
  });
  assert.equal(created.status, 201, await created.text());
  // The first event meets the 410: that delivery is dead and the subscriber disabled.
  assert.equal((await origin.api('/v1/events', { body: { id: 'evt_order_0', type: 'order.placed' } })).status, 202);
  await waitFor(async () => (await subView()).disabled, 15_000);
  // Later events wait, pending, for the subscriber to come back; nothing is sent meanwhile. A
  // witness subscribed to the same events marks the time: once it has received both, the
  // dispatcher has taken up their deliveries, and would have sent the disabled one's too.
  const witness = await startSubscriber(() => ({ status: 200, body: 'ok' }));
  t.after(() => witness.close());
  const watching = await origin.api('/v1/subscribers', {
    body: { id: 'sub_witness', url: `${witness.url}/w`, event_types: ['order.*'], lane: 'origin' },
  });
  assert.equal(watching.status, 201, await watching.text());
  const later = await origin.api('/v1/events', {
    body: [1, 2].map((i) => ({ id: `evt_order_${i}`, type: 'order.placed' })),
  });
  assert.equal(later.status, 202);
  await waitFor(() => witness.requests.length === 2, 15_000);
  assert.equal(sub.requests.length, 1, 'nothing is sent to a disabled subscriber');
  assert.equal((await deliveriesOf(origin, { subscriber: 'sub_orders', status: 'pending' })).length, 2);
  assert.equal((await origin.api('/v1/subscribers/sub_witness', { method: 'DELETE' })).status, 200);

  const { page, problems, dialogs } = await openPage(browser);
  await signIn(page, origin);
  const row = page.locator('#sub-table tr[data-subscriber="sub_orders"]');
  await row.locator('[data-field=disabled]').waitFor();
  assert.equal((await row.locator('[data-field=disabled]').textContent()).trim(), 'disabled');
  assert.equal((await row.locator('[data-field=disabled_reason]').textContent()).trim(), 'the endpoint answered 410 Gone');
  assert.equal((await row.locator('[data-field=pending]').textContent()).trim(), '2');
  assert.equal((await row.locator('[data-field=dead]').textContent()).trim(), '1');
  assert.equal(await row.locator('button[data-action=disable]').count(), 0);
  console.log(`screenshot: ${await shot(page, 'disabled')}`);
  assert.equal(sub.requests.length, 1, 'nothing is sent to a disabled subscriber');

  // The endpoint is back: Re-enable (no confirmation needed) and the table follows the
  // waiting deliveries until they are sent.
  gone = false;
  await row.locator('button[data-action=enable]').click();
  await row.locator('[data-field=sent]:text-is("2")').waitFor({ timeout: 15_000 });
  assert.equal(await row.locator('[data-field=disabled]').count(), 0);
  assert.equal((await row.locator('[data-field=pending]').textContent()).trim(), '0');
  assert.deepEqual(dialogs, []);
  await waitFor(() => sub.requests.length === 3, 5_000);
  assert.deepEqual(sub.requests.slice(1).map((r) => r.headers['webhook-id']).sort(), ['evt_order_1', 'evt_order_2']);
  assert.equal((await deliveriesOf(origin, { subscriber: 'sub_orders', status: 'sent' })).length, 2);
  assert.equal((await subView()).disabled, false);
  console.log(`screenshot: ${await shot(page, 're-enabled')}`);

  // Disable by hand (after a confirmation), then delete (after another).
  await row.locator('button[data-action=disable]').click();
  await row.locator('[data-field=disabled_reason]').waitFor();
  assert.equal((await row.locator('[data-field=disabled_reason]').textContent()).trim(), 'disabled by an operator');
  assert.equal(dialogs.length, 1);
  assert.match(dialogs[0], /^Disable sub_orders\?/);
  const view = await subView();
  assert.equal(view.disabled, true);
  assert.equal(view.disabled_reason, 'disabled by an operator');
  await row.locator('button[data-action=delete]').click();
  await row.waitFor({ state: 'detached' });
  assert.equal(dialogs.length, 2);
  assert.match(dialogs[1], /^Delete sub_orders\?/);
  assert.equal((await origin.api('/v1/subscribers/sub_orders')).status, 404);
  await page.locator('#sub-empty').waitFor();
  assert.deepEqual(problems, []);
});

test('console: Revoke portal links ends every link issued for that customer so far, and only those', async (t) => {
  const origin = await startOrigin();
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await origin.stop();
  });
  for (const id of ['acme', 'globex']) assert.equal((await origin.api('/v1/customers', { body: { id } })).status, 201);
  const link = async (id) => {
    const r = await origin.api(`/v1/customers/${id}/portal`, { body: {} });
    assert.equal(r.status, 201);
    return (await r.json()).token;
  };
  const asPortal = async (token) =>
    (await fetch(`${origin.url}/v1/subscribers`, { headers: { authorization: `Bearer ${token}` } })).status;
  const leaked = await link('acme');
  const other = await link('globex');
  assert.equal(await asPortal(leaked), 200);

  const { page, problems, dialogs } = await openPage(browser);
  await signIn(page, origin);
  await page.locator('#subscribers-view:not([hidden])').waitFor();
  await page.click('#nav a[data-view=customers]');
  const row = page.locator('#cus-table tr[data-customer="acme"]');
  await row.waitFor();
  await row.locator('button[data-action=revoke-links]').click();
  await waitFor(async () => (await asPortal(leaked)) === 401 || null, 5_000);
  assert.equal(dialogs.length, 1);
  assert.match(dialogs[0], /^Revoke every portal link issued for acme\?/);
  assert.equal(await asPortal(other), 200, "globex's links still work");
  assert.equal(await asPortal(await link('acme')), 200, 'a new link works');
  console.log(`screenshot: ${await shot(page, 'customers')}`);
  assert.deepEqual(problems, []);
});

test('console: a wrong token is refused and nothing is stored', async (t) => {
  const origin = await startOrigin();
  const browser = await launch();
  t.after(async () => {
    await browser.close();
    await origin.stop();
  });
  const { page } = await openPage(browser);
  const res = await page.goto(`${origin.url}/`);
  const headers = res.headers();
  assert.match(headers['content-security-policy'], /script-src 'self'/);
  assert.doesNotMatch(headers['content-security-policy'], /unsafe-inline/);
  assert.equal(headers['x-frame-options'], 'DENY');
  await signIn(page, origin, 'not-the-token');
  await page.locator('#signin-error:not([hidden])').waitFor();
  assert.match(await page.locator('#signin-error').textContent(), /refused/);
  assert.equal(await page.evaluate(() => sessionStorage.getItem('fanout.token')), null);
  assert.ok(await page.locator('#subscribers-view').isHidden());
  console.log(`screenshot: ${await shot(page, 'wrong-token')}`);

  // The right token signs in; signing out forgets it.
  await page.fill('#signin-token', origin.token);
  await page.click('#signin-submit');
  await page.locator('#subscribers-view:not([hidden])').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem('fanout.token')), origin.token);
  await page.click('#sign-out');
  await page.locator('#signin-view:not([hidden])').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem('fanout.token')), null);
});

/** A datetime-local input value (local time, seconds) for unix ms. */
function localInput(ms) {
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
