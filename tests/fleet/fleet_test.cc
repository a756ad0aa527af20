// Fleet tests: the REAL retry-budget-server (port 0, --port_file) and the REAL retry-budget-fleet
// binary, which starts real worker processes. Each test gets a fresh server and asserts on the
// tool's one JSON line and its exit code. Each run takes a few seconds of wall time: these are
// the end-to-end proof of DESIGN.md's invariant and of the leasing's utilisation.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/support/fleet_run.h"
#include "tests/support/test_launcher.h"
#include "tools/fleet/subprocess.h"

namespace retrybudget::fleet {
namespace {

using ::retrybudget::testing::FleetRun;
using ::retrybudget::testing::RunFleetTool;
using ::retrybudget::testing::ServerUnderTest;

constexpr char kServerBinary[] = RETRYBUDGET_SERVER_BIN;
constexpr char kFleetBinary[] = RETRYBUDGET_FLEET_BIN;

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Metrics off (the launcher's default): `make run` may hold 9464 on this machine.
    auto server = ServerUnderTest::Start({.binary = kServerBinary});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void TearDown() override {
    if (server_ == nullptr) return;
    absl::StatusOr<int> status = server_->Stop(SIGTERM, absl::Seconds(20));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(ExitedWith(*status, 0)) << DescribeWaitStatus(*status);
  }

  std::string Address() const { return server_->address(); }

  // Runs the fleet tool against this test's server and parses its JSON line (if any).
  FleetRun RunFleet(std::vector<std::string> args) {
    args.insert(args.begin(), absl::StrCat("--server=", Address()));
    return RunFleetTool(kFleetBinary, args);
  }

  // The runs of the invariant tests: 8 workers x 2 threads, 1 ms per attempt, 4 s. The policy
  // makes the bound a few hundred tokens while the fleet wants thousands of retries per second.
  static std::vector<std::string> BindingRun(double failure_rate, double credit) {
    return {"--workers=8",
            "--threads=2",
            "--duration=4",
            "--call-latency=1ms",
            absl::StrCat("--failure-rate=", failure_rate),
            "--tenant=fleet-test",
            "--capacity=20",
            "--refill=60",
            absl::StrCat("--credit=", credit),
            "--seed=7"};
  }

  void ExpectBindingRunWithinBudgetAndUsed(const FleetRun& r) {
    ASSERT_TRUE(r.Has("within_budget")) << "no JSON report: " << r.line;
    EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
    EXPECT_TRUE(r.Bool("within_budget")) << r.line;
    EXPECT_LE(r.Num("retries_allowed"), r.Num("bound"));
    // No tokens stranded: the fleet spends at least 90% of the bound less what may rightly be in
    // stock when the run stops (the bucket plus the leases: about one capacity, DESIGN.md).
    // Against the whole bound the margin was too thin under AddressSanitizer on 2 shared cores
    // (0.93-0.95, where the stock alone is up to 0.08 of it).
    EXPECT_GE(r.Num("retries_allowed"), 0.9 * (r.Num("bound") - r.Sub("policy", "capacity")))
        << "tokens stranded: " << r.line;
    // The budget bound: the fleet wanted far more retries than it was allowed.
    EXPECT_GT(r.Num("retries_denied"), 5 * r.Num("retries_allowed")) << r.line;
    EXPECT_EQ(r.Num("workers"), 8);
    EXPECT_EQ(r.Num("threads"), 2);
    // The harness counted for itself, and the library agrees with it.
    EXPECT_EQ(r.Sub("library", "retries_allowed"), r.Num("retries_allowed"));
    EXPECT_EQ(r.Sub("library", "tokens_held_at_exit"), 0);
  }

  std::unique_ptr<ServerUnderTest> server_;
};

TEST_F(FleetTest, FailureRateOneStaysWithinTheBudgetAndSpendsAtLeastNinetyPercentOfIt) {
  FleetRun r = RunFleet(BindingRun(/*failure_rate=*/1.0, /*credit=*/0.01));
  ExpectBindingRunWithinBudgetAndUsed(r);
  EXPECT_EQ(r.Num("successes"), 0);
  EXPECT_EQ(r.Num("failure_rate"), 1.0);
}

TEST_F(FleetTest, FailureRatePointThreeStaysWithinTheBudgetAndSpendsAtLeastNinetyPercentOfIt) {
  FleetRun r = RunFleet(BindingRun(/*failure_rate=*/0.3, /*credit=*/0.002));
  ExpectBindingRunWithinBudgetAndUsed(r);
  EXPECT_GT(r.Num("successes"), 0);
  // Successes earned part of the bound.
  EXPECT_GT(r.Num("successes") * r.Sub("policy", "success_credit"), 10) << r.line;
}

// The same binding run, each logical call going through the library's retry helper
// (retrybudget::Retry with 1-10 ms full-jitter backoff): the budget decides every retry and the
// fleet still spends (nearly) all of it, never more.
TEST_F(FleetTest, RetryHelperStrategyStaysWithinTheBudgetAndSpendsAtLeastNinetyPercentOfIt) {
  std::vector<std::string> args = BindingRun(/*failure_rate=*/1.0, /*credit=*/0.01);
  args.insert(args.end(), {"--strategy=retry-helper", "--backoff-initial=1ms",
                           "--backoff-max=10ms"});
  FleetRun r = RunFleet(args);
  ASSERT_TRUE(r.Has("strategy")) << r.line;
  EXPECT_EQ(r.json.fields().at("strategy").string_value(), "retry-helper");
  ExpectBindingRunWithinBudgetAndUsed(r);
  // Every denial ended a call with a status IsBudgetExhausted() recognised.
  EXPECT_EQ(r.Num("retries_denied"), r.Sub("library", "retries_denied")) << r.line;
}

TEST_F(FleetTest, DroppedDuplicatedAndReplayedSyncsStillStayWithinTheBudget) {
  std::vector<std::string> args = BindingRun(/*failure_rate=*/0.5, /*credit=*/0.002);
  args.insert(args.end(), {"--fault-drop-response=0.15", "--fault-duplicate-request=0.15",
                           "--fault-replay-old=0.15"});
  FleetRun r = RunFleet(args);
  ASSERT_TRUE(r.Has("faults")) << r.line;
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_TRUE(r.Bool("within_budget")) << r.line;
  EXPECT_LE(r.Num("retries_allowed"), r.Num("bound"));
  EXPECT_GT(r.Sub("faults", "dropped_responses"), 0);
  EXPECT_GT(r.Sub("faults", "duplicated_requests"), 0);
  EXPECT_GT(r.Sub("faults", "replayed_requests"), 0);
  EXPECT_GT(r.Sub("faults", "replays_stale"), 0);
  // A delayed old request changes nothing: in particular it is granted nothing.
  EXPECT_EQ(r.Sub("faults", "replay_granted_tokens"), 0);
}

// The harness can fail: a fleet that retries without a budget overspends, and the tool says so
// in its JSON and its exit code.
TEST_F(FleetTest, UnbudgetedFleetIsReportedOverBudgetWithExitCodeOne) {
  FleetRun r = RunFleet({"--workers=2", "--threads=2", "--duration=1", "--failure-rate=1",
                         "--tenant=fleet-test", "--capacity=20", "--refill=60", "--credit=0.01",
                         "--strategy=unbudgeted"});
  ASSERT_TRUE(r.Has("within_budget")) << r.line;
  EXPECT_FALSE(r.Bool("within_budget")) << r.line;
  EXPECT_GT(r.Num("retries_allowed"), r.Num("bound"));
  EXPECT_TRUE(ExitedWith(r.wait_status, 1)) << DescribeWaitStatus(r.wait_status);
}

TEST_F(FleetTest, BadOptionExitsTwoAndUnreachableServerExitsThree) {
  FleetRun bad = RunFleet({"--workers=0"});
  EXPECT_TRUE(ExitedWith(bad.wait_status, 2)) << DescribeWaitStatus(bad.wait_status);
  FleetRun unknown = RunFleet({"--no-such-option=1"});
  EXPECT_TRUE(ExitedWith(unknown.wait_status, 2)) << DescribeWaitStatus(unknown.wait_status);

  auto child = Subprocess::Spawn({kFleetBinary, "--server=127.0.0.1:1", "--connect-timeout=1s",
                                  "--workers=1", "--threads=1", "--duration=1"},
                                 {.pipe_stdout = true});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> status = (*child)->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(ExitedWith(*status, 3)) << DescribeWaitStatus(*status);
}

TEST_F(FleetTest, HelpExitsZeroAndDocumentsTheExitCodes) {
  auto child = Subprocess::Spawn({kFleetBinary, "--help"}, {.pipe_stdout = true});
  ASSERT_TRUE(child.ok()) << child.status();
  std::string text;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (absl::StatusOr<std::string> line = (*child)->ReadLine(deadline); line.ok();
       line = (*child)->ReadLine(deadline)) {
    absl::StrAppend(&text, *line, "\n");
  }
  absl::StatusOr<int> status = (*child)->Wait(deadline);
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(ExitedWith(*status, 0)) << DescribeWaitStatus(*status);
  EXPECT_NE(text.find("Exit codes:"), std::string::npos) << text;
  EXPECT_NE(text.find("--fault-replay-old"), std::string::npos);
}

// ---- Chaos (issue 4): the tool spawns, kills, hangs and slows the real server itself ----

// A behavioural bound, not a speed test: TryAcquire() never waits for the network, so even on a
// loaded 2-core CI machine it stays far below the 1 s Sync timeout it would show if it blocked:
// half of it (a preempted thread read 70-570 ms at a load average of 22-26, never 1 s).
constexpr double kMaxTryAcquireMs = 500;

// 4 workers x 2 threads; every attempt fails, so the fleet wants every token there is; leases
// last 1 s so clients fall back soon after the server goes away. The workers' clients reconnect
// as the library makes them (no flag): a restarted server is seen within about a second.
std::vector<std::string> ChaosRun(double duration) {
  return {absl::StrCat("--spawn-server=", kServerBinary),
          "--workers=4",
          "--threads=2",
          absl::StrCat("--duration=", duration),
          "--call-latency=1ms",
          "--failure-rate=1",
          "--tenant=chaos",
          "--capacity=20",
          "--refill=60",
          "--credit=0.01",
          "--lease-ttl-ms=1000",
          "--seed=11"};
}

// Whether a worker's final Sync (at shutdown) must have succeeded. Where the fault proxy drops
// responses on purpose, all kFinalSyncAttempts (3) attempts of one can lose theirs: at 30%, 0.3^3
// per worker, about one run in ten of 4 workers (seen in CI). The library then reports it and
// forfeits the unspent tokens (the safe direction); any other error still fails the test.
enum class FinalSync { kMustSucceed, kMayLoseItsResponses };

void ExpectWithinBudgetAndNeverBlocked(const FleetRun& r,
                                       FinalSync final_sync = FinalSync::kMustSucceed) {
  ASSERT_TRUE(r.Has("within_budget")) << "no JSON report: " << r.line;
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_TRUE(r.Bool("within_budget")) << r.line;
  // Counted by the workers themselves, lease and fallback together.
  EXPECT_LE(r.Num("retries_allowed"), r.Num("bound"));
  EXPECT_EQ(r.Sub("library", "retries_allowed"), r.Num("retries_allowed")) << r.line;
  EXPECT_LT(r.Num("max_try_acquire_ms"), kMaxTryAcquireMs) << r.line;
  const std::string shutdown = r.SubString("library", "shutdown_status");
  if (final_sync == FinalSync::kMayLoseItsResponses && shutdown != "OK") {
    EXPECT_TRUE(absl::StrContains(shutdown, "fault injected: response dropped")) << r.line;
  } else {
    EXPECT_EQ(shutdown, "OK") << r.line;
  }
}

// The local buckets spent something and never more than the allowance they were given; the
// lease part stayed within the lease bound.
void ExpectFallbackSpentWithinItsAllowance(const FleetRun& r) {
  EXPECT_GT(r.Sub("fallback", "library_fallback_allowed"), 0) << r.line;
  EXPECT_GT(r.Sub("fallback", "allowance"), 0) << r.line;
  EXPECT_LE(r.Sub("fallback", "library_fallback_allowed"), r.Sub("fallback", "allowance"))
      << r.line;
  EXPECT_LE(r.Num("retries_allowed") - r.Sub("fallback", "library_fallback_allowed"),
            r.Num("lease_bound"))
      << r.line;
  // The allowance comes from the SafeShares the workers received: together about one budget.
  EXPECT_NEAR(r.Sub("fallback", "safe_share_capacity_sum"), 20, 1e-6) << r.line;
  EXPECT_NEAR(r.Sub("fallback", "safe_share_refill_sum"), 60, 1e-6) << r.line;
  // Every client went back to leases, and leased retries were allowed again.
  EXPECT_EQ(r.Sub("fallback", "workers_back_on_lease"), 4) << r.line;
  EXPECT_GT(r.Sub("fallback", "worker_retries_allowed_after_fallback"), 0) << r.line;
}

TEST(FleetChaosTest, KillNineMidRunAndRestartStaysWithinLeasesPlusTheFallbackAllowance) {
  std::vector<std::string> args = ChaosRun(/*duration=*/9);
  args.insert(args.end(), {"--kill-server-after=2", "--restart-after=3"});
  FleetRun r = RunFleetTool(kFleetBinary, args);
  ExpectWithinBudgetAndNeverBlocked(r);
  ASSERT_TRUE(r.SubHas("chaos", "restart_at_seconds")) << r.line;
  EXPECT_NEAR(r.Sub("chaos", "kill_at_seconds"), 2, 0.5) << r.line;
  EXPECT_GE(r.Sub("chaos", "downtime_seconds"), 3) << r.line;
  // Workers kept serving through the outage: calls went on, and the local buckets allowed
  // retries while the server was gone.
  EXPECT_GT(r.Sub("chaos", "calls_during_outage"), 1000) << r.line;
  EXPECT_GT(r.Sub("chaos", "retries_during_outage"), 0) << r.line;
  // Lease -> fallback -> lease, and retries allowed again after the restart.
  ExpectFallbackSpentWithinItsAllowance(r);
  EXPECT_GT(r.Sub("chaos", "retries_after_outage"), 0) << r.line;
  // A restarted server restores its state from --data_dir (snapshot + reservation journal), so
  // the kill creates no tokens: the bound above holds across the restart.
  EXPECT_TRUE(r.SubBool("chaos", "persistent")) << r.line;
}

TEST(FleetChaosTest, HungServerNeverBlocksTryAcquireAndStaysWithinTheBudget) {
  std::vector<std::string> args = ChaosRun(/*duration=*/8);
  args.insert(args.end(), {"--stop-server-after=2", "--resume-after=3"});
  FleetRun r = RunFleetTool(kFleetBinary, args);
  ExpectWithinBudgetAndNeverBlocked(r);
  ASSERT_TRUE(r.SubHas("chaos", "resume_at_seconds")) << r.line;
  EXPECT_GE(r.Sub("chaos", "hung_seconds"), 3) << r.line;
  EXPECT_GT(r.Sub("chaos", "calls_during_outage"), 1000) << r.line;
  EXPECT_GT(r.Sub("fallback", "syncs_failed"), 0) << r.line;  // Syncs timed out
  ExpectFallbackSpentWithinItsAllowance(r);
}

// ---- Utilisation through faults (docs/BENCHMARKS.md section 9, bench/fault_utilisation.sh) ----
//
// The workload of section 9: 4 workers x 2 threads, half the attempts fail, a budget funded mostly
// by successes (capacity 50, refill 10/s, credit 0.1 per success), lease TTL 2 s. Each fault's run
// must stay within the bound (the lease part within the lease bound, the fallback within its share
// plus the credit its own successes deposited) and use a good part of what one ideal central
// bucket would have allowed the run's own demand (`utilisation_vs_ideal`). The floors sit far
// below the figures measured on a quiet machine (printed by each test and in section 9) so that a
// loaded CI machine under a sanitizer does not flake; a fleet that forgot the success credit in
// fallback or stranded its budget falls below them.
std::vector<std::string> CreditFundedRun(const std::string& tenant, double duration,
                                         std::vector<std::string> fault) {
  std::vector<std::string> args = {absl::StrCat("--spawn-server=", kServerBinary),
                                   "--workers=4",
                                   "--threads=2",
                                   absl::StrCat("--duration=", duration),
                                   "--call-latency=1ms",
                                   "--failure-rate=0.5",
                                   absl::StrCat("--tenant=", tenant),
                                   "--capacity=50",
                                   "--refill=10",
                                   "--credit=0.1",
                                   "--lease-ttl-ms=2000",
                                   "--seed=13"};
  args.insert(args.end(), fault.begin(), fault.end());
  return args;
}

void ExpectWithinTheBoundAndUsed(const FleetRun& r, double floor_vs_ideal,
                                 FinalSync final_sync = FinalSync::kMustSucceed) {
  ExpectWithinBudgetAndNeverBlocked(r, final_sync);
  EXPECT_LE(r.Num("retries_allowed") - r.Sub("fallback", "library_fallback_allowed"),
            r.Num("lease_bound"))
      << r.line;
  EXPECT_LE(r.Sub("fallback", "library_fallback_allowed"),
            r.Sub("fallback", "allowance") + r.Sub("fallback", "success_credit_deposited"))
      << r.line;
  ASSERT_TRUE(r.Has("utilisation_vs_ideal")) << r.line;
  std::printf("utilisation %.3f, utilisation_vs_ideal %.3f (floor %.2f)\n", r.Num("utilisation"),
              r.Num("utilisation_vs_ideal"), floor_vs_ideal);
  EXPECT_GE(r.Num("utilisation_vs_ideal"), floor_vs_ideal) << r.line;
}

// Through an outage: successes were credited locally, fallback spent something, and every client
// went back to leases afterwards.
void ExpectSuccessesFundedTheFallback(const FleetRun& r) {
  EXPECT_GT(r.Sub("library", "successes_credited_locally"), 0) << r.line;
  EXPECT_GT(r.Sub("fallback", "library_fallback_allowed"), 0) << r.line;
  EXPECT_EQ(r.Sub("fallback", "workers_back_on_lease"), 4) << r.line;
}

// Section 9 measured 0.99 of the ideal.
TEST(FleetFaultUtilisationTest, SteadyStateUsesWhatAnIdealBucketWould) {
  FleetRun r = RunFleetTool(kFleetBinary, CreditFundedRun("steady", 6, {}));
  ExpectWithinTheBoundAndUsed(r, 0.9);
  EXPECT_EQ(r.Sub("fallback", "library_fallback_allowed"), 0) << r.line;
}

// While the server hangs, each client's fallback bucket is funded by its own successes
// (success-funded fallback), which the server then does not credit again. Measured 0.92-0.93 on a
// quiet machine (0.78 without success-funded fallback and the early fallback of a spent lease).
TEST(FleetFaultUtilisationTest, SuccessesFundTheFallbackThroughAHangLongerThanTheLease) {
  FleetRun r = RunFleetTool(
      kFleetBinary, CreditFundedRun("hang", 8, {"--stop-server-after=2", "--resume-after=3"}));
  ExpectWithinTheBoundAndUsed(r, 0.6);
  ASSERT_TRUE(r.SubHas("chaos", "resume_at_seconds")) << r.line;
  ExpectSuccessesFundedTheFallback(r);
}

// kill -9, restarted 2 s later from its data directory: the journal keeps the credit deposited
// since the last snapshot, the clients fund their fallback meanwhile. Measured 0.98 (0.90 while a
// Sync waiting for the dead server held a spent lease out of fallback for a second).
TEST(FleetFaultUtilisationTest, SuccessesFundTheFallbackThroughAKillNineAndRestart) {
  FleetRun r = RunFleetTool(
      kFleetBinary, CreditFundedRun("kill", 10, {"--kill-server-after=3", "--restart-after=2"}));
  ExpectWithinTheBoundAndUsed(r, 0.6);
  ASSERT_TRUE(r.SubHas("chaos", "restart_at_seconds")) << r.line;
  EXPECT_TRUE(r.SubBool("chaos", "persistent")) << r.line;
  ExpectSuccessesFundedTheFallback(r);
}

// No outage, but 30% of the Sync responses lost, 10% of the requests duplicated and 10% replayed
// late through the fault proxy. Measured 0.96.
TEST(FleetFaultUtilisationTest, LostDuplicatedAndReplayedSyncsWasteLittle) {
  FleetRun r = RunFleetTool(
      kFleetBinary, CreditFundedRun("lossy", 8,
                                    {"--fault-drop-response=0.3", "--fault-duplicate-request=0.1",
                                     "--fault-replay-old=0.1"}));
  ExpectWithinTheBoundAndUsed(r, 0.7, FinalSync::kMayLoseItsResponses);
  ASSERT_TRUE(r.Has("faults")) << r.line;
  EXPECT_GT(r.Sub("faults", "dropped_responses"), 0) << r.line;
  EXPECT_EQ(r.Sub("faults", "replay_granted_tokens"), 0) << r.line;
}

TEST(FleetChaosTest, SlowServerStaysWithinTheBudget) {
  // Every Sync response is held 300 ms by the proxy: slower than a refresh period, within the
  // client's 1 s Sync deadline.
  std::vector<std::string> args = ChaosRun(/*duration=*/5);
  args.insert(args.end(), {"--fault-delay=300ms"});
  FleetRun r = RunFleetTool(kFleetBinary, args);
  ExpectWithinBudgetAndNeverBlocked(r);
  ASSERT_TRUE(r.Has("faults")) << r.line;
  EXPECT_GT(r.Sub("faults", "delayed_responses"), 0) << r.line;
  EXPECT_EQ(r.Sub("faults", "delay_ms"), 300);
  EXPECT_GT(r.Num("retries_allowed"), 0) << r.line;
}

// The server the tool spawns must not need the fixed default metrics port (9464): the README's
// `make run` holds it while a developer runs the tests, and every chaos run then failed with
// "cannot serve metrics". Here the port is held (by this test, or by whoever already has it).
TEST(FleetChaosTest, SpawnedServerStartsWhileTheDefaultMetricsPortIsHeld) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(9464);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    ASSERT_EQ(listen(fd, 1), 0) << std::strerror(errno);
  } else {
    ASSERT_EQ(errno, EADDRINUSE) << std::strerror(errno);  // held already: what we want
  }
  FleetRun r = RunFleetTool(kFleetBinary, ChaosRun(/*duration=*/1));
  close(fd);
  ASSERT_TRUE(r.Has("within_budget")) << "no JSON report: " << r.line;
  EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
  EXPECT_TRUE(r.Bool("within_budget")) << r.line;
  EXPECT_LE(r.Num("retries_allowed"), r.Num("bound"));
}

TEST(FleetChaosTest, ChaosOptionsWithoutSpawnServerExitTwo) {
  FleetRun r = RunFleetTool(kFleetBinary, {"--kill-server-after=1"});
  EXPECT_TRUE(ExitedWith(r.wait_status, 2)) << DescribeWaitStatus(r.wait_status);
  FleetRun overlap = RunFleetTool(
      kFleetBinary, {absl::StrCat("--spawn-server=", kServerBinary), "--kill-server-after=1",
                     "--restart-after=3", "--stop-server-after=2", "--resume-after=1"});
  EXPECT_TRUE(ExitedWith(overlap.wait_status, 2)) << DescribeWaitStatus(overlap.wait_status);
}

}  // namespace
}  // namespace retrybudget::fleet
