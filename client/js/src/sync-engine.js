// The leasing protocol of one client, without its transport (a port of the C++ Refresher's
// RunOnce / SyncLocked / ApplyResponseLocked / FinalSyncLocked, as the Python client's
// _sync_engine.py). BudgetClient's refresher loop drives it and only does the I/O:
//
//     let plan = engine.beginStep();     // steps the tenants; a Sync attempt to send, or null
//     while (plan) {                     // one per route (main target, owners) that is due
//       engine.endAttempt(plan, await send(plan));
//       plan = engine.nextPlan();
//     }
//     const next = engine.endStep();     // steps the tenants again with the outcomes
//
// The protocol rules kept here (with tenant-budget.js) are the client rulebook's,
// client/conformance/RULES.md, by id; tests/js/test_conformance.mjs runs the conformance corpus
// that pins them through this engine:
//  * Requests and seq: one-request-per-route, seq-new-request, resend-unchanged (retryBackoff),
//    abandon-after-refresh-period, server-state-from-outcome (the state each tenant's step()
//    sees: ANSWERING, UNREACHABLE, REFUSING, or DOWN once unreachable for a refresh period),
//    stale-dropped, grants-match-request, lease-ends-at-first-send, min-sync-interval,
//    first-sync-at-once (BudgetClient.tenant() wakes the loop), next-sync-from-grant,
//    low-water-wakes and want-from-demand (the last two in TenantBudget).
//  * Deadlines and connections: sync-deadline (MIN_FALLBACK_STEP_WINDOW),
//    cut-short-is-interrupted (also an attempt a wake cancelled: outcome.woken),
//    fail-fast-then-wait-for-ready (plan.waitForReady).
//  * Refusals: request-refused-split, tenant-refused.
//  * Routing (a cluster): every rule above holds per route, the main target (address null) or
//    one owner (plan.address), each with its own pending request, backoff, failures and server
//    state: redirect-followed, redirect-hop-limit (MAX_REDIRECT_HOPS), owner-route-limit
//    (MAX_OWNER_ROUTES), unavailable-parks, owner-unreachable-parks. Nothing of it runs until a
//    redirect is seen.
//  * final-sync: beginFinal / nextFinal / endFinal / finishFinal, driven by BudgetClient.close().
// Why some of them are as they are: client/cpp/sync_engine.h and client/cpp/refresher.h.

import {
  FINAL_SYNC_ATTEMPTS, INFINITE_FUTURE, INFINITE_PAST, MIN_FALLBACK_STEP_WINDOW, MAX_LEASE_TOKENS,
  retryBackoff,
} from './bucket-math.js';
import { ANSWERING, DOWN, REFUSING, UNREACHABLE } from './tenant-budget.js';
import { codeName, Status } from './codes.js';

export const MAX_REDIRECT_HOPS = 4;
export const MAX_OWNER_ROUTES = 64;
const DEADLINE_SLACK = 0.001;
const REFUSAL_LOG_INTERVAL = 60; // seconds
// An owner address: HOST:PORT of printable ASCII, no spaces, at most 255 characters.
const OWNER_RE = /^[\x21-\x7e]{1,255}:[0-9]{1,5}$/;

function isRequestRefusal(code) {
  return code === Status.INVALID_ARGUMENT || code === Status.RESOURCE_EXHAUSTED
    || code === Status.FAILED_PRECONDITION || code === Status.OUT_OF_RANGE;
}

/** The tenant limit a refusal names ("... at most N are allowed in one request"), or 0. */
export function tenantLimitIn(message) {
  const at = message.indexOf('at most ');
  if (at < 0 || message.indexOf('request', at) < 0) return 0;
  let limit = 0;
  for (let i = at + 8; i < message.length && message[i] >= '0' && message[i] <= '9'; i++) {
    limit = Math.min(limit * 10 + (message.charCodeAt(i) - 48), 1 << 20);
  }
  return limit;
}

