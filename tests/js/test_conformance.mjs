// The conformance corpus (client/conformance/README.md) through the JS client's own engine:
// SyncEngine + TenantBudget, built as BudgetClient builds them, on a fake clock, with every Sync
// outcome scripted by the scenario. Requests go through the real codec (budget.proto via
// proto-loader, as on the wire) and are compared whole, in proto3 JSON field names; responses
// are decoded from the scenario's proto3 JSON the same way, so the engine sees exactly what
// grpc-js would hand it. Strict: an unknown key anywhere, an attempt more or less than listed,
// or a scenario the runner cannot run fails.
//
// What this runner does not observe: a Refund's return value (the JS refund() returns nothing,
// so a step's optional true / false `expect` on `refund` is not checked; "cost_out_of_range" is:
// a RangeError naming cost and the value), and wake-ups (a scenario's steps are its own
// schedule).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { SyncEngine } from '../../client/js/src/sync-engine.js';
import { TenantBudget, checkTenantName } from '../../client/js/src/tenant-budget.js';
import { validateOptions } from '../../client/js/src/options.js';
import { Status } from '../../client/js/src/codes.js';
import { loadProto, protoDir, budgetServices } from '../../client/js/src/proto.js';

const SOURCE_DIR = process.env.RETRY_BUDGET_SOURCE_DIR ?? path.resolve(import.meta.dirname, '..', '..');
const CORPUS = path.join(SOURCE_DIR, 'client', 'conformance');
const SCENARIOS = path.join(CORPUS, 'scenarios');
const MS_TOLERANCE = 0.001;

// ---- the wire contract ----

const v1 = loadProto('retrybudget/v1/budget.proto', protoDir()).retrybudget.v1;
const SYNC = budgetServices().RetryBudgetService.service.Sync;

