// Starts one Worker locally through wrangler's programmatic API (unstable_startWorker) with the
// dev inspector turned OFF, which `wrangler dev` on the command line cannot do. bench/edge.mjs
// uses it for `--runner api` (see BENCHMARKS.md: under `wrangler dev` the inspector proxy turns
// every outbound fetch and every console.log into messages to wrangler's Node process).
//
//   node bench/start-worker.mjs <wrangler.toml> <port> <persist-dir> [VAR=value ...]
// prints `ready <url>` on stdout and runs until its stdin closes (or SIGTERM).
import path from 'node:path';
import { unstable_startWorker } from 'wrangler';

const [config, port, persist, ...varArgs] = process.argv.slice(2);
const vars = Object.fromEntries(
  varArgs.map((a) => {
    const i = a.indexOf('=');
    return [a.slice(0, i), a.slice(i + 1)];
  }),
);
const bindings = Object.fromEntries(Object.entries(vars).map(([k, v]) => [k, { type: 'plain_text', value: v }]));

const worker = await unstable_startWorker({
  config: path.resolve(config),
  bindings,
  dev: {
    inspector: false,
    server: { hostname: '127.0.0.1', port: Number(port) },
    persist,
    watch: false,
    liveReload: false,
    logLevel: 'log',
    remote: false,
    enableContainers: false,
  },
});
await worker.ready;
const url = await worker.url;
process.stdout.write(`ready ${url.origin ?? String(url).replace(/\/$/, '')}\n`);

const stop = async () => {
  try {
    await worker.dispose();
  } finally {
    process.exit(0);
  }
};
process.on('SIGTERM', stop);
process.stdin.on('end', stop);
process.stdin.resume();