class Route {
  constructor(address) {
    this.address = address; // null: the main target
    this.pending = null; // {request, tenants, firstSent}
    this.lastSend = INFINITE_PAST;
    this.retryAt = INFINITE_PAST;
    this.failures = 0;
    this.failingSince = INFINITE_FUTURE; // start of the first of those failed attempts
    this.serverState = ANSWERING;
    this.maxTenantsPerSync = Infinity; // the server's limit once it named one
    this.chunk = Infinity; // this step's limit (a split lowers it)
  }
}

class TenantRoute {
  constructor() {
    this.owner = null;
    this.hops = 0; // redirects since the last grant
    this.unavailable = false; // no owner could grant: unreachable until a grant
    // Since when: down once a refresh period old (a shard without an owner for a moment, while
    // servers join, is a blip).
    this.unavailableSince = INFINITE_FUTURE;
  }
}

function newStep(tenants = [], now = 0, cut = INFINITE_FUTURE) {
  // rest: address -> the tenants of a route still to send in this step (after a request of
  // part of them: a split, or the route's tenant limit).
  // sending: {rest, resend} of the attempt in flight (rest: the route's tenants still to send
  // in this step, this request's first).
  return { tenants, now, cut, round: 0, visited: new Set(), rest: new Map(), sending: null };
}

export class SyncEngine {
  /**
   * @param {object} o instanceId, policy {refreshPeriod, minSyncInterval, leaseBurst},
   *   syncTimeout (seconds), clock (() => seconds), registry ({snapshot()}), metrics (or null),
   *   log ((level, line) => void).
   */
  constructor(o) {
    this.instanceId = o.instanceId;
    this.policy = o.policy;
    this.syncTimeout = o.syncTimeout;
    this.clock = o.clock;
    this.registry = o.registry;
    this.metrics = o.metrics ?? null;
    this.log = o.log ?? (() => {});
    this.seq = 0; // per instance, across every route
    this.main = new Route(null);
    this.owners = new Map(); // address -> Route
    this.routed = new Map(); // TenantBudget -> TenantRoute; empty until a redirect is seen
    this.redirected = false;
    this.droppedAddresses = []; // owner routes dropped; the driver closes their channels
    this.redirects = 0;
    this.lastStatus = null; // null: OK; else "CODE: details"
    this.shutDown = false;
    this.step = newStep();
    this.finalTenants = [];
    this.finalRoutes = []; // {route, entries, done, n, chunk, status, stopped}, in order
    this.finalAt = 0;
    this.finalError = null;
    this.lastRefusalLog = INFINITE_PAST;
    this.refusalsNotLogged = 0;
  }

  /** Refusals are logged at most once a minute; the lines left out are counted in the next. */
  logRefusal(now, line) {
    if (now - this.lastRefusalLog < REFUSAL_LOG_INTERVAL) {
      this.refusalsNotLogged++;
      return;
    }
    this.log('error', `retrybudget: ${line} (${this.refusalsNotLogged} more refusals since the last such line)`);
    this.lastRefusalLog = now;
    this.refusalsNotLogged = 0;
  }

  get failures() {
    return this.main.failures;
  }

  get serverState() {
    return this.main.serverState;
  }

  stateOf(route, now) {
    if (route.serverState === UNREACHABLE && now >= this.downAt(route.failingSince)) return DOWN;
    return route.serverState;
  }

  /** When a route unreachable since `since` (its first failed attempt), or a tenant parked
   * since then, turns down: a refresh period later. The checks and nextDown use this one sum,
   * so the step scheduled for that moment sees the server down (with float milliseconds,
   * `now - since >= refreshPeriod` can be false at `now = since + refreshPeriod`). */
  downAt(since) {
    return since + this.policy.refreshPeriod;
  }

