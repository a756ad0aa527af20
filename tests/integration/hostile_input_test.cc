// Hostile requests through the real wire and the real binary: each row of the table gets its
// status and changes nothing; floods of distinct tenant names and instance ids are refused or
// evicted as specified while the server's memory stays bounded. Requests that try to create
// tokens or be applied twice (baselines, claims beyond grants, replays after final, eviction and
// restarts, ids of another credential, unparseable bytes) are in hostile_accounting_test.cc.
//
// The memory bound: the server's resident set (VmRSS of the child process) grows by less than
// kMaxRssGrowth over a whole flood (50k tenant names at --max_tenants=1000; 25k instance ids,
// 20 times --max_instances=1250). Without the limits the same floods hold every name and id
// forever. (The instance flood is one unary RPC per id: 200k of them take minutes on a shared
// two-core CI machine, so it keeps the ratio to the limit and not the absolute count.)
#include <signal.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMaxRssGrowth = 100 << 20;  // 100 MiB; README "Running the server"

// Under AddressSanitizer the server binary (built with the same flags) keeps freed memory in
// quarantine and adds redzones and shadow memory, so its resident set says nothing about the
// server's own footprint: the bound is checked in the plain build (make test), and the
// sanitizer build checks only the behaviour.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssIsMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kRssIsMeaningful = false;
#else
constexpr bool kRssIsMeaningful = true;
#endif
#else
constexpr bool kRssIsMeaningful = true;
#endif
constexpr int kMaxMessageBytes = 64 << 10;

// What an observer can see of the server: the budget of "t" and how many budgets exist.
struct Observed {
  v1::BudgetStatus t;
  int budgets = 0;
  bool operator==(const Observed& o) const {
    return t.SerializeAsString() == o.t.SerializeAsString() && budgets == o.budgets;
  }
};

Observed Observe(ServerConnection& c) {
  Observed o;
  EXPECT_TRUE(c.GetBudget("t", &o.t).ok());
  v1::ListBudgetsResponse list;
  EXPECT_TRUE(c.ListBudgets(&list).ok());
  o.budgets = list.budgets_size();
  return o;
}

std::string Describe(const Observed& o) {
  return absl::StrCat(o.t.ShortDebugString(), " budgets=", o.budgets);
}

// ---- the table ----

// The state every row starts from: instance "base" has applied seq 5 for tenant "t" (received
// 40, returned 5, spent 20, 100 successes).
v1::SyncRequest Base(uint64_t seq = 5) {
  v1::SyncRequest r = SyncOf("base", seq, "t", 0, 40, 5, 20);
  r.mutable_tenants(0)->set_successes(100);
  return r;
}

struct HostileRequest {
  std::string name;
  std::function<v1::SyncRequest()> request;
  grpc::StatusCode code;
  std::string message;    // a substring of the error message (or empty)
  bool stale = false;     // for OK rows: the response says stale
};

void PrintTo(const HostileRequest& h, std::ostream* os) { *os << h.name; }

class HostileRequestTest : public ::testing::TestWithParam<HostileRequest> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    const std::string policy = dir_->path() + "/policy.textproto";
    // No refill and no credit: the level of "t" changes only if something is applied.
    WriteFile(policy,
              "tenants { tenant: \"t\" policy { capacity: 1000 refill_per_second: 0 "
              "success_credit: 0 } }\n");
    server_ = ServerProcess::Start(
                  dir_->path(), {"--policy=" + policy, "--max_tenants_per_request=8",
                                 absl::StrCat("--max_message_bytes=", kMaxMessageBytes)})
                  .release();
    ASSERT_NE(server_, nullptr);
    ServerConnection c = server_->Connect();
    // Build the history "base" is at: seq 1 grants 40, seq 5 reports on them.
    v1::SyncResponse r;
    ASSERT_TRUE(c.Sync(SyncOf("base", 1, "t", 40), &r).ok());
    ASSERT_EQ(r.tenants(0).granted(), 40u);
    ASSERT_TRUE(c.Sync(Base(), &r).ok());
    base_response_ = new v1::SyncResponse(r);
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      EXPECT_EQ(server_->Stop(SIGTERM), 0) << server_->Output();
    }
    delete server_;
    delete base_response_;
    delete dir_;
  }

  static ScopedTempDir* dir_;
  static ServerProcess* server_;
  static v1::SyncResponse* base_response_;
};

