// The public factories of the client library.
#include "retrybudget/client.h"

#include <memory>
#include <utility>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget {

absl::StatusOr<std::unique_ptr<BudgetClient>> BudgetClient::Create(ClientOptions options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("options.target is empty; expected e.g. 127.0.0.1:50051");
  }
  absl::StatusOr<ClientOptions> valid = client_internal::ValidateAndDefault(std::move(options));
  if (!valid.ok()) return valid.status();
  // One channel per client; gRPC connects lazily, so Create() does not wait for the server.
  // Insecure only when no credentials are given (loopback, tests); production passes TLS.
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      valid->channel_credentials != nullptr ? valid->channel_credentials
                                            : grpc::InsecureChannelCredentials();
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(valid->target, credentials);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.target \"", valid->target, "\": cannot create a channel"));
  }
  absl::StatusOr<std::unique_ptr<client_internal::BudgetClientImpl>> client =
      client_internal::NewBudgetClientImpl(*valid, v1::RetryBudgetService::NewStub(channel));
  if (!client.ok()) return client.status();
  (*client)->Start();
  return std::unique_ptr<BudgetClient>(*std::move(client));
}

absl::StatusOr<std::unique_ptr<TestingBudgetClient>> CreateBudgetClientForTesting(
    ClientOptions options, std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
    bool start_refresher_thread) {
  if (stub == nullptr) return absl::InvalidArgumentError("stub is null");
  absl::StatusOr<ClientOptions> valid = client_internal::ValidateAndDefault(std::move(options));
  if (!valid.ok()) return valid.status();
  absl::StatusOr<std::unique_ptr<client_internal::BudgetClientImpl>> client =
      client_internal::NewBudgetClientImpl(*valid, std::move(stub));
  if (!client.ok()) return client.status();
  if (start_refresher_thread) (*client)->Start();
  return std::unique_ptr<TestingBudgetClient>(*std::move(client));
}

}  // namespace retrybudget
