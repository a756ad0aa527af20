// The public factories of the client library.
#include "retrybudget/client.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "client/cpp/client_impl.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget {
namespace {

// First wait before reconnecting (gRPC's default is 1 s): a restarted server is usually back
// within a few hundred milliseconds, and loopback or LAN refusals cost nothing.
constexpr int64_t kInitialReconnectBackoffMs = 100;
// Least time each connection attempt (TCP, TLS and HTTP/2 handshakes) is given. gRPC names it
// GRPC_ARG_MIN_RECONNECT_BACKOFF_MS but uses it as the connect timeout (default 20 s); it does
// not delay the next attempt after a refused connection, only bounds one that hangs (a host that
// drops SYNs). 1 s (or the reconnect backoff, if larger) leaves TLS over a WAN time to finish.
constexpr int64_t kMinConnectTimeoutMs = 1000;
// HTTP/2 keepalive: while a Sync is in flight, a connection that went dead silently (a
// partition, a vanished host) is closed after this long without traffic plus the timeout,
// instead of failing every Sync on it until TCP gives up (minutes). Only with calls in flight,
// and the refresher sends data at least every refresh_period, so the server's ping policy
// (pings without data at most every 5 minutes) is never crossed.
constexpr int kKeepaliveTimeMs = 20'000;
constexpr int kKeepaliveTimeoutMs = 10'000;

// The main channel's load balancing policy: round_robin, one connection to every address of the
// target (see ClientOptions::target). Owner channels name one address each and keep pick_first.
constexpr char kMainLbPolicy[] = "round_robin";

int ClampToInt(int64_t ms) {
  return static_cast<int>(std::clamp<int64_t>(ms, 1, std::numeric_limits<int>::max()));
}

grpc::ChannelArguments BudgetChannelArguments(const ClientOptions& options) {
  grpc::ChannelArguments args;
  const int64_t max_backoff_ms = absl::ToInt64Milliseconds(options.max_reconnect_backoff);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              ClampToInt(std::min(kInitialReconnectBackoffMs, max_backoff_ms)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ClampToInt(max_backoff_ms));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              ClampToInt(std::max(kMinConnectTimeoutMs, max_backoff_ms)));
  // The refresher resends a failed Sync itself, with the same seq (DESIGN.md, "Accounting");
  // gRPC's transparent retries would be a second, invisible layer under it.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  return args;
}

// `options` has been through ValidateAndDefault(). `lb_policy` empty: gRPC's default
// (pick_first).
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const ClientOptions& options,
                                                          const std::string& lb_policy) {
  // One channel per client; gRPC connects lazily, so Create() does not wait for the server.
  // Insecure only when no credentials are given (loopback, tests); production passes TLS.
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.channel_credentials != nullptr ? options.channel_credentials
                                             : grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args = BudgetChannelArguments(options);
  if (!lb_policy.empty()) args.SetLoadBalancingPolicyName(lb_policy);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.target, credentials, args);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.target \"", options.target, "\": cannot create a channel"));
  }
  return channel;
}

// Stubs for the owners a cluster redirects to: a channel per address, with the main target's
// credentials and arguments (a TLS certificate must then also name the owner's host).
client_internal::StubFactory OwnerStubs(const ClientOptions& options) {
  return [options](const std::string& address)
             -> std::unique_ptr<v1::RetryBudgetService::StubInterface> {
    ClientOptions owner = options;
    owner.target = address;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = NewChannel(owner, "");
    if (!channel.ok()) return nullptr;
    return v1::RetryBudgetService::NewStub(*channel);
  };
}

absl::Status CheckTarget(const ClientOptions& options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("options.target is empty; expected e.g. 127.0.0.1:50051");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BudgetClient>> BudgetClient::Create(ClientOptions options) {
  if (absl::Status target = CheckTarget(options); !target.ok()) return target;
  absl::StatusOr<ClientOptions> valid = client_internal::ValidateAndDefault(std::move(options));
  if (!valid.ok()) return valid.status();
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = NewChannel(*valid, kMainLbPolicy);
  if (!channel.ok()) return channel.status();
  absl::StatusOr<std::unique_ptr<client_internal::BudgetClientImpl>> client =
      client_internal::NewBudgetClientImpl(*valid, v1::RetryBudgetService::NewStub(*channel),
                                           OwnerStubs(*valid));
  if (!client.ok()) return client.status();
  (*client)->Start();
  return std::unique_ptr<BudgetClient>(*std::move(client));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateBudgetChannel(const ClientOptions& options) {
  if (absl::Status target = CheckTarget(options); !target.ok()) return target;
  absl::StatusOr<ClientOptions> valid = client_internal::ValidateAndDefault(options);
  if (!valid.ok()) return valid.status();
  return NewChannel(*valid, kMainLbPolicy);
}

absl::StatusOr<std::unique_ptr<TestingBudgetClient>> CreateBudgetClientForTesting(
    ClientOptions options, std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
    bool start_refresher_thread) {
  return CreateBudgetClientForTesting(std::move(options), std::move(stub), nullptr,
                                      start_refresher_thread);
}

absl::StatusOr<std::unique_ptr<TestingBudgetClient>> CreateBudgetClientForTesting(
    ClientOptions options, std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
    OwnerStubFactory owner_stubs, bool start_refresher_thread) {
  if (stub == nullptr) return absl::InvalidArgumentError("stub is null");
  absl::StatusOr<ClientOptions> valid = client_internal::ValidateAndDefault(std::move(options));
  if (!valid.ok()) return valid.status();
  absl::StatusOr<std::unique_ptr<client_internal::BudgetClientImpl>> client =
      client_internal::NewBudgetClientImpl(*valid, std::move(stub), std::move(owner_stubs));
  if (!client.ok()) return client.status();
  if (start_refresher_thread) (*client)->Start();
  return std::unique_ptr<TestingBudgetClient>(*std::move(client));
}

}  // namespace retrybudget