  /** The earliest time after `now` at which a route (unreachable since its failingSince) or a
   * parked tenant (since its unavailableSince) turns down, a refresh period later; Infinity
   * when none will. A step is due then, and a Sync attempt is cut short for it. */
  nextDown(now) {
    let next = INFINITE_FUTURE;
    const consider = (since) => {
      if (since === INFINITE_FUTURE) return;
      const down = this.downAt(since);
      if (down > now) next = Math.min(next, down);
    };
    if (this.main.serverState === UNREACHABLE) consider(this.main.failingSince);
    for (const route of this.owners.values()) if (route.serverState === UNREACHABLE) consider(route.failingSince);
    for (const r of this.routed.values()) if (r.unavailable) consider(r.unavailableSince);
    return next;
  }

  /** The ServerState a tenant's step sees at `now` (clock time; default the clock's now). */
  stateFor(tenant, now = this.clock()) {
    if (this.routed.size === 0) return this.stateOf(this.main, now);
    const r = this.routed.get(tenant);
    if (r === undefined) return this.stateOf(this.main, now);
    // A live server said the shard has no owner: a failover once it lasts a refresh period.
    if (r.unavailable) {
      return now >= this.downAt(r.unavailableSince) ? DOWN : UNREACHABLE;
    }
    const route = r.owner !== null ? this.owners.get(r.owner) : undefined;
    return this.stateOf(route ?? this.main, now);
  }

  /** [[route, its tenants]], the main route first. */
  groups(tenants) {
    if (this.routed.size === 0) return [[this.main, tenants]];
    const groups = new Map([[null, [this.main, []]]]);
    for (const t of tenants) {
      const r = this.routed.get(t);
      const route = r !== undefined && r.owner !== null ? this.owners.get(r.owner) : undefined;
      if (route === undefined) {
        groups.get(null)[1].push(t);
      } else {
        if (!groups.has(route.address)) groups.set(route.address, [route, []]);
        groups.get(route.address)[1].push(t);
      }
    }
    return [...groups.values()];
  }

  prune() {
    const used = new Set();
    for (const r of this.routed.values()) if (r.owner !== null) used.add(r.owner);
    for (const [address, route] of [...this.owners]) {
      if (!used.has(address) && route.pending === null) {
        this.owners.delete(address);
        this.droppedAddresses.push(address);
      }
    }
    for (const [t, r] of [...this.routed]) {
      if (r.owner === null && r.hops === 0 && !r.unavailable) this.routed.delete(t);
    }
  }

  syncDue(route, tenants) {
    if (route.pending !== null) return route.retryAt;
    if (tenants.length === 0) return INFINITE_FUTURE;
    let due = INFINITE_FUTURE;
    let first = false;
    for (const t of tenants) {
      due = Math.min(due, t.syncDueAt());
      if (!t.everRequested) first = true;
    }
    if (due === INFINITE_FUTURE) return due;
    // A tenant never asked for yet goes out at once (its workers are denied until its first
    // answer); at most once per tenant, so the Sync rate stays bounded.
    return first ? due : Math.max(due, route.lastSend + this.policy.minSyncInterval);
  }

  /** Steps every tenant; the first attempt to send, or null. */
  beginStep() {
    if (this.shutDown) {
      this.step = newStep();
      return null;
    }
    const tenants = this.registry.snapshot();
    const now = this.clock();
    let nextStep = INFINITE_FUTURE;
    let leaseEnds = INFINITE_FUTURE;
    for (const t of tenants) {
      nextStep = Math.min(nextStep, t.step(now, this.stateFor(t, now)));
      leaseEnds = Math.min(leaseEnds, t.leaseEndsAt());
    }
    // The Sync ends (or is cut short) in time for the next duty: a lease ends exactly at its
    // expiry, a fallback step runs at most MIN_FALLBACK_STEP_WINDOW late, and a server
    // unreachable since an earlier attempt turns "down" on time (a spent lease then falls back
    // at once, not when an attempt waiting for the channel gives up a syncTimeout later).
    nextStep = Math.min(nextStep, this.nextDown(now));
    const cut = Math.min(leaseEnds, Math.max(nextStep, now + MIN_FALLBACK_STEP_WINDOW));
    this.step = newStep(tenants, now, cut);
    if (this.routed.size > 0 || this.owners.size > 0) this.prune();
    this.main.chunk = this.main.maxTenantsPerSync;
    for (const route of this.owners.values()) route.chunk = route.maxTenantsPerSync;
    this.redirected = false;
    return this.nextPlan();
  }

