// The Debian package as an operator meets it (issue 39, item 1): scripts/package.sh builds it
// from the release binary; `dpkg -i` installs it on this machine (root); the installed unit
// passes `systemd-analyze verify` and rates at most 2.0 by `systemd-analyze security`; the
// unit's own ExecStart runs as the fanout user with the secrets file's variables and delivers
// a webhook the standardwebhooks verifier accepts; an upgrade to a rebuilt package keeps the
// ledger (the first event's delivery is still there), the settings and the secrets; removing
// keeps the ledger; purging removes settings and secrets and still keeps the ledger. The test
// purges the package and deletes what it made, so it can run again.
//
//   bash scripts/package.sh --deb && node --test tests/packaging/deb.mjs   (as root)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import {
  ROOT,
  deliveryStatuses,
  freePort,
  run,
  signedRoundTrip,
  startDaemon,
  tryRun,
  verifyingReceiver,
  waitFor,
} from './lib.mjs';

const UNIT = '/lib/systemd/system/fanout.service';
const ENV_FILE = '/etc/fanout/fanout.env';
const TOML = '/etc/fanout/fanout.toml';
const STATE = '/var/lib/fanout';
// Made by this test inside the state directory: tells its own leftovers from a real ledger.
const MARKER = path.join(STATE, '.package-test');

const cargoVersion = fs.readFileSync(path.join(ROOT, 'origin/Cargo.toml'), 'utf8').match(/^version = "([^"]+)"/m)[1];
const versions = [`${cargoVersion}+pkgtest1`, `${cargoVersion}+pkgtest2`];

/** Builds the .deb at `version` from the binary scripts/package.sh built; returns its path. */
function buildDeb(version) {
  run(['bash', 'scripts/package.sh', '--deb', '--no-build', '--deb-compression', 'gzip', '--version', version]);
  const deb = path.join(ROOT, 'target/package', `fanout_${version}_amd64.deb`);
  assert.ok(fs.existsSync(deb), deb);
  return deb;
}

function installedVersion() {
  const r = tryRun(['dpkg-query', '-W', '-f', '${Status} ${Version}', 'fanout']);
  const m = r.status === 0 && r.out.match(/^install ok installed (\S+)$/);
  return m ? m[1] : null;
}

/** The settings of a unit file's [Service] section: name → list of values, in order. */
function unitSettings(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const m = line.match(/^([A-Za-z]+)=(.*)$/);
    if (m) (out[m[1]] ??= []).push(m[2]);
  }
  return out;
}

/** KEY=VALUE lines of an EnvironmentFile (comments and blank lines skipped). */
function envFile(text) {
  const env = {};
  for (const line of text.split('\n')) {
    const m = line.match(/^([A-Z_][A-Z0-9_]*)=(.*)$/);
    if (m) env[m[1]] = m[2];
  }
  return env;
}

/** Removes everything a previous run of this test left, refusing to touch a real install. */
function cleanSlate() {
  const v = installedVersion();
  if (v && !v.includes('+pkgtest')) throw new Error(`fanout ${v} is installed here: not a test package, refusing`);
  if (fs.existsSync(STATE) && !fs.existsSync(MARKER)) {
    throw new Error(`${STATE} exists and is not this test's: a real ledger? refusing`);
  }
  tryRun(['dpkg', '--purge', 'fanout']);
  fs.rmSync(STATE, { recursive: true, force: true });
  if (tryRun(['getent', 'passwd', 'fanout']).status === 0) run(['userdel', 'fanout']);
  if (tryRun(['getent', 'group', 'fanout']).status === 0) run(['groupdel', 'fanout']);
}

/**
 * Starts the installed unit's ExecStart as its User/Group in its WorkingDirectory, with only
 * its EnvironmentFile's variables, plus a free port and loopback subscribers allowed (the
 * receiver is on 127.0.0.1; the test does not take port 8080 from whatever else runs here).
 */
async function startUnit() {
  const unit = unitSettings(fs.readFileSync(UNIT, 'utf8'));
  const [execStart] = unit.ExecStart;
  const [envPath] = unit.EnvironmentFile;
  const uid = run(['id', '-u', unit.User[0]]).trim();
  const gid = run(['getent', 'group', unit.Group[0]]).split(':')[2];
  const port = await freePort();
  const secrets = envFile(fs.readFileSync(envPath, 'utf8'));
  const env = {
    PATH: '/usr/local/bin:/usr/bin:/bin',
    ...secrets,
    FANOUT_LISTEN: `127.0.0.1:${port}`,
    FANOUT_ALLOW_LOOPBACK: 'true',
  };
  const argv = ['setpriv', `--reuid=${uid}`, `--regid=${gid}`, '--init-groups', '--no-new-privs', '--', ...execStart.split(/\s+/)];
  const url = `http://127.0.0.1:${port}`;
  const daemon = await startDaemon(argv, { env, cwd: unit.WorkingDirectory[0], url });
  return { ...daemon, url, token: secrets.FANOUT_API_TOKEN };
}

function mode(p) {
  const st = fs.statSync(p);
  return { mode: (st.mode & 0o7777).toString(8), uid: st.uid, gid: st.gid };
}

