// Sync through the wire: grants, the accounting of DESIGN.md (duplicates, stale seq, lost
// responses), several tenants, and many concurrent instances against one bucket. The server is
// real (gRPC on loopback); its clock is fake and only moves when a test says so.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace retrybudget::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;

v1::SyncRequest Request(absl::string_view instance, uint64_t seq,
                        std::vector<v1::TenantSync> tenants) {
  v1::SyncRequest r;
  r.set_instance_id(std::string(instance));
  r.set_seq(seq);
  for (auto& t : tenants) *r.add_tenants() = std::move(t);
  return r;
}

v1::TenantSync Entry(absl::string_view tenant, uint64_t want, uint64_t received = 0) {
  v1::TenantSync t;
  t.set_tenant(std::string(tenant));
  t.set_want(want);
  t.set_tokens_received(received);
  return t;
}

double Tokens(TestServer& s, absl::string_view tenant) {
  v1::BudgetStatus budget;
  const grpc::Status status = s.GetBudget(tenant, &budget);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return budget.tokens();
}

TEST(SyncTest, FirstSyncGrantsWhatIsWantedFromAFullDefaultBucket) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::SyncResponse response;
  ASSERT_TRUE(s->Sync(Request("worker-1", 1, {Entry("payments", 5)}), &response).ok());

  ASSERT_EQ(response.tenants_size(), 1);
  const v1::TenantGrant& grant = response.tenants(0);
  EXPECT_FALSE(response.stale());
  EXPECT_FALSE(grant.has_error());
  EXPECT_EQ(grant.tenant(), "payments");
  EXPECT_EQ(grant.granted(), 5u);
  EXPECT_EQ(grant.lease_ttl_ms(), 5000);  // the default policy
  EXPECT_EQ(grant.capacity(), 100);
  EXPECT_DOUBLE_EQ(grant.bucket_tokens(), 95);
  EXPECT_EQ(grant.active_instances(), 1u);
  EXPECT_GT(grant.next_sync_ms(), 0);
  EXPECT_DOUBLE_EQ(Tokens(*s, "payments"), 95);
}

TEST(SyncTest, DuplicateRequestReplaysTheSameResponseAndGrantsNothingMore) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  const v1::SyncRequest request = Request("worker-1", 1, {Entry("payments", 7)});
  v1::SyncResponse first, again;
  ASSERT_TRUE(s->Sync(request, &first).ok());
  ASSERT_TRUE(s->Sync(request, &again).ok());

  EXPECT_TRUE(MessageDifferencer::Equals(first, again))
      << first.DebugString() << " vs " << again.DebugString();
  EXPECT_EQ(again.tenants(0).granted(), 7u);
  EXPECT_DOUBLE_EQ(Tokens(*s, "payments"), 93);  // taken once
  v1::BudgetStatus budget;
  ASSERT_TRUE(s->GetBudget("payments", &budget).ok());
  EXPECT_EQ(budget.granted_total(), 7u);
}

TEST(SyncTest, OlderSeqIsStaleAndChangesNothing) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::SyncResponse response;
  ASSERT_TRUE(s->Sync(Request("worker-1", 1, {Entry("payments", 4)}), &response).ok());
  ASSERT_TRUE(s->Sync(Request("worker-1", 2, {Entry("payments", 4, 4)}), &response).ok());
  ASSERT_EQ(response.tenants(0).granted(), 4u);

  // A delayed copy of seq 1, with a different want, arrives late.
  v1::SyncResponse stale;
  ASSERT_TRUE(s->Sync(Request("worker-1", 1, {Entry("payments", 50)}), &stale).ok());
  EXPECT_TRUE(stale.stale());
  EXPECT_EQ(stale.tenants_size(), 0);
  EXPECT_DOUBLE_EQ(Tokens(*s, "payments"), 92);
}

