// The fleet tool against a real cluster it starts itself (--cluster=3: real etcd members and 3
// real retry-budget-server processes in cluster mode) with its fleet spread over several tenants
// (--tenants): each tenant stays within its own budget, with and without a kill -9 of a busy
// owner. Short versions of the cluster fleet runs of docs/BENCHMARKS.md.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "gtest/gtest.h"
#include "tests/support/fleet_run.h"
#include "tools/fleet/subprocess.h"

namespace retrybudget::fleet {
namespace {

using google::protobuf::Value;

using ::retrybudget::testing::FleetRun;
using ::retrybudget::testing::RunFleetTool;

constexpr char kFleetBinary[] = RETRYBUDGET_FLEET_BIN;

// 3 servers, 4 tenants spread over the shards, 4 workers x 2 threads (each thread on one
// tenant, two threads per tenant), every attempt failing: the bound binds hard.
std::vector<std::string> ClusterRun(double duration, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {
      absl::StrCat("--spawn-server=", RETRYBUDGET_SERVER_BIN),
      absl::StrCat("--etcd-binary=", RETRYBUDGET_ETCD_BIN),
      "--cluster=3",
      "--cluster-lease-ttl=2s",
      "--tenant=fc",
      "--tenants=4",
      "--workers=4",
      "--threads=2",
      absl::StrCat("--duration=", duration),
      "--failure-rate=1",
      "--capacity=20",
      "--refill=60",
      "--credit=0.01",
      "--lease-ttl-ms=1000",
      "--seed=3"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Every tenant's own verdict: within its bound. Returns the tenants' utilisations.
std::vector<double> ExpectEveryTenantWithinBudget(const FleetRun& r) {
  std::vector<double> utilisations;
  EXPECT_TRUE(r.json.fields().contains("tenants")) << "no per-tenant report: " << r.line;
  if (!r.json.fields().contains("tenants")) return utilisations;
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_TRUE(r.At("within_budget").bool_value()) << r.line;
  EXPECT_EQ(r.Num("tenant_count"), 4);
  EXPECT_EQ(r.Num("tenants_within_budget"), 4) << r.line;
  const auto& tenants = r.At("tenants").list_value().values();
  EXPECT_EQ(tenants.size(), 4u);
  for (const Value& t : tenants) {
    const auto& f = t.struct_value().fields();
    EXPECT_TRUE(f.at("within_budget").bool_value()) << f.at("tenant").string_value();
    EXPECT_LE(f.at("retries_allowed").number_value(), f.at("bound").number_value())
        << f.at("tenant").string_value();
    // The workers of every tenant retried (each tenant was busy).
    EXPECT_GT(f.at("retries_allowed").number_value(), 0) << f.at("tenant").string_value();
    utilisations.push_back(f.at("utilisation").number_value());
  }
  return utilisations;
}

TEST(FleetClusterTest, FourTenantsOnThreeServersEachStayWithinTheirBudgetAndUseIt) {
  FleetRun r = RunFleetTool(kFleetBinary, ClusterRun(6));
  std::vector<double> utilisations = ExpectEveryTenantWithinBudget(r);
  ASSERT_FALSE(HasFailure());
  // No tokens stranded in any tenant: the bound is a few hundred tokens, the stock that may
  // rightly remain at the end (bucket + leases) about one capacity (20).
  for (double u : utilisations) EXPECT_GE(u, 0.8) << r.line;
  EXPECT_TRUE(r.At("cluster").struct_value().fields().contains("owner_losses"));
}

TEST(FleetClusterTest, KillNineOfABusyOwnerKeepsEveryTenantWithinItsBudget) {
  FleetRun r = RunFleetTool(kFleetBinary, ClusterRun(9, {"--cluster-chaos=kill:owner@3"}));
  ExpectEveryTenantWithinBudget(r);
  ASSERT_FALSE(HasFailure());
  const auto& cluster = r.At("cluster").struct_value().fields();
  const auto& losses = cluster.at("owner_losses").list_value().values();
  ASSERT_EQ(losses.size(), 1u) << r.line;
  const auto& loss = losses[0].struct_value().fields();
  // The killed server owned tenant 0 at least, and each of its tenants got a new owner.
  EXPECT_GE(loss.at("tenants").number_value(), 1);
  EXPECT_TRUE(loss.contains("new_owner_after_seconds")) << r.line;
}

// etcd's quorum lost for 10 s (2 of 3 members killed at 3 s, started again with their data at
// 13 s): the servers stop granting within their etcd lease TTL (the clients spend their leases,
// then their fallback shares), every tenant stays within its budget, and the servers serve
// again: every worker is back on leases by the end.
TEST(FleetClusterTest, QuorumLostForTenSecondsAndRegainedKeepsEveryTenantWithinItsBudget) {
  FleetRun r = RunFleetTool(kFleetBinary, ClusterRun(20, {"--cluster-chaos=lose-quorum@3+10"}));
  ExpectEveryTenantWithinBudget(r);
  ASSERT_FALSE(HasFailure());
  const std::string events = r.At("cluster").struct_value().fields().at("events").string_value();
  EXPECT_THAT(events, ::testing::HasSubstr("(no quorum)")) << events;
  EXPECT_THAT(events, ::testing::HasSubstr("quorum back")) << events;
  EXPECT_THAT(events, ::testing::Not(::testing::HasSubstr("FAILED"))) << events;
  const auto& fallback = r.At("fallback").struct_value().fields();
  EXPECT_GT(fallback.at("entries").number_value(), 0) << r.line;
  // Each of the 4 workers' 2 tenants (one per thread) went into fallback and came back.
  EXPECT_EQ(fallback.at("workers_back_on_lease").number_value(), 8) << r.line;
  // Every tenant granted again after its longest gap (the outage), soon after the members were
  // started again at 13 s (a generous bound: the machine is noisy).
  for (const Value& t : r.At("tenants").list_value().values()) {
    const auto& f = t.struct_value().fields();
    ASSERT_TRUE(f.contains("granted_again_at_seconds")) << r.line;
    const double again = f.at("granted_again_at_seconds").number_value();
    EXPECT_GT(again, 13) << f.at("tenant").string_value();
    EXPECT_LT(again, 13 + 10) << f.at("tenant").string_value();
    std::printf("%s: longest gap without a grant %.2f s, granted again %.2f s after the members "
                "were started again\n",
                f.at("tenant").string_value().c_str(),
                f.at("ungranted_gap_max_seconds").number_value(), again - 13);
  }
  std::printf("quorum lost 10 s: %.0f fallback entries, %.1f s of fallback in all, utilisation "
              "vs ideal %.3f\n",
              fallback.at("entries").number_value(), fallback.at("seconds_total").number_value(),
              r.Num("utilisation_vs_ideal"));
}

// A server SIGTERMed while etcd has no quorum (2 of 3 members killed at 2 s, back at 8 s) and
// started again at 5 s, inside the outage: the report's stop time is the server's bounded stop
// (within --shutdown_grace, 5 s by default, plus 2 s, exit code 0 whatever etcd does), and its
// restart serves (health SERVING) only once the quorum is back: the start waits for etcd.
TEST(FleetClusterTest, ASigtermDuringALostQuorumIsTimedAndItsRestartServesOnceEtcdIsBack) {
  FleetRun r =
      RunFleetTool(kFleetBinary, ClusterRun(14, {"--cluster-chaos=lose-quorum@2+6,term:1@3+2"}));
  ExpectEveryTenantWithinBudget(r);
  ASSERT_FALSE(HasFailure());
  const auto& cluster = r.At("cluster").struct_value().fields();
  ASSERT_TRUE(cluster.contains("stops")) << r.line;
  const auto& stops = cluster.at("stops").list_value().values();
  ASSERT_EQ(stops.size(), 1u) << r.line;
  const auto& stop = stops[0].struct_value().fields();
  EXPECT_EQ(stop.at("server").number_value(), 1);
  EXPECT_EQ(stop.at("exit").string_value(), "exit code 0") << r.line;
  EXPECT_LT(stop.at("seconds").number_value(), 5 + 2) << r.line;
  const auto& restarts = cluster.at("restarts").list_value().values();
  ASSERT_EQ(restarts.size(), 1u) << r.line;
  const auto& restart = restarts[0].struct_value().fields();
  ASSERT_TRUE(restart.contains("serving_after_seconds")) << r.line;
  const double started = restart.at("at_seconds").number_value();
  const double serving = started + restart.at("serving_after_seconds").number_value();
  // The members were started again at 8 s: never SERVING before (a 50 ms poll's slack).
  EXPECT_GT(serving, 8 - 0.1) << r.line;
  EXPECT_LT(serving, 8 + 10) << r.line;
  std::printf("SIGTERM with no quorum: exited after %.3f s; started again at %.2f s, SERVING "
              "%.2f s after the members were started again\n",
              stop.at("seconds").number_value(), started, serving - 8);
}

// The cluster run of docs/BENCHMARKS.md section 9: one tenant funded mostly by successes
// (capacity 50, refill 10/s, credit 0.1, half the attempts fail), 4 workers x 2 threads, lease
// TTL 2 s, on 3 servers at the servers' default --etcd_lease_ttl (5 s); its owner is killed -9 at
// 3 s. Within the bound, and its clients funded their fallback with their own successes while
// the shard had no owner. Measured 0.9 of the ideal on a quiet machine; the floor is for a loaded
// CI machine.
TEST(FleetClusterTest, KillNineOfTheOwnerAtTheDefaultLeaseTtlKeepsTheBudgetUsable) {
  FleetRun r = RunFleetTool(
      kFleetBinary,
      {absl::StrCat("--spawn-server=", RETRYBUDGET_SERVER_BIN),
       absl::StrCat("--etcd-binary=", RETRYBUDGET_ETCD_BIN), "--cluster=3", "--tenant=owner-kill",
       "--workers=4", "--threads=2", "--duration=14", "--call-latency=1ms", "--failure-rate=0.5",
       "--capacity=50", "--refill=10", "--credit=0.1", "--lease-ttl-ms=2000", "--seed=5",
       "--cluster-chaos=kill:owner@3"});
  ASSERT_TRUE(r.json.fields().contains("within_budget")) << "no JSON report: " << r.line;
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_TRUE(r.At("within_budget").bool_value()) << r.line;
  EXPECT_LE(r.Num("retries_allowed"), r.Num("bound")) << r.line;
  const auto& fallback = r.At("fallback").struct_value().fields();
  EXPECT_LE(fallback.at("library_fallback_allowed").number_value(),
            fallback.at("allowance").number_value() +
                fallback.at("success_credit_deposited").number_value())
      << r.line;
  EXPECT_GT(fallback.at("success_credit_deposited").number_value(), 0) << r.line;
  EXPECT_EQ(fallback.at("workers_back_on_lease").number_value(), 4) << r.line;
  const auto& losses = r.At("cluster").struct_value().fields().at("owner_losses");
  ASSERT_EQ(losses.list_value().values().size(), 1u) << r.line;
  EXPECT_TRUE(losses.list_value().values()[0].struct_value().fields().contains(
      "new_owner_after_seconds"))
      << r.line;
  std::printf("utilisation %.3f, utilisation_vs_ideal %.3f (floor 0.6)\n", r.Num("utilisation"),
              r.Num("utilisation_vs_ideal"));
  EXPECT_GE(r.Num("utilisation_vs_ideal"), 0.6) << r.line;
}

}  // namespace
}  // namespace retrybudget::fleet
