// The retry helper: runs an operation and retries it the way DESIGN.md asks, so callers never
// write the retry loop themselves.
//
//   retrybudget::RetryPolicy policy;                       // 4 attempts, 50ms..5s backoff
//   retrybudget::CallControl control{.stop = stop_token,
//                                    .deadline = absl::Now() + absl::Seconds(2)};
//   absl::StatusOr<Row> row = retrybudget::Retry(
//       *budget, policy, control, [&](retrybudget::Attempt& a) -> absl::StatusOr<Row> {
//         return db.Get(key, a.idempotency_key, a.attempt_deadline, a.stop);
//       });
//   if (retrybudget::IsBudgetExhausted(row.status())) { /* shed load: the budget said no */ }
//
// What one logical call does:
//  * The first attempt is always sent (if the call is not already cancelled or past its
//    deadline), after one TenantBudget::RecordRequest() (the call counted once, for a windowed
//    policy's deposits). The budget decides every RETRY: one TenantBudget::TryAcquire(cost) per
//    retry, `cost` from RetryPolicy::retry_cost (1 by default).
//  * After a failed attempt, in this order: cancelled? -> retryable? -> attempts left? ->
//    backoff (server pushback or full-jitter exponential) -> would the backoff end at or after
//    the overall deadline? (then DEADLINE_EXCEEDED now, no token taken) -> the budget's first
//    answer (TenantBudget::WaitReady(), see below) -> TryAcquire(cost) (denied: the last error
//    now, marked budget-exhausted) -> sleep through Clock::SleepUntil with the stop token
//    (cancelled: the same cost is Refund()ed and CANCELLED returned at once) -> next attempt.
//  * A new client has no lease until the server's first answer (about one round trip after
//    Tenant()), so a retry then would be denied. Before taking a token the loop waits for that
//    answer, for at most the longest of kFirstAnswerWait (1 s, the default sync_timeout: by
//    then the first Sync got a lease, a refusal, or failed and the fallback applies), the
//    retry's backoff ceiling (min(max_backoff, initial_backoff * multiplier^(k-1))) and the
//    pushback, never past the overall deadline, cancelled by the stop (CANCELLED, no token
//    taken). Go's Do waits the same. The wait runs
//    inside the backoff: the retry starts at the later of its backoff and the answer. If no
//    answer comes (the server unreachable and its fallback not decided yet), TryAcquire()
//    decides. With a budget already answered this costs one atomic load. The wait goes through
//    the budget's own Clock (ClientOptions::clock): give Retry() the same clock.
//  * A call that succeeds, at any attempt, calls RecordSuccess() exactly once.
//  * Every attempt of a call sees the same idempotency key (dedup key).
//
// Thread-safety: Retry() keeps no state between calls; any number of threads may call it at
// once with the same budget, policy and clock (TenantBudget and Clock are thread-safe). The
// attempt function runs on the calling thread.
#ifndef RETRYBUDGET_RETRY_H_
#define RETRYBUDGET_RETRY_H_

#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "retrybudget/client.h"
#include "retrybudget/clock.h"

