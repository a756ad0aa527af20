// budgetctl, the binary, against the real server binary: every command, and the refusals with
// their exit codes (1: the server refused or could not be reached, 2: bad command line).
#include <signal.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ops/ops_test_util.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class BudgetctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = OpsServer::Start(RETRY_BUDGET_SERVER_BINARY, ServerArgs());
    ASSERT_NE(server_, nullptr);
  }
  virtual std::vector<std::string> ServerArgs() { return {}; }

  // budgetctl `args` --server=<the server>, with `env` prepended (e.g. "RETRY_BUDGET_TOKEN=x").
  CommandResult Ctl(const std::string& args, const std::string& env = "") {
    return RunCommand(absl::StrCat("env -u RETRY_BUDGET_TOKEN -u RETRY_BUDGET_SERVER ", env, " ",
                                   BUDGETCTL_BINARY, " ", args, " --server=", server_->address()));
  }

  std::unique_ptr<OpsServer> server_;
};

TEST_F(BudgetctlTest, PutGetListWatchDelete) {
  CommandResult r = Ctl("put payments --capacity=50 --refill 2 --credit=0.05 --lease-ttl-ms=2000");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("policy of \"payments\" set: capacity 50, refill 2/s"));
  ASSERT_EQ(Ctl("put search --initial=5 --refill=0").exit_code, 0);

  r = Ctl("get payments");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tenant:            payments"));
  EXPECT_THAT(r.output, HasSubstr("tokens:            50.00 / 50"));
  EXPECT_THAT(r.output, HasSubstr("lease 2000 ms (explicit)"));

  r = Ctl("list");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = absl::StrSplit(r.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << r.output;
  EXPECT_TRUE(absl::StartsWith(lines[0], "TENANT")) << r.output;
  EXPECT_TRUE(absl::StartsWith(lines[1], "payments")) << r.output;
  EXPECT_TRUE(absl::StartsWith(lines[2], "search")) << r.output;
  EXPECT_THAT(lines[2], HasSubstr("  5.0  "));

  r = Ctl("list --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"tenant\":\"payments\""));
  EXPECT_THAT(r.output, HasSubstr("\"tenant\":\"search\""));
  r = Ctl("get search --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"tokens\":5"));

  r = Ctl("watch payments --count=3 --interval=100ms");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> samples = absl::StrSplit(r.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(samples.size(), 3u) << r.output;
  EXPECT_THAT(samples[0], HasSubstr("payments  tokens    50.00 / 50  active 0"));

  r = Ctl("delete search");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("budget \"search\" deleted"));
  r = Ctl("list");
  EXPECT_THAT(r.output, Not(HasSubstr("search")));
}

TEST_F(BudgetctlTest, RefusedByTheServerExitsOneWithTheStatus) {
  CommandResult r = Ctl("get nobody");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("GetBudget(\"nobody\") failed: NOT_FOUND:"));
  r = Ctl("delete nobody");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("NOT_FOUND"));
  r = Ctl("put bad --capacity=-1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("PutPolicy(\"bad\") failed: INVALID_ARGUMENT: policy.capacity"));
  r = Ctl("watch nobody --count=2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("NOT_FOUND"));
}

TEST_F(BudgetctlTest, UnreachableServerExitsOneWithUnavailable) {
  const CommandResult r = RunCommand(absl::StrCat(
      BUDGETCTL_BINARY, " list --timeout=2s --server=127.0.0.1:", FreePort()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("ListBudgets failed: UNAVAILABLE"));
}

TEST_F(BudgetctlTest, BadCommandLinesExitTwoAndSendNothing) {
  for (const char* args : {"", "frobnicate", "get", "put", "get a b", "list --bogus",
                           "get a --capacity=1", "put a --capacity=lots", "watch a --count=0",
                           "watch a --interval=-1s", "list --timeout"}) {
    const CommandResult r = Ctl(args);
    EXPECT_EQ(r.exit_code, 2) << "budgetctl " << args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("Usage: budgetctl")) << args;
  }
  // Nothing was created by the refused `put`s.
  EXPECT_THAT(Ctl("list").output, HasSubstr("(no budgets)"));
  const CommandResult help = Ctl("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("Exit codes"));
}

TEST_F(BudgetctlTest, WatchStopsOnCtrlC) {
  ASSERT_EQ(Ctl("put live").exit_code, 0);
  ScopedTempDir dir;
  std::optional<ChildProcess> watch = ChildProcess::Start(
      BUDGETCTL_BINARY, {"watch", "live", "--interval=100ms", "--server=" + server_->address()},
      dir.path() + "/output");
  ASSERT_TRUE(watch.has_value());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && !absl::StrContains(watch->Output(), "live  tokens")) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_THAT(watch->Output(), HasSubstr("live  tokens"));
  watch->Signal(SIGINT);
  EXPECT_EQ(watch->Wait(absl::Seconds(5)), 0) << watch->Output();
}

// With credentials in the policy file, the admin API needs the admin token.
class BudgetctlAuthTest : public BudgetctlTest {
 protected:
  std::vector<std::string> ServerArgs() override {
    const std::string policy = policy_dir_.path() + "/policy.textproto";
    std::ofstream(policy) << "credentials { name: \"ops-admin\" token_sha256: \""
                          << Sha256Hex("admin-secret") << "\" admin: true }\n"
                          << "credentials { name: \"worker\" token_sha256: \""
                          << Sha256Hex("worker-secret") << "\" tenants: \"payments\" }\n";
    return {"--policy=" + policy};
  }

  static std::string Sha256Hex(const std::string& token) {
    const CommandResult r = RunCommand(absl::StrCat("printf %s ", token, " | sha256sum"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output.substr(0, 64);
  }

  ScopedTempDir policy_dir_;
};

TEST_F(BudgetctlAuthTest, AdminTokenRequired) {
  CommandResult r = Ctl("list");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("ListBudgets failed: UNAUTHENTICATED"));
  EXPECT_THAT(r.output, HasSubstr("hint: pass the admin token"));

  r = Ctl("list --token=wrong-secret");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("UNAUTHENTICATED"));

  r = Ctl("put payments --capacity=5 --token=worker-secret");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("PutPolicy(\"payments\") failed: PERMISSION_DENIED"));

  r = Ctl("put payments --capacity=5 --token=admin-secret");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Ctl("get payments", "RETRY_BUDGET_TOKEN=admin-secret");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tokens:            5.00 / 5"));
}

}  // namespace
}  // namespace retrybudget::testing
