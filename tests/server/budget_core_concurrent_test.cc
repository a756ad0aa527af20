// Many instances syncing one tenant at once, while admins read and reconfigure it: the total
// granted never exceeds what the bucket held. Run under ThreadSanitizer in CI.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "server/budget_core.h"
#include "server/compact_mutex.h"
#include "server/ref_ptr.h"

namespace retrybudget {
namespace {

// The per-tenant and per-instance lock (server/compact_mutex.h): plain, unsynchronised
// counters changed only under it come out exact, with the waiters that sleep in the kernel
// (four threads on two cores) as well as the ones that find it free. Under ThreadSanitizer an
// access not ordered by the lock is reported.
TEST(CompactMutexTest, GuardsPlainDataAcrossThreads) {
  CompactMutex mu;
  uint64_t count = 0;  // no atomics: only the mutex orders these
  std::vector<uint64_t> last_seen_by(4, 0);
  constexpr int kPerThread = 50'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        CompactMutexLock lock(&mu);
        ++count;
        last_seen_by[t] = count;
      }
    });
  }
  for (auto& th : threads) th.join();
  CompactMutexLock lock(&mu);
  EXPECT_EQ(count, 4u * kPerThread);
  for (uint64_t seen : last_seen_by) EXPECT_LE(seen, count);
}

TEST(CompactMutexTest, AWaiterBlockedWhileItIsHeldGetsItWhenReleased) {
  CompactMutex mu;
  int value = 0;
  std::atomic<bool> waiting{false};
  mu.Lock();
  std::thread waiter([&] {
    waiting.store(true);
    CompactMutexLock lock(&mu);  // spins, then sleeps: the holder keeps it for 50 ms
    value += 1;
  });
  while (!waiting.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  value = 41;  // the waiter must see this: it can only enter after the Unlock below
  mu.Unlock();
  waiter.join();
  CompactMutexLock lock(&mu);
  EXPECT_EQ(value, 42);
}

// The intrusive count the tenants and instances are shared by (server/ref_ptr.h): threads
// copying and dropping references to one record, the last of them on any thread, delete it
// exactly once, after every write made through a reference (under ThreadSanitizer, a deletion
// not ordered after those writes is reported).
struct Shared final : RefCounted {
  explicit Shared(std::atomic<int>* deletions) : deletions(deletions) {}
  ~Shared() {
    EXPECT_EQ(writes, 4 * 1000);
    deletions->fetch_add(1);
  }
  std::atomic<int>* deletions;
  CompactMutex mu;
  int writes = 0;
};

TEST(RefPtrConcurrentTest, TheLastReferenceOnAnyThreadDeletesTheRecordOnce) {
  for (int round = 0; round < 50; ++round) {
    std::atomic<int> deletions{0};
    std::vector<std::thread> threads;
    {
      RefPtr<Shared> record = MakeRef<Shared>(&deletions);
      for (int t = 0; t < 4; ++t) {
        threads.emplace_back([mine = record] {  // each thread holds its own reference
          for (int i = 0; i < 1000; ++i) {
            RefPtr<Shared> copy = mine;
            CompactMutexLock lock(&copy->mu);
            ++copy->writes;
          }
        });
      }
    }  // the main thread lets go first; one of the workers deletes it
    for (auto& th : threads) th.join();
    ASSERT_EQ(deletions.load(), 1) << "round " << round;
  }
}

TEST(BudgetCoreConcurrentTest, ConcurrentInstancesNeverGetMoreThanTheBucketHolds) {
  FakeClock clock;  // frozen: no refill, so everything granted came from the initial tokens
  CoreOptions options;
  options.clock = &clock;
  options.policy.mutable_default_policy()->set_capacity(1000);
  options.policy.mutable_default_policy()->set_refill_per_second(0);
  options.policy.mutable_default_policy()->set_success_credit(0);
  auto core = BudgetCore::Create(options);
  ASSERT_TRUE(core.ok());

  constexpr int kThreads = 8;
  constexpr int kRounds = 300;
  std::atomic<uint64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint64_t received = 0;
      for (int seq = 1; seq <= kRounds; ++seq) {
        v1::SyncRequest r;
        r.set_instance_id("instance-" + std::to_string(t));
        r.set_seq(seq);
        for (const char* tenant : {"shared", "other"}) {
          auto* e = r.add_tenants();
          e->set_tenant(tenant);
          e->set_want(7);
          if (std::string(tenant) == "shared") {
            e->set_tokens_received(received);
            e->set_retries_spent(received);  // spends everything it got
          }
        }
        auto resp = (*core)->Sync(r);
        ASSERT_TRUE(resp.ok()) << resp.status();
        received += resp->tenants(0).granted();
        granted += resp->tenants(0).granted();
        // Give "other" back nothing: it is never reported, so its tokens are simply held.
      }
    });
  }
  std::thread admin([&] {
    for (int i = 0; i < 200; ++i) {
      (void)(*core)->GetBudget("shared");
      (void)(*core)->ListBudgets({});
      v1::BudgetPolicy p;
      p.set_capacity(1000);
      p.set_refill_per_second(0);
      p.set_success_credit(0);
      (void)(*core)->PutPolicy("shared", p);
    }
  });
  for (auto& t : threads) t.join();
  admin.join();
  EXPECT_EQ(granted.load(), 1000u);  // all of it, and not one more
  auto status = (*core)->GetBudget("shared");
  ASSERT_TRUE(status.ok());
  EXPECT_LT(status->tokens(), 1.0);
  EXPECT_EQ(status->granted_total(), 1000u);
}

