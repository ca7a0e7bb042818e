#!/usr/bin/env node
// Checks the manual's links, which mdBook does not: every relative link and #anchor in
// docs/src (and in the Markdown files at the top of the repository that point into it) must
// name a file that exists and a heading that file has. A chapter that SUMMARY.md does not list
// is an error too (mdBook would not build it). And the manual holds the API: every route of
// origin/src/api/openapi.json but the pages' static files appears in docs/src on a line with its
// method. Exits 1 naming each problem.
//
//   node scripts/check-docs.mjs            # run by scripts/test.sh after `mdbook build docs`
//
// Anchors are made the way mdBook makes them (its `normalize_id`): the heading's text without
// Markdown, lower-cased, whitespace to `-`, anything but letters, digits, `_` and `-` dropped,
// and `-1`, `-2`… appended to repeats within one page.

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The text of a Markdown document with fenced code blocks blanked (line numbers kept). */
export function withoutCode(text) {
  let fence = null;
  return text
    .split('\n')
    .map((line) => {
      const m = line.match(/^\s*(```+|~~~+)/);
      if (m) {
        if (fence === null) fence = m[1];
        else if (m[1].startsWith(fence)) fence = null;
        return '';
      }
      return fence === null ? line : '';
    })
    .join('\n');
}

/** mdBook's id for a heading's text. */
export function slug(heading) {
  const text = heading
    .replace(/`([^`]*)`/g, '$1')
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/<[^>]+>/g, '')
    .replace(/[*_]{1,3}([^*_]+)[*_]{1,3}/g, '$1');
  let out = '';
  for (const ch of text.trim()) {
    if (/[\p{L}\p{N}_-]/u.test(ch)) out += ch.toLowerCase();
    else if (/\s/u.test(ch)) out += '-';
  }
  return out;
}

/** Every anchor a document's headings make. */
export function anchors(text) {
  const seen = new Map();
  const out = new Set();
  for (const line of withoutCode(text).split('\n')) {
    const m = line.match(/^#{1,6}\s+(.*?)\s*#*\s*$/);
    if (!m) continue;
    const base = slug(m[1]);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** The link targets of a document, outside code: `[text](target)` and `[ref]: target`. */
export function links(text) {
  const out = [];
  const lines = withoutCode(text).split('\n');
  lines.forEach((raw, i) => {
    const line = raw.replace(/`[^`]*`/g, (s) => ' '.repeat(s.length));
    for (const m of line.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
      out.push({ target: m[1], line: i + 1 });
    }
    const ref = line.match(/^\s*\[[^\]]+\]:\s*(\S+)/);
    if (ref) out.push({ target: ref[1], line: i + 1 });
  });
  return out;
}

const EXTERNAL = /^[a-z][a-z0-9+.-]*:/i;

/**
 * The broken links of `files` (a Map from a path relative to the repository to its text).
 * `bookRoot` is the book's source folder: a link from inside it must stay inside it, since the
 * built book holds nothing else. Links are read from the files `readFrom` accepts.
 */
export function brokenLinks(files, bookRoot, readFrom = () => true) {
  const problems = [];
  const anchorCache = new Map();
  const anchorsOf = (p) => {
    if (!anchorCache.has(p)) anchorCache.set(p, anchors(files.get(p)));
    return anchorCache.get(p);
  };
  for (const [file, text] of files) {
    if (!file.endsWith('.md') || !readFrom(file)) continue;
    const inBook = file.startsWith(`${bookRoot}/`);
    for (const { target, line } of links(text)) {
      if (EXTERNAL.test(target)) continue;
      const where = `${file}:${line}: ${target}`;
      const hash = target.indexOf('#');
      const rel = decodeURI(hash === -1 ? target : target.slice(0, hash));
      const anchor = hash === -1 ? null : target.slice(hash + 1);
      const dest = rel === '' ? file : path.posix.normalize(path.posix.join(path.posix.dirname(file), rel));
      if (dest.startsWith('..')) {
        problems.push(`${where}: points outside the repository`);
        continue;
      }
      if (inBook && !dest.startsWith(`${bookRoot}/`)) {
        problems.push(`${where}: points outside ${bookRoot}, which the built book does not hold`);
        continue;
      }
      const isDir = [...files.keys()].some((p) => p.startsWith(`${dest.replace(/\/$/, '')}/`));
      if (!files.has(dest) && !isDir) {
        problems.push(`${where}: no such file (${dest})`);
        continue;
      }
      if (anchor !== null && anchor !== '') {
        if (!dest.endsWith('.md')) {
          problems.push(`${where}: an anchor into a file that is not Markdown`);
        } else if (!anchorsOf(dest).has(anchor)) {
          problems.push(`${where}: ${dest} has no heading #${anchor}`);
        }
      }
    }
  }
  return problems;
}

/** The chapters under `bookRoot` that its SUMMARY.md does not link. */
export function unlistedChapters(files, bookRoot) {
  const summary = `${bookRoot}/SUMMARY.md`;
  if (!files.has(summary)) return [`${summary} is missing`];
  const listed = new Set(
    links(files.get(summary)).map(({ target }) => path.posix.join(bookRoot, target.split('#')[0])),
  );
  return [...files.keys()]
    .filter((p) => p.startsWith(`${bookRoot}/`) && p.endsWith('.md') && p !== summary)
    .filter((p) => !listed.has(p))
    .map((p) => `${p}: not listed in ${summary}, so the book leaves it out`);
}

/**
 * The routes of an OpenAPI document (`paths`) that no line of `book` names with its method, as
 * `METHOD /path`; the pages' scripts, style sheets and license files are not the user's API.
 */
export function undocumentedRoutes(openapi, book) {
  const lines = book.split('\n');
  const missing = [];
  for (const [route, ops] of Object.entries(openapi.paths ?? {})) {
    if (/\.(js|css|txt)$/.test(route)) continue;
    const escaped = route.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const named = new RegExp(`(^|[^\\w/{}-])${escaped}($|[^\\w/{}-])`);
    for (const method of Object.keys(ops)) {
      if (method === 'parameters') continue;
      const m = method.toUpperCase();
      if (!lines.some((l) => named.test(l) && l.includes(m))) missing.push(`${m} ${route}`);
    }
  }
  return missing;
}

/** Every file git would see under the repository (no .git, node_modules, target, book output). */
function readTree(root) {
  const skip = new Set(['.git', 'node_modules', 'target', 'build', 'book', '.wrangler', 'tmp']);
  const files = new Map();
  const walk = (dir) => {
    for (const e of fs.readdirSync(path.join(root, dir), { withFileTypes: true })) {
      if (skip.has(e.name)) continue;
      const rel = dir ? `${dir}/${e.name}` : e.name;
      if (e.isDirectory()) walk(rel);
      else files.set(rel, e.name.endsWith('.md') ? fs.readFileSync(path.join(root, rel), 'utf8') : '');
    }
  };
  walk('');
  return files;
}

function main() {
  const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
  const files = readTree(root);
  // The book, and the documents outside it that lead into it.
  const checked = (p) =>
    p.startsWith('docs/src/') ||
    ['README.md', 'ARCHITECTURE.md', 'BENCHMARKS.md', 'origin/README.md'].includes(p);
  const book = [...files]
    .filter(([p]) => p.startsWith('docs/src/') && p.endsWith('.md'))
    .map(([, t]) => t)
    .join('\n');
  const openapi = JSON.parse(fs.readFileSync(path.join(root, 'origin/src/api/openapi.json'), 'utf8'));
  const problems = [
    ...brokenLinks(files, 'docs/src', checked),
    ...unlistedChapters(new Map([...files].filter(([p]) => checked(p))), 'docs/src'),
    ...undocumentedRoutes(openapi, book).map((r) => `docs/src names no ${r} (openapi.json has it)`),
  ];
  if (problems.length) {
    console.error(`check-docs: ${problems.length} problem(s):\n  ${problems.join('\n  ')}`);
    process.exit(1);
  }
  const docs = [...files].filter(([p]) => checked(p));
  const n = docs.reduce((s, [, t]) => s + links(t).length, 0);
  console.log(`check-docs: ${docs.length} documents, ${n} links, all resolve`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