const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** {snake_name: {camel, type, repeated, message, values}} of a budget.proto message (`values`:
 * an enum field's {NAME: number}). */
function fieldsOf(message) {
  const fields = new Map();
  for (const f of v1[message].type.field) {
    const isEnum = f.type === 'TYPE_ENUM';
    fields.set(snake(f.name), {
      camel: f.name, type: f.type, repeated: f.label === 'LABEL_REPEATED',
      message: f.type === 'TYPE_MESSAGE' ? f.typeName : null,
      values: isEnum ? Object.fromEntries(v1[f.typeName].type.value.map((v) => [v.name, v.number])) : null,
    });
  }
  return fields;
}

const INT_TYPES = new Set(['TYPE_UINT64', 'TYPE_INT64', 'TYPE_UINT32', 'TYPE_INT32']);

function checkScalar(f, value, where) {
  if (f.type === 'TYPE_STRING') {
    assert.equal(typeof value, 'string', `${where} is ${JSON.stringify(value)}; expected a string`);
  } else if (f.type === 'TYPE_BOOL') {
    assert.equal(typeof value, 'boolean', `${where} is ${JSON.stringify(value)}; expected true or false`);
  } else if (INT_TYPES.has(f.type)) {
    const ok = (typeof value === 'number' && Number.isInteger(value)) || (typeof value === 'string' && /^-?[0-9]+$/.test(value));
    assert.ok(ok, `${where} is ${JSON.stringify(value)}; expected an integer (a number, or a decimal string)`);
    if (f.type.startsWith('TYPE_UINT')) assert.ok(!String(value).startsWith('-'), `${where} is ${value}; the field is unsigned`);
  } else if (f.type === 'TYPE_DOUBLE') {
    const ok = typeof value === 'number' || value === 'NaN' || value === 'Infinity' || value === '-Infinity';
    assert.ok(ok, `${where} is ${JSON.stringify(value)}; expected a number, "NaN" or "Infinity"`);
  } else if (f.type === 'TYPE_ENUM') {
    // proto3 JSON: the value's name, or its number (an unknown number is kept, as on the wire).
    const ok = Object.hasOwn(f.values, value) || (typeof value === 'number' && Number.isInteger(value));
    assert.ok(ok, `${where} is ${JSON.stringify(value)}; expected one of ${Object.keys(f.values).join(', ')} or an integer`);
  } else {
    assert.fail(`${where}: field type ${f.type} is not supported by this runner`);
  }
}

/** A proto3 JSON object (snake_case) of `message`, checked key by key, as the camelCase object
 * proto-loader serializes. */
function fromProtoJson(message, json, where) {
  assert.ok(json !== null && typeof json === 'object' && !Array.isArray(json), `${where} is not an object`);
  const fields = fieldsOf(message);
  const out = {};
  for (const [key, value] of Object.entries(json)) {
    const f = fields.get(key);
    assert.ok(f !== undefined, `${where}.${key}: not a field of ${message} (${[...fields.keys()].join(', ')})`);
    const scalar = (v) => (f.type === 'TYPE_DOUBLE' ? Number(v) : f.type === 'TYPE_ENUM' && typeof v === 'string' ? f.values[v] : v);
    const one = (v, w) => (f.message !== null ? fromProtoJson(f.message, v, w) : (checkScalar(f, v, w), scalar(v)));
    if (f.repeated) {
      assert.ok(Array.isArray(value), `${where}.${key} is not a list`);
      out[f.camel] = value.map((v, i) => one(v, `${where}.${key}[${i}]`));
    } else {
      out[f.camel] = one(value, `${where}.${key}`);
    }
  }
  return out;
}

/** A decoded message (camelCase, every field present) in proto3 JSON field names. */
function toProtoJson(message, obj) {
  const out = {};
  for (const [key, f] of fieldsOf(message)) {
    const v = obj[f.camel];
    if (f.message !== null) {
      out[key] = f.repeated ? v.map((e) => toProtoJson(f.message, e)) : (v === null ? null : toProtoJson(f.message, v));
    } else {
      out[key] = v;
    }
  }
  return out;
}

/** The expected message: the scenario's fields over proto3 defaults (unknown keys fail). */
function withDefaults(message, json, where) {
  assert.ok(json !== null && typeof json === 'object' && !Array.isArray(json), `${where} is not an object`);
  const fields = fieldsOf(message);
  for (const key of Object.keys(json)) {
    assert.ok(fields.has(key), `${where}.${key}: not a field of ${message} (${[...fields.keys()].join(', ')})`);
  }
  const out = {};
  for (const [key, f] of fields) {
    const v = json[key];
    if (f.repeated) {
      if (v !== undefined) assert.ok(Array.isArray(v), `${where}.${key} is not a list`);
      out[key] = (v ?? []).map((e, i) => (f.message !== null ? withDefaults(f.message, e, `${where}.${key}[${i}]`) : e));
    } else if (f.message !== null) {
      out[key] = v === undefined || v === null ? null : withDefaults(f.message, v, `${where}.${key}`);
    } else if (v === undefined) {
      out[key] = f.type === 'TYPE_STRING' ? '' : f.type === 'TYPE_BOOL' ? false : 0;
    } else {
      checkScalar(f, v, `${where}.${key}`);
      out[key] = f.type === 'TYPE_ENUM' && typeof v === 'string' ? f.values[v] : typeof v === 'string' && f.type !== 'TYPE_STRING' ? Number(v) : v;
    }
  }
  return out;
}

/** A request as the server would read it, in proto3 JSON field names. */
function onTheWire(request) {
  return toProtoJson('SyncRequest', SYNC.requestDeserialize(SYNC.requestSerialize(request)));
}

/** A scenario's response as grpc-js hands it to the client. */
function responseFrom(json, where) {
  return SYNC.responseDeserialize(SYNC.responseSerialize(fromProtoJson('SyncResponse', json, where)));
}

// ---- the scenario format ----

// A rule id: lower-case letters, digits, '-' and '.' (`refund-ledger`, `cost.all-or-nothing`).
const RULE_IDS = new Set([...readFileSync(path.join(CORPUS, 'RULES.md'), 'utf8').matchAll(/^- `([a-z0-9.-]+)`:/gm)].map((m) => m[1]));

const OPTION_KEYS = {
  instance_id: 'instanceId',
  refresh_period_ms: 'refreshPeriodMs',
  min_sync_interval_ms: 'minSyncIntervalMs',
  lease_burst: 'leaseBurst',
  sync_timeout_ms: 'syncTimeoutMs',
  fallback: 'fallback',
  fallback_capacity: 'fallbackCapacity',
  fallback_refill_per_second: 'fallbackRefillPerSecond',
};
const ACTIONS = ['tenant', 'try_acquire', 'record_success', 'record_request', 'refund', 'run', 'shutdown', 'expect_tenant'];
const EXTRA_STEP_KEYS = { try_acquire: ['expect', 'cost'], refund: ['expect', 'cost'] };
const COST_OUT_OF_RANGE = 'cost_out_of_range';
const ATTEMPT_KEYS = new Set(['expect', 'expect_address', 'expect_timeout_ms', 'expect_wait_for_ready', 'after_ms', 'response', 'error', 'message', 'lost']);
const TENANT_FIELDS = {
  mode: (t) => t.leaseMode,
  shadow: (t) => t.shadow,
  shadow_denied: (t) => t.stats().shadowDenied,
  requests: (t) => t.stats().requests,
  requests_credited_locally: (t) => t.stats().requestsCreditedLocally,
  tokens_held: (t) => t.stats().tokensHeld,
  retries_allowed: (t) => t.stats().retriesAllowed,
  retries_denied: (t) => t.stats().retriesDenied,
  fallback_allowed: (t) => t.stats().fallbackAllowed,
  successes: (t) => t.stats().successes,
  successes_credited_locally: (t) => t.stats().successesCreditedLocally,
  tokens_received: (t) => t.stats().tokensReceived,
  tokens_returned: (t) => t.stats().tokensReturned,
  refunds: (t) => t.stats().refunds,
  // "CODE: budget server refused ..." -> "CODE"; "OK" when none.
  error: (t) => (t.stats().error === null ? 'OK' : t.stats().error.split(':')[0]),
};

function onlyKeys(obj, allowed, where) {
  assert.ok(obj !== null && typeof obj === 'object' && !Array.isArray(obj), `${where} is not an object`);
  for (const key of Object.keys(obj)) assert.ok(allowed.includes(key), `${where}.${key}: unknown key (allowed: ${allowed.join(', ')})`);
}

function closeTo(actualMs, expectedMs, where) {
  assert.equal(typeof expectedMs, 'number', `${where} is ${JSON.stringify(expectedMs)}; expected milliseconds`);
  assert.ok(Math.abs(actualMs - expectedMs) <= MS_TOLERANCE, `${where}: ${actualMs} ms, expected ${expectedMs} ms`);
}

/** Whether any scripted answer names an owner (then an attempt's address is only checked where
 * the scenario writes expect_address). */
function redirects(scenario) {
  return /"owner":"[^"]/.test(JSON.stringify(scenario.steps));
}

