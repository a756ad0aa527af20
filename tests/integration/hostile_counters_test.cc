// Issue 36's counters over real gRPC against the real binary: `requests`,
// `requests_credited_locally`, `shadow_denied` and `retries_allowed`, and retries that cost more
// than one token. A lying, replayed or duplicated report creates nothing: a first contact is a
// baseline, a counter going backwards or over 2^53 or a part over its whole is INVALID_ARGUMENT
// naming the field and nothing is applied, a replay (same seq) applies once, a stale seq
// nothing. The totals survive a clean restart; a mode no server knows is refused, naming
// policy.mode and the value.
#include <signal.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t k2To53 = uint64_t{1} << 53;

// A classic budget with no refill and no success credit: the only tokens are the 10 it starts
// with, so any token created by the new counters would show.
constexpr char kFixedPolicy[] =
    "capacity: 100 initial_tokens: 10 refill_per_second: 0 success_credit: 0";

std::string PolicyFile(const std::string& dir, const std::string& policy) {
  const std::string path = dir + "/policy.textproto";
  WriteFile(path, absl::StrCat("tenants { tenant: \"t\" policy { ", policy, " } }\n"));
  return path;
}

// The new counters of one report.
struct Counts {
  uint64_t requests = 0;
  uint64_t requests_credited_locally = 0;
  uint64_t shadow_denied = 0;
  uint64_t retries_allowed = 0;
};

v1::SyncRequest With(v1::SyncRequest r, const Counts& c) {
  v1::TenantSync* t = r.mutable_tenants(0);
  t->set_requests(c.requests);
  t->set_requests_credited_locally(c.requests_credited_locally);
  t->set_shadow_denied(c.shadow_denied);
  t->set_retries_allowed(c.retries_allowed);
  return r;
}

v1::BudgetStatus Budget(ServerConnection& c) {
  v1::BudgetStatus b;
  const grpc::Status s = c.GetBudget("t", &b);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return b;
}

// The budget's state without what time changes by itself (nothing here refills).
std::string Fingerprint(ServerConnection& c) { return Budget(c).SerializeAsString(); }

// Each test's own server, started with StartWithPolicy() (tenant "t" given `policy` by a policy
// file) or Start() (flags only), connected as c(), and stopped cleanly (SIGTERM, exit 0) at the end.
class HostileCountersTest : public ::testing::Test {
 protected:
  void StartWithPolicy(const std::string& policy = kFixedPolicy,
                       std::vector<std::string> flags = {}) {
    flags.insert(flags.begin(), "--policy=" + PolicyFile(dir_.path(), policy));
    Start(std::move(flags));
  }
  void Start(std::vector<std::string> flags) {
    server_ = ServerProcess::Start(dir_.path(), std::move(flags));
    ASSERT_NE(server_, nullptr);
    connection_.emplace(server_->Connect());
  }
  void TearDown() override {
    connection_.reset();
    if (server_ != nullptr) {
      EXPECT_EQ(server_->Stop(SIGTERM), 0);
    }
  }
  ServerConnection& c() { return *connection_; }

  ScopedTempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::optional<ServerConnection> connection_;
  v1::SyncResponse r;
};

