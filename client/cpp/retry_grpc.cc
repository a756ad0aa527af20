#include "retrybudget/retry_grpc.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include <grpc/grpc.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace retrybudget {

void DisableGrpcBuiltInRetries(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
}

absl::Status StatusFromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // absl::StatusCode and grpc::StatusCode share their numbering (both are google.rpc.Code).
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status StatusToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

std::optional<absl::Duration> ParseRetryPushback(
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers) {
  auto it = trailers.find(grpc::string_ref(kRetryPushbackHeader));
  if (it == trailers.end()) return std::nullopt;
  int64_t ms = 0;
  // gRFC A6: a value that is not a non-negative integer means "do not retry".
  if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms) || ms < 0) {
    return absl::Milliseconds(-1);
  }
  return absl::Milliseconds(ms);
}

namespace retry_grpc_internal {

void PrepareContext(grpc::ClientContext& ctx, const Attempt& a) {
  if (a.attempt_deadline != absl::InfiniteFuture()) {
    // Attempt deadlines are in the call's Clock time; gRPC needs real time. Carry over the time
    // left, which is what matters, so a fake clock in tests still yields a sane deadline.
    const absl::Duration left =
        a.attempt_deadline - (a.clock != nullptr ? a.clock->Now() : absl::Now());
    ctx.set_deadline(std::chrono::system_clock::now() +
                     absl::ToChronoNanoseconds(std::max(left, absl::ZeroDuration())));
  }
  ctx.AddMetadata(kIdempotencyKeyHeader, std::string(a.idempotency_key));
  if (a.previous_attempts() > 0) {
    ctx.AddMetadata(kPreviousAttemptsHeader, absl::StrCat(a.previous_attempts()));
  }
}

void ReadPushback(const grpc::ClientContext& ctx, Attempt& a) {
  a.pushback = ParseRetryPushback(ctx.GetServerTrailingMetadata());
}

}  // namespace retry_grpc_internal
}  // namespace retrybudget
