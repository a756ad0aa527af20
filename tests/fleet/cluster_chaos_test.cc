// The --cluster-chaos schedule of the fleet tool (tools/fleet/cluster_chaos.h): what it accepts,
// and what it refuses with the action named. Playing it against a real cluster needs the
// server's cluster mode (tests/cluster/test_launcher_test.cc covers the launcher's actions).
#include "tools/fleet/cluster_chaos.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace retrybudget::fleet {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Kind = ClusterAction::Kind;

TEST(ParseClusterChaosTest, ReadsEveryActionWithItsServerTimeAndDuration) {
  absl::StatusOr<std::vector<ClusterAction>> plan = ParseClusterChaos(
      "kill:owner@3+2, stop:1@4+1.5,restart:2@9,kill-etcd-leader@6,stop-etcd@8+3,kill:0@1", 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre(ClusterAction{Kind::kKill, -1, 3, 2},
                                 ClusterAction{Kind::kStop, 1, 4, 1.5},
                                 ClusterAction{Kind::kRestart, 2, 9, std::nullopt},
                                 ClusterAction{Kind::kKillEtcdLeader, -1, 6, std::nullopt},
                                 ClusterAction{Kind::kStopEtcd, -1, 8, 3},
                                 ClusterAction{Kind::kKill, 0, 1, std::nullopt}));
}

TEST(ParseClusterChaosTest, EmptyIsNoAction) {
  absl::StatusOr<std::vector<ClusterAction>> plan = ParseClusterChaos("", 3);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->empty());
}

TEST(ParseClusterChaosTest, RefusesWhatItCannotPlayNamingTheAction) {
  for (const char* bad : {"kill:owner", "kill:3@1", "kill:x@1", "stop:0@1", "restart:0@1+2",
                          "explode@1", "kill-etcd-leader:0@1", "kill:0@-1", "kill:0@1+z"}) {
    absl::StatusOr<std::vector<ClusterAction>> plan = ParseClusterChaos(bad, 3);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(plan.status().message(), HasSubstr(bad)) << bad;
  }
}

TEST(ParseClusterChaosTest, ReadsTheEtcdMemberAndQuorumActions) {
  absl::StatusOr<std::vector<ClusterAction>> plan =
      ParseClusterChaos("restart-etcd:2@4,stop-etcd:1@5+3,lose-quorum@7+10,stop-etcd@9", 3, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre(ClusterAction{Kind::kRestartEtcdMember, 2, 4, std::nullopt},
                                 ClusterAction{Kind::kStopEtcdMember, 1, 5, 3},
                                 ClusterAction{Kind::kLoseQuorum, -1, 7, 10},
                                 ClusterAction{Kind::kStopEtcd, -1, 9, std::nullopt}));
  for (const char* bad : {"restart-etcd:3@1", "restart-etcd@1", "restart-etcd:0@1+2",
                          "stop-etcd:1@5", "stop-etcd:x@5+1", "lose-quorum@7",
                          "lose-quorum:1@7+1"}) {
    absl::StatusOr<std::vector<ClusterAction>> refused = ParseClusterChaos(bad, 3, 3);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr(bad)) << bad;
  }
}

TEST(ParseClusterChaosTest, ReadsARollingRestartWithAndWithoutItsGap) {
  absl::StatusOr<std::vector<ClusterAction>> plan =
      ParseClusterChaos("rolling-restart@6+4,rolling-restart@20", 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre(ClusterAction{Kind::kRollingRestart, -1, 6, 4},
                                 ClusterAction{Kind::kRollingRestart, -1, 20, std::nullopt}));
  EXPECT_FALSE(ParseClusterChaos("rolling-restart:1@6", 3).ok());
}