  /** The next route's attempt in this step, or null when every due route was tried (a
   * redirected tenant gets one more round, at most MAX_REDIRECT_HOPS + 1 rounds). */
  nextPlan() {
    const step = this.step;
    if (step.tenants.length === 0) return null;
    for (;;) {
      const now = this.clock();
      if (now >= step.cut && step.visited.size > 0) return null;
      for (const [route, group] of this.groups(step.tenants)) {
        let tenants = group;
        if (step.rest.has(route.address)) {
          // The rest of a route whose request carried part of its tenants: at once.
          tenants = step.rest.get(route.address);
          step.rest.delete(route.address);
        } else if (step.visited.has(route.address) || this.syncDue(route, group) > now) {
          continue;
        }
        step.visited.add(route.address);
        const plan = this.plan(route, tenants, now, step.cut);
        if (plan !== null) return plan;
      }
      if (!this.redirected || step.round >= MAX_REDIRECT_HOPS) return null;
      step.round++;
      step.visited = new Set();
      this.redirected = false;
    }
  }

  plan(route, tenants, now, cut) {
    if (route.pending !== null && now - route.pending.firstSent >= this.policy.refreshPeriod) {
      route.pending = null; // failing for a whole refresh period: a new request
      if (route.address !== null) {
        // An owner that cannot be reached: its tenants go back to the main target.
        this.log('error', `retrybudget: owner ${route.address} unreachable for a refresh period; its tenants go back to the main target`);
        // Unreachable since the owner's first failure: already down for a refresh period.
        for (const t of tenants) this.park(t, null, route.failingSince);
        route.failures = 0;
        route.failingSince = INFINITE_FUTURE;
        route.serverState = ANSWERING;
        return null;
      }
    }
    const resend = route.pending !== null;
    if (!resend) {
      // A new request: new seq, counters as of now. It is kept until a response arrives, so a
      // retry resends exactly this request (the server then answers it the same way). At most
      // route.chunk tenants, in order: the rest go in the next requests of this step.
      const chosen = tenants.length > route.chunk ? tenants.slice(0, Math.max(1, route.chunk)) : tenants;
      this.seq++;
      const request = { instanceId: this.instanceId, seq: this.seq, tenants: [], final: false };
      for (const t of chosen) request.tenants.push(t.fillSync(now, this.policy));
      route.pending = { request, tenants: [...chosen], firstSent: now };
    }
    route.lastSend = now;
    this.step.sending = { rest: tenants, resend };
    const deadline = Math.min(now + this.syncTimeout, cut);
    return {
      request: route.pending.request,
      timeout: Math.max(0, deadline - now),
      waitForReady: route.failures > 0,
      sent: now,
      deadline,
      address: route.address,
    };
  }

  routeOf(plan) {
    return plan.address === null ? this.main : this.owners.get(plan.address);
  }

