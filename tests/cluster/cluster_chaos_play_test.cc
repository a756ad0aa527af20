// The fleet tool's --cluster-chaos played against a real etcd cluster (tools/fleet/
// cluster_chaos.h): the etcd actions, and an owner that cannot be found. The server actions need
// the server's cluster mode; the launcher's own test covers kill / restart of a server.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_launcher.h"
#include "tools/fleet/cluster_chaos.h"

namespace retrybudget::fleet {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ClusterChaosTest, KillsTheEtcdLeaderStopsAllEtcdAndStartsThemAgain) {
  absl::StatusOr<std::unique_ptr<testing::ClusterUnderTest>> cluster =
      testing::ClusterUnderTest::Start(
          {.etcd = {.etcd_binary = RETRYBUDGET_ETCD_BIN}, .servers = 0});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::vector<ClusterAction>> plan =
      ParseClusterChaos("kill:owner@0.1,kill-etcd-leader@0.2,stop-etcd@1+0.5", 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> events;
  {
    ClusterChaos chaos(**cluster, *plan, "busy", std::chrono::steady_clock::now());
    // Every action is due within 1.5 s; starting etcd again waits for a leader.
    absl::SleepFor(absl::Seconds(1.5));
    events = chaos.Finish();
  }
  ASSERT_EQ(events.size(), 4u) << ::testing::PrintToString(events);
  EXPECT_THAT(events[0], HasSubstr("no owner of 'busy' to hit"));
  EXPECT_THAT(events[1], HasSubstr("kill -9 etcd leader (member "));
  EXPECT_THAT(events[2], HasSubstr("kill -9 all etcd"));
  EXPECT_THAT(events[3], HasSubstr("start all etcd"));
  EXPECT_THAT(events[3], ::testing::Not(HasSubstr("FAILED")));
  absl::StatusOr<int64_t> revision = (*cluster)->EtcdRevision();
  EXPECT_TRUE(revision.ok()) << revision.status();
}

TEST(ClusterChaosTest, FinishUndoesAnEtcdStopStillInForce) {
  absl::StatusOr<std::unique_ptr<testing::ClusterUnderTest>> cluster =
      testing::ClusterUnderTest::Start(
          {.etcd = {.etcd_binary = RETRYBUDGET_ETCD_BIN}, .servers = 0});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::vector<ClusterAction>> plan = ParseClusterChaos("stop-etcd@0.1+60", 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ClusterChaos chaos(**cluster, *plan, "busy", std::chrono::steady_clock::now());
  absl::SleepFor(absl::Seconds(0.5));
  std::vector<std::string> events = chaos.Finish();
  ASSERT_EQ(events.size(), 2u) << ::testing::PrintToString(events);
  EXPECT_THAT(events[1], HasSubstr("start all etcd"));
  EXPECT_TRUE((*cluster)->EtcdRevision().ok());
}

}  // namespace
}  // namespace retrybudget::fleet
