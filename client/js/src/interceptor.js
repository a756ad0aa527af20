// A grpc-js client interceptor that retries UNARY calls through the retry budget, as the C++
// RetryUnary (client/include/retrybudget/retry_grpc.h):
//
//     const client = new Echo(target, creds, { interceptors: [retryInterceptor(budget)],
//                                              'grpc.enable_retries': 0 });
//
//  * Each attempt is a fresh call with the same deadline as the caller's (and at most
//    perAttemptTimeoutMs of its own), metadata `x-idempotency-key` (the same on every attempt
//    of one logical call) and `grpc-previous-rpc-attempts` (the attempts before this one, on
//    retries only, as gRFC A6).
//  * A failed attempt is retried only for UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED and
//    DEADLINE_EXCEEDED (the last only while the call's deadline has time left: an attempt's own
//    timeout), while attempts are left, when the backoff (`grpc-retry-pushback-ms` from the
//    trailers: >= 0 replaces it, negative or unparsable means do not retry; else full jitter)
//    ends before the deadline, and only when budget.tryAcquire(cost) allows (options.cost: a
//    number, or a function of the failed attempt's error, {code, details, metadata}; default
//    1), asked once the tenant
//    had its first answer (a new client's first Sync: waited for as part of the backoff, up to
//    the call's deadline). The caller gets the
//    last attempt's status otherwise (denied by the budget: its details say so and trailer
//    `retry-budget-exhausted` holds the attempts made).
//  * Cancelling the call (call.cancel(), or an AbortSignal wired to it) cancels the attempt in
//    flight, or ends the backoff at once and refund(cost)s its tokens (or the wait for the first
//    answer, no token taken yet).
//  * budget.recordRequest() once per call, as its first attempt starts; a success calls
//    budget.recordSuccess(). Streaming calls pass through untouched.
//  * An options.cost function returning a bad cost ends the call with INTERNAL, its details
//    naming options.cost, the value and the last attempt's status.
// Channels must be built with 'grpc.enable_retries': 0: gRPC's own retries would be a second,
// budget-blind retry layer.

import * as grpc from '@grpc/grpc-js';
import { BudgetExhaustedError, RetryLoop, RETRYABLE_GRPC_CODES, IDEMPOTENCY_KEY_HEADER, PREVIOUS_ATTEMPTS_HEADER, parseRetryPushback } from './retry.js';

export const BUDGET_EXHAUSTED_TRAILER = 'retry-budget-exhausted';

function deadlineMs(deadline) {
  if (deadline === undefined || deadline === null) return Infinity;
  const t = deadline instanceof Date ? deadline.getTime() : Number(deadline);
  return Number.isFinite(t) ? t : Infinity;
}