ScopedTempDir* HostileRequestTest::dir_ = nullptr;
ServerProcess* HostileRequestTest::server_ = nullptr;
v1::SyncResponse* HostileRequestTest::base_response_ = nullptr;

TEST_P(HostileRequestTest, GetsItsStatusAndChangesNothing) {
  ASSERT_NE(server_, nullptr);
  ServerConnection c = server_->Connect();
  const Observed before = Observe(c);
  v1::SyncResponse response;
  const grpc::Status status = c.Sync(GetParam().request(), &response);
  EXPECT_EQ(status.error_code(), GetParam().code) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(GetParam().message));
  if (status.ok()) {
    EXPECT_EQ(response.stale(), GetParam().stale);
  }
  const Observed after = Observe(c);
  EXPECT_TRUE(after == before) << "before: " << Describe(before) << "\nafter:  "
                               << Describe(after);
}

TEST_F(HostileRequestTest, ReplayedRequestGetsTheSameResponseAgain) {
  ASSERT_NE(server_, nullptr);
  ServerConnection c = server_->Connect();
  const Observed before = Observe(c);
  v1::SyncResponse again;
  ASSERT_TRUE(c.Sync(Base(), &again).ok());
  EXPECT_EQ(again.SerializeAsString(), base_response_->SerializeAsString());
  EXPECT_TRUE(Observe(c) == before);
}

v1::SyncRequest WithTenant(v1::SyncRequest r, std::string tenant) {
  r.mutable_tenants(0)->set_tenant(std::move(tenant));
  return r;
}

v1::SyncRequest Next(std::function<void(v1::TenantSync&)> change) {
  v1::SyncRequest r = Base(6);
  change(*r.mutable_tenants(0));
  return r;
}

