// Channel credentials and the bearer token: every Sync carries `authorization: Bearer <token>`,
// through the mock stub's ClientContext and through a real channel to an in-process server.
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/client/client_test_util.h"

namespace retrybudget {
namespace {

using testing_util::ClientHarness;
using testing_util::Failing;
using testing_util::Granting;

TEST(ClientCredentialsTest, EverySyncCarriesTheBearerToken) {
  ClientOptions options = ClientHarness::DefaultOptions();
  options.bearer_token = "s3cret-token.for_payments";
  ClientHarness h(options);
  h.Tenant("payments");
  h.set_handler(Failing(grpc::StatusCode::UNAVAILABLE));
  h.clock().Set(h.client().RunOnce());  // a failed attempt, then its resend
  h.set_handler(Granting(1));
  h.client().RunOnce();
  ASSERT_EQ(h.sync_count(), 2u);
  const std::multimap<std::string, std::string> metadata = h.last_metadata();
  EXPECT_THAT(metadata, ::testing::Contains(::testing::Pair(
                            "authorization", "Bearer s3cret-token.for_payments")));
  EXPECT_EQ(metadata.count("authorization"), 1u);
  // The final Sync too.
  ASSERT_TRUE(h.client().Shutdown().ok());
  EXPECT_TRUE(h.last_request().final());
  EXPECT_EQ(h.last_metadata().count("authorization"), 1u);
}

TEST(ClientCredentialsTest, NoTokenNoAuthorizationMetadata) {
  ClientHarness h;
  h.Tenant("payments");
  h.set_handler(Granting(1));
  h.client().RunOnce();
  EXPECT_EQ(h.last_metadata().count("authorization"), 0u);
}

TEST(ClientCredentialsTest, MalformedTokensAreRefused) {
  for (const std::string& bad : {std::string("has space"), std::string("new\nline"),
                                 std::string("caf\xc3\xa9"), std::string(4097, 'a')}) {
    ClientOptions options;
    options.bearer_token = bad;
    const absl::Status status = BudgetClient::Create(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("bearer_token"));
  }
}

// A fake budget server that records the authorization metadata of each Sync.
class RecordingService final : public v1::RetryBudgetService::Service {
 public:
  grpc::Status Sync(grpc::ServerContext* context, const v1::SyncRequest* request,
                    v1::SyncResponse* response) override {
    std::string authorization;
    const auto& metadata = context->client_metadata();
    if (auto it = metadata.find("authorization"); it != metadata.end()) {
      authorization.assign(it->second.data(), it->second.size());
    }
    testing_util::GrantAll(*request, response, 1);
    std::lock_guard<std::mutex> lock(mu_);
    authorizations_.push_back(authorization);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  // The authorization of the first Sync; empty after 30 s without one (a safety net).
  std::optional<std::string> WaitForFirst() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [this] { return !authorizations_.empty(); })) {
      return std::nullopt;
    }
    return authorizations_.front();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> authorizations_;
};

TEST(ClientCredentialsTest, ARealChannelWithExplicitCredentialsSendsTheToken) {
  RecordingService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  ClientOptions options;
  options.target = "127.0.0.1:" + std::to_string(port);
  options.channel_credentials = grpc::InsecureChannelCredentials();  // loopback test only
  options.bearer_token = "tenant-a-token";
  absl::StatusOr<std::unique_ptr<BudgetClient>> client = BudgetClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Tenant("payments").ok());  // wakes the refresher: first Sync
  EXPECT_EQ(service.WaitForFirst(), "Bearer tenant-a-token");
  EXPECT_TRUE((*client)->Shutdown().ok());
  server->Shutdown();
}

}  // namespace
}  // namespace retrybudget