/** @returns {grpc.Interceptor} */
export function retryInterceptor(budget, options = {}) {
  // Validate once, up front (a bad option throws here, not in a call).
  new RetryLoop(budget, { ...options, clock: Date.now });
  return (callOptions, nextCall) => {
    const def = callOptions.method_definition;
    if (def.requestStream || def.responseStream) return new grpc.InterceptingCall(nextCall(callOptions));
    const loop = new RetryLoop(budget, { ...options, clock: Date.now, deadline: deadlineMs(callOptions.deadline) });
    let outer = null; // the caller's listener
    let baseMetadata = null;
    let message;
    let haveMessage = false;
    let current = null; // the attempt's call in flight (after the first)
    let cancelled = false;
    let sleeping = null; // {timer} during a backoff
    let waiting = null; // an AbortController while waiting for the budget's first answer
    let finished = false;

    const finish = (status, metadata, response, hasResponse) => {
      if (finished) return;
      finished = true;
      if (metadata !== null) outer.onReceiveMetadata(metadata);
      if (hasResponse) outer.onReceiveMessage(response);
      outer.onReceiveStatus(status);
    };

    const attemptMetadata = (attempt) => {
      const md = baseMetadata.clone();
      md.set(IDEMPOTENCY_KEY_HEADER, attempt.idempotencyKey);
      if (attempt.previousAttempts > 0) md.set(PREVIOUS_ATTEMPTS_HEADER, String(attempt.previousAttempts));
      else md.remove(PREVIOUS_ATTEMPTS_HEADER);
      return md;
    };

    const attemptOptions = (attempt) => {
      const o = { ...callOptions };
      if (Number.isFinite(attempt.attemptDeadline)) o.deadline = new Date(attempt.attemptDeadline);
      return o;
    };

    // Collects one attempt's metadata / message / status, then decides.
    const attemptListener = (attempt) => {
      let md = null;
      let response;
      let hasResponse = false;
      return {
        onReceiveMetadata(metadata) { md = metadata; },
        onReceiveMessage(m) { response = m; hasResponse = true; },
        onReceiveStatus(status) {
          current = null;
          if (status.code === grpc.status.OK) {
            budget.recordSuccess();
            finish(status, md, response, hasResponse);
            return;
          }
          if (cancelled) {
            finish(status, md, undefined, false);
            return;
          }
          const error = Object.assign(new Error(`${status.code} ${status.details}`), { code: status.code, details: status.details, metadata: status.metadata });
          attempt.pushbackMs = parseRetryPushback(status.metadata);
          let backoff;
          try {
            backoff = loop.afterFailure(attempt, error, RETRYABLE_GRPC_CODES.includes(status.code));
          } catch {
            finish(status, md, undefined, false); // the last status unchanged
            return;
          }
          const proceed = (waited) => {
            waiting = null;
            if (cancelled) return;
            try {
              loop.acquire();
            } catch (ended) {
              if (!(ended instanceof BudgetExhaustedError)) {
                finish({ code: grpc.status.INTERNAL, details: `${ended?.message ?? String(ended)} (last attempt: ${status.code} ${status.details})`, metadata: status.metadata }, md, undefined, false);
                return;
              }
              const trailers = status.metadata.clone();
              trailers.set(BUDGET_EXHAUSTED_TRAILER, String(ended.attempts));
              finish({ ...status, details: `${status.details} (retry budget exhausted after ${ended.attempts} attempt(s))`, metadata: trailers }, md, undefined, false);
              return;
            }
            sleeping = {
              timer: setTimeout(() => {
                sleeping = null;
                startRetry();
              }, Math.max(0, backoff - waited)),
            };
          };
          if (loop.budgetReady()) {
            proceed(0);
            return;
          }
          // A new client's tenant: its first Sync is on the way; wait for it (no token held).
          waiting = new AbortController();
          loop.firstAnswer(waiting.signal).then(proceed, () => {
            waiting = null;
            if (!cancelled) finish(status, md, undefined, false); // the deadline came first
          });
        },
      };
    };

    const startRetry = () => {
      if (cancelled) return;
      let attempt;
      try {
        attempt = loop.nextAttempt();
      } catch {
        loop.refund(); // the retry is never sent
        finish({ code: grpc.status.DEADLINE_EXCEEDED, details: 'Deadline exceeded before the retry', metadata: new grpc.Metadata() }, null, undefined, false);
        return;
      }
      loop.sent();
      const call = nextCall(attemptOptions(attempt));
      current = call;
      call.start(attemptMetadata(attempt), attemptListener(attempt));
      if (haveMessage) call.sendMessage(message);
      call.halfClose();
    };

    const requester = {
      start(metadata, listener, next) {
        outer = listener;
        baseMetadata = metadata;
        let attempt;
        try {
          attempt = loop.nextAttempt();
        } catch {
          // Already past the deadline: the attempt goes out and gRPC ends it at once.
          attempt = { number: 1, previousAttempts: 0, idempotencyKey: loop.key, deadline: loop.deadline, attemptDeadline: loop.deadline, pushbackMs: null };
        }
        loop.recordRequest();
        const l = attemptListener(attempt);
        // The first attempt runs on the call grpc-js made for this interceptor.
        next(attemptMetadata(attempt), {
          onReceiveMetadata(md) { l.onReceiveMetadata(md); },
          onReceiveMessage(m) { l.onReceiveMessage(m); },
          onReceiveStatus(s) { l.onReceiveStatus(s); },
        });
      },
      sendMessage(m, next) {
        message = m;
        haveMessage = true;
        next(m);
      },
      halfClose(next) {
        next();
      },
      cancel(next) {
        cancelled = true;
        if (waiting !== null) {
          waiting.abort();
          waiting = null;
          finish({ code: grpc.status.CANCELLED, details: 'Cancelled while waiting for the retry budget', metadata: new grpc.Metadata() }, null, undefined, false);
        }
        if (sleeping !== null) {
          clearTimeout(sleeping.timer);
          sleeping = null;
          loop.refund(); // the retry is never sent
          finish({ code: grpc.status.CANCELLED, details: 'Cancelled during the retry backoff', metadata: new grpc.Metadata() }, null, undefined, false);
        }
        if (current !== null) current.cancelWithStatus(grpc.status.CANCELLED, 'Cancelled on client');
        next();
      },
    };
    return new grpc.InterceptingCall(nextCall(attemptOptions({ attemptDeadline: loop.policy.perAttemptTimeoutMs === null ? loop.deadline : Math.min(loop.deadline, Date.now() + loop.policy.perAttemptTimeoutMs) })), requester);
  };
}
