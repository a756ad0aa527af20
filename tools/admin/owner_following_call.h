// One admin call about one tenant (GetBudget, DeleteBudget, PutPolicy) that finds the tenant's
// owner in cluster mode: a server that does not own the tenant answers FAILED_PRECONDITION with
// the trailing metadata `retry-budget-owner: HOST:PORT` (retrybudget/owner_redirect.h), and the
// call is sent again there (at most `max_hops` times); UNAVAILABLE (the shard has no owner now,
// or the owner just died) is retried from the first target with exponential backoff until
// `unavailable_for` has passed. Against a single server it is the plain call. budgetctl and
// retry-budget-fleet make their admin calls through it.
//
//   FollowedCall r = CallFollowingOwner(
//       *stub, InsecureOwnerStubs(), [](grpc::ClientContext& c) { c.set_deadline(...); },
//       [&](AdminStub& s, grpc::ClientContext& c) { return s.GetBudget(&c, request, &response); });
//   if (!r.status.ok()) ...;   // r.answered_by: "" (the first target) or the owner's address
#ifndef RETRYBUDGET_TOOLS_ADMIN_OWNER_FOLLOWING_CALL_H_
#define RETRYBUDGET_TOOLS_ADMIN_OWNER_FOLLOWING_CALL_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget::admin {

using AdminStub = v1::BudgetAdminService::StubInterface;
// Makes the stub for an owner's address (HOST:PORT), with the caller's credentials.
using AdminStubFactory = std::function<std::unique_ptr<AdminStub>(const std::string& address)>;
// Prepares the context of one attempt (deadline, metadata). Called once per attempt.
using ContextSetup = std::function<void(grpc::ClientContext&)>;
// One attempt of the call on `stub`.
using AdminAttempt = std::function<grpc::Status(AdminStub& stub, grpc::ClientContext& context)>;

struct FollowOptions {
  // Most redirects followed in a row (a shard moving while we follow it may need two).
  int max_hops = 3;
  // How long UNAVAILABLE is retried, from the first attempt; zero: not retried.
  absl::Duration unavailable_for = absl::Seconds(10);
  absl::Duration backoff_initial = absl::Milliseconds(50);
  absl::Duration backoff_max = absl::Seconds(1);
};

struct FollowedCall {
  grpc::Status status;       // the last attempt's
  std::string answered_by;   // "" : the first target; else the owner's address that answered
  int hops = 0;              // redirects followed by the last round
  int unavailable_retries = 0;
};

// The owner's address in the trailing metadata of a finished call, nullopt for none.
std::optional<std::string> OwnerFromTrailers(const grpc::ClientContext& context);

// Stubs over insecure channels (the fleet tool on loopback).
AdminStubFactory InsecureOwnerStubs();
// Stubs over channels with `credentials`.
AdminStubFactory OwnerStubsWith(std::shared_ptr<grpc::ChannelCredentials> credentials);

// Runs `attempt` against `first`, following the owner and waiting out UNAVAILABLE as above.
// Blocks; thread-compatible (the stubs it makes live for the call only).
FollowedCall CallFollowingOwner(AdminStub& first, const AdminStubFactory& owner_stubs,
                                const ContextSetup& setup, const AdminAttempt& attempt,
                                const FollowOptions& options = {});

}  // namespace retrybudget::admin

#endif  // RETRYBUDGET_TOOLS_ADMIN_OWNER_FOLLOWING_CALL_H_
