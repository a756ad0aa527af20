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
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/ops/ops_test_util.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The value in column `name` of row `row` (1: the first budget) of `budgetctl list`'s table.
std::string Column(const std::string& table, size_t row, const std::string& name) {
  const std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  if (row >= lines.size()) return "(no row " + std::to_string(row) + ")";
  const std::vector<std::string> header = absl::StrSplit(lines[0], ' ', absl::SkipEmpty());
  const std::vector<std::string> cells = absl::StrSplit(lines[row], ' ', absl::SkipEmpty());
  for (size_t i = 0; i < header.size() && i < cells.size(); ++i) {
    if (header[i] == name) return cells[i];
  }
  return "(no column " + name + ")";
}

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

  // One Sync of `tenant` by instance `instance`, as a client reports its cumulative counters.
  void Sync(const std::string& instance, uint64_t seq, const std::string& tenant,
            const v1::TenantSync& counters) {
    auto stub = v1::RetryBudgetService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::SyncRequest request;
    request.set_instance_id(instance);
    request.set_seq(seq);
    v1::TenantSync* entry = request.add_tenants();
    *entry = counters;
    entry->set_tenant(tenant);
    v1::SyncResponse response;
    const grpc::Status s = stub->Sync(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(response.tenants_size(), 1);
    ASSERT_FALSE(response.tenants(0).has_error()) << response.tenants(0).error().message();
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

TEST_F(BudgetctlTest, PutsAWindowedShadowPolicyAndModeSwitchesOnlyTheMode) {
  CommandResult r = Ctl(
      "put checkout --retry-ratio=0.5 --min-retries-per-second=2 --ttl-ms=5000 --mode=shadow");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("policy of \"checkout\" set: windowed: retry ratio 0.5, min 2 "
                                  "retries/s, ttl 5000 ms, lease 500 ms, mode shadow"));
  r = Ctl("get checkout");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("mode:              shadow"));
  EXPECT_THAT(r.output, HasSubstr("grantable now (deposits "));

  r = Ctl("mode checkout enforce");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("windowed: retry ratio 0.5, min 2 retries/s, ttl 5000 ms, "
                                  "lease 500 ms, mode enforce"));
  r = Ctl("get checkout --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"mode\":\"MODE_ENFORCE\""));
  EXPECT_THAT(r.output, HasSubstr("\"retry_ratio\":0.5"));
  EXPECT_THAT(r.output, HasSubstr("\"ttl_ms\":\"5000\""));
  EXPECT_THAT(r.output, HasSubstr("\"window_deposits\":"));
  r = Ctl("watch checkout --count=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("checkout  tokens    10.00 grantable, deposits 0.00  active 0"));

  // A token bucket keeps its fields through a switch, and its level.
  ASSERT_EQ(Ctl("put payments --capacity=40 --refill=0 --credit=0.5 --initial=7").exit_code, 0);
  r = Ctl("mode payments shadow");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("capacity 40, refill 0/s, credit 0.5 per success, initial 7, "
                                  "lease 5000 ms, mode shadow; tokens now 7.00"));

  r = Ctl("list");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = absl::StrSplit(r.output, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << r.output;
  EXPECT_TRUE(absl::StartsWith(lines[1], "checkout  enforce")) << r.output;
  EXPECT_TRUE(absl::StartsWith(lines[2], "payments  shadow ")) << r.output;
  EXPECT_EQ(Column(r.output, 1, "RATIO"), "0.5");
  EXPECT_EQ(Column(r.output, 1, "MIN/S"), "2");
  EXPECT_EQ(Column(r.output, 1, "TTL_MS"), "5000");
  EXPECT_EQ(Column(r.output, 1, "CAPACITY"), "-");
  EXPECT_EQ(Column(r.output, 2, "CAPACITY"), "40");
  EXPECT_EQ(Column(r.output, 2, "RATIO"), "-");
  r = Ctl("list --json");
  EXPECT_THAT(r.output, HasSubstr("\"mode\":\"MODE_SHADOW\""));
}