test('the .deb installs a hardened service that delivers signed webhooks; upgrade and remove keep the ledger', async (t) => {
  assert.equal(process.getuid(), 0, 'dpkg -i needs root');
  cleanSlate();
  const receiver = await verifyingReceiver();
  let daemon = null;
  t.after(async () => {
    await daemon?.stop();
    await receiver.close();
    cleanSlate();
  });

  // Install.
  run(['dpkg', '-i', buildDeb(versions[0])]);
  fs.writeFileSync(MARKER, 'made by tests/packaging/deb.mjs\n');
  assert.equal(installedVersion(), versions[0]);
  const fanoutUid = Number(run(['id', '-u', 'fanout']).trim());
  assert.ok(fanoutUid > 0 && fanoutUid < 1000, `fanout is a system user (uid ${fanoutUid})`);
  assert.equal(run(['getent', 'passwd', 'fanout']).trim().split(':')[6], '/usr/sbin/nologin');
  assert.equal(mode(STATE).mode, '700');
  assert.equal(mode(STATE).uid, fanoutUid);
  assert.deepEqual(mode(ENV_FILE), { mode: '600', uid: 0, gid: 0 });
  const secrets = fs.readFileSync(ENV_FILE, 'utf8');
  assert.match(secrets, /^FANOUT_API_TOKEN=fnt_[0-9a-f]{64}$/m);
  assert.match(fs.readFileSync('/var/lib/dpkg/info/fanout.conffiles', 'utf8'), /^\/etc\/fanout\/fanout\.toml$/m);
  assert.ok(!run(['dpkg', '-L', 'fanout']).includes(ENV_FILE), 'the secrets file is not the package\'s');
  // Every setting the example config documents is in the installed one (commented or set).
  const keys = (text) => new Set([...text.matchAll(/^(?:# )?([a-z_]+) = /gm)].map((m) => m[1]));
  const installed = keys(fs.readFileSync(TOML, 'utf8'));
  const missing = [...keys(fs.readFileSync(path.join(ROOT, 'origin/fanout.example.toml'), 'utf8'))].filter((k) => !installed.has(k));
  assert.deepEqual(missing, [], `settings of origin/fanout.example.toml missing from packaging/fanout.toml`);

  // The unit: valid, and hardened to at most 2.0.
  const verify = tryRun(['systemd-analyze', 'verify', UNIT]);
  assert.equal(verify.status, 0, `systemd-analyze verify: ${verify.out}`);
  const security = tryRun(['systemd-analyze', 'security', '--offline=true', UNIT]);
  const level = security.out.match(/Overall exposure level for fanout\.service: ([\d.]+)/);
  assert.ok(level, `systemd-analyze security:\n${security.out}`);
  assert.ok(Number(level[1]) <= 2.0, `exposure ${level[1]} > 2.0:\n${security.out}`);

  // The unit's own command, as the fanout user: one event, delivered signed.
  daemon = await startUnit();
  const secret = await signedRoundTrip({ ...daemon, receiver, subId: 'pkg_receiver', eventId: 'evt_pkg_1' });
  // The ledger records the answer just after the receiver has sent it.
  await waitFor(async () => (await deliveryStatuses(daemon.url, daemon.token, 'evt_pkg_1')).join() === 'sent', 10_000, {
    message: 'evt_pkg_1 is sent in the ledger',
  });
  await daemon.stop();
  daemon = null;
  const ledger = fs.readdirSync(STATE);
  assert.ok(ledger.includes('fanout.db'), `ledger in ${STATE}: ${ledger}`);
  assert.equal(fs.statSync(path.join(STATE, 'fanout.db')).uid, fanoutUid);

  // The operator edits the settings; the upgrade keeps the edit, the secrets and the ledger.
  const edited = `${fs.readFileSync(TOML, 'utf8')}\n# edited by tests/packaging/deb.mjs\nmax_attempts = 7\n`;
  fs.writeFileSync(TOML, edited);
  // No --force-conf*: dpkg must keep the edit without asking (stdin is not a terminal here).
  run(['dpkg', '-i', buildDeb(versions[1])], { input: '' });
  assert.equal(installedVersion(), versions[1]);
  assert.equal(fs.readFileSync(TOML, 'utf8'), edited, 'the upgrade kept the edited settings');
  assert.equal(fs.readFileSync(ENV_FILE, 'utf8'), secrets, 'the upgrade kept the secrets');
  assert.deepEqual(mode(STATE).mode, '700');
  daemon = await startUnit();
  assert.deepEqual(await deliveryStatuses(daemon.url, daemon.token, 'evt_pkg_1'), ['sent'], 'the ledger survived');
  // The same subscriber and secret go on working.
  await signedRoundTrip({ ...daemon, receiver, subId: 'pkg_receiver', eventId: 'evt_pkg_2', secret });
  await daemon.stop();
  daemon = null;

  // Remove: the program goes; ledger, settings and secrets stay.
  run(['dpkg', '-r', 'fanout']);
  assert.equal(installedVersion(), null);
  assert.ok(!fs.existsSync('/usr/bin/fanout'));
  assert.ok(!fs.existsSync(UNIT));
  assert.ok(fs.existsSync(path.join(STATE, 'fanout.db')), 'remove kept the ledger');
  assert.equal(fs.readFileSync(ENV_FILE, 'utf8'), secrets);
  assert.ok(fs.existsSync(TOML));

  // Purge: settings and secrets go, and the ledger still stays.
  const purge = run(['dpkg', '--purge', 'fanout']);
  assert.ok(!fs.existsSync(ENV_FILE) && !fs.existsSync(TOML), 'purge removed the settings and secrets');
  assert.ok(fs.existsSync(path.join(STATE, 'fanout.db')), 'purge kept the ledger');
  assert.match(purge, /kept the ledger in \/var\/lib\/fanout/);
});
