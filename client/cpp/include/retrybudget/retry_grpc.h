// The retry helper for gRPC unary calls: Retry() (retry.h) with one fresh grpc::ClientContext
// per attempt.
//
//   grpc::ChannelArguments args;
//   retrybudget::DisableGrpcBuiltInRetries(args);
//   std::unique_ptr<Echo::Stub> stub = Echo::NewStub(
//       grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
//   retrybudget::CallControl control{.stop = stop_token,
//                                    .deadline = absl::Now() + absl::Seconds(2)};
//   absl::StatusOr<EchoReply> reply = retrybudget::RetryUnary(
//       *budget, retrybudget::RetryPolicy{}, control, *stub, &Echo::Stub::Echo, request);
//
// Each attempt's ClientContext gets:
//  * the deadline Attempt::attempt_deadline, i.e. min(overall deadline, attempt start +
//    RetryPolicy::per_attempt_timeout), translated from CallControl::clock time into real time
//    as "this much time left";
//  * metadata `x-idempotency-key`: the call's idempotency key, identical on every attempt;
//  * metadata `grpc-previous-rpc-attempts`: the number of attempts made before this one, sent on
//    retries only ("1" on the first retry, "2" on the second, ...) and ABSENT on the first
//    attempt, as gRPC's own retry implementation does (gRFC A6). gRPC owns this header: a
//    channel with its built-in retries enabled (gRPC's default) REMOVES it before sending. Build
//    the channel with DisableGrpcBuiltInRetries(), which you want anyway: gRPC's retries would
//    be a second retry layer that multiplies attempts and spends no budget token;
//  * cancellation: a std::stop_callback on CallControl::stop calls ClientContext::TryCancel(),
//    so a stop requested mid-RPC ends the RPC at once (CANCELLED).
// After a failed attempt the server's trailing metadata `grpc-retry-pushback-ms` is honoured:
// a value >= 0 replaces the computed backoff with exactly that many milliseconds (still bounded
// by the deadline and still needing a budget token); a negative or unparsable value means "do
// not retry" (the failure is returned as is). Pushback never makes a non-retryable code
// retryable.
//
// The budget is used as by Retry(): one RecordRequest() per call, before its first attempt; one
// TryAcquire(cost) per retry, the cost from RetryPolicy::retry_cost given the failed attempt's
// status as StatusFromGrpc() makes it (an attempt that ran out of time is DEADLINE_EXCEEDED), so
// AWS's pricing is `RetryPolicy{.retry_cost = AwsRetryCost}`: 5 tokens for a retryable error, 10
// for a timeout.
//
// Thread-safety: as Retry(); the stub must be usable from the calling thread (generated gRPC
// stubs are thread-safe). The RPC runs on the calling thread.
#ifndef RETRYBUDGET_RETRY_GRPC_H_
#define RETRYBUDGET_RETRY_GRPC_H_

#include <functional>
#include <map>
#include <optional>
#include <stop_token>
#include <string_view>
#include <type_traits>

#include <grpcpp/client_context.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/string_ref.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "retrybudget/client.h"
#include "retrybudget/retry.h"

namespace retrybudget {

inline constexpr char kIdempotencyKeyHeader[] = "x-idempotency-key";
inline constexpr char kPreviousAttemptsHeader[] = "grpc-previous-rpc-attempts";
inline constexpr char kRetryPushbackHeader[] = "grpc-retry-pushback-ms";

// Turns off gRPC's own (per-channel, budget-blind) retries on a channel meant for RetryUnary():
//
//   grpc::ChannelArguments args;
//   retrybudget::DisableGrpcBuiltInRetries(args);
//   auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
void DisableGrpcBuiltInRetries(grpc::ChannelArguments& args);

// Same code and message; gRPC's binary error details are not carried over.
absl::Status StatusFromGrpc(const grpc::Status& status);
grpc::Status StatusToGrpc(const absl::Status& status);

// The server's pushback in `trailers`: nullopt when the header is absent; its value in
// milliseconds when it is a non-negative integer; a negative duration ("do not retry") when it is
// negative or unparsable. Only the first value counts.
std::optional<absl::Duration> ParseRetryPushback(
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers);

// Extra per-attempt settings of RetryUnary().
struct UnaryRetryOptions {
  // Called on each attempt's fresh context after the helper set its deadline and metadata, e.g.
  // to add credentials or set wait_for_ready. Must not change the deadline.
  std::function<void(grpc::ClientContext&, const Attempt&)> configure_context = nullptr;
};

namespace retry_grpc_internal {
// Sets the deadline and the metadata described above on `ctx` for attempt `a`.
void PrepareContext(grpc::ClientContext& ctx, const Attempt& a);
// Reads `grpc-retry-pushback-ms` from a finished failed call into a.pushback.
void ReadPushback(const grpc::ClientContext& ctx, Attempt& a);
}  // namespace retry_grpc_internal

// Retries the unary call `call(context, request, response)` (typically a lambda around a stub
// method). Returns what Retry() returns, with the response of the successful attempt. Call it as
// `RetryUnary<Resp>(...)`: Req is deduced from `request`.
template <class Resp, class Req>
absl::StatusOr<Resp> RetryUnary(
    TenantBudget& budget, const RetryPolicy& policy, const CallControl& control,
    absl::FunctionRef<grpc::Status(grpc::ClientContext*, const std::type_identity_t<Req>&, Resp*)>
        call,
    const Req& request, const UnaryRetryOptions& options = {}) {
  return Retry(budget, policy, control, [&](Attempt& a) -> absl::StatusOr<Resp> {
    grpc::ClientContext ctx;
    retry_grpc_internal::PrepareContext(ctx, a);
    if (options.configure_context) options.configure_context(ctx, a);
    Resp response;
    grpc::Status status;
    {
      // Runs TryCancel() at once if the stop is already requested; the destructor waits for a
      // callback running on another thread, so `ctx` outlives it.
      std::stop_callback cancel(a.stop, [&ctx] { ctx.TryCancel(); });
      status = call(&ctx, request, &response);
    }
    if (status.ok()) return response;
    retry_grpc_internal::ReadPushback(ctx, a);
    return StatusFromGrpc(status);
  });
}

// The same for a generated stub method, e.g. `RetryUnary(budget, policy, control, *stub,
// &Echo::Stub::Echo, request)`; `stub` may be a StubInterface (or a mock of it) when `method` is
// `&Echo::StubInterface::Echo`.
template <class Stub, class Req, class Resp>
absl::StatusOr<Resp> RetryUnary(TenantBudget& budget, const RetryPolicy& policy,
                                const CallControl& control, std::type_identity_t<Stub>& stub,
                                grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&,
                                                             Resp*),
                                const Req& request, const UnaryRetryOptions& options = {}) {
  auto call = [&stub, method](grpc::ClientContext* ctx, const Req& req, Resp* resp) {
    return (stub.*method)(ctx, req, resp);
  };
  return RetryUnary<Resp, Req>(budget, policy, control, call, request, options);
}

}  // namespace retrybudget

#endif  // RETRYBUDGET_RETRY_GRPC_H_