TEST_F(BudgetctlTest, GetListAndWatchShowTheNewTotals) {
  ASSERT_EQ(Ctl("put dry --capacity=100 --mode=shadow").exit_code, 0);
  v1::TenantSync first;
  first.set_want(10);
  Sync("worker", 1, "dry", first);  // a baseline, granted 10
  v1::TenantSync next;
  next.set_tokens_received(10);
  next.set_requests(40);
  next.set_retries_spent(6);  // two retries of cost 3
  next.set_retries_allowed(2);
  next.set_shadow_denied(5);
  Sync("worker", 2, "dry", next);

  CommandResult r = Ctl("get dry");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("requests:          40\n"));
  EXPECT_THAT(r.output, HasSubstr("retries:           6 tokens sent"));
  EXPECT_THAT(r.output, HasSubstr("retries allowed:   2 (mean cost 3 tokens)"));
  EXPECT_THAT(r.output, HasSubstr("shadow denied:     5 (would-be denials"));
  r = Ctl("get dry --json");
  EXPECT_THAT(r.output, HasSubstr("\"shadow_denied_total\":\"5\""));
  EXPECT_THAT(r.output, HasSubstr("\"requests_total\":\"40\""));
  EXPECT_THAT(r.output, HasSubstr("\"retries_allowed_total\":\"2\""));
  r = Ctl("list");
  EXPECT_EQ(Column(r.output, 1, "MODE"), "shadow") << r.output;
  EXPECT_EQ(Column(r.output, 1, "REQUESTS"), "40") << r.output;
  EXPECT_EQ(Column(r.output, 1, "RETRIES"), "6") << r.output;
  EXPECT_EQ(Column(r.output, 1, "ALLOWED"), "2") << r.output;
  EXPECT_EQ(Column(r.output, 1, "DENIED"), "0") << r.output;
  EXPECT_EQ(Column(r.output, 1, "SHADOW_DENIED"), "5") << r.output;
  r = Ctl("watch dry --count=1");
  EXPECT_THAT(r.output, HasSubstr("shadow-denied +0"));
}

TEST_F(BudgetctlTest, ModeOfATenantWithoutABudgetCreatesItInThatModeTheRestDefault) {
  const CommandResult r = Ctl("mode nobody shadow");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("policy of \"nobody\" set: capacity 100, refill 1/s"));
  EXPECT_THAT(r.output, HasSubstr("mode shadow"));
  EXPECT_EQ(Column(Ctl("list").output, 1, "MODE"), "shadow");
}

TEST_F(BudgetctlTest, PutOnlyChangesJustTheFlagsGivenKeepingTheRest) {
  ASSERT_EQ(Ctl("put payments --capacity=40 --refill=0 --credit=0.5 --initial=7 --mode=shadow")
                .exit_code,
            0);
  CommandResult r = Ctl("put payments --only --capacity=60");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("capacity 60, refill 0/s, credit 0.5 per success, initial 7, "
                                  "lease 5000 ms, mode shadow; tokens now 7.00"));
  r = Ctl("put payments --only --mode=enforce --lease-ttl-ms=2000");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("capacity 60, refill 0/s, credit 0.5 per success, initial 7, "
                                  "lease 2000 ms, mode enforce"));
  // A merge of both shapes is refused by the server, naming the mask; nothing changes.
  r = Ctl("put payments --only --retry-ratio=0.2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("INVALID_ARGUMENT: the policy merged by update_mask"));
  r = Ctl("get payments");
  EXPECT_THAT(r.output, HasSubstr("capacity 60,"));
  EXPECT_THAT(r.output, HasSubstr("mode:              enforce"));
}

TEST_F(BudgetctlTest, AnUnknownModeNamesTheFlagAndTheValueAndSendsNothing) {
  ASSERT_EQ(Ctl("put kept --capacity=9 --mode=shadow").exit_code, 0);
  CommandResult r = Ctl("put kept --capacity=9 --mode=dry-run");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--mode=\"dry-run\" is not a mode (enforce or shadow)"));
  r = Ctl("mode kept Shadow");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("MODE \"Shadow\" is not a mode (enforce or shadow)"));
  r = Ctl("put kept --retry-ratio=lots");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--retry-ratio=\"lots\" is not a number"));
  r = Ctl("get kept");
  EXPECT_THAT(r.output, HasSubstr("mode:              shadow"));
  EXPECT_THAT(r.output, HasSubstr("capacity 9,"));
}

TEST_F(BudgetctlTest, APolicyOfBothShapesIsRefusedByTheServerNamingTheFields) {
  const CommandResult r = Ctl("put mixed --capacity=10 --retry-ratio=0.2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("PutPolicy(\"mixed\") failed: INVALID_ARGUMENT"));
  EXPECT_THAT(r.output, HasSubstr("capacity"));
  EXPECT_THAT(r.output, HasSubstr("retry_ratio"));
  EXPECT_THAT(Ctl("list").output, HasSubstr("(no budgets)"));
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
                           "watch a --interval=-1s", "list --timeout", "put a --mode=dry",
                           "put a --mode", "mode a", "mode a dry", "mode a shadow extra",
                           "get a --mode=shadow", "mode a shadow --capacity=1",
                           "put a --ttl-ms=1.5", "put a --only", "get a --only",
                           "put a --only=maybe --capacity=1"}) {
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