// ---- one scenario through the engine ----

class Run {
  constructor(scenario) {
    this.scenario = scenario;
    onlyKeys(scenario.options ?? {}, Object.keys(OPTION_KEYS), 'options');
    const given = { instanceId: 'conformance' };
    for (const [key, value] of Object.entries(scenario.options ?? {})) given[OPTION_KEYS[key]] = value;
    // The client's own validation and defaults (a bad option fails the scenario here).
    const o = validateOptions(given);
    this.options = o;
    this.ms = 0; // the fake clock, in milliseconds
    this.nextWake = Infinity; // seconds, as the last run's endStep() said
    this.exact = null; // seconds: the clock's exact value while it stands at a wake time
    const clock = () => this.exact ?? this.ms / 1000;
    this.clock = clock;
    this.tenants = new Map();
    this.ordered = [];
    this.wakes = 0;
    // As BudgetClient's constructor builds it.
    this.engine = new SyncEngine({
      instanceId: o.instanceId,
      policy: { refreshPeriod: o.refreshPeriodMs / 1000, minSyncInterval: o.minSyncIntervalMs / 1000, leaseBurst: o.leaseBurst },
      syncTimeout: o.syncTimeoutMs / 1000,
      clock,
      registry: { snapshot: () => this.ordered },
      log: () => {},
    });
    this.neverReached = { capacity: o.fallbackCapacity, refillPerSecond: o.fallbackRefillPerSecond };
    this.checkAddresses = !redirects(scenario);
  }

  tenant(name, where) {
    const t = this.tenants.get(name);
    assert.ok(t !== undefined, `${where}: tenant ${JSON.stringify(name)} has no handle yet (a "tenant" step first)`);
    return t;
  }

