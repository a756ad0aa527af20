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

}  // namespace
}  // namespace retrybudget::fleet
