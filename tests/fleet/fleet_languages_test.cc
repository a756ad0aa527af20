// Workers of every language on one tenant of a real cluster under a seeded random fault
// schedule: the fleet tool's C++ workers and, through --foreign-workers, the Go (go_worker),
// Node (tools/fleet/js_worker) and Python (mixed_fleet.py --worker) workers of the worker
// protocol, on 3 real servers on a real 3-member etcd, through a server fault (kill -9, SIGSTOP or
// SIGTERM of the tenant's owner, with its restart), an etcd member's restart and a quorum lost and
// regained, drawn from the seed (printed). The verdict is the fleet tool's, counted from every
// worker's own spending: the tenant within its bound, every language spent and shut down cleanly.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fleet_run.h"
#include "tools/fleet/subprocess.h"

namespace retrybudget::fleet {
namespace {

using ::retrybudget::testing::FleetRun;
using ::retrybudget::testing::RunFleetTool;
using ::testing::HasSubstr;

constexpr double kDuration = 24;  // seconds of load
constexpr uint64_t kSeed = 38;

// A schedule over [2, kDuration - 4): one fault of the tenant's owner (restarted), an etcd
// member's restart and a quorum lost for 4-6 s, in an order and at times drawn from `seed`.
std::string RandomSchedule(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&rng](double a, double b) {
    return std::uniform_real_distribution<double>(a, b)(rng);
  };
  std::vector<std::string> kinds = {"server", "etcd-member", "quorum"};
  std::shuffle(kinds.begin(), kinds.end(), rng);
  std::vector<std::string> actions;
  double t = 2;
  for (const std::string& kind : kinds) {
    t += uniform(0.5, 1.5);
    if (kind == "server") {
      const int which = static_cast<int>(rng() % 3);
      const double d = uniform(1, 2.5);
      const char* action = which == 0 ? "kill" : which == 1 ? "stop" : "term";
      actions.push_back(absl::StrFormat("%s:owner@%.1f+%.1f", action, t, d));
      t += d + 2;
    } else if (kind == "etcd-member") {
      actions.push_back(absl::StrFormat("restart-etcd:%d@%.1f", static_cast<int>(rng() % 3), t));
      t += 2;
    } else {
      const double d = uniform(4, 6);
      actions.push_back(absl::StrFormat("lose-quorum@%.1f+%.1f", t, d));
      t += d + 3;
    }
  }
  return absl::StrJoin(actions, ",");
}

TEST(FleetLanguagesTest, EveryLanguageOnOneTenantThroughARandomClusterSchedule) {
  // The Python workers import the package and its generated modules.
  setenv("PYTHONPATH", RETRYBUDGET_PYTHON_PATH, 1);
  const std::string chaos = RandomSchedule(kSeed);
  std::printf("seed %llu: --cluster-chaos=%s\n", static_cast<unsigned long long>(kSeed),
              chaos.c_str());
  const std::vector<std::string> argv = {
      RETRYBUDGET_FLEET_BIN,
      absl::StrCat("--spawn-server=", RETRYBUDGET_SERVER_BIN),
      absl::StrCat("--etcd-binary=", RETRYBUDGET_ETCD_BIN),
      "--cluster=3",
      "--cluster-lease-ttl=2s",
      "--tenant=languages",
      "--workers=2",
      "--threads=2",
      absl::StrCat("--duration=", kDuration),
      "--failure-rate=0.5",
      "--capacity=20",
      "--refill=10",
      "--credit=0.1",
      "--lease-ttl-ms=1000",
      absl::StrCat("--seed=", kSeed),
      "--reset-budget",
      absl::StrCat("--foreign-workers=go:2:", RETRYBUDGET_GO_WORKER),
      absl::StrCat("--foreign-workers=js:2:", RETRYBUDGET_NODE, " ", RETRYBUDGET_JS_WORKER),
      absl::StrCat("--foreign-workers=python:2:", RETRYBUDGET_PYTHON, " ",
                   RETRYBUDGET_MIXED_FLEET, " --worker"),
      absl::StrCat("--cluster-chaos=", chaos)};
  const FleetRun run = RunFleetTool(argv[0], std::vector<std::string>(argv.begin() + 1, argv.end()),
                                    absl::Seconds(kDuration + 90));
  ASSERT_TRUE(run.Has("within_budget")) << "no JSON report: " << run.line << " ("
                                        << DescribeWaitStatus(run.wait_status) << ")";
  const auto& r = run.json.fields();

  // The one tenant, every language's own spending in its bound.
  EXPECT_TRUE(ExitedWith(run.wait_status, 0)) << DescribeWaitStatus(run.wait_status);
  EXPECT_TRUE(r.at("within_budget").bool_value());
  EXPECT_LE(r.at("retries_allowed").number_value(), r.at("bound").number_value());
  const auto& languages = r.at("languages").struct_value().fields();
  double spent = 0;
  for (const char* language : {"cpp", "go", "js", "python"}) {
    ASSERT_TRUE(languages.contains(language)) << language;
    const auto& l = languages.at(language).struct_value().fields();
    EXPECT_EQ(l.at("workers").number_value(), 2) << language;
    EXPECT_GT(l.at("retries_allowed").number_value(), 0) << language;
    EXPECT_EQ(l.at("shutdown_status").string_value(), "OK") << language;
    EXPECT_EQ(l.at("tokens_held_at_exit").number_value(), 0) << language;
    spent += l.at("retries_allowed").number_value();
  }
  EXPECT_EQ(spent, r.at("retries_allowed").number_value());

  // The schedule ran: the owner's fault, the member's restart, the quorum lost and back.
  const std::string events = r.at("cluster").struct_value().fields().at("events").string_value();
  EXPECT_THAT(events, HasSubstr("(owner of 'languages')"));
  EXPECT_THAT(events, HasSubstr("started again"));
  EXPECT_THAT(events, HasSubstr("(no quorum)"));
  EXPECT_THAT(events, HasSubstr("quorum back"));
}

}  // namespace
}  // namespace retrybudget::fleet
