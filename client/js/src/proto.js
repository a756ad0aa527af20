// The wire contract, loaded at run time from retrybudget/v1/budget.proto with
// @grpc/proto-loader (nothing generated, nothing committed). A packed package carries its own
// copy in proto/ beside src/ (scripts/proto-copy.mjs, at `npm pack`); in the repository the one
// proto/ at its root is read. Messages are plain objects with
// camelCase fields; 64-bit integers are Numbers (every counter and seq is at most 2^53);
// unset message fields are null.

import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

const here = path.dirname(fileURLToPath(import.meta.url));

const CONTRACT = path.join('retrybudget', 'v1', 'budget.proto');
// The package's own copy (an installed tarball), then the repository's proto/ (a checkout).
const BUILT_IN = [path.resolve(here, '..', 'proto'), path.resolve(here, '..', '..', '..', 'proto')];

/** The directory holding retrybudget/v1/budget.proto: `dir` when given, else
 * $RETRY_BUDGET_PROTO_DIR when set, else the package's proto/ (packed with it), else the
 * repository's proto/ (client/js/src/../../../proto). Throws naming every place looked at. */
export function protoDir(dir = null) {
  const env = process.env.RETRY_BUDGET_PROTO_DIR;
  const explicit = dir ?? (env !== undefined && env !== '' ? env : null);
  const candidates = explicit !== null ? [explicit] : BUILT_IN;
  for (const c of candidates) if (existsSync(path.join(c, CONTRACT))) return c;
  const where = explicit === null ? 'the package and repository' : (dir !== null ? 'options.protoDir' : '$RETRY_BUDGET_PROTO_DIR');
  throw new Error(`retrybudget: ${candidates.map((c) => path.join(c, CONTRACT)).join(' and ')} not found (from ${where}); a package made by \`npm pack\` in client/js carries its own copy`);
}

const LOADER_OPTIONS = Object.freeze({ keepCase: false, longs: Number, enums: Number, defaults: true, oneofs: true });
const cache = new Map();

/** Loads a .proto file (relative to `includeDir`) as a grpc-js package definition. */
export function loadProto(file, includeDir) {
  const key = `${includeDir}\0${file}`;
  let pkg = cache.get(key);
  if (pkg === undefined) {
    const definition = protoLoader.loadSync(file, { ...LOADER_OPTIONS, includeDirs: [includeDir] });
    pkg = grpc.loadPackageDefinition(definition);
    cache.set(key, pkg);
  }
  return pkg;
}

const warmed = new WeakSet();

// Runs Sync's request and response through their codecs once: protobufjs builds each type's
// encoder and decoder on first use, which would otherwise land on a new client's first Sync
// (tens of ms in a fresh process), i.e. on its first lease.
function warmSyncCodec(service) {
  if (warmed.has(service)) return;
  warmed.add(service);
  const sync = service.service.Sync;
  const entry = {
    tenant: 'warm-up', successes: 1, retriesSpent: 1, retriesDenied: 1, tokensReturned: 1, tokensReceived: 1, want: 1,
    fallbackSpent: 1, successesCreditedLocally: 1, retriesRefunded: 1, fallbackRefunded: 1,
    requests: 1, requestsCreditedLocally: 1, shadowDenied: 1, retriesAllowed: 1,
  };
  sync.requestDeserialize(sync.requestSerialize({ instanceId: 'warm-up', seq: 1, tenants: [entry], final: false }));
  const grant = {
    tenant: 'warm-up', granted: 1, leaseTtlMs: 1, nextSyncMs: 1, safeShare: { capacity: 1, refillPerSecond: 1, successCredit: 1, requestCredit: 1 },
    bucketTokens: 1, capacity: 1, activeInstances: 1, error: { code: 1, message: 'x', owner: 'x' }, mode: 2,
  };
  sync.responseDeserialize(sync.responseSerialize({ tenants: [grant], stale: false }));
}

/** {RetryBudgetService, BudgetAdminService}: grpc-js client constructors (with .service). */
export function budgetServices(dir = null) {
  const v1 = loadProto('retrybudget/v1/budget.proto', protoDir(dir)).retrybudget.v1;
  warmSyncCodec(v1.RetryBudgetService);
  return { RetryBudgetService: v1.RetryBudgetService, BudgetAdminService: v1.BudgetAdminService };
}