TEST_F(HostileCountersTest, AFirstContactIsABaselineAndTheCountersCreateNoTokens) {
  ASSERT_NO_FATAL_FAILURE(StartWithPolicy());
  // A first contact claiming the largest counts allowed: recorded as the base, nothing counted.
  ASSERT_TRUE(c().Sync(With(SyncOf("i", 7, "t", 0), {.requests = k2To53,
                                                    .requests_credited_locally = k2To53 / 2,
                                                    .shadow_denied = k2To53}),
                     &r)
                  .ok());
  v1::BudgetStatus b = Budget(c());
  EXPECT_EQ(b.requests_total(), 0u);
  EXPECT_EQ(b.shadow_denied_total(), 0u);
  EXPECT_EQ(b.retries_allowed_total(), 0u);
  EXPECT_EQ(b.tokens(), 10);
  // Another instance reports a billion requests and would-be denials after its baseline: they
  // are counted, and a classic budget gains no token from them.
  ASSERT_TRUE(c().Sync(SyncOf("j", 1, "t", 0), &r).ok());
  ASSERT_TRUE(c().Sync(With(SyncOf("j", 2, "t", 0), {.requests = 1'000'000'000,
                                                    .requests_credited_locally = 1'000'000,
                                                    .shadow_denied = 1'000'000'000}),
                     &r)
                  .ok());
  b = Budget(c());
  EXPECT_EQ(b.requests_total(), 1'000'000'000u);
  EXPECT_EQ(b.shadow_denied_total(), 1'000'000'000u);
  EXPECT_EQ(b.tokens(), 10) << b.ShortDebugString();
  ASSERT_TRUE(c().Sync(SyncOf("k", 1, "t", 100), &r).ok());
  EXPECT_EQ(r.tenants(0).granted(), 10u);
}

TEST_F(HostileCountersTest, EachCounterGoingBackwardsIsRefusedNamingItAndNothingIsApplied) {
  ASSERT_NO_FATAL_FAILURE(StartWithPolicy());
  ASSERT_TRUE(c().Sync(SyncOf("i", 1, "t", 10), &r).ok());
  ASSERT_EQ(r.tenants(0).granted(), 10u);
  const Counts applied{.requests = 20, .requests_credited_locally = 5, .shadow_denied = 4,
                       .retries_allowed = 2};
  ASSERT_TRUE(c().Sync(With(SyncOf("i", 2, "t", 0, 10, 0, 3), applied), &r).ok());
  const std::string before = Fingerprint(c());
  for (const auto& [lower, field] : std::vector<std::pair<Counts, std::string>>{
           {{19, 5, 4, 2}, "tenants[0].requests = 19"},
           {{20, 4, 4, 2}, "tenants[0].requests_credited_locally = 4"},
           {{20, 5, 3, 2}, "tenants[0].shadow_denied = 3"},
           {{20, 5, 4, 1}, "tenants[0].retries_allowed = 1"}}) {
    const grpc::Status s = c().Sync(With(SyncOf("i", 3, "t", 0, 10, 0, 4), lower), &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(s.error_message(), HasSubstr(field));
    EXPECT_THAT(s.error_message(), HasSubstr("never go backwards"));
  }
  EXPECT_EQ(Fingerprint(c()), before);
  // seq 3 is still the instance's next.
  ASSERT_TRUE(c().Sync(With(SyncOf("i", 3, "t", 0, 10, 0, 3), {21, 5, 4, 2}), &r).ok());
  EXPECT_FALSE(r.stale());
  EXPECT_EQ(Budget(c()).requests_total(), 21u);
}

TEST_F(HostileCountersTest, OverTwoToThe53OrAPartOverItsWholeIsRefusedNamingTheFields) {
  ASSERT_NO_FATAL_FAILURE(StartWithPolicy());
  ASSERT_TRUE(c().Sync(SyncOf("n", 1, "t", 4), &r).ok());
  ASSERT_EQ(r.tenants(0).granted(), 4u);
  const std::string before = Fingerprint(c());
  for (const auto& [request, field] : std::vector<std::pair<v1::SyncRequest, std::string>>{
           {With(SyncOf("n", 2, "t", 0), {.requests = k2To53 + 1}),
            "tenants[0].requests = 9007199254740993"},
           {With(SyncOf("n", 2, "t", 0), {.requests = k2To53 + 1,
                                          .requests_credited_locally = k2To53 + 1}),
            "tenants[0].requests = 9007199254740993"},
           {With(SyncOf("n", 2, "t", 0), {.shadow_denied = UINT64_MAX}),
            "tenants[0].shadow_denied = 18446744073709551615"},
           {With(SyncOf("n", 2, "t", 0, 4, 0, 4), {.retries_allowed = k2To53 + 1}),
            "tenants[0].retries_allowed = 9007199254740993"},
           {With(SyncOf("n", 2, "t", 0), {.requests = 4, .requests_credited_locally = 5}),
            "tenants[0].requests_credited_locally = 5 exceeds requests = 4"},
           // One retry allowed spends at least one token: two retries cannot have cost one.
           {With(SyncOf("n", 2, "t", 0, 4, 0, 1), {.retries_allowed = 2}),
            "tenants[0].retries_allowed = 2 exceeds retries_spent = 1"}}) {
    const grpc::Status s = c().Sync(request, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(s.error_message(), HasSubstr(field));
  }
  EXPECT_EQ(Fingerprint(c()), before);
  // The largest counts allowed are accepted.
  ASSERT_TRUE(c().Sync(With(SyncOf("n", 2, "t", 0, 4, 0, 4),
                          {.requests = k2To53, .requests_credited_locally = k2To53,
                           .shadow_denied = k2To53, .retries_allowed = 4}),
                     &r)
                  .ok());
  EXPECT_EQ(Budget(c()).requests_total(), k2To53);
}

TEST_F(HostileCountersTest, AReplayOrADuplicateAppliesOnceAndAStaleSeqNothing) {
  ASSERT_NO_FATAL_FAILURE(StartWithPolicy());
  ASSERT_TRUE(c().Sync(SyncOf("d", 1, "t", 5), &r).ok());
  const v1::SyncRequest report = With(SyncOf("d", 2, "t", 1, 5, 0, 5),
                                      {.requests = 30, .shadow_denied = 6, .retries_allowed = 1});
  v1::SyncResponse first;
  ASSERT_TRUE(c().Sync(report, &first).ok());
  const v1::BudgetStatus once = Budget(c());
  EXPECT_EQ(once.requests_total(), 30u);
  EXPECT_EQ(once.shadow_denied_total(), 6u);
  EXPECT_EQ(once.retries_allowed_total(), 1u);
  EXPECT_EQ(once.retries_total(), 5u);  // one retry of cost 5
  // The same request again (a retry of a lost response): the same answer, nothing applied.
  v1::SyncResponse again;
  ASSERT_TRUE(c().Sync(report, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), first.SerializeAsString());
  // The same seq with other counters: refused, nothing applied.
  const grpc::Status changed =
      c().Sync(With(SyncOf("d", 2, "t", 1, 5, 0, 5), {.requests = 60, .retries_allowed = 1}), &r);
  EXPECT_EQ(changed.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(changed.error_message(), HasSubstr("seq = 2 was already used"));
  // The same counters under a new seq (a duplicate): no delta, nothing more.
  v1::SyncRequest duplicate = report;
  duplicate.set_seq(3);
  duplicate.mutable_tenants(0)->set_tokens_received(first.tenants(0).granted() + 5);
  ASSERT_TRUE(c().Sync(duplicate, &r).ok());
  // A stale seq claiming more: ignored.
  ASSERT_TRUE(c().Sync(With(SyncOf("d", 1, "t", 0), {.requests = 1000, .shadow_denied = 1000}), &r)
                  .ok());
  EXPECT_TRUE(r.stale());
  const v1::BudgetStatus after = Budget(c());
  EXPECT_EQ(after.requests_total(), 30u);
  EXPECT_EQ(after.shadow_denied_total(), 6u);
  EXPECT_EQ(after.retries_allowed_total(), 1u);
  EXPECT_EQ(after.retries_total(), 5u);
}

TEST_F(HostileCountersTest, ARetryOfCostFiveSpendsFiveTokensAndCannotSpendMoreThanItReceived) {
  ASSERT_NO_FATAL_FAILURE(StartWithPolicy());
  ASSERT_TRUE(c().Sync(SyncOf("a", 1, "t", 10), &r).ok());
  ASSERT_EQ(r.tenants(0).granted(), 10u);
  // Two retries of cost 5 spend the whole lease.
  ASSERT_TRUE(c().Sync(With(SyncOf("a", 2, "t", 0, 10, 0, 10), {.retries_allowed = 2}), &r).ok());
  v1::BudgetStatus b = Budget(c());
  EXPECT_EQ(b.retries_total(), 10u);
  EXPECT_EQ(b.retries_allowed_total(), 2u);
  EXPECT_EQ(b.tokens(), 0);
  EXPECT_EQ(b.leased_tokens(), 0);
  // A third retry of cost 5 with no token left: refused, naming what it exceeds.
  const grpc::Status s =
      c().Sync(With(SyncOf("a", 3, "t", 0, 10, 0, 15), {.retries_allowed = 3}), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("exceed tokens_received (10)"));
  // Returning tokens spent on a costly retry gives nothing back.
  const grpc::Status back =
      c().Sync(With(SyncOf("a", 3, "t", 0, 10, 5, 10), {.retries_allowed = 2}), &r);
  EXPECT_EQ(back.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Budget(c()).tokens(), 0);
}

TEST_F(HostileCountersTest, TheTotalsSurviveACleanRestartAndAReplayAfterItAppliesNothing) {
  const std::vector<std::string> data_dir = {"--data_dir=" + dir_.path() + "/data"};
  ASSERT_NO_FATAL_FAILURE(StartWithPolicy(kFixedPolicy, data_dir));
  const v1::SyncRequest report = With(SyncOf("s", 2, "t", 0, 2, 0, 2),
                                      {.requests = 9, .shadow_denied = 3, .retries_allowed = 1});
  ASSERT_TRUE(c().Sync(SyncOf("s", 1, "t", 2), &r).ok());
  ASSERT_TRUE(c().Sync(report, &r).ok());
  connection_.reset();
  ASSERT_EQ(server_->Stop(SIGTERM), 0);
  ASSERT_NO_FATAL_FAILURE(StartWithPolicy(kFixedPolicy, data_dir));
  ASSERT_TRUE(c().Sync(report, &r).ok());  // the replay, answered from the snapshot
  ASSERT_TRUE(c().Sync(With(SyncOf("s", 3, "t", 0, 2, 0, 2),
                          {.requests = 10, .shadow_denied = 3, .retries_allowed = 1}),
                     &r)
                  .ok());  // credited from the restored record: one more request
  const v1::BudgetStatus b = Budget(c());
  EXPECT_EQ(b.requests_total(), 10u);
  EXPECT_EQ(b.shadow_denied_total(), 3u);
  EXPECT_EQ(b.retries_allowed_total(), 1u);
}

// A windowed tenant with no floor: its only tokens are its requests' deposits (retry_ratio 1,
// a window of 60 s that no deposit outlives during the test). A report deposits ratio * (new
// requests - new requests credited locally): claiming a local credit can only deposit less, and
// taking one back is refused as a counter going backwards.
TEST_F(HostileCountersTest, AWindowedTenantsDepositsComeOnlyFromNewRequestsNotCreditedLocally) {
  ASSERT_NO_FATAL_FAILURE(
      StartWithPolicy("retry_ratio: 1 min_retries_per_second: 0 ttl_ms: 60000"));
  // First contacts claiming millions of requests: baselines, nothing deposited.
  for (const char* instance : {"honest", "liar", "hider"}) {
    ASSERT_TRUE(c().Sync(With(SyncOf(instance, 1, "t", 0), {.requests = 5'000'000}), &r).ok());
  }
  EXPECT_EQ(Budget(c()).window_deposits(), 0);
  EXPECT_EQ(Budget(c()).tokens(), 0);
  // Ten new requests: ten tokens deposited.
  const v1::SyncRequest honest = With(SyncOf("honest", 2, "t", 0), {.requests = 5'000'010});
  ASSERT_TRUE(c().Sync(honest, &r).ok());
  EXPECT_EQ(Budget(c()).window_deposits(), 10);
  // Its replay and a duplicate under a new seq: nothing more; a stale seq: nothing.
  ASSERT_TRUE(c().Sync(honest, &r).ok());
  v1::SyncRequest duplicate = honest;
  duplicate.set_seq(3);
  ASSERT_TRUE(c().Sync(duplicate, &r).ok());
  ASSERT_TRUE(c().Sync(With(SyncOf("honest", 1, "t", 0), {.requests = 9'000'000}), &r).ok());
  EXPECT_TRUE(r.stale());
  EXPECT_EQ(Budget(c()).window_deposits(), 10);
  // Ten requests, four of them claimed as credited by the client's own fallback bucket: six.
  ASSERT_TRUE(c().Sync(With(SyncOf("liar", 2, "t", 0),
                          {.requests = 5'000'010, .requests_credited_locally = 4}),
                     &r)
                  .ok());
  EXPECT_EQ(Budget(c()).window_deposits(), 16);
  // Taking the local credit back, or claiming more than the requests: refused, nothing deposited.
  for (const auto& [lie, field] : std::vector<std::pair<Counts, std::string>>{
           {{.requests = 5'000'020, .requests_credited_locally = 0},
            "tenants[0].requests_credited_locally = 0"},
           {{.requests = 20, .requests_credited_locally = 21},
            "tenants[0].requests_credited_locally = 21 exceeds requests = 20"}}) {
    const grpc::Status s = c().Sync(With(SyncOf("liar", 3, "t", 0), lie), &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(s.error_message(), HasSubstr(field));
  }
  EXPECT_EQ(Budget(c()).window_deposits(), 16);
  // Hiding a local credit deposits what reporting as many requests deposits, no more.
  ASSERT_TRUE(c().Sync(With(SyncOf("hider", 2, "t", 0), {.requests = 5'000'005}), &r).ok());
  EXPECT_EQ(Budget(c()).window_deposits(), 21);
  // Nothing beyond the deposits is granted, to one instance or several.
  uint64_t granted = 0;
  for (const char* instance : {"a", "b"}) {
    ASSERT_TRUE(c().Sync(SyncOf(instance, 1, "t", 100), &r).ok());
    granted += r.tenants(0).granted();
  }
  EXPECT_LE(granted, 21u);
  EXPECT_GE(granted, 1u);
}

TEST_F(HostileCountersTest, AnUnknownModeIsRefusedNamingPolicyModeAndTheValueAndChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  v1::BudgetPolicy shadow;
  shadow.set_capacity(30);
  shadow.set_mode(v1::MODE_SHADOW);
  ASSERT_TRUE(c().PutPolicy("t", shadow).ok());
  const std::string before = Fingerprint(c());
  v1::BudgetPolicy unknown;
  unknown.set_capacity(50);
  unknown.set_mode(static_cast<v1::Mode>(7));  // a value from a newer contract
  const grpc::Status s = c().PutPolicy("t", unknown);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("policy.mode = 7"));
  EXPECT_EQ(Fingerprint(c()), before);
  // Nor is a new budget created by it.
  EXPECT_EQ(c().PutPolicy("fresh", unknown).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::BudgetStatus none;
  EXPECT_EQ(c().GetBudget("fresh", &none).error_code(), grpc::StatusCode::NOT_FOUND);
  // The mode of each grant is the policy's.
  ASSERT_TRUE(c().Sync(SyncOf("m", 1, "t", 1), &r).ok());
  EXPECT_EQ(r.tenants(0).mode(), v1::MODE_SHADOW);
}

}  // namespace
}  // namespace retrybudget::testing