TEST(SyncTest, GrantWhoseResponseWasLostIsReclaimedOnTheNextSeq) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::SyncResponse lost;
  ASSERT_TRUE(s->Sync(Request("worker-1", 1, {Entry("payments", 10)}), &lost).ok());
  ASSERT_EQ(lost.tenants(0).granted(), 10u);
  ASSERT_DOUBLE_EQ(Tokens(*s, "payments"), 90);

  // The client never saw that response: it still reports 0 tokens received.
  v1::SyncResponse next;
  ASSERT_TRUE(s->Sync(Request("worker-1", 2, {Entry("payments", 0, 0)}), &next).ok());
  EXPECT_EQ(next.tenants(0).granted(), 0u);
  EXPECT_DOUBLE_EQ(next.tenants(0).bucket_tokens(), 100);
  v1::BudgetStatus budget;
  ASSERT_TRUE(s->GetBudget("payments", &budget).ok());
  EXPECT_EQ(budget.reclaimed_total(), 10u);
  EXPECT_DOUBLE_EQ(budget.tokens(), 100);
}

TEST(SyncTest, SuccessesEarnCreditAndTimeRefillsThroughTheWire) {
  v1::PolicyConfig policy = Parse<v1::PolicyConfig>(R"pb(
    tenants {
      tenant: "db"
      policy { capacity: 10 refill_per_second: 2 success_credit: 0.5 }
    })pb");
  auto s = TestServer::Start({.policy = policy});
  ASSERT_NE(s, nullptr);
  v1::SyncResponse response;
  ASSERT_TRUE(s->Sync(Request("w", 1, {Entry("db", 10)}), &response).ok());
  ASSERT_EQ(response.tenants(0).granted(), 10u);
  EXPECT_DOUBLE_EQ(Tokens(*s, "db"), 0);

  v1::TenantSync report = Entry("db", 0, 10);
  report.set_successes(4);       // 4 * 0.5 = 2 tokens of credit
  report.set_retries_spent(10);  // the whole lease was spent
  ASSERT_TRUE(s->Sync(Request("w", 2, {report}), &response).ok());
  EXPECT_DOUBLE_EQ(response.tenants(0).bucket_tokens(), 2);

  s->clock().Advance(absl::Seconds(1.5));  // + 3 tokens
  EXPECT_DOUBLE_EQ(Tokens(*s, "db"), 5);
  s->clock().Advance(absl::Seconds(60));  // capped at capacity
  EXPECT_DOUBLE_EQ(Tokens(*s, "db"), 10);
}

TEST(SyncTest, TenantsInOneRequestAreAccountedIndependently) {
  v1::PolicyConfig policy = Parse<v1::PolicyConfig>(R"pb(
    tenants { tenant: "small" policy { capacity: 3 } }
    tenants { tenant: "big" policy { capacity: 1000 } })pb");
  auto s = TestServer::Start({.policy = policy});
  ASSERT_NE(s, nullptr);
  v1::SyncResponse response;
  ASSERT_TRUE(s->Sync(Request("w", 1, {Entry("small", 10), Entry("big", 10), Entry("new", 1)}),
                      &response)
                  .ok());
  ASSERT_EQ(response.tenants_size(), 3);
  EXPECT_EQ(response.tenants(0).tenant(), "small");
  EXPECT_EQ(response.tenants(0).granted(), 3u);  // all it holds
  EXPECT_EQ(response.tenants(1).tenant(), "big");
  EXPECT_EQ(response.tenants(1).granted(), 10u);
  EXPECT_EQ(response.tenants(2).tenant(), "new");  // created with the default policy
  EXPECT_EQ(response.tenants(2).granted(), 1u);
  EXPECT_EQ(response.tenants(2).capacity(), 100);
  EXPECT_DOUBLE_EQ(Tokens(*s, "small"), 0);
  EXPECT_DOUBLE_EQ(Tokens(*s, "big"), 990);
  EXPECT_DOUBLE_EQ(Tokens(*s, "new"), 99);
}

