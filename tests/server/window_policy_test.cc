// The windowed ratio policy through BudgetCore (DESIGN.md "The windowed ratio policy"): grants
// sized by the window, deposits from reported requests, carried leases, the status, a change of
// shape, snapshots. A fake clock; the bound itself is checked over a simulated fleet.
#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "retrybudget/clock.h"
#include "server/budget_core.h"

namespace retrybudget {
namespace {

// One instance's cumulative counters of tenant "w", as a client sends them.
struct Client {
  std::string id;
  uint64_t seq = 0;
  uint64_t requests = 0;
  uint64_t spent = 0;
  uint64_t returned = 0;
  uint64_t received = 0;
  uint64_t held = 0;
  absl::Time lease_ends = absl::InfinitePast();
};

v1::BudgetPolicy Windowed(double ratio, double floor_per_second, int64_t ttl_ms) {
  v1::BudgetPolicy p;
  p.set_retry_ratio(ratio);
  p.set_min_retries_per_second(floor_per_second);
  p.set_ttl_ms(ttl_ms);
  return p;
}

class WindowPolicyTest : public ::testing::Test {
 protected:
  void MakeCore(const v1::BudgetPolicy& policy) {
    CoreOptions options;
    *options.policy.mutable_default_policy() = policy;
    options.clock = &clock_;
    auto core = BudgetCore::Create(std::move(options));
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
  }

  // One Sync of `c` wanting `want`; applies the answer to `c` as a client would.
  v1::TenantGrant Sync(Client& c, uint64_t want, bool final = false) {
    v1::SyncRequest r;
    r.set_instance_id(c.id);
    r.set_seq(++c.seq);
    r.set_final(final);
    v1::TenantSync* t = r.add_tenants();
    t->set_tenant("w");
    t->set_requests(c.requests);
    t->set_retries_spent(c.spent);
    t->set_retries_allowed(c.spent);
    t->set_tokens_returned(c.returned);
    t->set_tokens_received(c.received);
    t->set_want(want);
    auto response = core_->Sync(r);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok() || response->tenants_size() != 1) return v1::TenantGrant();
    const v1::TenantGrant& g = response->tenants(0);
    EXPECT_FALSE(g.has_error()) << g.error().message();
    c.received += g.granted();
    c.held += g.granted();
    c.lease_ends = clock_.Now() + absl::Milliseconds(g.lease_ttl_ms());
    return g;
  }

  // Returns what `c` holds once its lease ended.
  void ReturnIfExpired(Client& c) {
    if (clock_.Now() >= c.lease_ends && c.held > 0) {
      c.returned += c.held;
      c.held = 0;
    }
  }

  v1::BudgetStatus Status() { return *core_->GetBudget("w"); }