  step(s, i) {
    const where = `steps[${i}]`;
    const actions = ACTIONS.filter((k) => k in s);
    assert.equal(actions.length, 1, `${where}: exactly one action key expected (${ACTIONS.join(', ')}); found ${actions.join(', ') || 'none'}`);
    const action = actions[0];
    onlyKeys(s, ['at_ms', action, ...(EXTRA_STEP_KEYS[action] ?? [])], where);
    assert.equal(typeof s.at_ms, 'number', `${where}.at_ms is ${JSON.stringify(s.at_ms)}`);
    assert.ok(s.at_ms >= this.ms - MS_TOLERANCE, `${where}.at_ms ${s.at_ms} is earlier than the clock (${this.ms} ms)`);
    if (s.at_ms > this.ms) {
      this.ms = s.at_ms;
      this.exact = null;
    }
    // A step at the time the last one said the next is due runs at exactly that time, as the
    // client's loop sleeping until it would: the engine's times are float seconds, where
    // 1.32 + 1.0 > 2.32, while the corpus's milliseconds are exact.
    if (Math.abs(this.nextWake * 1000 - this.ms) <= MS_TOLERANCE && this.nextWake > this.clock()) {
      this.ms = this.nextWake * 1000;
      this.exact = this.nextWake;
    }
    const w = `${where} (${action} at ${s.at_ms} ms)`;
    switch (action) {
      case 'tenant': {
        if (!this.tenants.has(s.tenant)) {
          // BudgetClient.tenant(): a new handle wakes the refresher (its first Sync at once).
          checkTenantName(s.tenant);
          const t = new TenantBudget(s.tenant, () => this.wakes++, this.clock(), this.options.fallback, this.neverReached);
          this.tenants.set(s.tenant, t);
          this.ordered.push(t);
          this.wakes++;
        }
        break;
      }
      case 'try_acquire': {
        const t = this.tenant(s.try_acquire, w);
        const args = this.costArgs(s, w);
        if (s.expect === COST_OUT_OF_RANGE) {
          this.outOfRange(() => t.tryAcquire(...args), s.cost, w);
          break;
        }
        assert.equal(typeof s.expect, 'boolean', `${w}: expect must be true, false or "${COST_OUT_OF_RANGE}"`);
        assert.equal(t.tryAcquire(...args), s.expect, `${w}: tryAcquire(${args.join('')})`);
        break;
      }
      case 'record_success':
        assert.ok(!('expect' in s), `${w}: record_success takes no expect`);
        this.tenant(s.record_success, w).recordSuccess();
        break;
      case 'record_request':
        this.tenant(s.record_request, w).recordRequest();
        break;
      case 'refund': {
        const t = this.tenant(s.refund, w);
        const args = this.costArgs(s, w);
        if (s.expect === COST_OUT_OF_RANGE) {
          this.outOfRange(() => t.refund(...args), s.cost, w);
          break;
        }
        if ('expect' in s) assert.equal(typeof s.expect, 'boolean', `${w}: expect must be true, false or "${COST_OUT_OF_RANGE}"`);
        t.refund(...args); // returns nothing in JS: a true / false `expect` is not checked
        break;
      }
      case 'run':
        this.run(s.run, w);
        break;
      case 'shutdown':
        this.shutdown(s.shutdown, w);
        break;
      case 'expect_tenant':
        this.expectTenant(s.expect_tenant, w);
        break;
      default:
        assert.fail(`${w}: unknown action`);
    }
  }

  /** The call's arguments: [] for the plain call, [cost] with a `cost`. */
  costArgs(s, where) {
    if (!('cost' in s)) return [];
    assert.ok(typeof s.cost === 'number' && Number.isInteger(s.cost), `${where}.cost is ${JSON.stringify(s.cost)}; expected an integer`);
    return [s.cost];
  }

  /** The JS form of "cost_out_of_range": a RangeError naming cost and the value. */
  outOfRange(call, cost, where) {
    assert.ok(cost !== undefined, `${where}: "${COST_OUT_OF_RANGE}" needs a cost`);
    assert.throws(call, (e) => e instanceof RangeError && e.message.includes('cost') && e.message.includes(String(cost)), `${where}: a RangeError naming cost and ${cost}`);
  }

  attempts(spec, where) {
    assert.ok(Array.isArray(spec.attempts), `${where}.attempts is not a list`);
    return spec.attempts;
  }