namespace retrybudget {

// The longest Retry() waits for a new tenant's first answer when the retry's backoff is
// shorter (see above); a longer backoff bounds the wait instead.
inline constexpr absl::Duration kFirstAnswerWait = absl::Seconds(1);

// Which failures are retried, how often and how far apart. A plain value: copy it freely.
struct RetryPolicy {
  // Most attempts of one logical call, the first included (1 = never retry). Must be >= 1.
  int max_attempts = 4;
  // Backoff before retry k (k = 1, 2, ...) is uniform in [0, ceiling_k), "full jitter", where
  // ceiling_k = min(max_backoff, initial_backoff * multiplier^(k-1)).
  // initial_backoff >= 0, max_backoff >= initial_backoff, multiplier >= 1.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(5);
  double multiplier = 2.0;
  // Time allowed to one attempt; each attempt's deadline is min(overall deadline, attempt start
  // + per_attempt_timeout). Must be > 0; infinite = only the overall deadline.
  absl::Duration per_attempt_timeout = absl::InfiniteDuration();
  // Status codes that may be retried. DEADLINE_EXCEEDED is retried only while the overall
  // deadline still has time (i.e. when it was one attempt's timeout that ran out). A status
  // already marked IsBudgetExhausted() (an inner retry layer's budget said no) is never retried,
  // whatever its code: stacked retry layers must not multiply.
  std::vector<absl::StatusCode> retryable_codes = {
      absl::StatusCode::kUnavailable, absl::StatusCode::kResourceExhausted,
      absl::StatusCode::kAborted, absl::StatusCode::kDeadlineExceeded};
  // Optional further filter: when set, a failure is retried only if its code is in
  // `retryable_codes` AND this returns true (e.g. to refuse errors that carry a "permanent"
  // payload). Called on the calling thread.
  std::function<bool(const absl::Status&)> is_retryable = nullptr;
  // The tokens the retry after a failed attempt costs (TenantBudget::TryAcquire(cost)), given
  // that attempt's error; empty: 1 per retry. A constant: `[](const absl::Status&) { return 5; }`.
  // A retry refunded (never sent) gives back the cost it took. Must return a cost in
  // [1, TenantBudget::kMaxCost]; another value ends the call with INVALID_ARGUMENT (naming it and
  // the last error), no token taken. Called on the calling thread, once per retry.
  //
  // AWS's SDKs price retries this way (their standard retry quota: a 500-token bucket, 5 per
  // retryable error, 10 per timeout, a success refunds): AwsRetryCost() below. A caller may also
  // price an attempt itself, e.g. an LLM call by its request size.
  std::function<uint32_t(const absl::Status&)> retry_cost = nullptr;
};

// AWS's shape of RetryPolicy::retry_cost: 10 tokens for a retry after a timeout
// (DEADLINE_EXCEEDED), 5 after any other error.
//
//   retrybudget::RetryPolicy policy{.retry_cost = retrybudget::AwsRetryCost};
uint32_t AwsRetryCost(const absl::Status& error);

// OK, or INVALID_ARGUMENT naming the first bad field and its value.
absl::Status ValidateRetryPolicy(const RetryPolicy& policy);

// How one logical call may be stopped, and its sources of time and randomness.
// Not owned pointers must outlive the Retry() call.
struct CallControl {
  // Requesting stop cancels the call: an attempt in flight sees it through Attempt::stop, a
  // backoff wakes at once, no further attempt starts. Default: never stopped.
  std::stop_token stop = {};
  // The overall deadline of the logical call: no attempt starts and no backoff ends at or after
  // it. Default: none.
  absl::Time deadline = absl::InfiniteFuture();
  // Time source for deadlines and backoff sleeps. Null: Clock::Real(). Not owned.
  Clock* clock = nullptr;
  // Jitter source: returns a value in [0, 1) (out-of-range values are clamped). Called once per
  // retry. Empty: a thread-local absl::BitGen.
  std::function<double()> random = nullptr;
  // The idempotency (dedup) key of this logical call, the same for all its attempts. Empty: a
  // fresh random key (NewIdempotencyKey()).
  std::string idempotency_key = {};
};

// What an attempt is told about itself, and what it may tell the loop back.
struct Attempt {
  // 1 for the first attempt, 2 for the first retry, ...
  int number = 1;
  // Same for every attempt of one logical call; pass it to the server as the dedup key.
  std::string_view idempotency_key = {};
  // The call's stop token: pass it on (e.g. a std::stop_callback that cancels the RPC).
  std::stop_token stop = {};
  // The overall deadline of the logical call.
  absl::Time deadline = absl::InfiniteFuture();
  // This attempt's deadline: min(deadline, start of attempt + policy.per_attempt_timeout).
  absl::Time attempt_deadline = absl::InfiniteFuture();
  // The call's clock (never null inside an attempt): both deadlines are in its time.
  Clock* clock = nullptr;

