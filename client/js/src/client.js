// BudgetClient: one per worker process, one TenantBudget per tenant it retries against, and one
// refresher (an async loop on a single unref()'d timer) that leases tokens for all of them with
// one Sync RPC per route. The hot path (tryAcquire / recordSuccess) is local and synchronous;
// when the server is unreachable the client never fails open: it spends its lease to its
// expiry, then falls back to a local bucket sized by the server's last SafeShares (the
// smallest of the last minute; options.fallback), and goes back to leases when the server
// answers again. The protocol itself is SyncEngine's (sync-engine.js).

import * as grpc from '@grpc/grpc-js';
import { SyncEngine } from './sync-engine.js';
import { TenantBudget, checkTenantName } from './tenant-budget.js';
import { channelOptions, validateOptions } from './options.js';
import { budgetServices } from './proto.js';
import { Status } from './codes.js';
import { PrometheusClientMetrics } from './metrics.js';

/** One Sync carries at most 256 entries (budget.proto). */
export const MAX_TENANTS_PER_CLIENT = 256;
// The refresher never sleeps longer than this in one go (seconds).
const MAX_IDLE_SLEEP = 60;

/** A new tenant was asked for after close(). */
export class ClientClosedError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ClientClosedError';
  }
}

function defaultLogger(level, line) {
  if (level === 'error') process.stderr.write(`${line}\n`);
}

export class BudgetClient {
  /** Creating it starts the refresher and does not wait for the server: until a lease
   * arrives, tryAcquire() denies. Throws TypeError / RangeError naming a bad option. */
  constructor(options = {}) {
    const o = validateOptions(options);
    this.options = o;
    const seconds = o.clock;
    this._clock = () => seconds() / 1000;
    this._services = budgetServices(o.protoDir);
    this._credentials = o.channelCredentials ?? grpc.credentials.createInsecure();
    this._stub = new this._services.RetryBudgetService(o.target, this._credentials, channelOptions(o, true));
    // Connect now, not at the first Sync: a tenant handle made later pays one round trip for
    // its first lease, not the connection's set-up too. (An idle connection never keeps the
    // process alive.)
    this._stub.getChannel().getConnectivityState(true);
    this._owners = new Map(); // owner address -> stub (a channel of its own)
    this._metadataBase = new grpc.Metadata();
    if (o.bearerToken !== '') this._metadataBase.set('authorization', `Bearer ${o.bearerToken}`);
    this._byName = new Map();
    this._ordered = [];
    this._registryClosed = false;
    const registry = { snapshot: () => this._ordered };
    this._wake = this._wake.bind(this);
    this.metrics = o.metricsRegistry !== null ? new PrometheusClientMetrics(o.metricsRegistry) : null;
    this._engine = new SyncEngine({
      instanceId: o.instanceId,
      policy: { refreshPeriod: o.refreshPeriodMs / 1000, minSyncInterval: o.minSyncIntervalMs / 1000, leaseBurst: o.leaseBurst },
      syncTimeout: o.syncTimeoutMs / 1000,
      clock: this._clock,
      registry,
      metrics: this.metrics,
      log: o.logger ?? defaultLogger,
    });
    this._neverReached = { capacity: o.fallbackCapacity, refillPerSecond: o.fallbackRefillPerSecond };
    // The loop's sleep / wake.
    this._wakePending = false;
    this._sleepResolve = null;
    this._timer = null;
    this._waitingCall = null; // a waitForReady attempt in progress (a wake cancels it)
    this._waitingWoken = false;
    this._stopping = false;
    this._closePromise = null;
    this._loop = this._run();
  }

  get instanceId() {
    return this.options.instanceId;
  }

  /** The handle for `name` (created on first call; the same object afterwards). Throws
   * TypeError for a malformed name, RangeError past 256 tenants, ClientClosedError after
   * close(). Keep the handle rather than calling this per retry. */
  tenant(name) {
    const existing = this._byName.get(name);
    if (existing !== undefined) return existing;
    checkTenantName(name);
    if (this._registryClosed) throw new ClientClosedError(`tenant ${JSON.stringify(name)} asked for after close()`);
    if (this._ordered.length >= MAX_TENANTS_PER_CLIENT) {
      throw new RangeError(`tenant ${JSON.stringify(name)} would be tenant number ${this._ordered.length + 1}; one client may use at most ${MAX_TENANTS_PER_CLIENT}`);
    }
    const budget = new TenantBudget(name, this._wake, this._clock(), this.options.fallback, this._neverReached);
    this._byName.set(name, budget);
    this._ordered.push(budget);
    this._wake(); // its first lease is asked for at once
    return budget;
  }

  /** null when the last Sync attempt got a response, else "CODE: message". */
  lastSyncStatus() {
    return this._engine.lastStatus;
  }

  /** The client's clock in seconds (the time base of TenantBudget.fallbackAllowance()). */
  now() {
    return this._clock();
  }

  // ---- the refresher ----