  /** Checks one attempt against `a` and returns its scripted outcome (the clock moved past it). */
  attempt(sent, a, where) {
    onlyKeys(a, [...ATTEMPT_KEYS], where);
    assert.ok('expect' in a, `${where}: expect (the request) is required`);
    const expected = withDefaults('SyncRequest', { instance_id: this.options.instanceId, ...a.expect }, `${where}.expect`);
    assert.deepEqual(onTheWire(sent.request), expected, `${where}: the request sent`);
    const address = sent.address ?? '';
    if ('expect_address' in a) {
      assert.equal(address, a.expect_address, `${where}: the address`);
    } else if (this.checkAddresses) {
      assert.equal(address, '', `${where}: sent to ${address}, not the main target`);
    }
    if ('expect_timeout_ms' in a) closeTo(sent.timeout * 1000, a.expect_timeout_ms, `${where}: the timeout`);
    if ('expect_wait_for_ready' in a) {
      assert.equal(typeof a.expect_wait_for_ready, 'boolean', `${where}.expect_wait_for_ready`);
      assert.equal(sent.waitForReady, a.expect_wait_for_ready, `${where}: wait_for_ready`);
    }
    const kinds = ['response', 'error', 'lost'].filter((k) => k in a);
    assert.equal(kinds.length, 1, `${where}: exactly one outcome expected (response, error, lost); found ${kinds.join(', ') || 'none'}`);
    if ('message' in a) assert.ok('error' in a && typeof a.message === 'string', `${where}.message goes with an error, as a string`);
    if (a.lost !== undefined) {
      assert.equal(a.lost, true, `${where}.lost must be true`);
      assert.ok(!('after_ms' in a), `${where}: after_ms goes with a response or an error, not with lost`);
      // Nanoseconds, as an absl::Time would hold the deadline.
      // At the deadline exactly, as the engine computed it (a lease expiry the deadline stops
      // at is then reached, which a rounded time could miss by a float's last bit).
      if (sent.deadline > this.clock()) {
        this.ms = Math.max(this.ms, sent.deadline * 1000);
        this.exact = sent.deadline;
      }
      return { code: Status.DEADLINE_EXCEEDED, details: 'Deadline Exceeded' };
    }
    if ('after_ms' in a) {
      assert.ok(typeof a.after_ms === 'number' && a.after_ms >= 0, `${where}.after_ms is ${JSON.stringify(a.after_ms)}`);
      if (a.after_ms > 0) {
        this.exact = null;
        this.ms += a.after_ms;
      }
    }
    if ('error' in a) {
      const code = Status[a.error];
      assert.ok(code !== undefined && code !== Status.OK, `${where}.error is ${JSON.stringify(a.error)}; expected a status code name other than OK`);
      return { code, details: a.message ?? '' };
    }
    return { code: null, response: responseFrom(a.response, `${where}.response`) };
  }

  run(spec, where) {
    onlyKeys(spec, ['attempts', 'next_wake_ms'], where);
    const attempts = this.attempts(spec, where);
    const engine = this.engine;
    let n = 0;
    // BudgetClient._run's step, with the transport replaced by the scenario.
    let plan = engine.beginStep();
    while (plan !== null) {
      assert.ok(n < attempts.length, `${where}: attempt ${n + 1} sent (${JSON.stringify(onTheWire(plan.request))} to "${plan.address ?? ''}"), ${attempts.length} listed`);
      const outcome = this.attempt(plan, attempts[n], `${where}.attempts[${n}]`);
      engine.endAttempt(plan, outcome);
      n++;
      plan = engine.nextPlan();
    }
    assert.equal(n, attempts.length, `${where}: ${n} attempts sent, ${attempts.length} listed`);
    const next = engine.endStep();
    this.nextWake = next;
    if ('next_wake_ms' in spec) {
      if (spec.next_wake_ms === null) {
        assert.equal(next, Infinity, `${where}: next wake at ${next * 1000} ms, expected never`);
      } else {
        assert.ok(Number.isFinite(next), `${where}: next wake never, expected ${spec.next_wake_ms} ms`);
        closeTo(next * 1000, spec.next_wake_ms, `${where}: next_wake_ms`);
      }
    }
  }

  shutdown(spec, where) {
    onlyKeys(spec, ['attempts', 'expect_status'], where);
    const attempts = this.attempts(spec, where);
    const engine = this.engine;
    let n = 0;
    // BudgetClient._finalSync, with the transport and the sleeps replaced.
    if (engine.beginFinal()) {
      for (let plan = engine.nextFinal(); plan !== null; plan = engine.nextFinal()) {
        for (;;) {
          const sent = { ...plan, deadline: this.clock() + plan.timeout };
          assert.ok(n < attempts.length, `${where}: final attempt ${n + 1} sent (${JSON.stringify(onTheWire(plan.request))}), ${attempts.length} listed`);
          const outcome = this.attempt(sent, attempts[n], `${where}.attempts[${n}]`);
          n++;
          const delay = engine.endFinal(plan, outcome);
          if (delay === null) break;
          this.exact = null;
          this.ms += delay * 1000;
        }
      }
      engine.finishFinal();
    }
    assert.equal(n, attempts.length, `${where}: ${n} final attempts sent, ${attempts.length} listed`);
    if ('expect_status' in spec) {
      const status = engine.lastStatus === null ? 'OK' : engine.lastStatus.split(':')[0];
      assert.equal(status, spec.expect_status, `${where}: the final Sync's status (${engine.lastStatus})`);
    }
  }

