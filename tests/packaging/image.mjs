// The container image (issue 39, item 2), built from ./Containerfile by scripts/package.sh with
// buildah. Containers cannot start on these machines, so the test mounts the image's own
// filesystem (`buildah from` + `buildah mount`) and runs the image's ENTRYPOINT and CMD from it
// under `chroot --userspec` as the image's USER, with the image's ENV: the daemon serves an
// event end to end (verified by the standardwebhooks package), its ledger lands in the
// volume's directory owned by that user, and the HEALTHCHECK command answers 0 while it runs
// and non-zero once it is gone. The image holds the binary and the volume's directory only.
// Without buildah the test is skipped, loudly.
//
//   node --test tests/packaging/image.mjs   (as root; scripts/package-test.sh runs it)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

import { ROOT, freePort, run, signedRoundTrip, startDaemon, tryRun, verifyingReceiver } from './lib.mjs';

const buildah = (...args) => run(['buildah', '--storage-driver', 'vfs', ...args]).trim();
const haveBuildah = tryRun(['buildah', '--version']).status === 0;
const version = `${fs.readFileSync(path.join(ROOT, 'origin/Cargo.toml'), 'utf8').match(/^version = "([^"]+)"/m)[1]}-imagetest`;
const TAG = `localhost/fanout:${version}`;

/** Every path under `dir`, relative, directories with a trailing slash. */
function tree(dir, prefix = '') {
  const out = [];
  for (const e of fs.readdirSync(path.join(dir, prefix), { withFileTypes: true })) {
    const rel = path.join(prefix, e.name);
    if (e.isDirectory()) out.push(`${rel}/`, ...tree(dir, rel));
    else out.push(rel);
  }
  return out.sort();
}

test('the image runs its own binary, as a non-root user, and serves a signed event', { skip: !haveBuildah && 'buildah is missing' }, async (t) => {
  assert.equal(process.getuid(), 0, 'buildah mount and chroot need root');
  run(['bash', 'scripts/package.sh', '--image', '--no-build', '--version', version]);
  const receiver = await verifyingReceiver();
  const container = buildah('from', '--pull-never', '--quiet', TAG);
  let daemon = null;
  t.after(async () => {
    await daemon?.stop();
    await receiver.close();
    tryRun(['buildah', '--storage-driver', 'vfs', 'umount', container]);
    tryRun(['buildah', '--storage-driver', 'vfs', 'rm', container]);
    tryRun(['buildah', '--storage-driver', 'vfs', 'rmi', TAG]);
  });

  const image = JSON.parse(buildah('inspect', '--type', 'image', TAG));
  const config = image.Docker.config;
  assert.equal(config.User, '65532:65532');
  assert.deepEqual(Object.keys(config.Volumes ?? {}), ['/var/lib/fanout']);
  assert.deepEqual(config.Healthcheck?.Test, ['CMD', '/usr/bin/fanout', 'healthcheck']);
  const env = Object.fromEntries(config.Env.map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));

  // The image's filesystem: the binary and the volume's directory, nothing else (no shell).
  const root = buildah('mount', container);
  assert.deepEqual(tree(root), ['usr/', 'usr/bin/', 'usr/bin/fanout', 'var/', 'var/lib/', 'var/lib/fanout/', 'var/lib/fanout/README']);
  const state = fs.statSync(path.join(root, 'var/lib/fanout'));
  assert.equal(state.uid, 65532);
  assert.equal(state.mode & 0o022, 0, 'the volume directory is writable by its owner only');

  // ENTRYPOINT + CMD, from the image's root, as its USER, with its ENV (and a port and the
  // loopback receiver allowed).
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const token = `tok_${crypto.randomBytes(16).toString('hex')}`;
  const runEnv = { ...env, FANOUT_API_TOKEN: token, FANOUT_LISTEN: `127.0.0.1:${port}`, FANOUT_ALLOW_LOOPBACK: 'true' };
  const inImage = (argv) => ['chroot', `--userspec=${config.User}`, root, ...argv];
  daemon = await startDaemon(inImage([...config.Entrypoint, ...config.Cmd]), { env: runEnv, url });
  await signedRoundTrip({ url, token, receiver, subId: 'img_receiver', eventId: 'evt_img_1' });
  const db = fs.statSync(path.join(root, env.FANOUT_DB.slice(1)));
  assert.equal(db.uid, 65532, 'the ledger belongs to the image user');

  // The HEALTHCHECK's command, run the same way: 0 while the daemon serves, non-zero after.
  const healthcheck = inImage(config.Healthcheck.Test.slice(1));
  assert.equal(tryRun(healthcheck, { env: runEnv }).status, 0);
  await daemon.stop();
  daemon = null;
  const down = tryRun(healthcheck, { env: runEnv });
  assert.notEqual(down.status, 0, 'the healthcheck fails once the daemon is gone');
  assert.match(down.out, /cannot reach the daemon/);
});

test('buildah is here, or the image test says loudly it did not run', () => {
  if (!haveBuildah) {
    const bar = '!'.repeat(78);
    console.error(`${bar}\n!!! SKIPPED: the container image test (tests/packaging/image.mjs): buildah is missing.\n!!! Install it (scripts/setup.sh does, with apt) to test the Containerfile.\n${bar}`);
  }
});
