// The launcher of servers and clusters under test (tests/support/test_launcher.h) against the
// real retry-budget-server binary and real etcd nodes.
#include "tests/support/test_launcher.h"

#include <signal.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_keys.h"
#include "cluster/shard_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

ServerUnderTestOptions Options() { return {.binary = RETRY_BUDGET_SERVER_BINARY}; }

TEST(ServerUnderTestTest, ServesOnThePortItReportsAndCapturesItsLog) {
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server = ServerUnderTest::Start(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), absl::StrCat("127.0.0.1:", (*server)->port()));
  EXPECT_TRUE((*server)->running());
  EXPECT_EQ((*server)->metrics_port(), 0);
  EXPECT_THAT((*server)->Log(), HasSubstr(absl::StrCat((*server)->port())));
}

TEST(ServerUnderTestTest, ReportsTheMetricsPortWhenAskedForMetrics) {
  ServerUnderTestOptions options = Options();
  options.metrics = true;
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server = ServerUnderTest::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->metrics_port(), 0);
  EXPECT_NE((*server)->metrics_port(), (*server)->port());
}

TEST(ServerUnderTestTest, RestartsOnTheSamePortAfterKill9) {
  ServerUnderTestOptions options = Options();
  options.data_dir = true;
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server = ServerUnderTest::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const pid_t first = (*server)->pid();
  ASSERT_TRUE((*server)->Kill().ok());
  EXPECT_FALSE((*server)->running());
  EXPECT_EQ((*server)->Restart().code(), absl::StatusCode::kOk);
  EXPECT_EQ((*server)->port(), port);
  EXPECT_NE((*server)->pid(), first);
  EXPECT_TRUE((*server)->running());
}

TEST(ServerUnderTestTest, PausedServerKeepsRunningAndResumes) {
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server = ServerUnderTest::Start(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Pause().ok());
  EXPECT_TRUE((*server)->running());
  ASSERT_TRUE((*server)->Resume().ok());
  EXPECT_TRUE((*server)->running());
}

TEST(ServerUnderTestTest, CleanStopExitsZero) {
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server = ServerUnderTest::Start(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<int> status = (*server)->Stop(SIGTERM, absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(ExitedWith(*status, 0)) << DescribeWaitStatus(*status);
  EXPECT_EQ((*server)->Restart().code(), absl::StatusCode::kOk);
}

TEST(ServerUnderTestTest, ServerThatCannotStartIsReportedWithItsLog) {
  ServerUnderTestOptions options = Options();
  options.flags = {"--no_such_flag_here"};
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server = ServerUnderTest::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(server.status().message(), HasSubstr("no_such_flag_here"));
}

TEST(ServerUnderTestTest, MissingBinaryIsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server =
      ServerUnderTest::Start({.binary = "/nonexistent/retry-budget-server"});
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MultiAddressTargetTest, JoinsSeveralAddressesForTheIpv4Resolver) {
  EXPECT_EQ(MultiAddressTarget({"127.0.0.1:1", "127.0.0.1:2"}), "ipv4:127.0.0.1:1,127.0.0.1:2");
  EXPECT_EQ(MultiAddressTarget({"127.0.0.1:1"}), "127.0.0.1:1");
}

ClusterUnderTestOptions EtcdOnly() {
  return {.etcd = {.etcd_binary = RETRYBUDGET_ETCD_BIN}, .servers = 0};
}

TEST(ClusterUnderTestTest, EtcdRevisionCountsWrites) {
  absl::StatusOr<std::unique_ptr<ClusterUnderTest>> cluster = ClusterUnderTest::Start(EtcdOnly());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<int64_t> before = (*cluster)->EtcdRevision();
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE((*cluster)->etcd_client().Put("/x", "1").ok());
  ASSERT_TRUE((*cluster)->etcd_client().Put("/x", "2").ok());
  absl::StatusOr<int64_t> after = (*cluster)->EtcdRevision();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after - *before, 2);
}

TEST(ClusterUnderTestTest, OwnerOfReadsTheOwnerKeyOfTheTenantsShard) {
  absl::StatusOr<std::unique_ptr<ClusterUnderTest>> cluster = ClusterUnderTest::Start(EtcdOnly());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string prefix = (*cluster)->etcd_prefix();
  etcd::EtcdClient& etcd = (*cluster)->etcd_client();
  EXPECT_EQ((*cluster)->OwnerOf("payments").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(etcd.Put(cluster::ShardCountKey(prefix), "16").ok());
  const int shard = cluster::ShardMap(16).ShardOf("payments");
  absl::StatusOr<int> owner = (*cluster)->OwnerOf("payments");
  EXPECT_EQ(owner.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(owner.status().message(), HasSubstr("has no owner"));
  ASSERT_TRUE(etcd.Put(cluster::ShardOwnerKey(prefix, shard), "server-a").ok());
  ASSERT_TRUE(etcd.Put(cluster::ServerKey(prefix, "server-a"), "127.0.0.1:1").ok());
  owner = (*cluster)->OwnerOf("payments");
  // The owner advertises an address that is none of this cluster's (it has no servers).
  EXPECT_EQ(owner.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(owner.status().message(), HasSubstr("127.0.0.1:1"));
}

TEST(ClusterUnderTestTest, EtcdLeaderKillAndFullStopComeBack) {
  absl::StatusOr<std::unique_ptr<ClusterUnderTest>> cluster = ClusterUnderTest::Start(EtcdOnly());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<int> killed = (*cluster)->KillEtcdLeader();
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_FALSE((*cluster)->etcd().etcd_running(*killed));
  ASSERT_TRUE((*cluster)->StopAllEtcd().ok());
  ASSERT_TRUE((*cluster)->StartAllEtcd().ok());
  absl::StatusOr<int64_t> revision = (*cluster)->EtcdRevision();
  EXPECT_TRUE(revision.ok()) << revision.status();
}

// Until the server has cluster mode, starting a cluster of servers says so; once it has, the
// servers join and the target names them all.
TEST(ClusterUnderTestTest, ServersJoinOrTheMissingClusterModeIsNamed) {
  ClusterUnderTestOptions options = EtcdOnly();
  options.servers = 3;
  options.server_binary = RETRY_BUDGET_SERVER_BINARY;
  absl::StatusOr<std::unique_ptr<ClusterUnderTest>> cluster = ClusterUnderTest::Start(options);
  if (!BinaryHasFlag(RETRY_BUDGET_SERVER_BINARY, "etcd_endpoints")) {
    EXPECT_EQ(cluster.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(cluster.status().message(),
              "the server has no cluster mode: --etcd_endpoints unknown");
    return;
  }
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_THAT((*cluster)->target(), StartsWith("ipv4:127.0.0.1:"));
  absl::StatusOr<int> owner = (*cluster)->WaitForOwner("payments", absl::Seconds(20));
  ASSERT_TRUE(owner.ok()) << owner.status();
  ASSERT_TRUE((*cluster)->KillServer(*owner).ok());
  ASSERT_TRUE((*cluster)->RestartServer(*owner).ok());
  EXPECT_TRUE((*cluster)->WaitUntilJoined(*owner, absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace retrybudget::testing
