#include "tools/admin/owner_following_call.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "retrybudget/owner_redirect.h"

namespace retrybudget::admin {

std::optional<std::string> OwnerFromTrailers(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(grpc::string_ref(kOwnerMetadataKey.data(), kOwnerMetadataKey.size()));
  if (it == trailers.end() || it->second.empty()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

AdminStubFactory InsecureOwnerStubs() {
  return OwnerStubsWith(grpc::InsecureChannelCredentials());
}

AdminStubFactory OwnerStubsWith(std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return [credentials = std::move(credentials)](const std::string& address) {
    return std::unique_ptr<AdminStub>(
        v1::BudgetAdminService::NewStub(grpc::CreateChannel(address, credentials)));
  };
}

FollowedCall CallFollowingOwner(AdminStub& first, const AdminStubFactory& owner_stubs,
                                const ContextSetup& setup, const AdminAttempt& attempt,
                                const FollowOptions& options) {
  const absl::Time give_up = absl::Now() + options.unavailable_for;
  absl::Duration backoff = options.backoff_initial;
  FollowedCall out;
  while (true) {
    // One round: the first target, then each owner it names.
    AdminStub* stub = &first;
    std::unique_ptr<AdminStub> owner_stub;
    out.answered_by.clear();
    out.hops = 0;
    while (true) {
      grpc::ClientContext context;
      if (setup) setup(context);
      out.status = attempt(*stub, context);
      if (out.status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) break;
      std::optional<std::string> owner = OwnerFromTrailers(context);
      if (!owner.has_value() || owner_stubs == nullptr || out.hops >= options.max_hops ||
          *owner == out.answered_by) {
        break;
      }
      owner_stub = owner_stubs(*owner);
      stub = owner_stub.get();
      out.answered_by = *owner;
      ++out.hops;
    }
    if (out.status.error_code() != grpc::StatusCode::UNAVAILABLE) return out;
    // No owner now, or the owner named is gone: start again from the first target.
    const absl::Time now = absl::Now();
    if (now + backoff > give_up) return out;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, options.backoff_max);
    ++out.unavailable_retries;
  }
}

}  // namespace retrybudget::admin
