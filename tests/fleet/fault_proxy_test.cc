// The fault proxy injects exactly the faults it is asked for, and counts them. The upstream is
// a recording fake of RetryBudgetService (in process, port 0); probabilities 0 or 1 make every
// case deterministic.
#include "tools/fleet/fault_proxy.h"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget::fleet {
namespace {

// Records every request; answers `stale` for a seq below the instance's highest, else grants
// what each tenant wants.
class RecordingUpstream final : public v1::RetryBudgetService::Service {
 public:
  grpc::Status Sync(grpc::ServerContext*, const v1::SyncRequest* request,
                    v1::SyncResponse* response) override {
    absl::MutexLock lock(&mu_);
    seen_.emplace_back(request->instance_id(), request->seq());
    uint64_t& highest = highest_[request->instance_id()];
    if (request->seq() < highest) {
      response->set_stale(true);
      return grpc::Status::OK;
    }
    highest = request->seq();
    for (const v1::TenantSync& t : request->tenants()) {
      v1::TenantGrant* g = response->add_tenants();
      g->set_tenant(t.tenant());
      g->set_granted(t.want());
    }
    return grpc::Status::OK;
  }

  std::vector<std::pair<std::string, uint64_t>> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::string, uint64_t>> seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> highest_ ABSL_GUARDED_BY(mu_);
};

class FaultProxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &upstream_port_);
    builder.RegisterService(&upstream_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(upstream_port_, 0);
  }
  void TearDown() override {
    if (proxy_) proxy_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now());
  }

  void StartProxy(FaultProxyOptions options) {
    options.upstream = absl::StrCat("127.0.0.1:", upstream_port_);
    auto proxy = FaultProxy::Start(std::move(options));
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = *std::move(proxy);
    stub_ = v1::RetryBudgetService::NewStub(
        grpc::CreateChannel(proxy_->address(), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Send(uint64_t seq, v1::SyncResponse* response, bool final = false) {
    v1::SyncRequest request;
    request.set_instance_id("i1");
    request.set_seq(seq);
    request.set_final(final);
    v1::TenantSync* t = request.add_tenants();
    t->set_tenant("t");
    t->set_want(3);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->Sync(&context, request, response);
  }

  RecordingUpstream upstream_;
  int upstream_port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<FaultProxy> proxy_;
  std::unique_ptr<v1::RetryBudgetService::Stub> stub_;
};

TEST_F(FaultProxyTest, WithoutFaultsForwardsOnceAndReturnsTheServersAnswer) {
  StartProxy({});
  v1::SyncResponse response;
  ASSERT_TRUE(Send(1, &response).ok());
  ASSERT_EQ(response.tenants_size(), 1);
  EXPECT_EQ(response.tenants(0).granted(), 3u);
  EXPECT_EQ(upstream_.seen().size(), 1u);
  FaultCounters c = proxy_->counters();
  EXPECT_EQ(c.proxied_requests, 1u);
  EXPECT_EQ(c.dropped_responses + c.duplicated_requests + c.replayed_requests, 0u);
}

TEST_F(FaultProxyTest, DroppedResponseWasAppliedUpstreamButTheClientSeesUnavailable) {
  StartProxy({.drop_response = 1});
  v1::SyncResponse response;
  grpc::Status s = Send(1, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(upstream_.seen().size(), 1u);
  EXPECT_EQ(proxy_->counters().dropped_responses, 1u);
}

TEST_F(FaultProxyTest, DuplicatedRequestReachesTheServerTwice) {
  StartProxy({.duplicate_request = 1});
  v1::SyncResponse response;
  ASSERT_TRUE(Send(1, &response).ok());
  auto seen = upstream_.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(proxy_->counters().duplicated_requests, 1u);
}

TEST_F(FaultProxyTest, ReplaySendsAnOlderRequestAfterTheNewerOneAndCountsItStale) {
  StartProxy({.replay_old = 1});
  v1::SyncResponse response;
  ASSERT_TRUE(Send(1, &response).ok());  // nothing older to replay yet
  ASSERT_TRUE(Send(2, &response).ok());
  auto seen = upstream_.seen();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].second, 2u);
  EXPECT_EQ(seen[2].second, 1u);  // the old one, after the newer
  FaultCounters c = proxy_->counters();
  EXPECT_EQ(c.replayed_requests, 1u);
  EXPECT_EQ(c.replays_stale, 1u);
  EXPECT_EQ(c.replay_granted_tokens, 0u);
}

TEST_F(FaultProxyTest, FinalRequestIsNeverReplayedAndEndsTheHistory) {
  StartProxy({.replay_old = 1});
  v1::SyncResponse response;
  ASSERT_TRUE(Send(1, &response).ok());
  ASSERT_TRUE(Send(2, &response, /*final=*/true).ok());
  EXPECT_EQ(upstream_.seen().size(), 2u);
  EXPECT_EQ(proxy_->counters().replayed_requests, 0u);
}

TEST(FaultProxyOptionsTest, RefusesProbabilitiesOutsideZeroToOne) {
  auto proxy = FaultProxy::Start({.upstream = "127.0.0.1:1", .duplicate_request = 1.5});
  ASSERT_FALSE(proxy.ok());
  EXPECT_EQ(proxy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(proxy.status().message().find("--fault-duplicate-request"), std::string::npos);
}

}  // namespace
}  // namespace retrybudget::fleet
