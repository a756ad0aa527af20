// Fleet tests: the REAL retry-budget-server (port 0, --port_file) and the REAL retry-budget-fleet
// binary, which starts real worker processes. Each test gets a fresh server and asserts on the
// tool's one JSON line and its exit code. Each run takes a few seconds of wall time: these are
// the end-to-end proof of DESIGN.md's invariant and of the leasing's utilisation.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tools/fleet/subprocess.h"

namespace retrybudget::fleet {
namespace {

constexpr char kServerBinary[] = RETRYBUDGET_SERVER_BIN;
constexpr char kFleetBinary[] = RETRYBUDGET_FLEET_BIN;

struct FleetResult {
  int wait_status = -1;
  std::string line;
  google::protobuf::Struct json;

  double Num(const std::string& key) const { return json.fields().at(key).number_value(); }
  bool Bool(const std::string& key) const { return json.fields().at(key).bool_value(); }
  double Sub(const std::string& object, const std::string& key) const {
    return json.fields().at(object).struct_value().fields().at(key).number_value();
  }
  bool Has(const std::string& key) const { return json.fields().contains(key); }
};

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    port_file_ = absl::StrCat(::testing::TempDir(), "/fleet_test_port_", getpid(), "_", ++counter);
    std::remove(port_file_.c_str());
    auto server = Subprocess::Spawn(
        {kServerBinary, "--listen=127.0.0.1:0", absl::StrCat("--port_file=", port_file_)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (port_ == 0) {
      std::ifstream in(port_file_);
      std::string text;
      if (in && std::getline(in, text)) {
        ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port_)) << text;
        break;
      }
      ASSERT_FALSE(server_->Poll().has_value()) << "server exited before serving";
      ASSERT_LT(absl::Now(), deadline) << "server wrote no port file " << port_file_;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void TearDown() override {
    if (server_ == nullptr) return;
    server_->Signal(SIGTERM);
    absl::StatusOr<int> status = server_->Wait(absl::Now() + absl::Seconds(20));
    ASSERT_TRUE(status.ok()) << "server did not exit on SIGTERM";
    EXPECT_TRUE(ExitedWith(*status, 0)) << DescribeWaitStatus(*status);
    std::remove(port_file_.c_str());
  }

  std::string Address() const { return absl::StrCat("127.0.0.1:", port_); }

  // Runs the fleet tool against this test's server and parses its JSON line (if any).
  FleetResult RunFleet(std::vector<std::string> args) {
    std::vector<std::string> argv = {kFleetBinary, absl::StrCat("--server=", Address())};
    argv.insert(argv.end(), args.begin(), args.end());
    FleetResult result;
    auto child = Subprocess::Spawn(argv, {.pipe_stdout = true});
    EXPECT_TRUE(child.ok()) << child.status();
    if (!child.ok()) return result;
    const absl::Time deadline = absl::Now() + absl::Seconds(90);
    absl::StatusOr<std::string> line = (*child)->ReadLine(deadline);
    absl::StatusOr<int> status = (*child)->Wait(deadline);
    EXPECT_TRUE(status.ok()) << status.status();
    if (status.ok()) result.wait_status = *status;
    if (line.ok()) {
      result.line = *line;
      std::cerr << "[fleet] " << result.line << "\n";
      EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(result.line, &result.json).ok())
          << result.line;
    }
    return result;
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

  void ExpectBindingRunWithinBudgetAndUsed(const FleetResult& r) {
    ASSERT_TRUE(r.Has("within_budget")) << "no JSON report: " << r.line;
    EXPECT_TRUE(ExitedWith(r.wait_status, 0)) << DescribeWaitStatus(r.wait_status);
    EXPECT_TRUE(r.Bool("within_budget")) << r.line;
    EXPECT_LE(r.Num("retries_allowed"), r.Num("bound"));
    EXPECT_GE(r.Num("utilisation"), 0.9) << "tokens stranded: " << r.line;
    // The budget bound: the fleet wanted far more retries than it was allowed.
    EXPECT_GT(r.Num("retries_denied"), 5 * r.Num("retries_allowed")) << r.line;
    EXPECT_EQ(r.Num("workers"), 8);
    EXPECT_EQ(r.Num("threads"), 2);
    // The harness counted for itself, and the library agrees with it.
    EXPECT_EQ(r.Sub("library", "retries_allowed"), r.Num("retries_allowed"));
    EXPECT_EQ(r.Sub("library", "tokens_held_at_exit"), 0);
  }

  std::string port_file_;
  int port_ = 0;
  std::unique_ptr<Subprocess> server_;
};

TEST_F(FleetTest, FailureRateOneStaysWithinTheBudgetAndSpendsAtLeastNinetyPercentOfIt) {
  FleetResult r = RunFleet(BindingRun(/*failure_rate=*/1.0, /*credit=*/0.01));
  ExpectBindingRunWithinBudgetAndUsed(r);
  EXPECT_EQ(r.Num("successes"), 0);
  EXPECT_EQ(r.Num("failure_rate"), 1.0);
}

TEST_F(FleetTest, FailureRatePointThreeStaysWithinTheBudgetAndSpendsAtLeastNinetyPercentOfIt) {
  FleetResult r = RunFleet(BindingRun(/*failure_rate=*/0.3, /*credit=*/0.002));
  ExpectBindingRunWithinBudgetAndUsed(r);
  EXPECT_GT(r.Num("successes"), 0);
  // Successes earned part of the bound.
  EXPECT_GT(r.Num("successes") * r.Sub("policy", "success_credit"), 10) << r.line;
}

TEST_F(FleetTest, DroppedDuplicatedAndReplayedSyncsStillStayWithinTheBudget) {
  std::vector<std::string> args = BindingRun(/*failure_rate=*/0.5, /*credit=*/0.002);
  args.insert(args.end(), {"--fault-drop-response=0.15", "--fault-duplicate-request=0.15",
                           "--fault-replay-old=0.15"});
  FleetResult r = RunFleet(args);
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
  FleetResult r = RunFleet({"--workers=2", "--threads=2", "--duration=1", "--failure-rate=1",
                            "--tenant=fleet-test", "--capacity=20", "--refill=60",
                            "--credit=0.01", "--strategy=unbudgeted"});
  ASSERT_TRUE(r.Has("within_budget")) << r.line;
  EXPECT_FALSE(r.Bool("within_budget")) << r.line;
  EXPECT_GT(r.Num("retries_allowed"), r.Num("bound"));
  EXPECT_TRUE(ExitedWith(r.wait_status, 1)) << DescribeWaitStatus(r.wait_status);
}

TEST_F(FleetTest, BadOptionExitsTwoAndUnreachableServerExitsThree) {
  FleetResult bad = RunFleet({"--workers=0"});
  EXPECT_TRUE(ExitedWith(bad.wait_status, 2)) << DescribeWaitStatus(bad.wait_status);
  FleetResult unknown = RunFleet({"--no-such-option=1"});
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

}  // namespace
}  // namespace retrybudget::fleet
