// The client in front of a cluster: tenants synced with the server that owns their shard,
// learnt from redirects (TenantError.owner), on a FakeClock through FakeCluster (several fake
// servers keyed by address). The server side of these answers is simulated here; the end-to-end
// tests with real servers on etcd live with the cluster tests (tests/cluster).
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "client/cpp/refresher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/clock.h"
#include "tests/client/fake_cluster.h"

namespace retrybudget {
namespace {

using client_internal::kMaxRedirectHops;
using testing_util::FakeCluster;

constexpr char kMain[] = "s1:7001";  // the server the client's target reaches
constexpr char kS2[] = "s2:7002";
constexpr char kS3[] = "s3:7003";

class RoutingTest : public ::testing::Test {
 protected:
  RoutingTest() {
    ClientOptions options;
    options.instance_id = "routing-test";
    options.refresh_period = absl::Milliseconds(200);
    options.min_sync_interval = absl::Milliseconds(5);
    options.clock = &clock_;
    client_ =
        CreateBudgetClientForTesting(options, cluster_.Stub(kMain), cluster_.Factory()).value();
  }

  // The tenant names in `request`.
  static std::vector<std::string> Tenants(const v1::SyncRequest& request) {
    std::vector<std::string> names;
    for (const v1::TenantSync& t : request.tenants()) names.push_back(t.tenant());
    return names;
  }

