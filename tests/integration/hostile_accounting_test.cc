// Accounting that no client and no restart can fool, through the real binary over real gRPC
// (docs/DESIGN.md "Accounting"). One test per way a request could create tokens or be applied
// twice; each names the case of issue 11 it covers:
//  1. tokens from nothing: claimed receipts and returns of a baseline credit nothing;
//  2. one client freezing a tenant: claimed holdings count only up to this server's grants;
//  3. applied twice after `final`, after eviction, after kill -9 and restart;
//  4. an exact replay after a clean restart gets the cached response;
//  5. counters over 2^53 are refused (so totals cannot wrap);
//  6. an instance id belongs to the credential that first used it;
//  8. unparseable bytes get INVALID_ARGUMENT with a message.
// (Case 7, the validation race, is in tests/server/budget_core_concurrent_test.cc.) One more
// test takes 1, 3, 4 and 6 again for an instance of several tenants, whose records after the
// first are kept apart (AnInstanceOfSeveralTenants...).
#include <signal.h>

#include <cstdint>
#include <future>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/bearer_authorizer.h"
#include "tests/integration/server_process.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
constexpr uint64_t k2To53 = uint64_t{1} << 53;

// `policy` (a BudgetPolicy's fields) as the only listed tenant `tenant`.
std::string PolicyFile(const std::string& dir, const std::string& tenant,
                       const std::string& policy, const std::string& extra = "") {
  const std::string path = dir + "/policy.textproto";
  WriteFile(path, absl::StrCat("tenants { tenant: \"", tenant, "\" policy { ", policy, " } }\n",
                               extra));
  return path;
}

v1::BudgetStatus Budget(ServerConnection& c, const std::string& tenant) {
  v1::BudgetStatus b;
  const grpc::Status s = c.GetBudget(tenant, &b);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return b;
}

v1::SyncRequest WithSuccesses(v1::SyncRequest r, uint64_t successes) {
  r.mutable_tenants(0)->set_successes(successes);
  return r;
}

// ---- 1. tokens from nothing ----

TEST(HostileAccountingTest, ClaimedReceiptsAndReturnsOfABaselineCreditNothing) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(
      dir.path(), {"--policy=" + PolicyFile(dir.path(), "t",
                                            "capacity: 100 initial_tokens: 0 "
                                            "refill_per_second: 0 success_credit: 0")});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  // "i" claims 50 tokens it never got from this server, then returns them.
  ASSERT_TRUE(c.Sync(SyncOf("i", 5, "t", 0, 50), &r).ok());
  ASSERT_TRUE(c.Sync(SyncOf("i", 6, "t", 0, 50, 50), &r).ok());
  v1::BudgetStatus b = Budget(c, "t");
  EXPECT_EQ(b.tokens(), 0) << b.ShortDebugString();
  EXPECT_EQ(b.granted_total(), 0u);
  EXPECT_EQ(b.uncredited_total(), 50u);
  // Another instance finds nothing to lease.
  ASSERT_TRUE(c.Sync(SyncOf("other", 1, "t", 50), &r).ok());
  EXPECT_EQ(r.tenants(0).granted(), 0u);
  // The largest claim allowed, and one beyond it.
  ASSERT_TRUE(c.Sync(SyncOf("j", 1, "t", 0, k2To53), &r).ok());
  ASSERT_TRUE(c.Sync(SyncOf("j", 2, "t", 0, k2To53, k2To53), &r).ok());
  EXPECT_EQ(Budget(c, "t").tokens(), 0);
  const grpc::Status over = c.Sync(SyncOf("k", 1, "t", 0, kMaxU64), &r);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(over.error_message(), HasSubstr("tokens_received = 18446744073709551615"));
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// ---- 2. one client freezing a tenant ----

