#include "tests/integration/test_server.h"

#include <chrono>
#include <utility>

#include "gtest/gtest.h"

namespace retrybudget::testing {
namespace {

void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

}  // namespace

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
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);  // let oversize requests reach the server's limit
  t->channel_ = grpc::CreateCustomChannel(t->address(), grpc::InsecureChannelCredentials(), args);
  t->budget_stub_ = v1::RetryBudgetService::NewStub(t->channel_);
  t->admin_stub_ = v1::BudgetAdminService::NewStub(t->channel_);
  return t;
}

TestServer::~TestServer() {
  if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
}

grpc::Status TestServer::Sync(const v1::SyncRequest& request, v1::SyncResponse* response) {
  grpc::ClientContext context;
  SetDeadline(context);
  return budget_stub_->Sync(&context, request, response);
}

grpc::Status TestServer::GetBudget(absl::string_view tenant, v1::BudgetStatus* budget) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetBudgetRequest request;
  request.set_tenant(std::string(tenant));
  v1::GetBudgetResponse response;
  grpc::Status status = admin_stub_->GetBudget(&context, request, &response);
  *budget = response.budget();
  return status;
}

grpc::Status TestServer::ListBudgets(const v1::ListBudgetsRequest& request,
                                     v1::ListBudgetsResponse* response) {
  grpc::ClientContext context;
  SetDeadline(context);
  return admin_stub_->ListBudgets(&context, request, response);
}

grpc::Status TestServer::PutPolicy(absl::string_view tenant, const v1::BudgetPolicy& policy,
                                   v1::BudgetStatus* budget) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::PutPolicyRequest request;
  request.set_tenant(std::string(tenant));
  *request.mutable_policy() = policy;
  v1::PutPolicyResponse response;
  grpc::Status status = admin_stub_->PutPolicy(&context, request, &response);
  *budget = response.budget();
  return status;
}

grpc::Status TestServer::DeleteBudget(absl::string_view tenant) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::DeleteBudgetRequest request;
  request.set_tenant(std::string(tenant));
  v1::DeleteBudgetResponse response;
  return admin_stub_->DeleteBudget(&context, request, &response);
}

}  // namespace retrybudget::testing
