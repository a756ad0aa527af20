// The launcher of a cluster under test, against the real etcd binary: it starts three nodes with
// a leader, kills the leader so that the other two elect a new one, and stops and restarts every
// node with its data.
#include "tests/support/test_cluster.h"

#include <filesystem>

#include "etcd/etcd_client.h"
#include "gtest/gtest.h"

namespace retrybudget::testing {
namespace {

TestClusterOptions Options() { return {.etcd_binary = RETRYBUDGET_ETCD_BIN}; }

TEST(TestClusterTest, StartsThreeNodesWithALeaderThatServeWrites) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(Options());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ((*cluster)->etcd_node_count(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE((*cluster)->etcd_running(i)) << i;

  auto etcd = etcd::EtcdClient::Create({.endpoints = (*cluster)->etcd_endpoints()});
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  ASSERT_TRUE((*etcd)->Put("/k", "v").ok());
  absl::StatusOr<etcd::RangeResult> got = (*etcd)->Get("/k");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "v");
}

TEST(TestClusterTest, KillingTheLeaderLeavesTwoNodesThatElectAnother) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(Options());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<int> killed = (*cluster)->KillEtcdLeader();
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_FALSE((*cluster)->etcd_running(*killed));

  absl::StatusOr<int> leader = (*cluster)->WaitForEtcdLeader(absl::Seconds(20));
  ASSERT_TRUE(leader.ok()) << leader.status();
  EXPECT_NE(*leader, *killed);

  ASSERT_TRUE((*cluster)->RestartEtcdNode(*killed).ok());
  EXPECT_TRUE((*cluster)->etcd_running(*killed));
}

TEST(TestClusterTest, StoppedAndRestartedNodesKeepTheirData) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster = TestCluster::Start(Options());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto etcd = etcd::EtcdClient::Create(
      {.endpoints = (*cluster)->etcd_endpoints(), .call_timeout = absl::Seconds(1)});
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  ASSERT_TRUE((*etcd)->Put("/kept", "yes").ok());

  ASSERT_TRUE((*cluster)->StopAllEtcd().ok());
  for (int i = 0; i < 3; ++i) EXPECT_FALSE((*cluster)->etcd_running(i)) << i;
  EXPECT_FALSE((*etcd)->Get("/kept").ok());

  ASSERT_TRUE((*cluster)->StartAllEtcd().ok());
  absl::StatusOr<etcd::RangeResult> got = (*etcd)->Get("/kept");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "yes");
}

TEST(TestClusterTest, RemovesItsDirectoryWhenDestroyed) {
  std::string dir;
  {
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start({.etcd_nodes = 1, .etcd_binary = RETRYBUDGET_ETCD_BIN});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    dir = (*cluster)->dir();
    EXPECT_TRUE(std::filesystem::exists(dir));
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(TestClusterTest, MissingBinaryIsNotFound) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.etcd_binary = "/nonexistent/etcd"});
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace retrybudget::testing