TEST(HostileAccountingTest, ClaimedHoldingsDoNotHoldTheCapacity) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(
      dir.path(), {"--policy=" + PolicyFile(dir.path(), "dos",
                                            "capacity: 100 refill_per_second: 0 "
                                            "success_credit: 0")});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  // x claims to hold 1e15 tokens; two more claim 2^53 and 1 (their sum wrapped 64 bits once).
  ASSERT_TRUE(c.Sync(SyncOf("x", 9, "dos", 1, 1'000'000'000'000'000), &r).ok());
  ASSERT_TRUE(c.Sync(SyncOf("y", 9, "dos", 1, k2To53), &r).ok());
  ASSERT_TRUE(c.Sync(SyncOf("z", 9, "dos", 1, 1), &r).ok());
  v1::BudgetStatus b = Budget(c, "dos");
  // Only the one token each was granted here counts against the capacity.
  EXPECT_LE(b.leased_tokens(), 3);
  EXPECT_EQ(b.tokens() + b.leased_tokens(), 100);
  // Another instance still leases what is left.
  ASSERT_TRUE(c.Sync(SyncOf("w", 1, "dos", 50), &r).ok());
  EXPECT_EQ(r.tenants(0).granted(), 50u);
  const grpc::Status over = c.Sync(SyncOf("v", 9, "dos", 1, kMaxU64), &r);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(over.error_message(), HasSubstr("tokens_received"));
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// ---- 3. applied twice after the server forgot the instance ----

constexpr char kCreditPolicy[] =
    "capacity: 1000 initial_tokens: 10 refill_per_second: 0 success_credit: 1";

TEST(HostileAccountingTest, RequestsOfAFinishedInstanceAreStale) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(
      dir.path(), {"--policy=" + PolicyFile(dir.path(), "t", kCreditPolicy)});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  const v1::SyncRequest first = WithSuccesses(SyncOf("f", 1, "t", 0), 0);
  const v1::SyncRequest second = WithSuccesses(SyncOf("f", 2, "t", 0), 5);
  v1::SyncRequest last = WithSuccesses(SyncOf("f", 3, "t", 0), 10);
  last.set_final(true);
  ASSERT_TRUE(c.Sync(first, &r).ok());
  ASSERT_TRUE(c.Sync(second, &r).ok());
  ASSERT_TRUE(c.Sync(last, &r).ok());
  const v1::BudgetStatus done = Budget(c, "t");
  EXPECT_EQ(done.tokens(), 20);
  // Delayed duplicates of every request it sent: stale, nothing applied, nothing granted.
  for (v1::SyncRequest again : {first, second, last}) {
    again.mutable_tenants(0)->set_want(again.seq() == 1 ? 10 : 0);
    const grpc::Status s = c.Sync(again, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(r.stale()) << again.ShortDebugString();
  }
  const v1::BudgetStatus after = Budget(c, "t");
  EXPECT_EQ(after.tokens(), done.tokens());
  EXPECT_EQ(after.granted_total(), done.granted_total());
  EXPECT_EQ(after.successes_total(), done.successes_total());
  // A higher seq is the id's new life: a baseline.
  ASSERT_TRUE(c.Sync(WithSuccesses(SyncOf("f", 4, "t", 0), 99), &r).ok());
  EXPECT_FALSE(r.stale());
  EXPECT_EQ(Budget(c, "t").tokens(), done.tokens());
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

TEST(HostileAccountingTest, RequestsOfAnEvictedInstanceAreStale) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(
      dir.path(),
      {"--policy=" + PolicyFile(dir.path(), "t", kCreditPolicy), "--max_instances=10"});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  const v1::SyncRequest first = WithSuccesses(SyncOf("e", 1, "t", 0), 10);
  ASSERT_TRUE(c.Sync(first, &r).ok());
  // 12 more instances: "e" (the least recently seen) and two others are evicted and leave
  // tombstones (at most --max_instances of them are kept).
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(c.Sync(SyncOf(absl::StrCat("crowd-", i), 1, "t", 0), &r).ok());
  }
  const v1::BudgetStatus before = Budget(c, "t");
  ASSERT_TRUE(c.Sync(first, &r).ok());  // a resend after "e" was evicted
  EXPECT_TRUE(r.stale());
  const v1::BudgetStatus after = Budget(c, "t");
  EXPECT_EQ(after.tokens(), before.tokens());
  EXPECT_EQ(after.successes_total(), before.successes_total());
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// Eviction forgets an instance's history, not what it holds: its lease runs on at its client
// until the TTL, so its tokens keep counting against the capacity, and the refill stops short
// of them (the bucket and the holdings together never exceed the capacity).
TEST(HostileAccountingTest, AnEvictedInstancesHoldingsStillCountAgainstTheCapacity) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(
      dir.path(),
      {"--policy=" + PolicyFile(dir.path(), "t",
                                "capacity: 100 refill_per_second: 1000 success_credit: 0 "
                                "initial_tokens: 100 lease_ttl_ms: 600000"),
       "--max_instances=2"});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  const v1::SyncRequest first = SyncOf("holder", 1, "t", 30);
  ASSERT_TRUE(c.Sync(first, &r).ok());
  ASSERT_EQ(r.tenants(0).granted(), 30u);
  for (int i = 0; i < 3; ++i) {  // evict "holder", the least recently seen
    ASSERT_TRUE(c.Sync(SyncOf(absl::StrCat("crowd-", i), 1, "t", 0), &r).ok());
  }
  ASSERT_TRUE(c.Sync(first, &r).ok());  // its resend is stale: it was evicted
  EXPECT_TRUE(r.stale());
  absl::SleepFor(absl::Milliseconds(300));  // the refill (1,000/s) has had time to fill all
  const v1::BudgetStatus b = Budget(c, "t");
  EXPECT_EQ(b.leased_tokens(), 30) << b.ShortDebugString();
  EXPECT_EQ(b.tokens(), 70) << b.ShortDebugString();
  EXPECT_EQ(b.active_instances(), 4u) << b.ShortDebugString();
  EXPECT_EQ(b.granted_total(), 30u);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

TEST(HostileAccountingTest, AResendAfterKillNineIsABaseline) {
  ScopedTempDir dir;
  const std::vector<std::string> args = {
      "--policy=" + PolicyFile(dir.path(), "t", kCreditPolicy),
      "--data_dir=" + dir.path() + "/data", "--snapshot_interval=100ms"};
  auto server = ServerProcess::Start(dir.path(), args);
  ASSERT_NE(server, nullptr);
  v1::SyncResponse r;
  const v1::SyncRequest first = WithSuccesses(SyncOf("k", 1, "t", 0), 10);
  {
    ServerConnection c = server->Connect();
    ASSERT_TRUE(c.Sync(first, &r).ok());
  }
  absl::SleepFor(absl::Milliseconds(300));  // a periodic snapshot holds the level
  server->Stop(SIGKILL);
  server = ServerProcess::Start(dir.path(), args);
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  const v1::BudgetStatus before = Budget(c, "t");
  // The client never got the response: it resends the same request.
  ASSERT_TRUE(c.Sync(first, &r).ok());
  const v1::BudgetStatus after = Budget(c, "t");
  EXPECT_EQ(after.tokens(), before.tokens());
  EXPECT_EQ(after.successes_total(), before.successes_total());
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// ---- 4. an exact replay after a clean restart ----

TEST(HostileAccountingTest, ExactReplayAfterACleanRestartGetsTheSameResponse) {
  ScopedTempDir dir;
  const std::vector<std::string> args = {
      "--policy=" + PolicyFile(dir.path(), "t", kCreditPolicy),
      "--data_dir=" + dir.path() + "/data"};
  auto server = ServerProcess::Start(dir.path(), args);
  ASSERT_NE(server, nullptr);
  v1::SyncResponse first;
  const v1::SyncRequest request = SyncOf("r", 2, "t", 3, 0);
  {
    ServerConnection c = server->Connect();
    v1::SyncResponse r;
    ASSERT_TRUE(c.Sync(SyncOf("r", 1, "t", 0), &r).ok());
    ASSERT_TRUE(c.Sync(request, &first).ok());
    ASSERT_EQ(first.tenants(0).granted(), 3u);
  }
  ASSERT_EQ(server->Stop(SIGTERM), 0);
  server = ServerProcess::Start(dir.path(), args);
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse again;
  const grpc::Status s = c.Sync(request, &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.SerializeAsString(), first.SerializeAsString());
  EXPECT_EQ(Budget(c, "t").granted_total(), 3u);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// The same for an instance of three tenants: the records after the first, kept in their own set,
// are written to the snapshot and read back, so the replay is answered from them and the next
// request is credited from them (a record lost in the restart would make it a baseline, which
// credits nothing).
TEST(HostileAccountingTest, ExactReplayOfSeveralTenantsAfterACleanRestartIsAnsweredFromTheRecords) {
  ScopedTempDir dir;
  const std::string policy = dir.path() + "/policy.textproto";
  WriteFile(policy, absl::StrCat("default_policy { ", kCreditPolicy, " }\n"));
  const std::vector<std::string> args = {"--policy=" + policy,
                                         "--data_dir=" + dir.path() + "/data"};
  auto request = [](uint64_t seq, uint64_t b_successes, uint64_t c_successes) {
    v1::SyncRequest r = SyncOf("r", seq, "a", seq == 2 ? 3 : 0, seq > 2 ? 3 : 0);
    v1::TenantSync* b = r.add_tenants();
    b->set_tenant("b");
    b->set_successes(b_successes);
    b->set_want(seq == 2 ? 2 : 0);
    b->set_tokens_received(seq > 2 ? 2 : 0);
    v1::TenantSync* c = r.add_tenants();
    c->set_tenant("c");
    c->set_successes(c_successes);
    return r;
  };
  auto server = ServerProcess::Start(dir.path(), args);
  ASSERT_NE(server, nullptr);
  v1::SyncResponse first;
  const v1::SyncRequest second = request(2, 5, 2);
  {
    ServerConnection c = server->Connect();
    v1::SyncResponse r;
    ASSERT_TRUE(c.Sync(request(1, 0, 0), &r).ok());
    ASSERT_TRUE(c.Sync(second, &first).ok());
    ASSERT_EQ(first.tenants(0).granted(), 3u);
    ASSERT_EQ(first.tenants(1).granted(), 2u);
  }
  ASSERT_EQ(server->Stop(SIGTERM), 0);
  server = ServerProcess::Start(dir.path(), args);
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse again;
  const grpc::Status s = c.Sync(second, &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.SerializeAsString(), first.SerializeAsString());
  EXPECT_EQ(Budget(c, "a").granted_total(), 3u);
  EXPECT_EQ(Budget(c, "b").granted_total(), 2u);
  EXPECT_EQ(Budget(c, "b").successes_total(), 5u);
  EXPECT_EQ(Budget(c, "c").successes_total(), 2u);
  // The next request: 3 more successes on "b", 4 on "c", credited from the restored records.
  v1::SyncResponse r;
  ASSERT_TRUE(c.Sync(request(3, 8, 6), &r).ok());
  EXPECT_FALSE(r.stale());
  EXPECT_EQ(Budget(c, "b").successes_total(), 8u);
  EXPECT_EQ(Budget(c, "c").successes_total(), 6u);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// ---- 5. counters beyond the bound ----

TEST(HostileAccountingTest, CountersOverTwoToThe53AreRefusedNamingFieldAndValue) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(
      dir.path(), {"--policy=" + PolicyFile(dir.path(), "t", kCreditPolicy)});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  ASSERT_TRUE(c.Sync(SyncOf("n", 1, "t", 0), &r).ok());
  const v1::BudgetStatus before = Budget(c, "t");
  struct Case {
    std::string field;
    v1::SyncRequest request;
  };
  v1::SyncRequest successes = SyncOf("n", 2, "t", 0);
  successes.mutable_tenants(0)->set_successes(kMaxU64);
  v1::SyncRequest retries = SyncOf("n", 2, "t", 0);
  retries.mutable_tenants(0)->set_retries_denied(k2To53 + 1);
  v1::SyncRequest fallback = SyncOf("n", 2, "t", 0);
  fallback.mutable_tenants(0)->set_retries_spent(kMaxU64);
  fallback.mutable_tenants(0)->set_fallback_spent(kMaxU64);
  v1::SyncRequest seq = SyncOf("n", kMaxU64, "t", 0);
  v1::SyncRequest jump = SyncOf("n", (uint64_t{1} << 32) + 2, "t", 0);
  for (const Case& k : {Case{"tenants[0].successes = 18446744073709551615", successes},
                        Case{"tenants[0].retries_denied = 9007199254740993", retries},
                        Case{"tenants[0].retries_spent = 18446744073709551615", fallback},
                        Case{"seq = 18446744073709551615", seq},
                        Case{"more than 2^32 past", jump}}) {
    const grpc::Status s = c.Sync(k.request, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k.field;
    EXPECT_THAT(s.error_message(), HasSubstr(k.field));
  }
  // Nothing changed, and seq 2 is still the instance's next.
  EXPECT_EQ(Budget(c, "t").SerializeAsString(), before.SerializeAsString());
  ASSERT_TRUE(c.Sync(WithSuccesses(SyncOf("n", 2, "t", 0), 3), &r).ok());
  EXPECT_FALSE(r.stale());
  EXPECT_EQ(Budget(c, "t").successes_total(), 3u);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// ---- 6. instance ids belong to a credential ----

std::string Sha256Hex(const std::string& token) {
  const std::array<uint8_t, 32> d = Sha256(token);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}

TEST(HostileAccountingTest, AnInstanceIdOfAnotherCredentialIsPermissionDenied) {
  ScopedTempDir dir;
  const std::string policy = PolicyFile(
      dir.path(), "b", "capacity: 100 refill_per_second: 0 success_credit: 0",
      absl::StrCat("credentials { name: \"alpha\" token_sha256: \"", Sha256Hex("alpha-token"),
                   "\" tenants: \"a\" }\n"
                   "credentials { name: \"beta\" token_sha256: \"", Sha256Hex("beta-token"),
                   "\" tenants: \"b\" }\n"
                   "credentials { name: \"ops\" token_sha256: \"", Sha256Hex("ops-token"),
                   "\" admin: true }\n"));
  auto server = ServerProcess::Start(dir.path(), {"--policy=" + policy});
  ASSERT_NE(server, nullptr);
  ServerConnection alpha = server->Connect("alpha-token");
  ServerConnection beta = server->Connect("beta-token");
  ServerConnection ops = server->Connect("ops-token");
  v1::SyncResponse r;
  ASSERT_TRUE(beta.Sync(SyncOf("victim", 1, "b", 10), &r).ok());
  ASSERT_EQ(r.tenants(0).granted(), 10u);
  const v1::BudgetStatus before = Budget(ops, "b");

  v1::SyncRequest jump = SyncOf("victim", (uint64_t{1} << 32), "a", 0);
  v1::SyncRequest final_request = SyncOf("victim", 2, "a", 0);
  final_request.set_final(true);
  for (const v1::SyncRequest& hostile : {jump, final_request}) {
    const grpc::Status s = alpha.Sync(hostile, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << hostile.ShortDebugString();
    EXPECT_THAT(s.error_message(), HasSubstr("\"victim\""));
  }
  // The victim goes on as if nothing happened: seq 2 is neither stale nor refused, and its 10
  // tokens come back.
  ASSERT_TRUE(beta.Sync(SyncOf("victim", 2, "b", 0, 10, 10), &r).ok());
  EXPECT_FALSE(r.stale());
  const v1::BudgetStatus after = Budget(ops, "b");
  EXPECT_EQ(after.tokens(), before.tokens() + 10);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// An instance that syncs several tenants keeps its records of the second and later ones apart
// from the first (server/instance_state.h). Each case above, for those records: a lie about one
// tenant applies nothing to any of them, another credential using the id is refused, an exact
// replay is answered from the record without being applied again, a budget deleted and made again
// takes the record's next report as a baseline (what the old budget granted is not returned into
// the new one), and a delayed duplicate after `final` is stale.
TEST(HostileAccountingTest, AnInstanceOfSeveralTenantsIsAccountedPerTenantWhateverItClaims) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/policy.textproto";
  WriteFile(path,
            absl::StrCat("default_policy { ", kCreditPolicy, " }\n",
                         "credentials { name: \"owner\" token_sha256: \"", Sha256Hex("owner-token"),
                         "\" tenants: \"a\" tenants: \"b\" tenants: \"c\" }\n",
                         "credentials { name: \"other\" token_sha256: \"", Sha256Hex("other-token"),
                         "\" tenants: \"a\" tenants: \"b\" tenants: \"c\" }\n",
                         "credentials { name: \"ops\" token_sha256: \"", Sha256Hex("ops-token"),
                         "\" admin: true }\n"));
  auto server = ServerProcess::Start(dir.path(), {"--policy=" + path});
  ASSERT_NE(server, nullptr);
  ServerConnection owner = server->Connect("owner-token");
  ServerConnection other = server->Connect("other-token");
  ServerConnection ops = server->Connect("ops-token");
  const std::vector<std::string> tenants = {"a", "b", "c"};
  struct Report {
    uint64_t received = 0;
    uint64_t returned = 0;
    uint64_t successes = 0;
    uint64_t want = 0;
  };
  auto request = [&](uint64_t seq, const std::vector<Report>& reports) {
    v1::SyncRequest r;
    r.set_instance_id("m");
    r.set_seq(seq);
    for (size_t i = 0; i < tenants.size(); ++i) {
      v1::TenantSync* t = r.add_tenants();
      t->set_tenant(tenants[i]);
      t->set_tokens_received(reports[i].received);
      t->set_tokens_returned(reports[i].returned);
      t->set_successes(reports[i].successes);
      t->set_want(reports[i].want);
    }
    return r;
  };
  // Each budget's level and totals, to check that nothing moved.
  auto budgets = [&] {
    std::vector<std::string> out;
    for (const std::string& t : tenants) {
      const v1::BudgetStatus b = Budget(ops, t);
      out.push_back(absl::StrCat(t, ": tokens ", b.tokens(), " granted ", b.granted_total(),
                                 " successes ", b.successes_total()));
    }
    return out;
  };

  v1::SyncResponse r;
  ASSERT_TRUE(owner.Sync(request(1, {{.want = 4}, {.want = 4}, {.want = 4}}), &r).ok());
  for (int i = 0; i < 3; ++i) ASSERT_EQ(r.tenants(i).granted(), 4u) << i;
  const std::vector<std::string> granted = budgets();

  // A lie about the second tenant (50 tokens received where 4 were granted): refused, naming it,
  // and nothing of the request applied to any tenant.
  const v1::SyncRequest lie =
      request(2, {{.received = 4, .successes = 3}, {.received = 50, .returned = 50}, {}});
  grpc::Status s = owner.Sync(lie, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("tenants[1].tokens_received = 50"));
  EXPECT_EQ(budgets(), granted);
  // Another credential's request with the same id: refused before any record is read.
  s = other.Sync(request(2, {{.received = 4}, {.received = 4, .returned = 4}, {}}), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(budgets(), granted);

  // The truth: 3 successes on "a", the 4 tokens of "b" given back and 4 more wanted, 5
  // successes on "c".
  const v1::SyncRequest second = request(2, {{.received = 4, .successes = 3},
                                             {.received = 4, .returned = 4, .want = 4},
                                             {.received = 4, .successes = 5}});
  ASSERT_TRUE(owner.Sync(second, &r).ok());
  const std::string answer = r.SerializeAsString();
  const v1::BudgetStatus a2 = Budget(ops, "a"), b2 = Budget(ops, "b"), c2 = Budget(ops, "c");
  EXPECT_EQ(a2.successes_total(), 3u);
  EXPECT_EQ(b2.tokens(), 6);  // 6 left + the 4 returned - 4 granted again
  EXPECT_EQ(c2.successes_total(), 5u);
  const std::vector<std::string> applied = budgets();
  // Its exact replay (the response was lost): the same answer, applied once.
  ASSERT_TRUE(owner.Sync(second, &r).ok());
  EXPECT_EQ(r.SerializeAsString(), answer);
  EXPECT_EQ(budgets(), applied);

  // "b" deleted and made again by the next report: the record's history was the old budget's,
  // so the 4 tokens it now returns (the old budget's second grant) fill nothing in the new one;
  // "a" and "c" go on as before.
  ASSERT_TRUE(ops.DeleteBudget("b").ok());
  const v1::SyncRequest third =
      request(3, {{.received = 4, .successes = 3},
                  {.received = 8, .returned = 8},
                  {.received = 4, .successes = 7}});
  ASSERT_TRUE(owner.Sync(third, &r).ok());
  EXPECT_FALSE(r.tenants(1).has_error()) << r.ShortDebugString();
  EXPECT_EQ(Budget(ops, "b").tokens(), 10);  // a new budget at its initial level
  EXPECT_EQ(Budget(ops, "a").successes_total(), 3u);
  EXPECT_EQ(Budget(ops, "c").successes_total(), 7u);

  // `final`, then a delayed duplicate of the third request: stale, nothing applied.
  v1::SyncRequest last = third;
  last.set_seq(4);
  last.set_final(true);
  ASSERT_TRUE(owner.Sync(last, &r).ok());
  const std::vector<std::string> finished = budgets();
  ASSERT_TRUE(owner.Sync(third, &r).ok());
  EXPECT_TRUE(r.stale());
  EXPECT_EQ(budgets(), finished);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// ---- 7b. successes credited locally (success-funded fallback) ----

v1::SyncRequest WithLocalCredit(v1::SyncRequest r, uint64_t successes, uint64_t local) {
  r.mutable_tenants(0)->set_successes(successes);
  r.mutable_tenants(0)->set_successes_credited_locally(local);
  return r;
}

TEST(HostileAccountingTest, SuccessesCreditedLocallyOnlyLowerTheCreditAndAreChecked) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(
      dir.path(), {"--policy=" + PolicyFile(dir.path(), "t",
                                            "capacity: 1000 initial_tokens: 0 "
                                            "refill_per_second: 0 success_credit: 1")});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  ASSERT_TRUE(c.Sync(SyncOf("i", 1, "t", 0), &r).ok());  // the baseline
  // Ten successes its fallback bucket credited: nothing here.
  ASSERT_TRUE(c.Sync(WithLocalCredit(SyncOf("i", 2, "t", 0), 10, 10), &r).ok());
  EXPECT_EQ(Budget(c, "t").tokens(), 0);
  // Ten more, credited here.
  ASSERT_TRUE(c.Sync(WithLocalCredit(SyncOf("i", 3, "t", 0), 20, 10), &r).ok());
  EXPECT_EQ(Budget(c, "t").tokens(), 10);
  // A client that hides its local credit gains what a client claiming successes gains, no
  // more: "j" claims 10 successes, none credited locally.
  ASSERT_TRUE(c.Sync(SyncOf("j", 1, "t", 0), &r).ok());
  ASSERT_TRUE(c.Sync(WithLocalCredit(SyncOf("j", 2, "t", 0), 10, 0), &r).ok());
  EXPECT_EQ(Budget(c, "t").tokens(), 20);
  // More credited locally than successes, or fewer than already reported: refused, nothing
  // applied, the seq still free.
  for (const v1::SyncRequest& bad : {WithLocalCredit(SyncOf("j", 3, "t", 0), 10, 11),
                                      WithLocalCredit(SyncOf("i", 4, "t", 0), 30, 5)}) {
    const grpc::Status s = c.Sync(bad, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.ShortDebugString();
    EXPECT_THAT(s.error_message(), HasSubstr("successes_credited_locally")) << s.error_message();
  }
  EXPECT_EQ(Budget(c, "t").tokens(), 20);
  ASSERT_TRUE(c.Sync(WithLocalCredit(SyncOf("i", 4, "t", 0), 30, 15), &r).ok());
  EXPECT_EQ(Budget(c, "t").tokens(), 25);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// ---- refunds (TenantSync.retries_refunded, fallback_refunded) ----

v1::SyncRequest WithRefunds(v1::SyncRequest r, uint64_t refunded, uint64_t fallback_spent = 0,
                            uint64_t fallback_refunded = 0) {
  r.mutable_tenants(0)->set_retries_refunded(refunded);
  r.mutable_tenants(0)->set_fallback_spent(fallback_spent);
  r.mutable_tenants(0)->set_fallback_refunded(fallback_refunded);
  return r;
}

TEST(HostileAccountingTest, RefundsGiveBackOnlyWhatThisServerGrantedAndApplyOnce) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(
      dir.path(), {"--policy=" + PolicyFile(dir.path(), "t",
                                            "capacity: 100 initial_tokens: 10 "
                                            "refill_per_second: 0 success_credit: 0")});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  ASSERT_TRUE(c.Sync(SyncOf("i", 1, "t", 10), &r).ok());
  ASSERT_EQ(r.tenants(0).granted(), 10u);
  // Four retries spent, reported; then one of them refunded (never sent) and the other seven
  // returned: the refunded token is back in the bucket with them, and only three were sent.
  ASSERT_TRUE(c.Sync(SyncOf("i", 2, "t", 0, 10, 0, 4), &r).ok());
  EXPECT_EQ(Budget(c, "t").retries_total(), 4u);
  const v1::SyncRequest refund = WithRefunds(SyncOf("i", 3, "t", 0, 10, 7, 4), 1);
  ASSERT_TRUE(c.Sync(refund, &r).ok());
  v1::BudgetStatus b = Budget(c, "t");
  EXPECT_EQ(b.tokens(), 7) << b.ShortDebugString();
  EXPECT_EQ(b.retries_total(), 3u);
  EXPECT_EQ(b.refunded_total(), 1u);
  // An exact replay, and the same counters under a new seq: nothing more.
  ASSERT_TRUE(c.Sync(refund, &r).ok());
  v1::SyncRequest again = refund;
  again.set_seq(4);
  ASSERT_TRUE(c.Sync(again, &r).ok());
  b = Budget(c, "t");
  EXPECT_EQ(b.tokens(), 7);
  EXPECT_EQ(b.refunded_total(), 1u);
  // Lies refused, naming the field, nothing applied: more refunded than spent, refunds of
  // lease tokens beyond the lease tokens spent, a fallback refund with no fallback spending,
  // and counters going backwards.
  for (const auto& [bad, field] : std::vector<std::pair<v1::SyncRequest, std::string>>{
           {WithRefunds(SyncOf("i", 5, "t", 0, 10, 7, 4), 5), "retries_refunded = 5"},
           {WithRefunds(SyncOf("i", 5, "t", 0, 10, 7, 4), 3, 2), "refunds of lease tokens"},
           {WithRefunds(SyncOf("i", 5, "t", 0, 10, 7, 4), 2, 0, 1), "fallback_refunded = 1"},
           {WithRefunds(SyncOf("i", 5, "t", 0, 10, 6, 4), 0), "never go backwards"},
           {WithRefunds(SyncOf("i", 5, "t", 0, 10, 8, 4), 1), "exceed tokens_received"}}) {
    const grpc::Status s = c.Sync(bad, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.ShortDebugString();
    EXPECT_THAT(s.error_message(), HasSubstr(field)) << s.error_message();
  }
  b = Budget(c, "t");
  EXPECT_EQ(b.tokens(), 7);
  EXPECT_EQ(b.retries_total(), 3u);
  // Claiming every spent token refunded and then returning all ten: the bucket gets back the
  // ten this server granted, never more (an honest client returning everything gets as much).
  ASSERT_TRUE(c.Sync(WithRefunds(SyncOf("i", 5, "t", 0, 10, 7, 4), 4), &r).ok());
  EXPECT_EQ(Budget(c, "t").tokens(), 7);
  ASSERT_TRUE(c.Sync(WithRefunds(SyncOf("i", 6, "t", 0, 10, 10, 4), 4), &r).ok());
  b = Budget(c, "t");
  EXPECT_EQ(b.tokens(), 10);
  EXPECT_EQ(b.retries_total(), 0u);
  // A baseline claiming spent, refunded and returned tokens of a previous life: nothing.
  ASSERT_TRUE(c.Sync(WithRefunds(SyncOf("b", 1, "t", 0, 50, 0, 50), 40), &r).ok());
  ASSERT_TRUE(c.Sync(WithRefunds(SyncOf("b", 2, "t", 0, 50, 50, 50), 50), &r).ok());
  EXPECT_EQ(Budget(c, "t").tokens(), 10);
  // Fallback refunds take nothing from the bucket and give nothing to it; they come off the
  // fallback retries.
  ASSERT_TRUE(c.Sync(SyncOf("f", 1, "t", 0), &r).ok());
  ASSERT_TRUE(c.Sync(WithRefunds(SyncOf("f", 2, "t", 0, 0, 0, 3), 1, 3, 1), &r).ok());
  b = Budget(c, "t");
  EXPECT_EQ(b.tokens(), 10);
  EXPECT_EQ(b.fallback_retries_total(), 2u);
  EXPECT_EQ(b.fallback_refunded_total(), 1u);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

TEST(HostileAccountingTest, ARefundAfterACleanRestartIsCreditedFromTheRestoredRecord) {
  ScopedTempDir dir;
  const std::string policy = PolicyFile(dir.path(), "t",
                                        "capacity: 100 initial_tokens: 10 "
                                        "refill_per_second: 0 success_credit: 0");
  const std::vector<std::string> flags = {"--policy=" + policy,
                                          "--data_dir=" + dir.path() + "/data"};
  auto server = ServerProcess::Start(dir.path(), flags);
  ASSERT_NE(server, nullptr);
  {
    ServerConnection c = server->Connect();
    v1::SyncResponse r;
    ASSERT_TRUE(c.Sync(SyncOf("i", 1, "t", 10), &r).ok());
    ASSERT_EQ(r.tenants(0).granted(), 10u);
    ASSERT_TRUE(c.Sync(SyncOf("i", 2, "t", 0, 10, 0, 4), &r).ok());
  }
  ASSERT_EQ(server->Stop(SIGTERM), 0);
  server = ServerProcess::Start(dir.path(), flags);
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  // Two of the four refunded, everything unspent returned: 8 back, as before the restart.
  ASSERT_TRUE(c.Sync(WithRefunds(SyncOf("i", 3, "t", 0, 10, 8, 4), 2), &r).ok());
  v1::BudgetStatus b = Budget(c, "t");
  EXPECT_EQ(b.tokens(), 8) << b.ShortDebugString();
  EXPECT_EQ(b.retries_total(), 2u);
  EXPECT_EQ(b.refunded_total(), 2u);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// ---- 8. unparseable bytes ----

grpc::Status SendRaw(const ServerProcess& server, const std::string& bytes,
                     const std::string& method = "/retrybudget.v1.RetryBudgetService/Sync") {
  auto channel = grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

TEST(HostileAccountingTest, UnparseableBytesAreInvalidArgumentNamingWhatIsWrong) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(dir.path(), {});
  ASSERT_NE(server, nullptr);
  struct Case {
    std::string name;
    std::string bytes;
    std::string message;
  };
  // Field 1 (instance_id) = "\xff\xfe"; field 2 (seq) = 1.
  const std::string bad_id("\x0a\x02\xff\xfe\x10\x01", 6);
  // instance_id "i", seq 1, tenants { tenant: "t\xff" }.
  const std::string bad_tenant("\x0a\x01i\x10\x01\x1a\x04\x0a\x02t\xff", 11);
  const std::string garbage("\xff\xff\xff\xff\xff", 5);
  for (const Case& k : {Case{"bad_id", bad_id, "instance_id"},
                        Case{"bad_tenant", bad_tenant, "tenants[0].tenant"},
                        Case{"garbage", garbage, "not a protobuf encoding"}}) {
    const grpc::Status s = SendRaw(*server, k.bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k.name;
    EXPECT_THAT(s.error_message(), HasSubstr("request is not a valid retrybudget.v1.SyncRequest"))
        << k.name;
    EXPECT_THAT(s.error_message(), HasSubstr(k.message)) << k.name;
  }
  // The protobuf library logs each invalid UTF-8 string it parses; the server lets one such line
  // through per 10 s, so a client cannot fill the log.
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(SendRaw(*server, bad_tenant).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  const std::string log = server->Output();
  int utf8_lines = 0;
  for (size_t at = log.find("UTF-8"); at != std::string::npos; at = log.find("UTF-8", at + 1)) {
    ++utf8_lines;
  }
  EXPECT_GE(utf8_lines, 1) << log;  // the first one is written
  EXPECT_LE(utf8_lines, 2) << log;  // not one per request
  // A well-formed request through the same path works.
  const grpc::Status ok = SendRaw(*server, SyncOf("fine", 1, "t", 1).SerializeAsString());
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

TEST(HostileAccountingTest, AdminRequestsWhoseBytesDoNotParseAreInvalidArgumentNamingTheField) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(dir.path(), {});
  ASSERT_NE(server, nullptr);
  ServerConnection ops = server->Connect();
  // A budget that every refused request below must leave as it is.
  v1::SyncResponse r;
  ASSERT_TRUE(ops.Sync(SyncOf("inst", 1, "kept", 5), &r).ok());
  const v1::BudgetStatus before = Budget(ops, "kept");
  const std::string admin = "/retrybudget.v1.BudgetAdminService/";
  // Field 1 (tenant) = "k\xff".
  const std::string bad_tenant("\x0a\x02k\xff", 4);
  // tenant "kept", policy = two bytes that are no encoding of a BudgetPolicy.
  const std::string bad_policy("\x0a\x04kept\x12\x02\xff\xff", 10);
  // page_token (field 2) = "\xc0\x80": an overlong encoding, not UTF-8.
  const std::string bad_token("\x12\x02\xc0\x80", 4);
  const std::string garbage("\xff\xff\xff\xff\xff", 5);
  struct Case {
    std::string method;
    std::string bytes;
    std::string message;  // the request type and the field (or the encoding) named
  };
  for (const Case& k : {
           Case{"GetBudget", bad_tenant, "retrybudget.v1.GetBudgetRequest: tenant"},
           Case{"DeleteBudget", bad_tenant, "retrybudget.v1.DeleteBudgetRequest: tenant"},
           Case{"PutPolicy", bad_tenant, "retrybudget.v1.PutPolicyRequest: tenant"},
           Case{"PutPolicy", bad_policy,
                "retrybudget.v1.PutPolicyRequest: policy is not a protobuf encoding"},
           Case{"ListBudgets", bad_token,
                "retrybudget.v1.ListBudgetsRequest: page_token is not valid UTF-8"},
           Case{"GetBudget", garbage, "not a protobuf encoding"},
           Case{"ListShards", garbage, "not a protobuf encoding"},
       }) {
    const grpc::Status s = SendRaw(*server, k.bytes, admin + k.method);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k.method;
    EXPECT_THAT(s.error_message(), HasSubstr("request is not a valid ")) << k.method;
    EXPECT_THAT(s.error_message(), HasSubstr(k.message)) << k.method << ": " << s.error_message();
  }
  // Nothing was applied: the budget is still there with its policy and totals.
  const v1::BudgetStatus after = Budget(ops, "kept");
  EXPECT_EQ(after.policy().ShortDebugString(), before.policy().ShortDebugString());
  EXPECT_EQ(after.granted_total(), before.granted_total());
  // Well-formed admin requests through the same raw path work.
  v1::GetBudgetRequest get;
  get.set_tenant("kept");
  EXPECT_TRUE(SendRaw(*server, get.SerializeAsString(), admin + "GetBudget").ok());
  v1::ListShardsRequest shards;
  EXPECT_TRUE(SendRaw(*server, shards.SerializeAsString(), admin + "ListShards").ok());
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace retrybudget::testing
