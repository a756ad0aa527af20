// The fleet tool's --cluster-chaos played against a real etcd cluster (tools/fleet/
// cluster_chaos.h): the etcd actions, and an owner that cannot be found. The server actions need
// the server's cluster mode; the launcher's own test covers kill / restart of a server. The etcd
// member and quorum actions bring each member back with its data.
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

// One member restarted, one stopped and back, then a majority stopped and back: each with its
// data (the revision written before is still there), and quorum back when the action is done.
TEST(ClusterChaosTest, RestartsStopsEtcdMembersAndBringsTheQuorumBack) {
  absl::StatusOr<std::unique_ptr<testing::ClusterUnderTest>> cluster =
      testing::ClusterUnderTest::Start(
          {.etcd = {.etcd_binary = RETRYBUDGET_ETCD_BIN}, .servers = 0});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->etcd_client().Put("/chaos/kept", "1").ok());
  absl::StatusOr<std::vector<ClusterAction>> plan =
      ParseClusterChaos("restart-etcd:2@0.1,stop-etcd:1@0.5+0.5,lose-quorum@1.5+60", 0, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> events;
  {
    ClusterChaos chaos(**cluster, *plan, "busy", std::chrono::steady_clock::now());
    // The quorum is lost from 1.5 s until Finish() brings it back.
    absl::SleepFor(absl::Seconds(2));
    EXPECT_FALSE((*cluster)->EtcdRevision().ok()) << "etcd answered while a majority was down";
    events = chaos.Finish();
  }
  ASSERT_EQ(events.size(), 5u) << ::testing::PrintToString(events);
  EXPECT_THAT(events[0], HasSubstr("kill -9 etcd member 2, started again"));
  EXPECT_THAT(events[1], HasSubstr("kill -9 etcd member 1"));
  EXPECT_THAT(events[2], HasSubstr("start etcd member(s) 1"));
  EXPECT_THAT(events[3], HasSubstr("kill -9 etcd members 0,1 of 3 (no quorum)"));
  EXPECT_THAT(events[4], HasSubstr("start etcd member(s) 0,1, quorum back"));
  for (const std::string& e : events) EXPECT_THAT(e, ::testing::Not(HasSubstr("FAILED")));
  for (int m = 0; m < 3; ++m) EXPECT_TRUE((*cluster)->etcd().etcd_running(m)) << m;
  absl::StatusOr<etcd::RangeResult> kept = (*cluster)->etcd_client().Get("/chaos/kept");
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->kvs.size(), 1u);
  EXPECT_EQ(kept->kvs[0].value, "1");
}

}  // namespace
}  // namespace retrybudget::fleet
