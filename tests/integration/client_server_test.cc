// The client library (retrybudget::client) against the real server on loopback, both on the
// real clock: many threads in one BudgetClient, and several BudgetClients sharing one tenant.
// The invariant of DESIGN.md is checked by counting what the workers actually spent:
//
//   sum of TryAcquire() == true  <=  initial + refill * elapsed + credit * successes
//
// and the server's own totals (reported by the clients' final Sync) must agree with the counts.
#include <atomic>
#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "tests/integration/test_server.h"

namespace retrybudget::testing {
namespace {

constexpr double kCapacity = 30;
constexpr double kRefill = 20;   // tokens per second
constexpr double kCredit = 0.01;  // tokens per success
constexpr absl::Duration kRun = absl::Milliseconds(1500);

v1::PolicyConfig Policy() {
  return Parse<v1::PolicyConfig>(absl::StrCat(R"pb(
    tenants {
      tenant: "shared"
      policy { capacity: )pb", kCapacity, " refill_per_second: ", kRefill,
                                              " success_credit: ", kCredit, R"pb( }
    })pb"));
}

struct Counts {
  std::atomic<uint64_t> allowed{0};
  std::atomic<uint64_t> denied{0};
  std::atomic<uint64_t> successes{0};
};

// A worker thread: calls a simulated backend that fails 80% of the time, retries (at most 3
// times) only when the budget allows, and records successes.
void Work(TenantBudget* budget, absl::Time until, uint32_t seed, Counts& counts) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution fails(0.8);
  while (absl::Now() < until) {
    bool ok = !fails(rng);
    for (int retry = 0; !ok && retry < 3; ++retry) {
      if (!budget->TryAcquire()) {
        counts.denied.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      counts.allowed.fetch_add(1, std::memory_order_relaxed);
      ok = !fails(rng);
    }
    if (ok) {
      budget->RecordSuccess();
      counts.successes.fetch_add(1, std::memory_order_relaxed);
    }
    // A backend call takes some time; keeps the success credit from dominating the bound.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Runs `clients` BudgetClients with `threads` workers each against one server; checks the
// invariant and that the server's totals match the workers' counts.
void RunFleet(int clients, int threads) {
  const absl::Time start = absl::Now();  // before the bucket exists: a generous elapsed
  auto server = TestServer::Start({.policy = Policy(), .real_clock = true});
  ASSERT_NE(server, nullptr);

  Counts counts;
  std::vector<std::unique_ptr<BudgetClient>> fleet;
  std::vector<TenantBudget*> budgets;
  for (int c = 0; c < clients; ++c) {
    ClientOptions options;
    options.target = server->address();
    auto client = BudgetClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    auto budget = (*client)->Tenant("shared");
    ASSERT_TRUE(budget.ok()) << budget.status();
    budgets.push_back(*budget);
    fleet.push_back(*std::move(client));
  }
  // Each client's first Sync of the tenant is the server's baseline for it: counters recorded
  // before it reaches the server are not credited (docs/DESIGN.md "Accounting"), so the workers
  // start once every client holds its first lease and the totals below can match exactly.
  const absl::Time ready_by = absl::Now() + absl::Seconds(10);
  for (TenantBudget* budget : budgets) {
    while (!budget->Stats().lease_active && absl::Now() < ready_by) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_TRUE(budget->Stats().lease_active) << "no first lease within 10 s";
  }
  const absl::Time until = absl::Now() + kRun;
  std::vector<std::thread> workers;
  for (int c = 0; c < clients; ++c) {
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back(Work, budgets[c], until, static_cast<uint32_t>(c * 1000 + t),
                           std::ref(counts));
    }
  }
  for (auto& w : workers) w.join();
  // Each client's final Sync reports its counters and returns its unspent tokens.
  for (auto& client : fleet) EXPECT_TRUE(client->Shutdown().ok());
  const absl::Duration elapsed = absl::Now() - start;

  const double bound = kCapacity + kRefill * absl::ToDoubleSeconds(elapsed) +
                       kCredit * static_cast<double>(counts.successes.load());
  const uint64_t spent = counts.allowed.load();
  std::cout << clients << " client(s) x " << threads << " threads: spent " << spent
            << ", denied " << counts.denied.load() << ", successes " << counts.successes.load()
            << ", bound " << bound << " over " << elapsed << "\n";
  EXPECT_LE(static_cast<double>(spent), bound)
      << "spent " << spent << " retries; bound " << bound << " after " << elapsed;
  EXPECT_GT(spent, 0u);
  EXPECT_GT(counts.denied.load(), 0u) << "the budget never bound; the test proves nothing";

  v1::BudgetStatus status;
  ASSERT_TRUE(server->GetBudget("shared", &status).ok());
  EXPECT_EQ(status.retries_total(), spent);
  EXPECT_EQ(status.successes_total(), counts.successes.load());
  EXPECT_EQ(status.retries_denied_total(), counts.denied.load());
  // Every token that left the bucket was spent, returned, or reclaimed.
  EXPECT_EQ(status.granted_total(),
            status.retries_total() + status.returned_total() + status.reclaimed_total());
}

TEST(ClientServerTest, ManyThreadsInOneClientStayWithinTheBudget) { RunFleet(1, 8); }

TEST(ClientServerTest, SeveralClientsSharingATenantStayWithinTheBudget) { RunFleet(4, 3); }

}  // namespace
}  // namespace retrybudget::testing