TEST(ParseClusterChaosTest, ReadsASigtermOfAServerWithAndWithoutItsRestart) {
  absl::StatusOr<std::vector<ClusterAction>> plan =
      ParseClusterChaos("term:owner@3+2,term:1@8", 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(*plan, ElementsAre(ClusterAction{Kind::kTerm, -1, 3, 2},
                                 ClusterAction{Kind::kTerm, 1, 8, std::nullopt}));
  for (const char* bad : {"term@1", "term:3@1", "term:x@1", "term:0@1+y"}) {
    absl::StatusOr<std::vector<ClusterAction>> refused = ParseClusterChaos(bad, 3);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr(bad)) << bad;
  }
}

// Tenants 0 and 1 owned by server 0, tenant 2 by server 1; server 0 killed at 5.
std::vector<OwnerSample> KillOfServerZero() {
  return {{.at = 0, .owners = {0, 0, 1}},
          {.at = 7.5, .owners = {kNoOwnerKey, kNoOwnerKey, 1}},
          {.at = 8.0, .owners = {2, kNoOwnerKey, 1}},
          {.at = 8.5, .owners = {2, 1, 1}}};
}

TEST(OwnerLossesTest, TheLongestWaitOfTheHitServersTenantsForANewOwnerAndTheirClients) {
  std::vector<OwnerLoss> losses =
      OwnerLosses(KillOfServerZero(), {{.at = 5, .server = 0, .what = "kill -9 server 0"}},
                  {{3.5, 8.2}, {3.8, 8.9}, {0.2, 1.0}});
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_EQ(losses[0].tenants, 2);
  EXPECT_THAT(losses[0].new_owner_after_seconds, ::testing::Optional(3.5));
  ASSERT_TRUE(losses[0].leases_back_after_owner_seconds.has_value());
  EXPECT_NEAR(*losses[0].leases_back_after_owner_seconds, 0.4, 1e-9);
  EXPECT_DOUBLE_EQ(MaxSecondsWithoutOwnerKey(KillOfServerZero(), 10), 1.0);
}

TEST(OwnerLossesTest, AClientGapElsewhereDoesNotCountAsLeasesBackLate) {
  // Tenant 0's longest gap (0.3 s) ended at 20, long after its new owner at 8: not this loss.
  std::vector<OwnerLoss> losses =
      OwnerLosses(KillOfServerZero(), {{.at = 5, .server = 0}}, {{0.3, 20}, {3.8, 8.9}});
  ASSERT_EQ(losses.size(), 1u);
  ASSERT_TRUE(losses[0].leases_back_after_owner_seconds.has_value());
  EXPECT_NEAR(*losses[0].leases_back_after_owner_seconds, 0.4, 1e-9);
}

TEST(OwnerLossesTest, ATenantThatNeverGotANewOwnerLeavesTheWaitUnset) {
  std::vector<OwnerSample> samples = {{.at = 0, .owners = {0}},
                                      {.at = 6, .owners = {kNoOwnerKey}}};
  std::vector<OwnerLoss> losses = OwnerLosses(samples, {{.at = 5, .server = 0}}, {{}});
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_EQ(losses[0].tenants, 1);
  EXPECT_FALSE(losses[0].new_owner_after_seconds.has_value());
  EXPECT_DOUBLE_EQ(MaxSecondsWithoutOwnerKey(samples, 10), 4.0);
}

TEST(OwnerLossesTest, TheSameServerTakingItsShardBackAfterARestartIsANewOwner) {
  std::vector<OwnerSample> samples = {{.at = 0, .owners = {1}},
                                      {.at = 2.2, .owners = {kNoOwnerKey}},
                                      {.at = 2.9, .owners = {1}}};
  std::vector<OwnerLoss> losses = OwnerLosses(samples, {{.at = 2, .server = 1}}, {{1.0, 3.0}});
  ASSERT_EQ(losses.size(), 1u);
  ASSERT_TRUE(losses[0].new_owner_after_seconds.has_value());
  EXPECT_NEAR(*losses[0].new_owner_after_seconds, 0.9, 1e-9);
}

}  // namespace
}  // namespace retrybudget::fleet
