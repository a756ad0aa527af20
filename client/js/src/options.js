// ClientOptions: the same options, with the same meaning, as the C++ client's
// retrybudget::ClientOptions (client/include/retrybudget/client.h), in JavaScript style:
// camelCase names, durations in milliseconds. A bad option throws a TypeError (wrong type) or
// RangeError (out of range) naming the option and its value.

import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';

const MAX_FALLBACK_VALUE = 1e9;
const MAX_BEARER_TOKEN_LENGTH = 4096;
const MAX_WANT = 1_000_000;

export const DEFAULT_OPTIONS = Object.freeze({
  // gRPC target of the budget server ("127.0.0.1:50051", "dns:///budget:50051"), or of several
  // servers of one cluster: "ipv4:10.0.0.1:50051,10.0.0.2:50051" (round_robin over them, as the
  // C++ client: a Sync that waited out syncTimeoutMs on a hung server is resent to the next).
  target: '127.0.0.1:50051',
  instanceId: '', // random when empty; 1-128 printable ASCII characters
  refreshPeriodMs: 200,
  minSyncIntervalMs: 5,
  syncTimeoutMs: 1000,
  maxReconnectBackoffMs: 1000,
  leaseBurst: 2,
  clock: null, // () => milliseconds, monotonic; performance.now when null
  fallback: 'local_bucket', // or 'deny'
  fallbackCapacity: 1,
  fallbackRefillPerSecond: 0.1,
  metricsRegistry: null, // a prom-client Registry
  channelCredentials: null, // grpc.ChannelCredentials; null: insecure (loopback, tests)
  bearerToken: '',
  protoDir: null, // directory holding retrybudget/v1/budget.proto; null: the package's own copy
  logger: null, // (level: 'error' | 'info', line: string) => void; null: errors to stderr
});

const KNOWN = new Set(Object.keys(DEFAULT_OPTIONS));

function show(value) {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'function') return 'a function';
  try {
    return String(value);
  } catch {
    return typeof value;
  }
}

function number(o, name, { min = -Infinity, max = Infinity, minExclusive = false, integer = false } = {}) {
  const v = o[name];
  if (typeof v !== 'number' || Number.isNaN(v)) {
    throw new TypeError(`options.${name} is ${show(v)}; expected a number`);
  }
  if (integer && !Number.isInteger(v)) throw new RangeError(`options.${name} is ${show(v)}; it must be an integer`);
  if (!Number.isFinite(v) || (minExclusive ? v <= min : v < min) || v > max) {
    const lo = minExclusive ? `(${min}` : `[${min}`;
    throw new RangeError(`options.${name} is ${show(v)}; it must be in ${lo}, ${max}]`);
  }
  return v;
}

/** A frozen copy of `options` with defaults filled in; throws naming the first bad option. */
export function validateOptions(options = {}) {
  if (options === null || typeof options !== 'object') {
    throw new TypeError(`options is ${show(options)}; expected an object`);
  }
  for (const key of Object.keys(options)) {
    if (!KNOWN.has(key)) throw new TypeError(`options.${key} is not an option of BudgetClient`);
  }
  const o = { ...DEFAULT_OPTIONS };
  for (const [k, v] of Object.entries(options)) if (v !== undefined) o[k] = v;
  if (typeof o.target !== 'string' || o.target === '') {
    throw new TypeError(`options.target is ${show(o.target)}; expected e.g. "127.0.0.1:50051"`);
  }
  if (typeof o.instanceId !== 'string') throw new TypeError(`options.instanceId is ${show(o.instanceId)}; expected a string`);
  if (o.instanceId === '') {
    o.instanceId = `rb-${randomBytes(16).toString('hex')}`;
  } else if (o.instanceId.length > 128 || !/^[\x20-\x7e]+$/.test(o.instanceId)) {
    throw new RangeError(`options.instanceId is ${show(o.instanceId)}; expected 1-128 printable ASCII characters`);
  }
  number(o, 'refreshPeriodMs', { min: 0, minExclusive: true, max: 3_600_000 });
  number(o, 'minSyncIntervalMs', { min: 0, max: o.refreshPeriodMs });
  number(o, 'syncTimeoutMs', { min: 0, minExclusive: true, max: 3_600_000 });
  number(o, 'maxReconnectBackoffMs', { min: 1, max: 3_600_000 });
  number(o, 'leaseBurst', { min: 0, max: MAX_WANT, integer: true });
  if (o.clock !== null && typeof o.clock !== 'function') {
    throw new TypeError(`options.clock is ${show(o.clock)}; expected a function returning milliseconds`);
  }
  if (o.fallback !== 'local_bucket' && o.fallback !== 'deny') {
    throw new RangeError(`options.fallback is ${show(o.fallback)}; expected "local_bucket" or "deny"`);
  }
  number(o, 'fallbackCapacity', { min: 0, max: MAX_FALLBACK_VALUE });
  number(o, 'fallbackRefillPerSecond', { min: 0, max: MAX_FALLBACK_VALUE });
  if (o.metricsRegistry !== null && (typeof o.metricsRegistry !== 'object' || typeof o.metricsRegistry.registerMetric !== 'function')) {
    throw new TypeError(`options.metricsRegistry is ${show(o.metricsRegistry)}; expected a prom-client Registry`);
  }
  if (typeof o.bearerToken !== 'string') throw new TypeError(`options.bearerToken is ${show(o.bearerToken)}; expected a string`);
  if (o.bearerToken.length > MAX_BEARER_TOKEN_LENGTH) {
    throw new RangeError(`options.bearerToken is ${o.bearerToken.length} characters long; at most ${MAX_BEARER_TOKEN_LENGTH} are allowed`);
  }
  for (let i = 0; i < o.bearerToken.length; i++) {
    const c = o.bearerToken.charCodeAt(i);
    if (!(c > 0x20 && c < 0x7f)) {
      throw new RangeError(`options.bearerToken has character code ${c} at position ${i}; only printable ASCII without spaces is allowed`);
    }
  }
  if (o.protoDir !== null && typeof o.protoDir !== 'string') throw new TypeError(`options.protoDir is ${show(o.protoDir)}; expected a directory path`);
  if (o.logger !== null && typeof o.logger !== 'function') throw new TypeError(`options.logger is ${show(o.logger)}; expected a function`);
  if (o.clock === null) o.clock = () => performance.now();
  return Object.freeze(o);
}

/** The channel arguments the C++ client sets (client/client.cc): a short reconnect backoff, no
 * transparent retries (the refresher resends with the same seq), keepalive with calls; for the
 * main channel (the target's) round_robin over its addresses. An owner's channel (one address)
 * keeps pick_first. */
export function channelOptions(o, main = true) {
  const maxMs = Math.max(1, Math.floor(o.maxReconnectBackoffMs));
  const args = {
    'grpc.initial_reconnect_backoff_ms': Math.min(100, maxMs),
    'grpc.max_reconnect_backoff_ms': maxMs,
    'grpc.enable_retries': 0,
    'grpc.keepalive_time_ms': 20_000,
    'grpc.keepalive_timeout_ms': 10_000,
    'grpc.keepalive_permit_without_calls': 0,
  };
  if (main) args['grpc.service_config'] = JSON.stringify({ loadBalancingConfig: [{ round_robin: {} }] });
  return args;
}