// Budgets deleted while instances sync them: every request that held the old budget moves to the
// new one, none crashes or uses a freed budget (TSan/ASan), and no incarnation of the budget
// grants more than it held. The tenant never deleted is exact.
TEST(BudgetCoreConcurrentTest, DeletingABudgetUnderLoadNeverGrantsMoreThanItsIncarnationsHeld) {
  FakeClock clock;
  CoreOptions options;
  options.clock = &clock;
  options.policy.mutable_default_policy()->set_capacity(500);
  options.policy.mutable_default_policy()->set_refill_per_second(0);
  options.policy.mutable_default_policy()->set_success_credit(0);
  auto core = BudgetCore::Create(options);
  ASSERT_TRUE(core.ok());

  constexpr int kThreads = 6;
  constexpr int kRounds = 300;
  std::atomic<uint64_t> doomed_granted{0}, kept_granted{0}, refused{0};
  std::atomic<bool> syncing{true};
  std::atomic<uint64_t> deletions{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint64_t received[2] = {0, 0};
      for (int seq = 1; seq <= kRounds; ++seq) {
        // Halfway, until the budget was deleted at least once (10 s at most): on a loaded
        // machine the Syncs could otherwise all finish before the admin thread first runs.
        if (seq == kRounds / 2) {
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (deletions.load() == 0 && std::chrono::steady_clock::now() < give_up) {
            std::this_thread::yield();
          }
        }
        v1::SyncRequest r;
        r.set_instance_id("instance-" + std::to_string(t));
        r.set_seq(seq);
        int k = 0;
        for (const char* tenant : {"doomed", "kept"}) {
          auto* e = r.add_tenants();
          e->set_tenant(tenant);
          e->set_want(5);
          e->set_tokens_received(received[k]);
          e->set_retries_spent(received[k]);
          ++k;
        }
        auto resp = (*core)->Sync(r);
        ASSERT_TRUE(resp.ok()) << resp.status();
        for (int i = 0; i < 2; ++i) {
          const v1::TenantGrant& g = resp->tenants(i);
          if (g.has_error()) {
            EXPECT_EQ(g.error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
            ++refused;
            continue;
          }
          received[i] += g.granted();
          (i == 0 ? doomed_granted : kept_granted) += g.granted();
        }
      }
    });
  }
  std::thread admin([&] {
    while (syncing.load()) {
      if ((*core)->DeleteBudget("doomed").ok()) ++deletions;
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  syncing = false;
  admin.join();
  EXPECT_GT(deletions.load(), 0u);
  EXPECT_EQ(kept_granted.load(), 500u);
  EXPECT_LE(doomed_granted.load(), 500u * (deletions.load() + 1));
  auto kept = (*core)->GetBudget("kept");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->granted_total(), 500u);
}


// Issue 11, case 7: a first request of an id racing another first request of the same id.
// Whatever their order, the id ends up with exactly one instance: a request that fails never
// erases an instance another request created (it erases only the object it created itself).
TEST(BudgetCoreConcurrentTest, AFailedFirstRequestNeverErasesAnotherRequestsInstance) {
  FakeClock clock;
  CoreOptions options;
  options.clock = &clock;
  options.policy.mutable_default_policy()->set_capacity(1e9);
  auto core = BudgetCore::Create(options);
  ASSERT_TRUE(core.ok());
  constexpr int kIds = 1000;
  std::atomic<int> arrived{0};
  auto run = [&](bool good) {
    for (int i = 0; i < kIds; ++i) {
      // Both threads start each id together.
      arrived.fetch_add(1);
      while (arrived.load() < 2 * (i + 1)) {
      }
      v1::SyncRequest r;
      r.set_instance_id("race-" + std::to_string(i));
      r.set_seq(1);
      auto* e = r.add_tenants();
      e->set_tenant("t");
      if (good) {
        e->set_want(1);
      } else {
        e->set_tokens_received(5);  // once refused as more than was ever granted
      }
      (void)(*core)->Sync(r);
    }
  };
  std::thread good([&] { run(true); });
  std::thread bad([&] { run(false); });
  good.join();
  bad.join();
  EXPECT_EQ((*core)->instance_count(), static_cast<size_t>(kIds));
}

}  // namespace
}  // namespace retrybudget