// The server parses into and answers from messages it keeps per thread and clears between
// Syncs (server/reused_messages.h): whatever a Sync before it held (more entries, long names,
// an entry refused), a response holds its own request's entries and nothing else.
TEST(SyncTest, EachResponseHoldsItsOwnEntriesWhateverTheSyncBeforeItHeld) {
  std::string config = "strict: true\n";
  std::vector<std::string> long_names;
  for (int i = 0; i < 8; ++i) {
    long_names.push_back(absl::StrCat("a-tenant-name-longer-than-any-inline-string-", i));
  }
  for (const std::string& name : long_names) {
    absl::StrAppend(&config, "tenants { tenant: \"", name, "\" policy { capacity: 1e6 } }\n");
  }
  absl::StrAppend(&config, "tenants { tenant: \"p\" policy { capacity: 1e6 } }\n");
  auto s = TestServer::Start({.policy = Parse<v1::PolicyConfig>(config)});
  ASSERT_NE(s, nullptr);
  for (int round = 0; round < 30; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    std::vector<v1::TenantSync> eight;
    for (const std::string& name : long_names) eight.push_back(Entry(name, 1));
    v1::SyncResponse big;
    ASSERT_TRUE(s->Sync(Request(absl::StrCat("big-", round), 1, eight), &big).ok());
    ASSERT_EQ(big.tenants_size(), 8);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(big.tenants(i).tenant(), long_names[i]);
      EXPECT_FALSE(big.tenants(i).has_error());
      EXPECT_TRUE(big.tenants(i).has_safe_share());
      EXPECT_EQ(big.tenants(i).granted(), 1u);
    }

    v1::SyncResponse refused;  // strict: a tenant without a budget is refused, entry by entry
    ASSERT_TRUE(s->Sync(Request(absl::StrCat("refused-", round), 1, {Entry("unlisted", 1)}),
                        &refused)
                    .ok());
    ASSERT_EQ(refused.tenants_size(), 1);
    EXPECT_EQ(refused.tenants(0).tenant(), "unlisted");
    EXPECT_EQ(refused.tenants(0).error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
    EXPECT_FALSE(refused.tenants(0).has_safe_share());
    EXPECT_EQ(refused.tenants(0).granted(), 0u);
    EXPECT_EQ(refused.tenants(0).capacity(), 0);

    v1::SyncResponse bad;  // refused whole: the messages are cleared after a failed parse too
    EXPECT_EQ(s->Sync(Request(absl::StrCat("bad-", round), 1, {Entry("p q", 1)}), &bad)
                  .error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);

    v1::SyncResponse small;
    ASSERT_TRUE(s->Sync(Request(absl::StrCat("small-", round), 1, {Entry("p", 1)}), &small).ok());
    ASSERT_EQ(small.tenants_size(), 1) << small.ShortDebugString();
    EXPECT_EQ(small.tenants(0).tenant(), "p");
    EXPECT_FALSE(small.tenants(0).has_error()) << small.ShortDebugString();
    EXPECT_TRUE(small.tenants(0).has_safe_share());
    EXPECT_EQ(small.tenants(0).granted(), 1u);
    EXPECT_EQ(small.tenants(0).capacity(), 1e6);
    EXPECT_FALSE(small.stale());
  }
}

// Drains `tenant` from `threads` concurrent instances, each syncing with increasing seq and
// honest counters until the bucket is dry. Returns the sum of all grants.
uint64_t DrainConcurrently(TestServer& s, const std::vector<std::string>& tenants, int threads,
                           uint64_t want, absl::string_view instance_prefix = "instance-") {
  std::atomic<uint64_t> total{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      const std::string instance = absl::StrCat(instance_prefix, w);
      std::vector<uint64_t> received(tenants.size(), 0);
      for (uint64_t seq = 1; seq <= 2000; ++seq) {
        v1::SyncRequest request;
        request.set_instance_id(instance);
        request.set_seq(seq);
        for (size_t i = 0; i < tenants.size(); ++i) {
          *request.add_tenants() = Entry(tenants[i], want, received[i]);
        }
        v1::SyncResponse response;
        if (!s.Sync(request, &response).ok() || response.stale() ||
            response.tenants_size() != static_cast<int>(tenants.size())) {
          failures.fetch_add(1);
          return;
        }
        bool any_left = false;
        for (size_t i = 0; i < tenants.size(); ++i) {
          received[i] += response.tenants(i).granted();
          total.fetch_add(response.tenants(i).granted());
          any_left |= response.tenants(i).bucket_tokens() >= 1;
        }
        if (!any_left) return;
      }
    });
  }
  for (auto& t : workers) t.join();
  EXPECT_EQ(failures.load(), 0);
  return total.load();
}