  /** Records what sending `plan` gave: {code: null, response} or {code, details, woken}. */
  endAttempt(plan, outcome) {
    const route = this.routeOf(plan);
    const received = this.clock();
    const code = outcome.code ?? null;
    if (this.metrics !== null) {
      this.metrics.syncAttempted(code === null);
      if (code !== null) this.metrics.syncFailed(code);
    }
    this.lastStatus = code === null ? null : `${codeName(code)}: Sync to the budget server failed: ${outcome.details ?? ''}`;
    const cutShort = plan.deadline < plan.sent + this.syncTimeout && code === Status.DEADLINE_EXCEEDED
      && received >= plan.deadline - DEADLINE_SLACK;
    if (cutShort || (outcome.woken && code === Status.CANCELLED)) {
      route.retryAt = received;
      return;
    }
    if (code !== null && isRequestRefusal(code)) {
      const size = route.pending.tenants.length;
      // Split: the same tenants again in this step; one tenant refused: the next ones.
      const split = this.refused(route, code, outcome.details ?? '', received);
      this.sendRest(plan, split ? 0 : size);
      return;
    }
    if (code === null) route.serverState = ANSWERING;
    else if (code === Status.UNAUTHENTICATED || code === Status.PERMISSION_DENIED) route.serverState = REFUSING;
    else route.serverState = UNREACHABLE;
    if (code !== null) {
      if (route.failures === 0) route.failingSince = plan.sent;
      route.failures++;
      route.retryAt = Math.max(received, plan.sent + retryBackoff(route.failures, this.policy));
      if (route.failures === 1) {
        this.log('error', `retrybudget: Sync seq ${plan.request.seq} failed; retrying (tenants whose lease ends meanwhile fall back): ${this.lastStatus}`);
      }
      return;
    }
    if (route.failures > 0) {
      this.log('info', `retrybudget: Sync seq ${plan.request.seq} succeeded after ${route.failures} failed attempts`);
    }
    route.failures = 0;
    route.failingSince = INFINITE_FUTURE;
    const done = route.pending;
    route.pending = null;
    // The answer to a resend leaves the route's other tenants to their schedule.
    if (!this.step.sending.resend) this.sendRest(plan, done.tenants.length);
    const response = outcome.response;
    if (response === null || typeof response !== 'object') return;
    if (response.stale === true) {
      this.log('error', `retrybudget: Sync seq ${done.request.seq} answered as stale; ignored`);
      return;
    }
    this.applyResponse(done, response, received);
  }

  /** The route's tenants after the first `sent` of those left when `plan` was made go out next
   * in this step. */
  sendRest(plan, sent) {
    const rest = this.step.sending.rest;
    if (rest.length > sent) this.step.rest.set(plan.address, rest.slice(sent));
  }

  /** A request refused as a whole: true when it is split (its tenants go again in smaller
   * requests), false when its one tenant is denied. */
  refused(route, code, details, received) {
    // The server answered: it is reachable, and this request as a whole is refused. It applied
    // nothing, so the counters simply go in the next request.
    route.serverState = ANSWERING;
    route.failures = 0;
    route.failingSince = INFINITE_FUTURE;
    const refused = route.pending;
    route.pending = null;
    const size = refused.tenants.length;
    if (size > 1) {
      const named = tenantLimitIn(details);
      if (named > 0 && named < size) {
        route.maxTenantsPerSync = named;
        route.chunk = named;
      } else {
        route.chunk = Math.floor(size / 2);
      }
      this.logRefusal(received, `Sync seq ${refused.request.seq} with ${size} tenants refused; splitting it into requests of ${route.chunk}: ${this.lastStatus}`);
      return true;
    }
    // One tenant, refused: deny it until its next refresh (not fallback: the server answers).
    this.logRefusal(received, `Sync seq ${refused.request.seq} for tenant "${refused.tenants[0].tenant}" refused; the tenant is denied: ${this.lastStatus}`);
    refused.tenants[0].applyRefusal(codeName(code), details, received, this.policy);
    return false;
  }

  redirect(tenant, owner, received) {
    this.redirects++;
    if (this.metrics !== null) this.metrics.redirected();
    let r = this.routed.get(tenant);
    if (r === undefined) {
      r = new TenantRoute();
      this.routed.set(tenant, r);
    }
    r.hops++;
    if (r.hops > MAX_REDIRECT_HOPS || !OWNER_RE.test(owner)
        || (!this.owners.has(owner) && this.owners.size >= MAX_OWNER_ROUTES)) {
      this.log('error', `retrybudget: tenant "${tenant.tenant}" redirected ${r.hops} times without a grant (last to ${JSON.stringify(owner.slice(0, 300))}), a malformed owner, or too many owners; treated as unavailable`);
      this.park(tenant, received);
      return;
    }
    if (!this.owners.has(owner)) this.owners.set(owner, new Route(owner));
    r.owner = owner;
    r.unavailable = false;
    r.unavailableSince = INFINITE_FUTURE;
    this.redirected = true;
    tenant.syncAgainAt(INFINITE_PAST); // at once, on the owner's route
  }

