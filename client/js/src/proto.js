// The wire contract, loaded at run time from proto/retrybudget/v1/budget.proto with
// @grpc/proto-loader (nothing generated, nothing committed). Messages are plain objects with
// camelCase fields; 64-bit integers are Numbers (every counter and seq is at most 2^53);
// unset message fields are null.

import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

const here = path.dirname(fileURLToPath(import.meta.url));

/** The directory holding retrybudget/v1/budget.proto: `dir`, else $RETRY_BUDGET_PROTO_DIR,
 * else the repository's proto/ (client/js/src/../../../proto). */
export function protoDir(dir = null) {
  const found = dir ?? process.env.RETRY_BUDGET_PROTO_DIR ?? path.resolve(here, '..', '..', '..', 'proto');
  if (!existsSync(path.join(found, 'retrybudget', 'v1', 'budget.proto'))) {
    throw new Error(`retrybudget: ${path.join(found, 'retrybudget', 'v1', 'budget.proto')} not found; pass options.protoDir or set RETRY_BUDGET_PROTO_DIR to the repository's proto/ directory`);
  }
  return found;
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

/** {RetryBudgetService, BudgetAdminService}: grpc-js client constructors (with .service). */
export function budgetServices(dir = null) {
  const v1 = loadProto('retrybudget/v1/budget.proto', protoDir(dir)).retrybudget.v1;
  return { RetryBudgetService: v1.RetryBudgetService, BudgetAdminService: v1.BudgetAdminService };
}