TEST(SyncConcurrencyTest, ManyInstancesNeverGetMoreThanTheBucketHolds) {
  v1::PolicyConfig policy = Parse<v1::PolicyConfig>(R"pb(
    tenants { tenant: "shared" policy { capacity: 250 refill_per_second: 5 } })pb");
  auto s = TestServer::Start({.policy = policy});
  ASSERT_NE(s, nullptr);

  // The fake clock does not move: no refill, so the fleet can get exactly the initial 250.
  const uint64_t granted = DrainConcurrently(*s, {"shared"}, 16, 3);

  EXPECT_EQ(granted, 250u);
  v1::BudgetStatus budget;
  ASSERT_TRUE(s->GetBudget("shared", &budget).ok());
  EXPECT_EQ(budget.granted_total(), 250u);
  EXPECT_DOUBLE_EQ(budget.tokens(), 0);
  EXPECT_EQ(budget.reclaimed_total(), 0u);  // honest clients: nothing was lost
}

TEST(SyncConcurrencyTest, SeveralTenantsDrainedTogetherEachGiveExactlyTheirCapacity) {
  v1::PolicyConfig policy = Parse<v1::PolicyConfig>(R"pb(
    tenants { tenant: "a" policy { capacity: 40 } }
    tenants { tenant: "b" policy { capacity: 75 } }
    tenants { tenant: "c" policy { capacity: 120 initial_tokens: 60 } })pb");
  auto s = TestServer::Start({.policy = policy});
  ASSERT_NE(s, nullptr);

  const uint64_t granted = DrainConcurrently(*s, {"a", "b", "c"}, 12, 2);

  EXPECT_EQ(granted, 40u + 75u + 60u);
  for (const auto& [tenant, expected] :
       std::vector<std::pair<std::string, uint64_t>>{{"a", 40}, {"b", 75}, {"c", 60}}) {
    v1::BudgetStatus budget;
    ASSERT_TRUE(s->GetBudget(tenant, &budget).ok());
    EXPECT_EQ(budget.granted_total(), expected) << tenant;
    EXPECT_DOUBLE_EQ(budget.tokens(), 0) << tenant;
  }
}

TEST(SyncConcurrencyTest, RefillDuringAConcurrentDrainIsGrantedAtMostOnce) {
  v1::PolicyConfig policy = Parse<v1::PolicyConfig>(R"pb(
    tenants { tenant: "shared" policy { capacity: 50 refill_per_second: 10 } })pb");
  auto s = TestServer::Start({.policy = policy});
  ASSERT_NE(s, nullptr);

  std::atomic<bool> done{false};
  std::thread ticker([&] {
    // 20 ticks of 0.5 s of fake time: 100 tokens of refill in all.
    for (int i = 0; i < 20 && !done.load(); ++i) {
      s->clock().Advance(absl::Milliseconds(500));
      std::this_thread::yield();
    }
  });
  const uint64_t during = DrainConcurrently(*s, {"shared"}, 8, 4);
  done = true;
  ticker.join();
  const absl::Duration elapsed = s->clock().Now() - absl::FromUnixSeconds(1'700'000'000);
  const uint64_t after = DrainConcurrently(*s, {"shared"}, 8, 4, "late-");  // what is left

  const double bound = 50 + 10 * absl::ToDoubleSeconds(elapsed);
  EXPECT_LE(static_cast<double>(during + after), bound);
  EXPECT_GE(during + after, 50u);  // at least the initial level was handed out
  v1::BudgetStatus budget;
  ASSERT_TRUE(s->GetBudget("shared", &budget).ok());
  EXPECT_EQ(budget.granted_total(), during + after);
  // Refill that arrived while the bucket was full is lost to the cap, never added twice.
  EXPECT_LE(static_cast<double>(budget.granted_total()) + budget.tokens(), bound);
}

}  // namespace
}  // namespace retrybudget::testing
