#include "tests/support/server_connection.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace retrybudget::testing {

ServerConnection ServerConnection::Create(const std::string& target,
                                          std::shared_ptr<grpc::ChannelCredentials> credentials,
                                          std::string bearer_token) {
  ServerConnection c;
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);  // let oversize requests reach the server's limit
  c.channel = grpc::CreateCustomChannel(target, std::move(credentials), args);
  c.budget = v1::RetryBudgetService::NewStub(c.channel);
  c.admin = v1::BudgetAdminService::NewStub(c.channel);
  c.bearer_token = std::move(bearer_token);
  return c;
}

void ServerConnection::Prepare(grpc::ClientContext& context) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  context.set_wait_for_ready(wait_for_ready);
  if (!bearer_token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", bearer_token));
  }
}

grpc::Status ServerConnection::Sync(const v1::SyncRequest& request, v1::SyncResponse* response) {
  grpc::ClientContext context;
  Prepare(context);
  return budget->Sync(&context, request, response);
}

grpc::Status ServerConnection::GetBudget(absl::string_view tenant, v1::BudgetStatus* budget) {
  grpc::ClientContext context;
  Prepare(context);
  v1::GetBudgetRequest request;
  request.set_tenant(std::string(tenant));
  v1::GetBudgetResponse response;
  grpc::Status status = admin->GetBudget(&context, request, &response);
  *budget = response.budget();
  return status;
}

grpc::Status ServerConnection::PutPolicy(absl::string_view tenant, const v1::BudgetPolicy& policy,
                                         v1::BudgetStatus* budget) {
  grpc::ClientContext context;
  Prepare(context);
  v1::PutPolicyRequest request;
  request.set_tenant(std::string(tenant));
  *request.mutable_policy() = policy;
  v1::PutPolicyResponse response;
  grpc::Status status = admin->PutPolicy(&context, request, &response);
  if (budget != nullptr) *budget = response.budget();
  return status;
}

grpc::Status ServerConnection::ListBudgets(v1::ListBudgetsResponse* response,
                                           const v1::ListBudgetsRequest& request) {
  grpc::ClientContext context;
  Prepare(context);
  return admin->ListBudgets(&context, request, response);
}

grpc::Status ServerConnection::DeleteBudget(absl::string_view tenant) {
  grpc::ClientContext context;
  Prepare(context);
  v1::DeleteBudgetRequest request;
  request.set_tenant(std::string(tenant));
  v1::DeleteBudgetResponse response;
  return admin->DeleteBudget(&context, request, &response);
}

}  // namespace retrybudget::testing
