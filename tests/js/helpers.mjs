// Shared by the JS client's tests: the real server on 127.0.0.1:0 in a fresh directory, a
// policy file, and polling for a condition (never a fixed sleep standing in for one).

import assert from 'node:assert/strict';
import { accessSync, constants, mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { ServerProcess, AdminClient } from '../../client/js/src/testing.js';

export const SOURCE_DIR = process.env.RETRY_BUDGET_SOURCE_DIR ?? path.resolve(import.meta.dirname, '..', '..');

export function serverBinary() {
  const binary = process.env.RETRY_BUDGET_SERVER_BIN ?? '';
  try {
    accessSync(binary, constants.X_OK);
  } catch {
    assert.fail(`RETRY_BUDGET_SERVER_BIN=${JSON.stringify(binary)} is not an executable server binary`);
  }
  return binary;
}

export function tempDir(prefix = 'rb-js-') {
  return mkdtempSync(path.join(os.tmpdir(), prefix));
}

/** Starts the real server with `policyText` (a PolicyConfig text proto) and extra flags. */
export async function startServer(t, policyText = '', args = []) {
  const dir = tempDir();
  const flags = [...args];
  if (policyText !== '') {
    writeFileSync(path.join(dir, 'policy.textproto'), policyText);
    flags.push(`--policy=${path.join(dir, 'policy.textproto')}`);
  }
  const server = await new ServerProcess(serverBinary(), dir, flags).start();
  t?.after(async () => {
    await server.kill();
    rmSync(dir, { recursive: true, force: true });
  });
  return server;
}

export function policy(tenant, { capacity = 100, refill = 1, credit = 0.1, initial, ttlMs = 5000 } = {}) {
  const init = initial === undefined ? '' : ` initial_tokens: ${initial}`;
  return `tenants { tenant: "${tenant}" policy { capacity: ${capacity} refill_per_second: ${refill} success_credit: ${credit}${init} lease_ttl_ms: ${ttlMs} } }\n`;
}

export async function waitUntil(predicate, { timeoutMs = 10_000, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) assert.fail(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await delay(5);
  }
}

export async function getBudget(target, tenant) {
  const admin = new AdminClient(target);
  try {
    return await admin.getBudget(tenant);
  } finally {
    admin.close();
  }
}

export { ServerProcess, AdminClient };
