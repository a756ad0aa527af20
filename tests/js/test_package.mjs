// The package as a user gets it: `npm pack` in client/js, the tarball installed with
// `npm install <tarball>` into a new project in a temporary directory outside the repository
// (its dependencies from the registry, through npm's cache), and a small worker there against
// the real server, with no environment variable pointing into the repository.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { startServer, policy, getBudget, tempDir, SOURCE_DIR } from './helpers.mjs';

const run = promisify(execFile);
const NPM = process.env.RETRY_BUDGET_NPM || 'npm';
const PACKAGE_DIR = path.join(SOURCE_DIR, 'client', 'js');

// Only what any shell has: nothing that names the repository.
function userEnv() {
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp' };
  for (const name of ['npm_config_cache', 'NPM_CONFIG_CACHE', 'npm_config_registry', 'NPM_CONFIG_REGISTRY', 'HTTPS_PROXY', 'HTTP_PROXY', 'NO_PROXY']) {
    if (process.env[name] !== undefined) env[name] = process.env[name];
  }
  return env;
}

const WORKER = `
import { BudgetClient, callWithRetry } from '@retry-budget/client';
import { pRetryWithBudget } from '@retry-budget/client/p-retry';
import { budgetRetry } from '@retry-budget/client/cockatiel';

const client = new BudgetClient({ target: process.argv[2] });
const budget = client.tenant('packaged');
let attempts = 0;
const result = await callWithRetry(budget, async () => {
  if (attempts++ === 0) throw Object.assign(new Error('unavailable'), { code: 14, details: 'down' });
  return 'ok';
}, { random: () => 0 });
const stats = budget.stats();
const status = await client.close();
console.log(JSON.stringify({
  result, attempts, status, stats,
  resolved: import.meta.resolve('@retry-budget/client'),
  adapters: [typeof pRetryWithBudget, typeof budgetRetry],
}));
`;

test('npm pack -> npm install <tarball> in a new project outside the repository -> a worker runs against the server', async (t) => {
  const server = await startServer(t, policy('packaged', { capacity: 100, refill: 0, initial: 50, credit: 0 }));
  const dir = tempDir('rb-js-package-');
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  assert.ok(path.relative(SOURCE_DIR, dir).startsWith('..'), `${dir} is not outside ${SOURCE_DIR}`);

  // Pack: the .proto files go in (prepack), and the copy is gone again (postpack).
  const packed = await run(NPM, ['pack', '--json', '--pack-destination', dir], { cwd: PACKAGE_DIR, env: { ...userEnv() }, timeout: 120_000 });
  const [info] = JSON.parse(packed.stdout.slice(packed.stdout.indexOf('[')));
  const files = info.files.map((f) => f.path);
  for (const f of ['proto/retrybudget/v1/budget.proto', 'src/index.js', 'src/index.d.ts', 'src/p-retry.js', 'src/p-retry.d.ts', 'src/cockatiel.js', 'src/cockatiel.d.ts', 'README.md', 'package.json']) {
    assert.ok(files.includes(f), `${f} is not in the tarball: ${files.join(', ')}`);
  }
  assert.ok(files.includes('scripts/proto-copy.mjs'), 'the prepack script travels too (packing an unpacked tarball again)');
  assert.ok(!files.some((f) => f.startsWith('node_modules/') || f.startsWith('bench/')), files.join(', '));
  assert.equal(existsSync(path.join(PACKAGE_DIR, 'proto')), false, 'postpack removed the pack-time copy of proto/');
  const tarball = path.join(dir, info.filename);

  // A new project: its own package.json, the tarball installed with its dependencies.
  const project = path.join(dir, 'project');
  mkdirSync(project);
  writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'user-project', version: '1.0.0', type: 'module', private: true }));
  await run(NPM, ['install', '--no-audit', '--no-fund', '--prefer-offline', tarball], { cwd: project, env: userEnv(), timeout: 240_000 });
  const manifest = JSON.parse((await run(process.execPath, ['-e', "process.stdout.write(require('fs').readFileSync('node_modules/@retry-budget/client/package.json','utf8'))"], { cwd: project })).stdout);
  assert.equal(manifest.private, undefined, 'the package is not private');
  writeFileSync(path.join(project, 'worker.mjs'), WORKER);

  const { stdout } = await run(process.execPath, ['worker.mjs', server.target], { cwd: project, env: userEnv(), timeout: 60_000 });
  const r = JSON.parse(stdout);
  assert.equal(r.result, 'ok');
  assert.equal(r.attempts, 2);
  assert.equal(r.status, null);
  assert.equal(r.stats.retriesAllowed, 1);
  assert.equal(r.stats.successes, 1);
  assert.deepEqual(r.adapters, ['function', 'function']);
  assert.ok(r.resolved.startsWith(`file://${project}/node_modules/@retry-budget/client/`), r.resolved);
  const status = await getBudget(server.target, 'packaged');
  assert.equal(Number(status.retriesTotal), 1);
  assert.equal(Number(status.successesTotal), 1);
});