  _wake() {
    this._wakePending = true;
    if (this._sleepResolve !== null) {
      clearTimeout(this._timer);
      const resolve = this._sleepResolve;
      this._sleepResolve = null;
      this._timer = null;
      resolve();
    }
    const call = this._waitingCall;
    if (call !== null && !this._waitingWoken) {
      // A Sync waiting for the channel to connect would hold the wake to its deadline.
      this._waitingWoken = true;
      call.cancel();
    }
  }

  _sleep(seconds) {
    return new Promise((resolve) => {
      this._sleepResolve = resolve;
      if (Number.isFinite(seconds)) {
        this._timer = setTimeout(() => {
          this._sleepResolve = null;
          this._timer = null;
          resolve();
        }, Math.max(1, Math.ceil(seconds * 1000)));
        // The refresher alone never keeps the process alive.
        this._timer.unref();
      }
    });
  }

  _stubFor(address) {
    for (const dropped of this._engine.droppedAddresses) {
      const stub = this._owners.get(dropped);
      if (stub !== undefined) {
        stub.close();
        this._owners.delete(dropped);
      }
    }
    this._engine.droppedAddresses.length = 0;
    if (address === null) return this._stub;
    let stub = this._owners.get(address);
    if (stub === undefined) {
      // Same credentials and options as the main target's; pick_first to the one address.
      stub = new this._services.RetryBudgetService(address, this._credentials, channelOptions(this.options, false));
      this._owners.set(address, stub);
    }
    return stub;
  }

  _callSync(stub, request, timeoutSeconds, waitForReady, cancellable) {
    return new Promise((resolve) => {
      const metadata = this._metadataBase.clone();
      if (waitForReady) metadata.setOptions({ waitForReady: true });
      const deadline = new Date(Date.now() + Math.max(0, timeoutSeconds * 1000));
      let call = null;
      try {
        call = stub.Sync(request, metadata, { deadline }, (error, response) => {
        const woken = this._waitingCall === call && this._waitingWoken;
        if (cancellable && this._waitingCall === call) this._waitingCall = null;
          if (error) {
            resolve({ code: typeof error.code === 'number' ? error.code : Status.UNKNOWN, details: error.details ?? error.message, woken });
          } else {
            resolve({ code: null, response });
          }
        });
      } catch (error) {
        // Never expected (the request is built here); a failed attempt, not a crashed refresher.
        resolve({ code: Status.INTERNAL, details: `the Sync could not be sent: ${error?.message ?? error}` });
        return;
      }
      if (cancellable && waitForReady) {
        this._waitingCall = call;
        this._waitingWoken = false;
      }
    });
  }

  async _run() {
    const engine = this._engine;
    while (!this._stopping) {
      this._wakePending = false;
      let plan = engine.beginStep();
      while (plan !== null) {
        const outcome = await this._callSync(this._stubFor(plan.address), plan.request, plan.timeout, plan.waitForReady, true);
        engine.endAttempt(plan, outcome);
        plan = engine.nextPlan();
      }
      const next = engine.endStep();
      if (this._stopping) return;
      // Every turn of this loop yields to the event loop at least once (a step that sent
      // nothing must not spin): a wake goes round after pending I/O and timers, a step due now
      // after the shortest timer.
      if (this._wakePending) {
        await new Promise((resolve) => setImmediate(resolve));
        continue;
      }
      const delay = Math.min(next - this._clock(), MAX_IDLE_SLEEP);
      await this._sleep(next === Infinity ? Infinity : Math.max(0, delay));
    }
  }

  // ---- close ----

  /** Reports everything and returns all unspent tokens now (the final Sync: at most 3
   * attempts, same seq, each bounded by syncTimeoutMs), then stops the refresher and closes
   * the channels; afterwards tryAcquire() denies. Idempotent. Resolves to null when the final
   * Sync got a response (or there was nothing to report), else its error "CODE: message". */
  close() {
    if (this._closePromise === null) this._closePromise = this._close();
    return this._closePromise;
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }

  async _close() {
    this._stopping = true;
    this._wake();
    await this._loop; // the step in flight (its Sync bounded by syncTimeoutMs) finishes first
    this._registryClosed = true;
    const status = await this._finalSync();
    this._stub.close();
    for (const stub of this._owners.values()) stub.close();
    this._owners.clear();
    return status;
  }

  async _finalSync() {
    const engine = this._engine;
    if (!engine.beginFinal()) return engine.lastStatus;
    // Every server that holds tenants of this instance gets its final Sync.
    for (let plan = engine.nextFinal(); plan !== null; plan = engine.nextFinal()) {
      const stub = this._stubFor(plan.address);
      for (;;) {
        const outcome = await this._callSync(stub, plan.request, plan.timeout, plan.waitForReady, false);
        const delay = engine.endFinal(plan, outcome);
        if (delay === null) break;
        await new Promise((resolve) => setTimeout(resolve, delay * 1000));
      }
    }
    engine.finishFinal();
    return engine.lastStatus;
  }
}
