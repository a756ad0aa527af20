#include "tests/integration/test_server.h"

#include <utility>

#include "gtest/gtest.h"

namespace retrybudget::testing {
std::unique_ptr<TestServer> TestServer::Start(TestServerOptions options) {
  std::unique_ptr<TestServer> t(new TestServer());
  auto core = BudgetCore::Create({.policy = std::move(options.policy),
                                  .clock = options.real_clock ? Clock::Real() : &t->clock_});
  if (!core.ok()) {
    ADD_FAILURE() << "BudgetCore::Create: " << core.status();
    return nullptr;
  }
  t->core_ = *std::move(core);
  auto server = BudgetServer::Start(
      {.listen = "127.0.0.1:0",
       .max_message_bytes = options.max_message_bytes,
       .service = {.core = t->core_.get(),
                   .authorizer = options.authorizer,
                   .metrics = options.metrics,
                   .testonly_sync_response_delay = options.sync_response_delay}});
  if (!server.ok()) {
    ADD_FAILURE() << "BudgetServer::Start: " << server.status();
    return nullptr;
  }
  t->server_ = *std::move(server);
  t->connection_ =
      ServerConnection::Create(t->address(), grpc::InsecureChannelCredentials());
  return t;
}

TestServer::~TestServer() {
  if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
}

grpc::Status TestServer::Sync(const v1::SyncRequest& request, v1::SyncResponse* response) {
  return connection_.Sync(request, response);
}

grpc::Status TestServer::GetBudget(absl::string_view tenant, v1::BudgetStatus* budget) {
  return connection_.GetBudget(tenant, budget);
}

grpc::Status TestServer::ListBudgets(const v1::ListBudgetsRequest& request,
                                     v1::ListBudgetsResponse* response) {
  return connection_.ListBudgets(response, request);
}

grpc::Status TestServer::PutPolicy(absl::string_view tenant, const v1::BudgetPolicy& policy,
                                   v1::BudgetStatus* budget) {
  return connection_.PutPolicy(tenant, policy, budget);
}

grpc::Status TestServer::DeleteBudget(absl::string_view tenant) {
  return connection_.DeleteBudget(tenant);
}

}  // namespace retrybudget::testing
