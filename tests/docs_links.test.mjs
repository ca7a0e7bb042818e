// The manual's link checker (scripts/check-docs.mjs): the book as it is has no broken link, and
// each kind of breakage is caught on a synthetic book. `scripts/test.sh` also runs the checker
// itself after `mdbook build docs`.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { anchors, brokenLinks, slug, undocumentedRoutes, unlistedChapters } from '../scripts/check-docs.mjs';

test('the manual as it is: every link and anchor resolves', () => {
  const checker = fileURLToPath(new URL('../scripts/check-docs.mjs', import.meta.url));
  const out = execFileSync(process.execPath, [checker], { encoding: 'utf8' });
  assert.match(out, /all resolve/);
});

test("anchors are mdBook's ids", () => {
  assert.equal(slug('`fanout listen` in detail'), 'fanout-listen-in-detail');
  assert.equal(slug("The edge's platform limits"), 'the-edges-platform-limits');
  assert.equal(slug('Ed25519 signatures (`v1a`)'), 'ed25519-signatures-v1a');
  assert.equal(slug('Connections, `LISTEN` and poolers'), 'connections-listen-and-poolers');
  // Repeats get -1, -2; headings inside code are not headings.
  assert.deepEqual([...anchors('# A\n## A\n```sh\n# not a heading\n```\n## A\n')], ['a', 'a-1', 'a-2']);
});

test('each kind of broken link is caught', () => {
  const files = new Map([
    ['docs/src/SUMMARY.md', '- [One](one.md)\n- [Two](two.md)\n'],
    ['docs/src/one.md', '# One\n## Part\n'],
    [
      'docs/src/two.md',
      [
        '# Two',
        '[fine](one.md#part) [fine too](#two) [web](https://example.com/x#y)',
        '[gone](three.md) [wrong anchor](one.md#nope) [outside](../../README.md)',
        '`[in code](nowhere.md)`',
        '```md',
        '[in a block](nowhere.md)',
        '```',
      ].join('\n'),
    ],
    ['docs/src/stray.md', '# Stray\n'],
    ['README.md', '[in](docs/src/one.md#part) [bad](docs/src/one.md#missing)\n'],
  ]);
  const problems = brokenLinks(files, 'docs/src');
  assert.deepEqual(
    problems.map((p) => p.split(': ').slice(0, 2).join(': ')),
    [
      'docs/src/two.md:3: three.md',
      'docs/src/two.md:3: one.md#nope',
      'docs/src/two.md:3: ../../README.md',
      'README.md:1: docs/src/one.md#missing',
    ],
  );
  assert.deepEqual(unlistedChapters(files, 'docs/src'), [
    'docs/src/stray.md: not listed in docs/src/SUMMARY.md, so the book leaves it out',
  ]);
});

test('a route openapi.json has and the manual does not name is caught', () => {
  const openapi = {
    paths: {
      '/v1/things': { get: {}, post: {} },
      '/v1/things/{id}': { parameters: [], delete: {} },
      '/v1/thingsx': { get: {} },
      '/app.js': { get: {} },
    },
  };
  const book = ['`GET /v1/things` lists them.', '`DELETE /v1/things/{id}` removes one.', 'POST elsewhere'].join('\n');
  assert.deepEqual(undocumentedRoutes(openapi, book), ['POST /v1/things', 'GET /v1/thingsx']);
});