  expectTenant(spec, where) {
    onlyKeys(spec, [...this.tenants.keys()], where);
    for (const [name, fields] of Object.entries(spec)) {
      onlyKeys(fields, Object.keys(TENANT_FIELDS), `${where}.${name}`);
      const t = this.tenant(name, where);
      for (const [field, expected] of Object.entries(fields)) {
        assert.equal(TENANT_FIELDS[field](t), expected, `${where}: tenant ${name}'s ${field}`);
      }
    }
  }
}

function load(file) {
  const text = readFileSync(path.join(SCENARIOS, file), 'utf8');
  let scenario;
  try {
    scenario = JSON.parse(text);
  } catch (e) {
    assert.fail(`${file}: not JSON: ${e.message}`);
  }
  onlyKeys(scenario, ['name', 'rules', 'description', 'options', 'steps'], file);
  assert.equal(`${scenario.name}.json`, file, `${file}: name is ${JSON.stringify(scenario.name)}`);
  assert.ok(Array.isArray(scenario.rules) && scenario.rules.length > 0, `${file}: rules must list at least one id`);
  for (const id of scenario.rules) assert.ok(RULE_IDS.has(id), `${file}: rule ${JSON.stringify(id)} is not an id of RULES.md`);
  assert.equal(typeof scenario.description, 'string', `${file}: description`);
  assert.ok(Array.isArray(scenario.steps) && scenario.steps.length > 0, `${file}: steps`);
  return scenario;
}

export function runScenario(scenario) {
  const r = new Run(scenario);
  scenario.steps.forEach((s, i) => r.step(s, i));
}

const files = readdirSync(SCENARIOS).filter((f) => f.endsWith('.json')).sort();

test('the corpus is there, every rule pinned by a scenario and every scenario RULES.md names present', () => {
  assert.ok(RULE_IDS.size > 0, 'RULES.md names no rule ids');
  assert.ok(files.length > 0, `no scenarios in ${SCENARIOS}`);
  const pinned = new Set();
  for (const file of files) for (const id of JSON.parse(readFileSync(path.join(SCENARIOS, file), 'utf8')).rules ?? []) pinned.add(id);
  assert.deepEqual([...RULE_IDS].filter((id) => !pinned.has(id)), [], 'rules of RULES.md no scenario lists in its "rules"');
  // The names in each rule's "Scenarios:" list (up to the next rule or section).
  const named = [];
  for (const list of readFileSync(path.join(CORPUS, 'RULES.md'), 'utf8').matchAll(/Scenarios:([^]*?)(?=\n- `|\n#|$)/g)) {
    for (const m of list[1].matchAll(/`([^`]+)`/g)) named.push(m[1]);
  }
  assert.ok(named.length > 0, 'RULES.md lists no scenarios');
  assert.deepEqual([...new Set(named)].filter((n) => !files.includes(`${n}.json`)), [], 'scenarios RULES.md names that are not in scenarios/');
  // And the other way: a scenario pinning a rule is named under that rule.
  const ruleText = new Map();
  for (const m of readFileSync(path.join(CORPUS, 'RULES.md'), 'utf8').matchAll(/\n- `([a-z0-9.-]+)`:([^]*?)(?=\n- `|\n#|$)/g)) ruleText.set(m[1], m[2]);
  const unlisted = [];
  for (const file of files) {
    const name = file.slice(0, -'.json'.length);
    for (const id of JSON.parse(readFileSync(path.join(SCENARIOS, file), 'utf8')).rules ?? []) {
      if (!(ruleText.get(id) ?? '').includes(`\`${name}\``)) unlisted.push(`${id}: ${name}`);
    }
  }
  assert.deepEqual(unlisted, [], 'scenarios a rule of RULES.md does not name, though they pin it');
});

for (const file of files) {
  test(file.slice(0, -'.json'.length), () => runScenario(load(file)));
}
