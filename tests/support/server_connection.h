// A test's connection to a budget server, in-process (tests/integration TestServer) or a child
// process (ServerUnderTest, ServerProcess): both stubs over one channel, a deadline and an
// optional bearer token on each call. Client side only: linking it does not link the server.
//
//   ServerConnection admin = ServerConnection::Create(address, grpc::InsecureChannelCredentials());
//   grpc::Status put = admin.PutPolicy("payments", policy);
//   v1::BudgetStatus budget;
//   grpc::Status got = admin.GetBudget("payments", &budget);
#ifndef RETRYBUDGET_TESTS_SUPPORT_SERVER_CONNECTION_H_
#define RETRYBUDGET_TESTS_SUPPORT_SERVER_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget::testing {

// A connection to a server: both stubs over one channel, an optional bearer token on each call.
struct ServerConnection {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::RetryBudgetService::Stub> budget;
  std::unique_ptr<v1::BudgetAdminService::Stub> admin;
  std::string bearer_token;  // empty: no authorization metadata
  absl::Duration deadline = absl::Seconds(10);
  // Wait (within the deadline) for a server that is not reachable yet, e.g. one restarting,
  // instead of failing the call at once with UNAVAILABLE.
  bool wait_for_ready = false;

  static ServerConnection Create(const std::string& target,
                                 std::shared_ptr<grpc::ChannelCredentials> credentials,
                                 std::string bearer_token = "");

  grpc::Status Sync(const v1::SyncRequest& request, v1::SyncResponse* response);
  grpc::Status GetBudget(absl::string_view tenant, v1::BudgetStatus* budget);
  // `budget` (may be null) receives the budget as the policy left it.
  grpc::Status PutPolicy(absl::string_view tenant, const v1::BudgetPolicy& policy,
                         v1::BudgetStatus* budget = nullptr);
  grpc::Status ListBudgets(v1::ListBudgetsResponse* response,
                           const v1::ListBudgetsRequest& request = {});
  grpc::Status DeleteBudget(absl::string_view tenant);

 private:
  void Prepare(grpc::ClientContext& context) const;
};

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_SUPPORT_SERVER_CONNECTION_H_
