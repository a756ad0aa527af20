// For tests, benches and fleet drivers: the real retry-budget-server as a child process on
// loopback (port 0, the port read from its --port_file, as tests/integration/server_process.cc
// and the Python retrybudget.testing do), killed with SIGKILL and restarted on the same port
// with the same data directory, and a few admin calls. Not for production use.

import { spawn } from 'node:child_process';
import { mkdirSync, openSync, closeSync, readFileSync, rmSync, existsSync } from 'node:fs';
import path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import * as grpc from '@grpc/grpc-js';
import { budgetServices } from './proto.js';

const START_TIMEOUT_MS = 20_000;

export class ServerProcess {
  /** `directory` holds its port file, output log and data directory (a restart keeps the
   * buckets). `args` are extra server flags. */
  constructor(binary, directory, args = []) {
    this.binary = binary;
    this.directory = directory;
    this.args = [...args];
    this.port = 0;
    this.process = null;
    this.exited = null;
    mkdirSync(path.join(directory, 'data'), { recursive: true });
  }

  get target() {
    return `127.0.0.1:${this.port}`;
  }

  async spawnAt(listen) {
    const portFile = path.join(this.directory, 'port');
    rmSync(portFile, { force: true });
    const log = openSync(path.join(this.directory, 'output'), 'a');
    const argv = [`--listen=${listen}`, `--port_file=${portFile}`, '--metrics_listen=', `--data_dir=${path.join(this.directory, 'data')}`, ...this.args];
    const child = spawn(this.binary, argv, { stdio: ['ignore', log, log] });
    closeSync(log);
    let exitCode = null;
    const exited = new Promise((resolve) => child.once('exit', (code, signal) => {
      exitCode = code ?? signal;
      resolve(exitCode);
    }));
    const deadline = Date.now() + START_TIMEOUT_MS;
    while (Date.now() < deadline) {
      if (exitCode !== null) throw new Error(`the server exited with ${exitCode}; output:\n${this.output()}`);
      if (existsSync(portFile)) {
        const text = readFileSync(portFile, 'utf8').trim();
        if (text !== '') {
          this.port = Number(text);
          this.process = child;
          this.exited = exited;
          return;
        }
      }
      await delay(10);
    }
    child.kill('SIGKILL');
    throw new Error(`the server did not write its port file; output:\n${this.output()}`);
  }

  async start() {
    await this.spawnAt('127.0.0.1:0');
    return this;
  }

  /** SIGKILL, and reap it. */
  async kill() {
    if (this.process !== null && this.process.exitCode === null && this.process.signalCode === null) {
      this.process.kill('SIGKILL');
      await this.exited;
    }
  }

  /** Starts it again on the same port (retried while the old socket is still held). */
  async restart() {
    const deadline = Date.now() + START_TIMEOUT_MS;
    for (;;) {
      try {
        await this.spawnAt(`127.0.0.1:${this.port}`);
        return;
      } catch (error) {
        if (Date.now() > deadline) throw error;
        await delay(50);
      }
    }
  }

  output() {
    try {
      return readFileSync(path.join(this.directory, 'output'), 'utf8');
    } catch {
      return '';
    }
  }
}

function unary(stub, method, request) {
  return new Promise((resolve, reject) => {
    stub[method](request, { deadline: new Date(Date.now() + 10_000) }, (error, response) => (error ? reject(error) : resolve(response)));
  });
}

/** BudgetAdminService calls on `target` (insecure unless `credentials`). */
export class AdminClient {
  constructor(target, credentials = grpc.credentials.createInsecure(), channelOptions = {}) {
    const { BudgetAdminService } = budgetServices();
    this.stub = new BudgetAdminService(target, credentials, channelOptions);
  }

  async getBudget(tenant) {
    return (await unary(this.stub, 'GetBudget', { tenant })).budget;
  }

  async putPolicy(tenant, policy) {
    return (await unary(this.stub, 'PutPolicy', { tenant, policy })).budget;
  }

  close() {
    this.stub.close();
  }
}

/** A TenantBudget with no server behind it whose lease holds `tokens` (never refilled, never
 * expiring; isReady): for unit tests of code that takes a budget (callWithRetry, the
 * interceptor). */
export async function localBudget(tokens, name = 'local') {
  const { TenantBudget } = await import('./tenant-budget.js');
  const budget = new TenantBudget(name, () => {}, 0, 'deny', { capacity: 0, refillPerSecond: 0 });
  budget.applyGrant({ granted: tokens, leaseTtlMs: Number.MAX_SAFE_INTEGER, nextSyncMs: 0, safeShare: null }, { want: 0 }, 0, 0, { refreshPeriod: 1, minSyncInterval: 0 });
  budget._mark = 0; // never asks for more
  return budget;
}
