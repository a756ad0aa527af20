// A deliberately unreliable FlakyEcho server (examples/flaky_backend/flaky.proto) in grpc-js,
// for the example and the interceptor's tests. Each attempt is recorded with its metadata; the
// `decide(call, attemptsSeen)` hook chooses its fate: null to echo, or {code, details,
// pushbackMs, delayMs} to fail. Attempts are counted per `x-idempotency-key`, and a key that
// already succeeded is answered `duplicate` (the side effect is not applied twice).

import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { grpc, loadProto } from '../../client/js/src/index.js';

const here = path.dirname(fileURLToPath(import.meta.url));
export const FLAKY_PROTO_DIR = path.resolve(here, '..', 'flaky_backend');

export function flakyEchoClient() {
  return loadProto('flaky.proto', FLAKY_PROTO_DIR).retrybudget.examples.FlakyEcho;
}

/** Fails with UNAVAILABLE with probability `failureRate` (a seeded generator), optionally
 * with a pushback trailer. */
export function randomFailures(failureRate, seed = 1, pushbackMs = null) {
  let s = seed >>> 0 || 1;
  const rnd = () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 2 ** 32;
  };
  return () => (rnd() < failureRate ? { code: grpc.status.UNAVAILABLE, details: 'flaky backend: injected failure', pushbackMs } : null);
}

export async function startFlakyBackend(decide = () => null) {
  const FlakyEcho = flakyEchoClient();
  const attempts = []; // {key, previous, message, deadline} per attempt, in order
  const seen = new Map(); // key -> attempts
  const succeeded = new Set();
  const server = new grpc.Server();
  let backend = null;
  server.addService(FlakyEcho.service, {
    Echo(call, callback) {
      const key = String(call.metadata.get('x-idempotency-key')[0] ?? '');
      const previous = call.metadata.get('grpc-previous-rpc-attempts')[0];
      const n = (seen.get(key) ?? 0) + 1;
      seen.set(key, n);
      attempts.push({ key, previous: previous === undefined ? null : String(previous), message: call.request.message, deadline: call.getDeadline() });
      const fate = decide(call, n);
      const reply = () => {
        if (fate === null || fate === undefined) {
          const duplicate = key !== '' && succeeded.has(key);
          succeeded.add(key);
          callback(null, { message: call.request.message, attemptsSeen: n, duplicate });
          return;
        }
        const metadata = new grpc.Metadata();
        if (fate.pushbackMs !== null && fate.pushbackMs !== undefined) metadata.set('grpc-retry-pushback-ms', String(fate.pushbackMs));
        callback({ code: fate.code, details: fate.details ?? 'flaky', metadata });
      };
      if (fate?.delayMs) setTimeout(reply, fate.delayMs);
      else reply();
    },
  });
  const port = await new Promise((resolve, reject) => server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  backend = {
    target: `127.0.0.1:${port}`,
    attempts,
    stop: () => server.forceShutdown(),
  };
  return backend;
}