  FakeCluster cluster_;
  FakeClock clock_;
  std::unique_ptr<TestingBudgetClient> client_;
};

TEST_F(RoutingTest, RedirectedTenantIsSyncedWithItsOwnerInTheSameStep) {
  cluster_.SetOwner("a", kS2);
  TenantBudget* a = client_->Tenant("a").value();
  client_->RunOnce();
  ASSERT_EQ(cluster_.requests_to(kMain).size(), 1u);
  ASSERT_EQ(cluster_.requests_to(kS2).size(), 1u);
  EXPECT_THAT(Tenants(cluster_.requests_to(kS2)[0]), ::testing::ElementsAre("a"));
  EXPECT_TRUE(a->TryAcquire());
  EXPECT_EQ(a->Stats().mode, BudgetMode::kLease);

  // Later refreshes go to the owner only.
  clock_.Advance(absl::Milliseconds(200));
  client_->RunOnce();
  EXPECT_EQ(cluster_.requests_to(kMain).size(), 1u);
  EXPECT_EQ(cluster_.requests_to(kS2).size(), 2u);
}

TEST_F(RoutingTest, OneSyncPerOwnerPerRefreshWithThatOwnersTenants) {
  cluster_.SetOwner("a", kMain);
  cluster_.SetOwner("b", kS2);
  cluster_.SetOwner("c", kS3);
  cluster_.SetOwner("d", kS2);
  for (const char* name : {"a", "b", "c", "d"}) ASSERT_TRUE(client_->Tenant(name).ok());
  client_->RunOnce();
  clock_.Advance(absl::Milliseconds(200));
  const size_t before = cluster_.received().size();
  client_->RunOnce();
  const std::vector<FakeCluster::Received> all = cluster_.received();
  std::map<std::string, std::vector<std::string>> step;
  for (size_t i = before; i < all.size(); ++i) {
    ASSERT_FALSE(step.contains(all[i].address)) << "two Syncs to " << all[i].address;
    step[all[i].address] = Tenants(all[i].request);
  }
  EXPECT_THAT(
      step, ::testing::UnorderedElementsAre(::testing::Pair(kMain, ::testing::ElementsAre("a")),
                                            ::testing::Pair(kS2, ::testing::ElementsAre("b", "d")),
                                            ::testing::Pair(kS3, ::testing::ElementsAre("c"))));
}

TEST_F(RoutingTest, SeqIncreasesAcrossEveryServer) {
  cluster_.SetOwner("a", kMain);
  cluster_.SetOwner("b", kS2);
  cluster_.SetOwner("c", kS3);
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(client_->Tenant(name).ok());
  for (int i = 0; i < 5; ++i) {
    client_->RunOnce();
    clock_.Advance(absl::Milliseconds(200));
  }
  ASSERT_TRUE(client_->Shutdown().ok());
  uint64_t last = 0;
  for (const FakeCluster::Received& r : cluster_.received()) {
    EXPECT_GT(r.request.seq(), last) << "to " << r.address;
    last = r.request.seq();
  }
}

TEST_F(RoutingTest, FinalSyncReachesEveryOwner) {
  cluster_.SetOwner("a", kMain);
  cluster_.SetOwner("b", kS2);
  cluster_.SetOwner("c", kS3);
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(client_->Tenant(name).ok());
  client_->RunOnce();
  ASSERT_TRUE(client_->Shutdown().ok());
  for (const auto& [address, tenant] :
       std::vector<std::pair<std::string, std::string>>{{kMain, "a"}, {kS2, "b"}, {kS3, "c"}}) {
    const std::vector<v1::SyncRequest> requests = cluster_.requests_to(address);
    ASSERT_FALSE(requests.empty()) << address;
    EXPECT_TRUE(requests.back().final()) << address;
    EXPECT_THAT(Tenants(requests.back()), ::testing::ElementsAre(tenant)) << address;
  }
}

TEST_F(RoutingTest, ShardWithoutOwnerKeepsTheLeaseThenFallsBack) {
  cluster_.SetOwner("a", kS2);
  TenantBudget* a = client_->Tenant("a").value();
  client_->RunOnce();  // leased by s2 for 1 s
  ASSERT_EQ(a->Stats().mode, BudgetMode::kLease);
  cluster_.SetOwner("a", "");  // s2 lost the shard; no owner yet
  clock_.Advance(absl::Milliseconds(200));
  client_->RunOnce();
  EXPECT_EQ(a->Stats().mode, BudgetMode::kLease);
  EXPECT_TRUE(a->TryAcquire());
  // The lease runs out: the fallback share, never fail open. Asked again on the main target.
  const size_t main_before = cluster_.requests_to(kMain).size();
  clock_.Advance(absl::Milliseconds(801));
  client_->RunOnce();
  EXPECT_EQ(a->Stats().mode, BudgetMode::kFallback);
  EXPECT_GT(cluster_.requests_to(kMain).size(), main_before);
  // A new owner: the main target redirects there and the tenant is leased again.
  cluster_.SetOwner("a", kS3);
  clock_.Advance(absl::Milliseconds(200));
  client_->RunOnce();
  EXPECT_EQ(a->Stats().mode, BudgetMode::kLease);
  EXPECT_FALSE(cluster_.requests_to(kS3).empty());
}

TEST_F(RoutingTest, ASpentLeaseWhoseShardHasNoOwnerFallsBackOnlyOnceThatLastsARefreshPeriod) {
  cluster_.SetOwner("a", kS2);
  TenantBudget* a = client_->Tenant("a").value();
  client_->RunOnce();  // leased by s2 for 1 s
  ASSERT_EQ(a->Stats().mode, BudgetMode::kLease);
  while (a->TryAcquire()) {
  }
  cluster_.SetOwner("a", "");  // no owner for a moment (shards moving)
  clock_.Advance(absl::Milliseconds(10));
  client_->RunOnce();
  // Parked, but not down yet: a shard without an owner for a moment opens no fallback bucket.
  EXPECT_EQ(a->Stats().mode, BudgetMode::kLease);
  EXPECT_EQ(a->Stats().fallback_allowed, 0u);
  // Still without an owner a refresh period later: a failover, and the spent lease falls back
  // long before its expiry (1 s).
  clock_.Advance(absl::Milliseconds(200));
  client_->RunOnce();
  EXPECT_EQ(a->Stats().mode, BudgetMode::kFallback);
}

TEST_F(RoutingTest, RedirectLoopIsBoundedPerRefresh) {
  cluster_.SetOwner("a", kS2);
  cluster_.SetClaim(kS2, "a", kMain);  // s1 says s2, s2 says s1
  TenantBudget* a = client_->Tenant("a").value();
  // Step as the refresher thread would, for one refresh period.
  const absl::Time start = clock_.Now();
  while (clock_.Now() < start + absl::Milliseconds(190)) {
    const absl::Time next = client_->RunOnce();
    ASSERT_GT(next, clock_.Now()) << "a busy loop";
    clock_.Advance(std::min(next, start + absl::Milliseconds(190)) - clock_.Now());
  }
  // The first Sync and kMaxRedirectHops redirects followed; then the tenant is parked.
  EXPECT_EQ(cluster_.received().size(), static_cast<size_t>(kMaxRedirectHops + 1));
  EXPECT_EQ(a->Stats().mode, BudgetMode::kFallback);  // no owner grants: the fallback share
}

TEST_F(RoutingTest, UnreachableOwnerSendsItsTenantsBackToTheMainTarget) {
  cluster_.SetOwner("a", kS2);
  TenantBudget* a = client_->Tenant("a").value();
  client_->RunOnce();
  ASSERT_EQ(a->Stats().mode, BudgetMode::kLease);
  cluster_.SetDown(kS2, true);  // s2 dies; s3 takes the shard over
  cluster_.SetOwner("a", kS3);
  for (int i = 0; i < 20 && cluster_.requests_to(kS3).empty(); ++i) {
    clock_.Advance(absl::Milliseconds(50));
    client_->RunOnce();
  }
  // Resent unchanged to s2 while it failed, then back to the main target, redirected to s3.
  const std::vector<v1::SyncRequest> to_s2 = cluster_.requests_to(kS2);
  ASSERT_GE(to_s2.size(), 3u);
  EXPECT_EQ(to_s2[1].seq(), to_s2[2].seq());
  ASSERT_FALSE(cluster_.requests_to(kS3).empty());
  EXPECT_EQ(a->Stats().mode, BudgetMode::kLease);
}

}  // namespace
}  // namespace retrybudget