INSTANTIATE_TEST_SUITE_P(
    Table, HostileRequestTest,
    ::testing::Values(
        HostileRequest{"TenantNameWithSpace", [] { return WithTenant(Base(6), "a b"); },
                       grpc::StatusCode::INVALID_ARGUMENT, "tenants[0].tenant"},
        HostileRequest{"EmptyTenantName", [] { return WithTenant(Base(6), ""); },
                       grpc::StatusCode::INVALID_ARGUMENT, "tenants[0].tenant"},
        HostileRequest{"TenantNameTooLong",
                       [] { return WithTenant(Base(6), std::string(129, 'x')); },
                       grpc::StatusCode::INVALID_ARGUMENT, "tenants[0].tenant"},
        HostileRequest{"TenantNameWithNul",
                       [] { return WithTenant(Base(6), std::string("t\0x", 3)); },
                       grpc::StatusCode::INVALID_ARGUMENT, "tenants[0].tenant"},
        HostileRequest{"EmptyInstanceId",
                       [] {
                         v1::SyncRequest r = Base(6);
                         r.set_instance_id("");
                         return r;
                       },
                       grpc::StatusCode::INVALID_ARGUMENT, "instance_id"},
        HostileRequest{"SeqZero", [] { return Base(0); }, grpc::StatusCode::INVALID_ARGUMENT,
                       "seq"},
        HostileRequest{"TenantTwice",
                       [] {
                         v1::SyncRequest r = Base(6);
                         *r.add_tenants() = r.tenants(0);
                         return r;
                       },
                       grpc::StatusCode::INVALID_ARGUMENT, "tenants[1]"},
        HostileRequest{"TooManyTenants",
                       [] {
                         v1::SyncRequest r = Base(6);
                         for (int i = 0; i < 8; ++i) r.add_tenants()->set_tenant(absl::StrCat("n", i));
                         return r;
                       },
                       grpc::StatusCode::INVALID_ARGUMENT, "at most 8"},
        HostileRequest{"WantOutOfRange",
                       [] { return Next([](v1::TenantSync& t) { t.set_want(1'000'001); }); },
                       grpc::StatusCode::INVALID_ARGUMENT, "want"},
        HostileRequest{"SuccessesBackwards",
                       [] { return Next([](v1::TenantSync& t) { t.set_successes(99); }); },
                       grpc::StatusCode::INVALID_ARGUMENT, "successes"},
        HostileRequest{"RetriesSpentBackwards",
                       [] { return Next([](v1::TenantSync& t) { t.set_retries_spent(19); }); },
                       grpc::StatusCode::INVALID_ARGUMENT, "retries_spent"},
        HostileRequest{"TokensReturnedBackwards",
                       [] { return Next([](v1::TenantSync& t) { t.set_tokens_returned(4); }); },
                       grpc::StatusCode::INVALID_ARGUMENT, "tokens_returned"},
        HostileRequest{"TokensReceivedBackwards",
                       [] { return Next([](v1::TenantSync& t) { t.set_tokens_received(39); }); },
                       grpc::StatusCode::INVALID_ARGUMENT, "tokens_received"},
        HostileRequest{"ReceivedMoreThanEverGranted",
                       [] { return Next([](v1::TenantSync& t) { t.set_tokens_received(41); }); },
                       grpc::StatusCode::INVALID_ARGUMENT, "tokens_received"},
        HostileRequest{"SameSeqDifferentContent",
                       [] {
                         v1::SyncRequest r = Base(5);
                         r.mutable_tenants(0)->set_successes(200);  // try to credit 100 more
                         return r;
                       },
                       grpc::StatusCode::INVALID_ARGUMENT, "seq"},
        HostileRequest{"ReorderedOlderSeq",
                       [] {
                         v1::SyncRequest r = Base(3);
                         r.mutable_tenants(0)->set_successes(200);
                         return r;
                       },
                       grpc::StatusCode::OK, "", /*stale=*/true},
        HostileRequest{"Oversize",
                       [] {
                         v1::SyncRequest r = Base(6);
                         r.set_instance_id(std::string(kMaxMessageBytes, 'x'));
                         return r;
                       },
                       grpc::StatusCode::RESOURCE_EXHAUSTED, ""},
        HostileRequest{"OversizeTenantName",
                       [] { return WithTenant(Base(6), std::string(kMaxMessageBytes + 1, 't')); },
                       grpc::StatusCode::RESOURCE_EXHAUSTED, ""}),
    [](const auto& info) { return info.param.name; });

// ---- floods ----

// Runs `calls` Syncs made by `make(i)` on `threads` threads with their own channels; returns the
// number that failed with an RPC error. `check` sees each OK response.
int Flood(const ServerProcess& server, int calls, int threads,
          const std::function<v1::SyncRequest(int)>& make,
          const std::function<void(int, const v1::SyncResponse&)>& check) {
  std::atomic<int> next{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&] {
      ServerConnection c = server.Connect();
      for (int i = next++; i < calls; i = next++) {
        v1::SyncResponse r;
        const grpc::Status s = c.Sync(make(i), &r);
        if (!s.ok()) {
          ++failed;
          continue;
        }
        check(i, r);
      }
    });
  }
  for (auto& w : workers) w.join();
  return failed.load();
}