  // OUT, optional, set by a failed attempt when the server asked for a delay (e.g. gRPC's
  // `grpc-retry-pushback-ms`): a value >= 0 replaces the computed backoff (it still needs a
  // budget token and must end before the deadline); a negative value means "do not retry".
  std::optional<absl::Duration> pushback = std::nullopt;

  int previous_attempts() const { return number - 1; }
};

// The type URL of the payload that marks a status as "the retry budget denied a retry".
inline constexpr char kBudgetExhaustedTypeUrl[] =
    "type.googleapis.com/retrybudget.BudgetExhausted";

// True when `status` was returned because the retry budget denied a retry: it is then the last
// attempt's error (code and message unchanged) with a kBudgetExhaustedTypeUrl payload. False for
// OK and for every other error.
bool IsBudgetExhausted(const absl::Status& status);

// `status` with the budget-exhausted payload added (a no-op on OK). The payload value records
// how many attempts were made.
absl::Status MarkBudgetExhausted(absl::Status status, int attempts);

// A fresh random 128-bit key as 32 lowercase hex characters. Thread-safe.
std::string NewIdempotencyKey();

// Full-jitter backoff before retry `retry` (1 = the first retry) for `policy`, given a `random`
// value in [0, 1). Exposed for tests and benchmarks.
absl::Duration ComputeBackoff(const RetryPolicy& policy, int retry, double random);

namespace retry_internal {
// The type-erased loop behind Retry(): `attempt` returns the attempt's status; on OK the loop
// records the success and returns OK.
absl::Status RunRetryLoop(TenantBudget& budget, const RetryPolicy& policy,
                          const CallControl& control,
                          absl::FunctionRef<absl::Status(Attempt&)> attempt);

template <typename R>
struct IsStatusOr : std::false_type {};
template <typename T>
struct IsStatusOr<absl::StatusOr<T>> : std::true_type {};
}  // namespace retry_internal

// Runs `attempt` (callable as `absl::StatusOr<T>(Attempt&)` or `absl::Status(Attempt&)`; it may
// take `const Attempt&` when it sets no pushback) and retries it as described at the top of this
// file. Blocks the calling thread for at most about the overall deadline (plus the time an
// attempt itself overstays it) and wakes at once when `control.stop` is requested.
//
// Returns:
//  * the first successful result (RecordSuccess() called once);
//  * a non-retryable error, or the last error when attempts run out or the server said "do not
//    retry", unchanged;
//  * the last error marked IsBudgetExhausted() when the budget denied a retry;
//  * CANCELLED when the stop was requested (before an attempt, or during an attempt or backoff);
//  * DEADLINE_EXCEEDED when the overall deadline passed (before an attempt, or while waiting for
//    the budget's first answer) or a backoff would have crossed it (the message includes the
//    last error);
//  * INVALID_ARGUMENT for an invalid policy (no attempt made).
template <typename F>
auto Retry(TenantBudget& budget, const RetryPolicy& policy, const CallControl& control,
           F&& attempt) -> std::invoke_result_t<F&, Attempt&> {
  using R = std::invoke_result_t<F&, Attempt&>;
  if constexpr (std::is_same_v<R, absl::Status>) {
    return retry_internal::RunRetryLoop(budget, policy, control, attempt);
  } else {
    static_assert(retry_internal::IsStatusOr<R>::value,
                  "the attempt must return absl::StatusOr<T> or absl::Status");
    std::optional<R> result;
    absl::Status status = retry_internal::RunRetryLoop(
        budget, policy, control, [&](Attempt& a) -> absl::Status {
          R r = std::invoke(attempt, a);
          absl::Status s = r.status();
          if (s.ok()) result.emplace(std::move(r));
          return s;
        });
    if (status.ok()) return *std::move(result);
    return R(std::move(status));
  }
}

}  // namespace retrybudget

#endif  // RETRYBUDGET_RETRY_H_