  park(tenant, received, since = null) {
    let r = this.routed.get(tenant);
    if (r === undefined) {
      r = new TenantRoute();
      this.routed.set(tenant, r);
    }
    r.owner = null;
    r.hops = 0;
    if (!r.unavailable) r.unavailableSince = since ?? received ?? this.clock();
    r.unavailable = true;
    if (received !== null) tenant.syncAgainAt(received + this.policy.refreshPeriod);
  }

  applyResponse(pending, response, received) {
    const grants = Array.isArray(response.tenants) ? response.tenants : [];
    const sentEntries = pending.request.tenants;
    if (grants.length !== sentEntries.length) {
      this.log('error', `retrybudget: Sync response has ${grants.length} tenant entries for ${sentEntries.length} in the request`);
    }
    const n = Math.min(grants.length, sentEntries.length);
    for (let i = 0; i < n; i++) {
      const grant = grants[i];
      const sent = sentEntries[i];
      const tenant = pending.tenants[i];
      if (grant === null || typeof grant !== 'object' || grant.tenant !== sent.tenant) {
        // Not this tenant's answer: take nothing. A grant dropped here is never counted as
        // received, so the server reclaims it; the tenant asks again on its schedule.
        this.log('error', `retrybudget: Sync response entry ${i} is for tenant ${JSON.stringify(grant?.tenant)}, not "${sent.tenant}"`);
        continue;
      }
      const error = grant.error;
      const errCode = error !== null && typeof error === 'object' ? Number(error.code) || 0 : 0;
      const owner = errCode !== 0 && typeof error.owner === 'string' ? error.owner : '';
      if (errCode === Status.FAILED_PRECONDITION && owner !== '') {
        // Not this server's shard: nothing was applied; sync the tenant with its owner.
        this.redirect(tenant, owner, received);
        continue;
      }
      if (errCode === Status.UNAVAILABLE && owner === '') {
        // The shard has no owner that can grant now: lease to expiry, then fallback.
        this.park(tenant, received);
        continue;
      }
      if (errCode !== 0) {
        const message = typeof error.message === 'string' ? error.message : '';
        this.logRefusal(received, `budget server refused tenant "${sent.tenant}" (${codeName(errCode)}): ${message}`);
        tenant.applyRefusal(codeName(errCode), message, received, this.policy);
        continue;
      }
      tenant.applyGrant(grant, sent, pending.firstSent, received, this.policy);
      const r = this.routed.size > 0 ? this.routed.get(tenant) : undefined;
      if (r !== undefined) {
        r.hops = 0;
        r.unavailable = false;
        r.unavailableSince = INFINITE_FUTURE;
      }
    }
  }

  /** Steps the tenants again with the attempts' outcomes; returns the next step's time. */
  endStep() {
    const tenants = this.step.tenants;
    if (this.shutDown || tenants.length === 0) return INFINITE_FUTURE;
    const now = this.clock();
    let next = INFINITE_FUTURE;
    for (const [route, group] of this.groups(tenants)) next = Math.min(next, this.syncDue(route, group));
    for (const t of tenants) next = Math.min(next, t.step(now, this.stateFor(t, now)));
    next = Math.min(next, this.nextDown(now));
    this.updateMetrics(tenants);
    return next;
  }

  updateMetrics(tenants) {
    if (this.metrics !== null) for (const t of tenants) this.metrics.tenantUpdated(t.tenant, t.stats());
  }

  // ---- the final Sync ----
  //
  //     if (engine.beginFinal()) {
  //       for (let plan = engine.nextFinal(); plan; plan = engine.nextFinal()) {
  //         for (;;) {
  //           const delay = engine.endFinal(plan, await send(plan));
  //           if (delay === null) break;   // this request is done (or split)
  //           await sleep(delay);          // then the same request again (same seq)
  //         }
  //       }
  //       engine.finishFinal();
  //     }