TEST(FloodTest, FiftyThousandTenantNamesStopAtTheTenantLimit) {
  ScopedTempDir dir;
  auto server = ServerProcess::Start(dir.path(), {"--max_tenants=1000"});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  ASSERT_TRUE(c.Sync(SyncOf("owner", 1, "t", 10), &r).ok());  // an existing budget
  const int64_t rss_before = server->ResidentBytes();
  ASSERT_GT(rss_before, 0);

  constexpr int kNames = 50'000;
  constexpr int kPerRequest = 250;
  std::atomic<int> created{0};
  std::atomic<int> exhausted{0};
  std::atomic<int> other{0};
  const int failed = Flood(
      *server, kNames / kPerRequest, 4,
      [](int i) {
        v1::SyncRequest req;
        req.set_instance_id(absl::StrCat("flood-", i));
        req.set_seq(1);
        for (int j = 0; j < kPerRequest; ++j) {
          v1::TenantSync* t = req.add_tenants();
          t->set_tenant(absl::StrCat("tenant-", i, "-", j));
          t->set_want(1);
        }
        return req;
      },
      [&](int, const v1::SyncResponse& resp) {
        for (const v1::TenantGrant& g : resp.tenants()) {
          if (g.error().code() == 0) {
            ++created;
          } else if (g.error().code() == static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED)) {
            ++exhausted;
          } else {
            ++other;
          }
        }
      });
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(created.load(), 999);  // the limit, "t" included
  EXPECT_EQ(exhausted.load(), kNames - 999);
  EXPECT_EQ(other.load(), 0);

  // The existing budget still works; a new one is still refused.
  ASSERT_TRUE(c.Sync(SyncOf("owner", 2, "t", 5, 10), &r).ok());
  EXPECT_EQ(r.tenants(0).granted(), 5u);
  ASSERT_TRUE(c.Sync(SyncOf("owner", 3, "one-more", 5), &r).ok());
  EXPECT_EQ(r.tenants(0).error().code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  v1::BudgetStatus ignored;
  EXPECT_EQ(c.GetBudget("one-more", &ignored).error_code(), grpc::StatusCode::NOT_FOUND);

  const int64_t growth = server->ResidentBytes() - rss_before;
  RecordProperty("rss_growth_bytes", std::to_string(growth));
  std::cout << "tenant flood: VmRSS grew by " << growth / 1024 << " KiB\n";
  if (kRssIsMeaningful) {
    EXPECT_LT(growth, kMaxRssGrowth);
  }
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

TEST(FloodTest, InstanceIdsTwentyTimesTheLimitAreEvictedWithoutCredit) {
  ScopedTempDir dir;
  const std::string policy = dir.path() + "/policy.textproto";
  WriteFile(policy, "default_policy { capacity: 1000 refill_per_second: 0 success_credit: 0 }\n");
  auto server = ServerProcess::Start(dir.path(), {"--policy=" + policy, "--max_instances=1250"});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  // The first instance holds 10 tokens; it will be forgotten by the flood.
  ASSERT_TRUE(c.Sync(SyncOf("first", 1, "t", 10), &r).ok());
  ASSERT_EQ(r.tenants(0).granted(), 10u);
  v1::BudgetStatus before;
  ASSERT_TRUE(c.GetBudget("t", &before).ok());
  const int64_t rss_before = server->ResidentBytes();

  constexpr int kIds = 25'000;
  std::atomic<int> bad{0};
  const absl::Time start = absl::Now();
  const int failed = Flood(
      *server, kIds, 4, [](int i) { return SyncOf(absl::StrCat("flood-instance-", i), 1, "t", 0); },
      [&](int, const v1::SyncResponse& resp) {
        if (resp.tenants(0).error().code() != 0 || resp.tenants(0).granted() != 0) ++bad;
      });
  std::cout << "instance flood: " << kIds << " Syncs in " << absl::Now() - start << "\n";
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(bad.load(), 0);

  // "first" was forgotten: it comes back returning its 10 tokens, and is taken as a baseline
  // (its history unknown), credited nothing: forgetting forfeits, never creates.
  const grpc::Status back = c.Sync(SyncOf("first", 2, "t", 0, 10, 10), &r);
  ASSERT_TRUE(back.ok()) << back.error_message();
  v1::BudgetStatus after;
  ASSERT_TRUE(c.GetBudget("t", &after).ok());
  EXPECT_EQ(after.tokens(), before.tokens());
  EXPECT_EQ(after.returned_total(), before.returned_total());

  const int64_t growth = server->ResidentBytes() - rss_before;
  RecordProperty("rss_growth_bytes", std::to_string(growth));
  std::cout << "instance flood: VmRSS grew by " << growth / 1024 << " KiB\n";
  if (kRssIsMeaningful) {
    EXPECT_LT(growth, kMaxRssGrowth);
  }
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace retrybudget::testing
