// Issue 36 end to end: shadow mode, the windowed ratio policy and retries that cost more than one
// token, each run by the REAL retry-budget-fleet (real worker processes, C++ and, for the mixed
// fleet, Go, Node and Python) against the REAL retry-budget-server it spawns on 127.0.0.1:0 (or
// a real cluster of 3 servers on a real 3-member etcd), mode switches by the REAL budgetctl.
// Every verdict is counted from the workers' own spending (tools/fleet/README.md); no assertion
// is on wall-clock speed: the lags asserted are against the client's refresh period, with a
// stated slack.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/support/fleet_run.h"
#include "tools/fleet/subprocess.h"

namespace retrybudget::fleet {
namespace {

using ::retrybudget::testing::FleetRun;
using ::retrybudget::testing::RunFleetTool;

const std::string kServer = absl::StrCat("--spawn-server=", RETRYBUDGET_SERVER_BIN);
const std::string kBudgetctl = absl::StrCat("--budgetctl=", RETRYBUDGET_BUDGETCTL_BIN);

// The clients' refresh period (ClientOptions::refresh_period's default, 200 ms) and the slack a
// switch may take beyond it: the Sync in flight when budgetctl returned (its answer may predate
// the new policy), one round trip, and a loaded machine (2 cores shared by the suite).
constexpr double kRefreshPeriodSeconds = 0.2;
constexpr double kSwitchSlackSeconds = 0.5;

FleetRun RunFleet(std::vector<std::string> args, absl::Duration timeout = absl::Seconds(90)) {
  return RunFleetTool(RETRYBUDGET_FLEET_BIN, args, timeout);
}

void ExpectReport(const FleetRun& r) {
  ASSERT_TRUE(r.Has("within_budget")) << "no JSON report: " << r.line << " ("
                                      << DescribeWaitStatus(r.wait_status) << ")";
}

// A paced, denial-heavy load: every call fails its first attempt and asks for exactly one retry
// (--max-attempts=2), 250 calls a second per thread whatever the budget answers, so an enforced
// run and a shadow run ask for the same retries at the same instants.
std::vector<std::string> PacedLoad(const std::string& tenant, double duration) {
  return {kServer,
          absl::StrCat("--tenant=", tenant),
          "--workers=4",
          "--threads=2",
          absl::StrCat("--duration=", duration),
          "--failure-rate=1",
          "--max-attempts=2",
          "--call-interval=4ms",
          "--call-latency=1ms",
          "--capacity=20",
          "--refill=100",
          "--credit=0",
          "--lease-ttl-ms=1000",
          "--seed=7"};
}

std::vector<std::string> With(std::vector<std::string> args,
                              const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(FleetShadowTest, AShadowRunDeniesNothingAndCountsWithinTenPercentOfTheEnforcedRunsDenials) {
  const FleetRun enforced = RunFleet(With(PacedLoad("shadow-a", 4), {"--mode=enforce"}));
  ASSERT_NO_FATAL_FAILURE(ExpectReport(enforced));
  const FleetRun shadow = RunFleet(With(PacedLoad("shadow-a", 4), {"--mode=shadow"}));
  ASSERT_NO_FATAL_FAILURE(ExpectReport(shadow));

  EXPECT_TRUE(ExitedWith(enforced.wait_status, 0)) << DescribeWaitStatus(enforced.wait_status);
  EXPECT_TRUE(enforced.Bool("within_budget")) << enforced.line;
  EXPECT_EQ(enforced.Num("shadow_denied"), 0);
  // The budget binds: most of the retries asked are denied.
  const double denied = enforced.Num("retries_denied");
  EXPECT_GT(denied, 4 * enforced.Num("retries_allowed")) << enforced.line;

  // The shadow run: nothing denied, every retry asked sent, the would-be denials counted by the
  // clients (and reported: the server's total is the workers' sum).
  EXPECT_TRUE(ExitedWith(shadow.wait_status, 0)) << DescribeWaitStatus(shadow.wait_status);
  EXPECT_EQ(shadow.SubString("policy", "mode"), "shadow");
  EXPECT_EQ(shadow.Num("retries_denied"), 0) << shadow.line;
  EXPECT_EQ(shadow.Sub("library", "retries_denied"), 0);
  const double would_be = shadow.Num("shadow_denied");
  EXPECT_EQ(shadow.Sub("server", "shadow_denied"), would_be) << shadow.line;
  EXPECT_NEAR(would_be, denied, 0.1 * denied)
      << "would-be denials " << would_be << " vs enforced denials " << denied;
  std::printf("shadow would-be denials %.0f, enforced denials %.0f (%+.2f%%)\n", would_be,
              denied, 100 * (would_be - denied) / denied);
  // The tokens the shadow run took (its would-be denials took none) stayed within the bound.
  EXPECT_TRUE(shadow.Bool("within_budget")) << shadow.line;
  EXPECT_EQ(shadow.Num("spent"), shadow.Sub("server", "retries")) << shadow.line;
}

// One worker of each other language (Go, Node, Python: the worker protocol), 2 loops each.
std::vector<std::string> ForeignWorkers() {
  setenv("PYTHONPATH", RETRYBUDGET_PYTHON_PATH, 1);
  return {absl::StrCat("--foreign-workers=go:1:", RETRYBUDGET_GO_WORKER),
          absl::StrCat("--foreign-workers=js:1:", RETRYBUDGET_NODE, " ", RETRYBUDGET_JS_WORKER),
          absl::StrCat("--foreign-workers=python:1:", RETRYBUDGET_PYTHON, " ",
                       RETRYBUDGET_MIXED_FLEET, " --worker")};
}

// Each switch played by budgetctl: its result, and every client seen in the new mode within one
// refresh period (+ the slack) of budgetctl's return; while every client is in shadow nothing is
// denied, once back in enforce denials resume.
void ExpectSwitchesFollowed(const FleetRun& r) {
  ASSERT_TRUE(r.Has("mode_switches")) << r.line;
  const auto& switches = r.At("mode_switches").list_value().values();
  ASSERT_EQ(switches.size(), 2u) << r.line;
  for (int i = 0; i < 2; ++i) {
    const auto& s = switches[i].struct_value().fields();
    const std::string mode = s.at("mode").string_value();
    EXPECT_EQ(mode, i == 0 ? "shadow" : "enforce");
    EXPECT_EQ(s.at("result").string_value(), "OK") << r.line;
    ASSERT_TRUE(s.contains("lag_after_done_seconds")) << "a client never saw it: " << r.line;
    const double lag = s.at("lag_after_done_seconds").number_value();
    std::printf("switch to %s: every client followed %.3f s after budgetctl returned\n",
                mode.c_str(), lag);
    EXPECT_LE(lag, kRefreshPeriodSeconds + kSwitchSlackSeconds) << mode << ": " << r.line;
    const double denied = s.at("retries_denied_while_all_in_mode").number_value();
    if (mode == "shadow") {
      EXPECT_EQ(denied, 0) << r.line;
    } else {
      EXPECT_GT(denied, 0) << r.line;
    }
  }
  EXPECT_GT(r.Num("shadow_denied"), 0) << r.line;
  EXPECT_EQ(r.Sub("server", "shadow_denied"), r.Num("shadow_denied")) << r.line;
  EXPECT_TRUE(r.Bool("within_budget")) << r.line;
  // Every language's clients were in the switches (their mode changes are in the lag above:
  // the C++ clients' at the answer's receipt, the others' polled every 10 ms) and counted
  // would-be denials while in shadow.
  const auto& languages = r.At("languages").struct_value().fields();
  for (const char* language : {"cpp", "go", "js", "python"}) {
    ASSERT_TRUE(languages.contains(language)) << language << ": " << r.line;
    const auto& l = languages.at(language).struct_value().fields();
    EXPECT_GT(l.at("shadow_denied").number_value(), 0) << language;
    EXPECT_GT(l.at("retries_denied").number_value(), 0) << language;
    EXPECT_EQ(l.at("shutdown_status").string_value(), "OK") << language;
  }
}

TEST(FleetShadowTest, BudgetctlSwitchesEveryClientWithinOneRefreshPeriodOnOneServer) {
  const FleetRun r =
      RunFleet(With(With(PacedLoad("switch-one", 6), ForeignWorkers()),
                    {"--mode=enforce", "--mode-switch=shadow@2,enforce@4", kBudgetctl}));
  ASSERT_NO_FATAL_FAILURE(ExpectReport(r));
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  ExpectSwitchesFollowed(r);
}

// The cluster's flags: 3 servers on 3 etcd members, a 2 s etcd lease (an owner's loss found
// quickly).
std::vector<std::string> Cluster() {
  return {"--cluster=3", absl::StrCat("--etcd-binary=", RETRYBUDGET_ETCD_BIN),
          "--cluster-lease-ttl=2s"};
}

TEST(FleetShadowClusterTest, BudgetctlSwitchesEveryClientWithinOneRefreshPeriodInACluster) {
  // The policy is the owner's, in etcd; budgetctl reaches it through any server.
  const FleetRun r =
      RunFleet(With(With(With(PacedLoad("switch-cluster", 6), Cluster()), ForeignWorkers()),
                    {"--mode=enforce", "--mode-switch=shadow@2,enforce@4", kBudgetctl}));
  ASSERT_NO_FATAL_FAILURE(ExpectReport(r));
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_EQ(r.Sub("cluster", "servers"), 3);
  ExpectSwitchesFollowed(r);
}

// A windowed tenant (floor 20/s, 10% of requests, a 2 s window) under a load that wants far
// more: half the attempts fail, every failure retried while the budget allows.
std::vector<std::string> WindowedLoad(const std::string& tenant, double duration) {
  return {kServer,
          absl::StrCat("--tenant=", tenant),
          "--workers=4",
          "--threads=2",
          absl::StrCat("--duration=", duration),
          "--failure-rate=0.5",
          "--call-latency=1ms",
          "--retry-ratio=0.1",
          "--min-retries-per-second=20",
          "--ttl-ms=2000",
          "--seed=7"};
}

void ExpectWindowedBoundHeld(const FleetRun& r) {
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_TRUE(r.SubBool("policy", "windowed")) << r.line;
  ASSERT_TRUE(r.Has("windowed")) << r.line;
  EXPECT_TRUE(r.SubBool("windowed", "checked")) << r.line;
  EXPECT_TRUE(r.SubBool("windowed", "within")) << r.line;
  EXPECT_EQ(r.Sub("windowed", "windows_over"), 0) << r.line;
  EXPECT_GT(r.Sub("windowed", "windows"), 20) << r.line;
  EXPECT_GT(r.Num("retries_denied"), 0) << "the budget never bound: " << r.line;
  std::printf("windowed: %.0f windows, fullest %.3f of its bound (%.0f tokens of %.1f)\n",
              r.Sub("windowed", "windows"), r.Sub("windowed", "max_utilisation"),
              r.Sub("windowed", "worst_spent"), r.Sub("windowed", "worst_bound"));
}

TEST(FleetWindowedTest, TheWindowedBoundHoldsThroughAKillNineAndRestartOfTheServer) {
  // The server keeps its state in its --data_dir (the tool's temporary one) across the restart.
  // D = 2 refresh periods + 1 s + the 1.5 s outage (the requests made while it was down are
  // received after the restart).
  const FleetRun r = RunFleet(With(WindowedLoad("windowed-kill", 8),
                              {"--kill-server-after=2.5", "--restart-after=1.5"}));
  ASSERT_NO_FATAL_FAILURE(ExpectReport(r));
  ExpectWindowedBoundHeld(r);
  ASSERT_TRUE(r.Has("chaos")) << r.line;
  EXPECT_TRUE(r.SubBool("chaos", "persistent")) << r.line;
  EXPECT_TRUE(r.SubHas("chaos", "restart_at_seconds")) << r.line;
  EXPECT_GT(r.Sub("fallback", "entries"), 0) << "no client fell back: " << r.line;
  EXPECT_GT(r.Sub("fallback", "workers_back_on_lease"), 0) << r.line;
}

TEST(FleetWindowedClusterTest, TheWindowedBoundHoldsThroughAnOwnersKillNineForEveryLanguage) {
  // The owner is killed at 2 s and restarted 3 s later; its shard moves once its 2 s etcd lease
  // expires. D = 5 s: the requests made while the tenant had no owner are received after.
  // Beside the C++ workers, one of each other language; every retry costs 2 tokens.
  const FleetRun r = RunFleet(
      With(With(With(WindowedLoad("windowed-owner", 9), Cluster()), ForeignWorkers()),
           {"--cluster-chaos=kill:owner@2+3", "--report-delay-slack=5s", "--retry-cost=2"}));
  ASSERT_NO_FATAL_FAILURE(ExpectReport(r));
  ExpectWindowedBoundHeld(r);
  ASSERT_TRUE(r.Has("cluster")) << r.line;
  EXPECT_NE(r.SubString("cluster", "events").find("kill -9"), std::string::npos) << r.line;
  const auto& languages = r.At("languages").struct_value().fields();
  for (const char* language : {"cpp", "go", "js", "python"}) {
    ASSERT_TRUE(languages.contains(language)) << language << ": " << r.line;
    const auto& l = languages.at(language).struct_value().fields();
    EXPECT_GT(l.at("retries_allowed").number_value(), 0) << language;
    EXPECT_EQ(l.at("tokens_spent").number_value(), 2 * l.at("retries_allowed").number_value())
        << language;
    EXPECT_EQ(l.at("shutdown_status").string_value(), "OK") << language;
    EXPECT_EQ(l.at("tokens_held_at_exit").number_value(), 0) << language;
  }
}

TEST(FleetCostTest, ARetryOfCostFiveTakesFiveTokensAndTheBoundCountsTokensFleetWide) {
  const FleetRun r = RunFleet({kServer, "--tenant=cost-five", "--workers=4", "--threads=2",
                          "--duration=4", "--failure-rate=1", "--call-latency=1ms",
                          "--capacity=50", "--refill=100", "--credit=0", "--lease-ttl-ms=1000",
                          "--retry-cost=5", "--seed=7"});
  ASSERT_NO_FATAL_FAILURE(ExpectReport(r));
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  const double retries = r.Num("retries_allowed");
  EXPECT_GT(retries, 0);
  EXPECT_EQ(r.Num("retry_cost"), 5);
  // Counted by the workers, by the clients and by the server alike: 5 tokens a retry.
  EXPECT_EQ(r.Num("tokens_spent"), 5 * retries) << r.line;
  EXPECT_EQ(r.Sub("library", "retries_allowed"), retries) << r.line;
  EXPECT_EQ(r.Sub("server", "retries"), 5 * retries) << r.line;
  EXPECT_EQ(r.Sub("server", "retries_allowed"), retries) << r.line;
  // The classic bound is in tokens: the fleet's tokens stay within it, and fill it (less what
  // may rightly be in stock at the end: about one capacity), so its retries are a fifth of it.
  EXPECT_TRUE(r.Bool("within_budget")) << r.line;
  EXPECT_LE(r.Num("spent"), r.Num("bound"));
  EXPECT_GE(r.Num("spent"), 0.8 * (r.Num("bound") - r.Sub("policy", "capacity"))) << r.line;
  EXPECT_LE(5 * retries, r.Num("bound")) << r.line;
}

// Every language on one tenant (2 C++ workers of the tool, 1 Go, 1 Node, 1 Python), 2 loops
// each, the paced denial-heavy load, under one policy shape.
FleetRun RunMixed(const std::string& tenant, const std::vector<std::string>& shape) {
  std::vector<std::string> args = {
      kServer,
      absl::StrCat("--tenant=", tenant),
      "--workers=2",
      "--threads=2",
      "--duration=4",
      "--failure-rate=1",
      "--max-attempts=2",
      "--call-interval=4ms",
      "--call-latency=1ms",
      "--retry-cost=2",
      "--seed=11"};
  return RunFleet(With(With(args, ForeignWorkers()), shape));
}

// Every language spent (or, in shadow, let through) retries, shut down cleanly, and counted
// its requests; the tokens are its retries at cost 2.
void ExpectEveryLanguage(const FleetRun& r, bool shadow) {
  const auto& languages = r.At("languages").struct_value().fields();
  for (const char* language : {"cpp", "go", "js", "python"}) {
    ASSERT_TRUE(languages.contains(language)) << language << ": " << r.line;
    const auto& l = languages.at(language).struct_value().fields();
    EXPECT_GT(l.at("retries_allowed").number_value(), 0) << language;
    EXPECT_EQ(l.at("tokens_spent").number_value(), 2 * l.at("retries_allowed").number_value())
        << language;
    EXPECT_EQ(l.at("requests").number_value(), l.at("calls").number_value()) << language;
    EXPECT_EQ(l.at("shutdown_status").string_value(), "OK") << language;
    EXPECT_EQ(l.at("tokens_held_at_exit").number_value(), 0) << language;
    if (shadow) {
      EXPECT_EQ(l.at("retries_denied").number_value(), 0) << language;
      EXPECT_GT(l.at("shadow_denied").number_value(), 0) << language;
    } else {
      EXPECT_GT(l.at("retries_denied").number_value(), 0) << language;
      EXPECT_EQ(l.at("shadow_denied").number_value(), 0) << language;
    }
  }
}

TEST(FleetMixedShapesTest, EveryLanguageOnOneClassicTenantStaysWithinItsBound) {
  const FleetRun r = RunMixed("mixed-classic", {"--capacity=20", "--refill=100", "--credit=0",
                                                "--lease-ttl-ms=1000"});
  ASSERT_NO_FATAL_FAILURE(ExpectReport(r));
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_TRUE(r.Bool("within_budget")) << r.line;
  EXPECT_LE(r.Num("spent"), r.Num("bound"));
  EXPECT_EQ(r.Sub("server", "retries"), r.Num("spent")) << r.line;
  ExpectEveryLanguage(r, /*shadow=*/false);
}

TEST(FleetMixedShapesTest, EveryLanguageOnOneWindowedTenantStaysWithinItsWindowedBound) {
  const FleetRun r = RunMixed("mixed-windowed", {"--retry-ratio=0.05",
                                                 "--min-retries-per-second=20", "--ttl-ms=1000"});
  ASSERT_NO_FATAL_FAILURE(ExpectReport(r));
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_TRUE(r.SubBool("windowed", "checked")) << r.line;
  EXPECT_TRUE(r.SubBool("windowed", "within")) << r.line;
  EXPECT_GT(r.Sub("windowed", "windows"), 10) << r.line;
  EXPECT_EQ(r.Sub("server", "requests"), r.Num("requests")) << r.line;
  ExpectEveryLanguage(r, /*shadow=*/false);
}

TEST(FleetMixedShapesTest, EveryLanguageOnOneShadowTenantDeniesNothingAndCountsItsWouldBeDenials) {
  const FleetRun r = RunMixed("mixed-shadow", {"--mode=shadow", "--capacity=20", "--refill=100",
                                               "--credit=0", "--lease-ttl-ms=1000"});
  ASSERT_NO_FATAL_FAILURE(ExpectReport(r));
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_TRUE(r.Bool("within_budget")) << r.line;  // the tokens taken, not the would-be denials
  EXPECT_EQ(r.Num("retries_denied"), 0) << r.line;
  EXPECT_EQ(r.Sub("server", "shadow_denied"), r.Num("shadow_denied")) << r.line;
  ExpectEveryLanguage(r, /*shadow=*/true);
}

// Bad input names the option and the value, exits 2 and starts nothing.
TEST(FleetPolicyOptionsTest, ABadModeCostOrSwitchExitsTwoNamingIt) {
  struct Case {
    std::vector<std::string> args;
    std::string named;  // the option
    std::string value;  // and the value refused
  };
  for (const Case& c : std::vector<Case>{
           {{"--mode=dry"}, "--mode", "dry"},
           {{"--retry-cost=0"}, "--retry-cost", "0"},
           {{"--retry-cost=1000001"}, "--retry-cost", "1000001"},
           {{"--mode-switch=shadow@2,sometimes@3", kBudgetctl}, "--mode-switch", "sometimes@3"},
           {{"--mode-switch=shadow@4,enforce@2", kBudgetctl}, "--mode-switch", "enforce@2"},
           {{"--mode-switch=shadow@2"}, "--mode-switch", "--budgetctl"},
       }) {
    std::vector<std::string> argv = {RETRYBUDGET_FLEET_BIN, "--server=127.0.0.1:1"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const std::string output = absl::StrCat(::testing::TempDir(), "/fleet-bad-input.txt");
    absl::StatusOr<std::unique_ptr<Subprocess>> child =
        Subprocess::Spawn(argv, {.output_file = output});
    ASSERT_TRUE(child.ok()) << child.status();
    absl::StatusOr<int> status = (*child)->Wait(absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(ExitedWith(*status, 2)) << c.named << ": " << DescribeWaitStatus(*status);
    std::ifstream in(output);
    const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(said.find(c.named), std::string::npos) << said;
    EXPECT_NE(said.find(c.value), std::string::npos) << said;
  }
}

}  // namespace
}  // namespace retrybudget::fleet