  FakeClock clock_;
  std::unique_ptr<BudgetCore> core_;
};

TEST_F(WindowPolicyTest, AFreshTenantGrantsTheFloorOfOneWindow) {
  MakeCore(Windowed(0.2, 2, 10'000));  // floor: 2/s * 10 s = 20
  Client a{.id = "a"};
  const v1::TenantGrant g = Sync(a, 50);
  EXPECT_EQ(g.granted(), 20u);
  EXPECT_EQ(g.lease_ttl_ms(), 1000);  // ttl/10
  EXPECT_DOUBLE_EQ(Status().tokens(), 0);
  EXPECT_EQ(Sync(a, 50).granted(), 0u);
}

TEST_F(WindowPolicyTest, RequestsDepositTheRatioAndTheStatusShowsThem) {
  MakeCore(Windowed(0.5, 1, 10'000));
  Client a{.id = "a"};
  Sync(a, 0);  // the baseline
  a.requests = 40;
  Sync(a, 0);
  EXPECT_DOUBLE_EQ(Status().window_deposits(), 20);
  // The deposits live one window from their slot's start, and no longer.
  clock_.Advance(absl::Seconds(10));
  EXPECT_DOUBLE_EQ(Status().window_deposits(), 0);
}

TEST_F(WindowPolicyTest, ABaselineDepositsNothing) {
  MakeCore(Windowed(0.5, 1, 10'000));
  Client a{.id = "a", .requests = 1000};
  Sync(a, 0);
  EXPECT_DOUBLE_EQ(Status().window_deposits(), 0);
}

TEST_F(WindowPolicyTest, DepositsFundGrantsBesideTheFloor) {
  MakeCore(Windowed(1, 1, 10'000));  // floor 10
  Client a{.id = "a"};
  EXPECT_EQ(Sync(a, 100).granted(), 10u);
  a.spent = 10;
  a.held = 0;
  // A window and a lease later, the first grant expired; 30 requests deposit 30.
  clock_.Advance(absl::Seconds(12));
  a.requests = 30;
  Sync(a, 0);
  EXPECT_DOUBLE_EQ(Status().tokens(), 40);
  // A lease granted within a lease TTL of the deposits' expiry could be spent after it: then
  // only the floor funds it.
  clock_.Advance(absl::Milliseconds(9500));
  EXPECT_DOUBLE_EQ(Status().tokens(), 10);
}

TEST_F(WindowPolicyTest, ReturnedTokensMakeRoomAgain) {
  MakeCore(Windowed(0.2, 1, 10'000));
  Client a{.id = "a"};
  EXPECT_EQ(Sync(a, 10).granted(), 10u);
  clock_.Advance(absl::Seconds(2));  // the lease (1 s) ended: its 10 come back
  ReturnIfExpired(a);
  Sync(a, 0);
  EXPECT_DOUBLE_EQ(Status().tokens(), 10);
}

TEST_F(WindowPolicyTest, HeldTokensThatDoNotFitEndTheLeaseAtOnce) {
  MakeCore(Windowed(1, 1, 10'000));  // floor 10
  Client a{.id = "a"};
  Client b{.id = "b"};
  Sync(b, 0);  // b's baseline: its requests below are deposited
  Sync(a, 0);
  b.requests = 20;
  Sync(b, 0);
  EXPECT_EQ(Sync(a, 30).granted(), 30u);  // the floor and the deposits, held by a
  // a keeps its 30 tokens, carrying them into each new lease, until a lease would outlive the
  // deposits that fund them: then its lease ends at once and it is granted nothing.
  v1::TenantGrant g;
  int syncs = 0;
  do {
    clock_.Advance(absl::Milliseconds(500));
    g = Sync(a, 30);
    ++syncs;
  } while (g.lease_ttl_ms() != 0 && syncs < 30);
  EXPECT_EQ(g.lease_ttl_ms(), 0) << "a's held tokens were carried past their deposits";
  EXPECT_EQ(g.granted(), 0u);
  EXPECT_GE(syncs, 16);  // not before the deposits were within a lease TTL of their expiry
  EXPECT_LE(syncs, 20);
  // Its tokens come back at its next Sync, soon: then the floor is granted again.
  EXPECT_LE(g.next_sync_ms(), 10);
  ReturnIfExpired(a);
  EXPECT_EQ(Sync(a, 30).granted(), 10u);
}

TEST_F(WindowPolicyTest, ChangingTheShapeStartsNewBooks) {
  MakeCore(Windowed(0.2, 1, 10'000));
  Client a{.id = "a"};
  EXPECT_EQ(Sync(a, 10).granted(), 10u);
  // To a token bucket: the bucket starts at what the window allowed (0), capped.
  v1::BudgetPolicy bucket;
  bucket.set_capacity(50);
  bucket.set_refill_per_second(1);
  ASSERT_TRUE(core_->PutPolicy("w", bucket).ok());
  EXPECT_DOUBLE_EQ(Status().tokens(), 0);
  EXPECT_DOUBLE_EQ(Status().window_deposits(), 0);
  // And back: a fresh window, with what the fleet holds counted as granted now.
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(core_->PutPolicy("w", Windowed(0.2, 3, 10'000)).ok());
  EXPECT_LE(Status().tokens(), 30);
  // The same window with another floor keeps the books: the new floor applies at once.
  ASSERT_TRUE(core_->PutPolicy("w", Windowed(0.2, 1, 10'000)).ok());
  EXPECT_LE(Status().tokens(), 10);
}

TEST_F(WindowPolicyTest, ACleanSnapshotKeepsTheWindow) {
  MakeCore(Windowed(0.5, 1, 10'000));
  Client a{.id = "a"};
  Sync(a, 0);
  a.requests = 20;
  EXPECT_EQ(Sync(a, 4).granted(), 4u);
  const v1::ServerState state = core_->ExportState(/*clean=*/true);
  ASSERT_EQ(state.tenants_size(), 1);
  EXPECT_GT(state.tenants(0).window_slots_size(), 0);
  const double tokens = Status().tokens();
  MakeCore(Windowed(0.5, 1, 10'000));
  RecoveredState recovered;
  recovered.snapshot = state;
  ASSERT_TRUE(core_->Restore(recovered).ok());
  EXPECT_DOUBLE_EQ(Status().tokens(), tokens);
  EXPECT_DOUBLE_EQ(Status().window_deposits(), 10);
}

TEST_F(WindowPolicyTest, ACrashCountsTheReservationAsGrantedAtTheRestart) {
  MakeCore(Windowed(0.5, 2, 10'000));  // floor 20
  Client a{.id = "a"};
  Sync(a, 0);
  const v1::ServerState state = core_->ExportState(/*clean=*/false);
  MakeCore(Windowed(0.5, 2, 10'000));
  RecoveredState recovered;
  recovered.snapshot = state;
  recovered.reservations["w"] = state.tenants(0).granted_total() + 15;
  ASSERT_TRUE(core_->Restore(recovered).ok());
  EXPECT_DOUBLE_EQ(Status().tokens(), 5);
  // Counted from the restart: still counted a window after it, gone after a window and a lease.
  clock_.Advance(absl::Seconds(10));
  EXPECT_DOUBLE_EQ(Status().tokens(), 5);
  clock_.Advance(absl::Milliseconds(1700));  // a slot's end + ttl + the lease in slots (1.25 s)
  EXPECT_DOUBLE_EQ(Status().tokens(), 20);
}

TEST_F(WindowPolicyTest, ATakeoverCountsTheLastOwnersGrantsAsGrantedNow) {
  MakeCore(Windowed(0.5, 2, 10'000));
  Client a{.id = "a"};
  EXPECT_EQ(Sync(a, 6).granted(), 6u);
  std::vector<v1::TenantState> states =
      core_->ExportTenants([](absl::string_view) { return true; });
  ASSERT_EQ(states.size(), 1u);
  states[0].set_grant_limit(states[0].granted_total() + 4);
  MakeCore(Windowed(0.5, 2, 10'000));
  clock_.Advance(absl::Seconds(30));  // long after: still counted from the takeover
  core_->AdoptTenants(states, clock_.Now());
  EXPECT_DOUBLE_EQ(Status().tokens(), 10);
}

// A simulated fleet against the core: every window of ttl ending at a retry holds at most
// floor * ttl + ratio * requests reported in it of tokens spent (spending at random times
// within each lease; held tokens carried across Syncs; returns at lease expiry).
TEST_F(WindowPolicyTest, AFleetSpendsWithinTheWindowedBound) {
  const double ratio = 0.3;
  const double floor_per_second = 20;
  const int64_t ttl_ms = 2000;
  MakeCore(Windowed(ratio, floor_per_second, ttl_ms));
  const absl::Time start = clock_.Now();
  std::mt19937_64 rng(7);
  std::vector<Client> fleet(5);
  for (size_t i = 0; i < fleet.size(); ++i) fleet[i].id = "i" + std::to_string(i);
  std::vector<int64_t> requests;  // ms since start, one per request reported
  std::vector<int64_t> spends;
  std::vector<uint64_t> reported(fleet.size(), 0);
  for (int64_t ms = 0; ms < 20'000; ms += 10) {
    clock_.Set(start + absl::Milliseconds(ms));
    const bool busy = (ms / 4000) % 2 == 0;
    for (size_t i = 0; i < fleet.size(); ++i) {
      Client& c = fleet[i];
      if (busy) c.requests += rng() % 8;
      // Half the instances spend as they go; the others hoard, carrying their tokens across
      // Syncs, and spend them all at once now and then.
      const bool hoards = i % 2 == 1;
      if (clock_.Now() < c.lease_ends && c.held > 0 && rng() % (hoards ? 400 : 8) == 0) {
        const uint64_t n = hoards ? c.held : 1 + rng() % c.held;
        for (uint64_t k = 0; k < n; ++k) spends.push_back(ms);
        c.spent += n;
        c.held -= n;
      }
      ReturnIfExpired(c);
      if (rng() % 10 == 0) {
        // Requests count from the Sync that reports them (the server's receipt).
        for (uint64_t k = reported[i]; k < c.requests; ++k) requests.push_back(ms);
        reported[i] = c.requests;
        Sync(c, 20);
      }
    }
  }
  std::sort(spends.begin(), spends.end());
  std::sort(requests.begin(), requests.end());
  uint64_t total = 0;
  // Every window ending at a retry (the bound's form: DESIGN.md, window_ledger.h).
  for (const int64_t t : spends) {
    auto in = [&](const std::vector<int64_t>& v) {
      return static_cast<double>(std::upper_bound(v.begin(), v.end(), t) -
                                 std::upper_bound(v.begin(), v.end(), t - ttl_ms));
    };
    const double bound = floor_per_second * ttl_ms / 1000.0 + ratio * in(requests);
    ASSERT_LE(in(spends), bound + 1e-6) << "window ending at " << t << " ms";
  }
  total = spends.size();
  EXPECT_GT(total, 100u) << "the fleet spent almost nothing: the check proves little";
}

}  // namespace
}  // namespace retrybudget