  /** Shuts every tenant down (every token withdrawn, want 0) and queues the final requests, per
   * route that has tenants (the main target's first). False when already shut down. */
  beginFinal() {
    if (this.shutDown) return false;
    this.shutDown = true;
    const tenants = this.registry.snapshot();
    this.step = newStep();
    this.finalError = null;
    this.finalRoutes = [];
    this.finalAt = 0;
    this.main.pending = null;
    for (const route of this.owners.values()) route.pending = null;
    const now = this.clock();
    for (const [route, group] of this.groups(tenants)) {
      if (group.length === 0) continue;
      this.finalRoutes.push({
        route, entries: group.map((t) => t.fillFinal(now)), done: 0, n: 0,
        chunk: route.maxTenantsPerSync, status: null, stopped: false,
      });
    }
    this.finalTenants = tenants;
    return true;
  }

  /** The next final request, {address, request, timeout, waitForReady, attempts}, or null when
   * every route's are done. Each is a new seq (even if a request was pending: a grant of it that
   * the server applied is reclaimed from tokens_received); a route's tenants go in requests of at
   * most its tenant limit, and only the last of them carries final=true (the server forgets the
   * instance on it). */
  nextFinal() {
    while (this.finalAt < this.finalRoutes.length) {
      const f = this.finalRoutes[this.finalAt];
      if (f.stopped || f.done >= f.entries.length) {
        if (this.finalError === null) this.finalError = f.status;
        this.finalAt++;
        continue;
      }
      f.n = Math.min(Math.max(1, f.chunk), f.entries.length - f.done);
      this.seq++;
      const request = {
        instanceId: this.instanceId, seq: this.seq, tenants: f.entries.slice(f.done, f.done + f.n),
        final: f.done + f.n === f.entries.length,
      };
      // With the server known unreachable, fail fast rather than hold close() 3 x timeout.
      return {
        address: f.route.address, request, timeout: this.syncTimeout,
        waitForReady: f.route.serverState !== UNREACHABLE, attempts: 0,
      };
    }
    return null;
  }

  /** Records an attempt of the final request `plan`: how long to wait (seconds) before sending
   * it again, same seq (at most FINAL_SYNC_ATTEMPTS attempts, never again once refused), or null
   * when it is done. A request of several tenants refused as a whole is split, as a Sync. */
  endFinal(plan, outcome) {
    const code = outcome.code ?? null;
    if (this.metrics !== null) {
      this.metrics.syncAttempted(code === null);
      if (code !== null) this.metrics.syncFailed(code);
    }
    this.lastStatus = code === null ? null : `${codeName(code)}: Sync to the budget server failed: ${outcome.details ?? ''}`;
    plan.attempts++;
    const refused = code !== null && isRequestRefusal(code);
    if (code !== null && !refused && plan.attempts < FINAL_SYNC_ATTEMPTS) return retryBackoff(plan.attempts, this.policy);
    const f = this.finalRoutes[this.finalAt];
    if (refused && f.n > 1) {
      const named = tenantLimitIn(outcome.details ?? '');
      if (named > 0 && named < f.n) f.route.maxTenantsPerSync = named;
      f.chunk = named > 0 && named < f.n ? named : Math.floor(f.n / 2);
      return null;
    }
    if (code !== null) {
      f.status = this.lastStatus; // the route's last failure
      this.log('error', `retrybudget: final Sync failed; unspent tokens are forfeited: ${this.lastStatus}`);
      if (!refused) {
        f.stopped = true; // unreachable: the rest would fail too
        return null;
      }
    }
    f.done += f.n;
    return null;
  }

  /** After the last final request: lastStatus is the first route's failure (null: none). */
  finishFinal() {
    this.lastStatus = this.finalError;
    this.updateMetrics(this.finalTenants);
  }
}

export { MAX_LEASE_TOKENS };
