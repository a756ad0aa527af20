#include "server/budget_core.h"

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "retrybudget/mutex.h"
#include "server/replay_cache.h"
#include "server/tenant_router.h"
#include "gtest/gtest.h"

namespace retrybudget {
namespace {

using ::testing::HasSubstr;

// Cumulative counters of one tenant as a client would send them.
struct Counters {
  uint64_t successes = 0;
  uint64_t spent = 0;
  uint64_t denied = 0;
  uint64_t returned = 0;
  uint64_t received = 0;
  uint64_t want = 0;
  uint64_t fallback = 0;
  uint64_t credited_locally = 0;
};

v1::TenantSync Entry(const std::string& tenant, const Counters& c) {
  v1::TenantSync t;
  t.set_tenant(tenant);
  t.set_successes(c.successes);
  t.set_retries_spent(c.spent);
  t.set_retries_denied(c.denied);
  t.set_tokens_returned(c.returned);
  t.set_tokens_received(c.received);
  t.set_want(c.want);
  t.set_fallback_spent(c.fallback);
  t.set_successes_credited_locally(c.credited_locally);
  return t;
}

v1::SyncRequest Request(const std::string& instance, uint64_t seq, const std::string& tenant,
                        const Counters& c) {
  v1::SyncRequest r;
  r.set_instance_id(instance);
  r.set_seq(seq);
  *r.add_tenants() = Entry(tenant, c);
  return r;
}

class BudgetCoreTest : public ::testing::Test {
 protected:
  // A budget of `capacity` tokens, full at start, refilling `refill`/s, crediting `credit`.
  void MakeCore(double capacity, double refill, double credit, double initial = -1,
                CoreOptions options = {}) {
    v1::BudgetPolicy* p = options.policy.mutable_default_policy();
    p->set_capacity(capacity);
    p->set_refill_per_second(refill);
    p->set_success_credit(credit);
    if (initial >= 0) p->set_initial_tokens(initial);
    p->set_lease_ttl_ms(5000);
    options.clock = &clock_;
    auto core = BudgetCore::Create(std::move(options));
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
  }

  // A strict server whose only listed tenant is "known" (capacity 10).
  void MakeStrictCoreListingKnown() {
    CoreOptions options;
    options.policy.set_strict(true);
    auto* listed = options.policy.add_tenants();
    listed->set_tenant("known");
    listed->mutable_policy()->set_capacity(10);
    MakeCore(100, 0, 0, -1, options);
  }

  v1::TenantGrant SyncOne(const std::string& instance, uint64_t seq, const Counters& c,
                          const std::string& tenant = "t") {
    auto r = core_->Sync(Request(instance, seq, tenant, c));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->tenants_size() != 1) return v1::TenantGrant();
    return r->tenants(0);
  }

  double Tokens(const std::string& tenant = "t") {
    auto s = core_->GetBudget(tenant);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->tokens() : -1;
  }

  v1::BudgetStatus Status(const std::string& tenant = "t") { return *core_->GetBudget(tenant); }

  FakeClock clock_;
  std::unique_ptr<BudgetCore> core_;
};

TEST_F(BudgetCoreTest, FirstSyncGrantsWhatIsWantedFromAFullBucket) {
  MakeCore(100, 1, 0.1);
  auto g = SyncOne("a", 1, {.want = 10});
  EXPECT_EQ(g.granted(), 10u);
  EXPECT_EQ(g.lease_ttl_ms(), 5000);
  EXPECT_DOUBLE_EQ(Tokens(), 90);
  EXPECT_FALSE(g.has_error());
}

TEST_F(BudgetCoreTest, GrantsOnlyWholeTokensAndNeverBelowZero) {
  MakeCore(10, 0, 0, 3.5);
  EXPECT_EQ(SyncOne("a", 1, {.want = 10}).granted(), 3u);
  EXPECT_NEAR(Tokens(), 0.5, 1e-9);
  EXPECT_EQ(SyncOne("a", 2, {.received = 3, .want = 10}).granted(), 0u);
  EXPECT_GE(Tokens(), 0);
}

TEST_F(BudgetCoreTest, RefillFollowsTheClock) {
  MakeCore(100, 2, 0, 0);
  EXPECT_EQ(SyncOne("a", 1, {.want = 50}).granted(), 0u);
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(SyncOne("a", 2, {.want = 50}).granted(), 6u);
  clock_.Advance(absl::Hours(1));
  EXPECT_DOUBLE_EQ(Tokens(), 100);  // capped
}

TEST_F(BudgetCoreTest, SuccessesEarnTheirCredit) {
  MakeCore(100, 0, 0.1, 0);
  SyncOne("a", 1, {});  // the baseline
  SyncOne("a", 2, {.successes = 50});
  EXPECT_NEAR(Tokens(), 5, 1e-9);
  SyncOne("a", 3, {.successes = 70});  // cumulative: 20 new
  EXPECT_NEAR(Tokens(), 7, 1e-9);
  EXPECT_EQ(Status().successes_total(), 70u);
}

TEST_F(BudgetCoreTest, SuccessesCreditedByTheClientsFallbackBucketAreNotCreditedAgain) {
  MakeCore(100, 0, 0.5, 0);
  SyncOne("a", 1, {});  // the baseline
  // 30 successes, 10 of which the client's fallback bucket already credited: 20 earn credit.
  SyncOne("a", 2, {.successes = 30, .credited_locally = 10});
  EXPECT_NEAR(Tokens(), 10, 1e-9);
  EXPECT_EQ(Status().successes_total(), 30u);  // every success is still counted
  // Cumulative: 10 more successes, all credited locally, earn nothing here.
  SyncOne("a", 3, {.successes = 40, .credited_locally = 20});
  EXPECT_NEAR(Tokens(), 10, 1e-9);
  // A replay of the earlier request changes nothing; a later one with fewer credited locally
  // than before is refused (cumulative counters never go back).
  auto replay = core_->Sync(Request("a", 2, "t", {.successes = 30, .credited_locally = 10}));
  ASSERT_TRUE(replay.ok());
  EXPECT_TRUE(replay->stale());
  auto back = core_->Sync(Request("a", 4, "t", {.successes = 50, .credited_locally = 0}));
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(std::string(back.status().message()),
              HasSubstr("tenants[0].successes_credited_locally = 0"));
  EXPECT_NEAR(Tokens(), 10, 1e-9);
  SyncOne("a", 4, {.successes = 50, .credited_locally = 20});
  EXPECT_NEAR(Tokens(), 15, 1e-9);
}

TEST_F(BudgetCoreTest, MoreSuccessesCreditedLocallyThanSuccessesIsRefusedNamingBoth) {
  MakeCore(100, 0, 0.5, 0);
  SyncOne("a", 1, {});
  auto r = core_->Sync(Request("a", 2, "t", {.successes = 3, .credited_locally = 4}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("successes_credited_locally = 4 exceeds successes = 3"));
  EXPECT_NEAR(Tokens(), 0, 1e-9);
}

TEST_F(BudgetCoreTest, TheSafeShareCarriesTheUndividedSuccessCredit) {
  MakeCore(100, 10, 0.25);
  SyncOne("a", 1, {.want = 1});
  const v1::TenantGrant g = SyncOne("b", 1, {.want = 1});
  EXPECT_DOUBLE_EQ(g.safe_share().capacity(), 50);
  EXPECT_DOUBLE_EQ(g.safe_share().refill_per_second(), 5);
  EXPECT_DOUBLE_EQ(g.safe_share().success_credit(), 0.25);
}

TEST_F(BudgetCoreTest, DuplicateRequestGetsTheSameResponseAndChangesNothing) {
  MakeCore(100, 0, 0.1);
  SyncOne("a", 1, {});  // the baseline
  auto req = Request("a", 2, "t", {.successes = 10, .want = 20});
  auto first = core_->Sync(req);
  ASSERT_TRUE(first.ok());
  const double after_first = Tokens();
  auto again = core_->Sync(req);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->SerializeAsString(), first->SerializeAsString());
  EXPECT_DOUBLE_EQ(Tokens(), after_first);
  EXPECT_EQ(Status().granted_total(), 20u);
  EXPECT_EQ(Status().successes_total(), 10u);
}

TEST_F(BudgetCoreTest, SameSeqWithDifferentContentIsRefused) {
  MakeCore(100, 0, 0.1);
  SyncOne("a", 1, {.want = 5});
  auto r = core_->Sync(Request("a", 1, "t", {.successes = 99, .want = 5}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("seq = 1"));
  EXPECT_DOUBLE_EQ(Tokens(), 95);
}

TEST_F(BudgetCoreTest, StaleSeqIsIgnored) {
  MakeCore(100, 0, 0.1);
  SyncOne("a", 1, {.want = 5});
  SyncOne("a", 3, {.successes = 10, .received = 5, .want = 5});
  const double level = Tokens();
  // A delayed request from before seq 3: must not undo or redo anything.
  auto r = core_->Sync(Request("a", 2, "t", {.successes = 5, .received = 5, .want = 50}));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->stale());
  EXPECT_EQ(r->tenants_size(), 0);
  EXPECT_DOUBLE_EQ(Tokens(), level);
  EXPECT_EQ(Status().successes_total(), 10u);
}

TEST_F(BudgetCoreTest, LostResponseIsReclaimedOnTheNextSeq) {
  MakeCore(100, 0, 0);
  EXPECT_EQ(SyncOne("a", 1, {.want = 10}).granted(), 10u);  // response lost
  EXPECT_DOUBLE_EQ(Tokens(), 90);
  // The client never received those 10: its tokens_received is still 0.
  auto g = SyncOne("a", 2, {.received = 0, .want = 0});
  EXPECT_EQ(g.granted(), 0u);
  EXPECT_DOUBLE_EQ(Tokens(), 100);
  EXPECT_EQ(Status().reclaimed_total(), 10u);
  // And it is not reclaimed twice.
  SyncOne("a", 3, {.received = 0, .want = 0});
  EXPECT_DOUBLE_EQ(Tokens(), 100);
}

TEST_F(BudgetCoreTest, PartiallyReceivedGrantsReclaimOnlyTheMissingPart) {
  MakeCore(100, 0, 0);
  SyncOne("a", 1, {.want = 10});                             // received
  SyncOne("a", 2, {.received = 10, .want = 7});              // lost
  SyncOne("a", 3, {.spent = 4, .received = 10, .want = 0});  // reports 10 received, not 17
  EXPECT_DOUBLE_EQ(Tokens(), 90);
  EXPECT_EQ(Status().reclaimed_total(), 7u);
}

TEST_F(BudgetCoreTest, UnknownInstanceIsABaselineAndItsEarlierTokensCreditNothing) {
  MakeCore(100, 0, 0.1, 50);
  // The server has never seen "ghost" but it is at seq 40: its history is unknown.
  auto g = SyncOne("ghost", 40, {.successes = 1000, .spent = 10, .returned = 15, .received = 30});
  EXPECT_DOUBLE_EQ(Tokens(), 50);  // nothing credited
  EXPECT_EQ(g.granted(), 0u);
  EXPECT_EQ(Status().leased_tokens(), 0);  // its 5 held tokens were not granted here
  // From then on only differences count, and returns only up to what this server granted it
  // (nothing): the 5 returned tokens came from elsewhere.
  SyncOne("ghost", 41, {.successes = 1010, .spent = 10, .returned = 20, .received = 30});
  EXPECT_NEAR(Tokens(), 50 + 1, 1e-9);
  EXPECT_EQ(Status().returned_total(), 5u);
  EXPECT_EQ(Status().uncredited_total(), 5u);
}

TEST_F(BudgetCoreTest, FirstContactIsABaselineEvenAtSeqOne) {
  MakeCore(100, 0, 0.1, 0);
  SyncOne("a", 1, {.successes = 30});
  EXPECT_NEAR(Tokens(), 0, 1e-9);
  // A tenant a known instance reports for the first time is a baseline too.
  SyncOne("a", 2, {.successes = 40}, "u");
  EXPECT_NEAR(Tokens("u"), 0, 1e-9);
  SyncOne("a", 3, {.successes = 50}, "u");
  EXPECT_NEAR(Tokens("u"), 1, 1e-9);
  SyncOne("a", 4, {.successes = 40});
  EXPECT_NEAR(Tokens(), 1, 1e-9);
}

TEST_F(BudgetCoreTest, CountersGoingBackwardsAreRefusedAndChangeNothing) {
  MakeCore(100, 0, 0.1);
  SyncOne("a", 1, {.successes = 10, .want = 10});
  const v1::BudgetStatus before = Status();
  auto r = core_->Sync(Request("a", 2, "t", {.successes = 9, .received = 10, .want = 10}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("tenants[0].successes = 9"));
  EXPECT_EQ(Status().SerializeAsString(), before.SerializeAsString());
  // The instance's seq did not move either: seq 2 is still usable.
  EXPECT_EQ(SyncOne("a", 2, {.successes = 10, .received = 10, .want = 1}).granted(), 1u);
}

TEST_F(BudgetCoreTest, OneBadTenantRefusesTheWholeRequest) {
  MakeCore(100, 0, 0.1);
  SyncOne("a", 1, {.successes = 10}, "u");
  v1::SyncRequest r = Request("a", 2, "t", {.want = 10});
  *r.add_tenants() = Entry("u", {.successes = 1});
  auto resp = core_->Sync(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr("tenants[1].successes = 1"));
  EXPECT_FALSE(core_->GetBudget("t").ok());  // "t" was not even created
}

TEST_F(BudgetCoreTest, ClaimingMoreReceivedThanGrantedIsRefused) {
  MakeCore(100, 0, 0.1);
  SyncOne("a", 1, {.want = 5});
  auto r = core_->Sync(Request("a", 2, "t", {.received = 6}));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("tokens_received = 6"));
  EXPECT_DOUBLE_EQ(Tokens(), 95);
}

TEST_F(BudgetCoreTest, ReturningMoreThanReceivedIsRefused) {
  MakeCore(100, 0, 0.1);
  auto r = core_->Sync(Request("a", 1, "t", {.spent = 3, .returned = 8, .received = 10}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("tokens_returned (8)"));
  EXPECT_EQ(core_->tenant_count(), 0u);
  EXPECT_EQ(core_->instance_count(), 0u);
}

TEST_F(BudgetCoreTest, ReturnedTokensGoBackIntoTheBucket) {
  MakeCore(100, 0, 0);
  SyncOne("a", 1, {.want = 30});
  EXPECT_DOUBLE_EQ(Tokens(), 70);
  SyncOne("a", 2, {.spent = 10, .returned = 20, .received = 30});
  EXPECT_DOUBLE_EQ(Tokens(), 90);
  EXPECT_EQ(Status().returned_total(), 20u);
  EXPECT_EQ(Status().retries_total(), 10u);
}

// The capacity bounds what the fleet can spend at once: tokens leased out still count against it,
// so a bucket whose tokens are all held by clients does not refill behind their backs.
TEST_F(BudgetCoreTest, LeasedTokensCountAgainstTheCapacity) {
  MakeCore(10, 1, 0);
  EXPECT_EQ(SyncOne("a", 1, {.want = 10}).granted(), 10u);
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(SyncOne("b", 1, {.want = 5}).granted(), 0u);  // a holds the whole capacity
  EXPECT_DOUBLE_EQ(Tokens(), 0);
  EXPECT_DOUBLE_EQ(Status().leased_tokens(), 10);
  // a reports 4 spent and wants nothing: it holds 6, so the bucket may refill up to 4.
  EXPECT_EQ(SyncOne("a", 2, {.spent = 4, .received = 10}).granted(), 0u);
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(SyncOne("b", 2, {.want = 5}).granted(), 2u);  // refilled 2 of the 4
  clock_.Advance(absl::Seconds(2));
  EXPECT_DOUBLE_EQ(Tokens(), 2);  // a holds 6, b holds 2: room for 2 more, and 2 refilled
  clock_.Advance(absl::Seconds(60));
  // Both leases expired (TTL 5 s): what they held can no longer be spent.
  EXPECT_DOUBLE_EQ(Tokens(), 10);
  EXPECT_DOUBLE_EQ(Status().leased_tokens(), 0);
  EXPECT_EQ(Status().active_instances(), 0u);
}

TEST_F(BudgetCoreTest, ReturnedAndLostTokensMakeRoomForThemselves) {
  MakeCore(10, 0, 0);
  EXPECT_EQ(SyncOne("a", 1, {.want = 10}).granted(), 10u);
  SyncOne("a", 2, {.returned = 10, .received = 10});
  EXPECT_DOUBLE_EQ(Tokens(), 10);
  EXPECT_EQ(SyncOne("b", 1, {.want = 10}).granted(), 10u);
  SyncOne("b", 2, {.received = 0});  // the grant never arrived
  EXPECT_DOUBLE_EQ(Tokens(), 10);
  EXPECT_EQ(Status().reclaimed_total(), 10u);
}

TEST_F(BudgetCoreTest, SuccessCreditBeyondWhatTheFleetHoldsIsDiscarded) {
  MakeCore(10, 0, 1, 0);  // starts empty, 1 token per success
  SyncOne("a", 1, {});  // the baseline
  SyncOne("a", 2, {.successes = 8, .want = 0});
  EXPECT_DOUBLE_EQ(Tokens(), 8);
  EXPECT_EQ(SyncOne("a", 3, {.successes = 8, .want = 8}).granted(), 8u);
  SyncOne("a", 4, {.successes = 18, .received = 8});  // 10 credit, but a holds 8
  EXPECT_DOUBLE_EQ(Tokens(), 2);
}

// A fleet of clients that spend, return and lose grants at random. The server's count of leased
// tokens never falls short of what the clients that keep tokens really hold (they got what they
// wanted and spent less than they hold since their last report; the others pass their tokens
// through and are not counted, see DESIGN.md), refill never grows the bucket past the capacity
// less that count, and what the fleet spent never passes the budget's bound (DESIGN.md "The
// invariant").
TEST_F(BudgetCoreTest, RefillStopsAtTheCapacityLessWhatTheFleetKeeps) {
  constexpr double kCapacity = 20, kRefill = 5, kCredit = 0.5;
  const absl::Duration kTtl = absl::Seconds(5);  // MakeCore's lease TTL
  MakeCore(kCapacity, kRefill, kCredit);
  struct Client {
    std::string id;
    uint64_t seq = 0;
    Counters c;
    uint64_t held = 0;
    bool keeps = false;
    absl::Time last_sync = absl::InfinitePast();
  };
  std::vector<Client> fleet(6);
  for (size_t i = 0; i < fleet.size(); ++i) fleet[i].id = "i" + std::to_string(i);
  std::mt19937 rng(42);
  uint64_t spent = 0, successes = 0;
  int refill_grew = 0;
  // The budget exists from the first Sync on (a full bucket).
  ASSERT_TRUE(core_->Sync(Request(fleet[0].id, ++fleet[0].seq, "t", fleet[0].c)).ok());
  fleet[0].last_sync = clock_.Now();
  double level = Tokens();
  const absl::Time start = clock_.Now();
  for (int step = 0; step < 3000 && !HasFailure(); ++step) {
    const absl::Duration tick = absl::Milliseconds(rng() % 200);
    clock_.Advance(tick);
    for (Client& f : fleet) {  // a lease ends at send time + TTL; the rest goes back
      if (clock_.Now() - f.last_sync >= kTtl) {
        f.c.returned += f.held;
        f.held = 0;
        f.keeps = false;
      }
    }
    const v1::BudgetStatus refilled = Status();
    if (refilled.tokens() > level + 1e-9) {
      ++refill_grew;
      ASSERT_LE(refilled.tokens() + refilled.leased_tokens(), kCapacity + 1e-9)
          << "step " << step << ": refill grew the level from " << level;
    }
    Client& cl = fleet[rng() % fleet.size()];
    const uint64_t spend = std::min<uint64_t>(cl.held, rng() % 4);
    cl.held -= spend;
    cl.c.spent += spend;
    spent += spend;
    const uint64_t give_back = rng() % 8 == 0 ? cl.held : 0;
    cl.held -= give_back;
    cl.c.returned += give_back;
    const uint64_t ok = rng() % 5;
    cl.c.successes += ok;
    successes += ok;
    cl.c.want = rng() % 12;
    auto r = core_->Sync(Request(cl.id, ++cl.seq, "t", cl.c));
    ASSERT_TRUE(r.ok()) << r.status();
    const uint64_t granted = r->tenants(0).granted();
    cl.keeps = granted >= cl.c.want && spend < cl.held + granted;
    cl.last_sync = clock_.Now();
    if (rng() % 10 != 0) {  // 1 in 10 responses is lost
      cl.c.received += granted;
      cl.held += granted;
    }
    uint64_t kept = 0;
    for (const Client& f : fleet) kept += f.keeps ? f.held : 0;
    const v1::BudgetStatus after = Status();
    ASSERT_GE(after.leased_tokens(), static_cast<double>(kept)) << "step " << step;
    level = after.tokens();
    ASSERT_LE(static_cast<double>(spent),
              kCapacity + kRefill * absl::ToDoubleSeconds(clock_.Now() - start) +
                  kCredit * static_cast<double>(successes) + 1e-9);
  }
  EXPECT_GT(spent, 0u);
  EXPECT_GT(refill_grew, 100);  // the rule was exercised
}

// An instance that spends at least what it holds between reports passes its tokens through: what
// it holds is not kept, and counting it would idle the refill.
TEST_F(BudgetCoreTest, AnInstanceThatSpendsWhatItHoldsDoesNotIdleTheRefill) {
  MakeCore(10, 10, 0);
  EXPECT_EQ(SyncOne("a", 1, {.want = 6}).granted(), 6u);
  clock_.Advance(absl::Milliseconds(600));
  EXPECT_DOUBLE_EQ(Tokens(), 4);  // a keeps 6: the refill stops at 10 - 6
  EXPECT_EQ(SyncOne("a", 2, {.spent = 6, .received = 6, .want = 4}).granted(), 4u);
  EXPECT_DOUBLE_EQ(Status().leased_tokens(), 0);  // spent 6 since its last report, holds 4
  clock_.Advance(absl::Seconds(1));
  EXPECT_DOUBLE_EQ(Tokens(), 10);
}

// Under contention the refill goes to the instances waiting for it: a starving instance's
// holdings do not keep the bucket from refilling.
TEST_F(BudgetCoreTest, AStarvingInstancesHoldingsDoNotIdleTheRefill) {
  MakeCore(10, 1, 0);
  EXPECT_EQ(SyncOne("a", 1, {.want = 30}).granted(), 10u);  // wanted 30: starving
  clock_.Advance(absl::Seconds(4));
  EXPECT_DOUBLE_EQ(Tokens(), 4);  // a's 10 do not hold the bucket at 0
}

TEST_F(BudgetCoreTest, ScarceTokensAreSharedInProportionToWants) {
  auto grant_of_first = [&](const std::string& first, uint64_t first_want,
                            uint64_t other_want) {
    MakeCore(100, 20, 0, 0);
    // Both register their wants while the bucket is empty.
    SyncOne(first, 1, {.want = first_want});
    SyncOne("other", 1, {.want = other_want});
    clock_.Advance(absl::Seconds(1));  // 20 tokens for wants of 40
    return SyncOne(first, 2, {.want = first_want}).granted();
  };
  EXPECT_EQ(grant_of_first("big", 30, 10), 15u);
  EXPECT_EQ(grant_of_first("small", 10, 30), 5u);
}

TEST_F(BudgetCoreTest, EveryActiveInstanceGetsAtLeastOneTokenWhileAnyIsLeft) {
  MakeCore(100, 3, 0, 0);
  SyncOne("big", 1, {.want = 1000});
  clock_.Advance(absl::Seconds(1));  // 3 tokens; "small" is owed 3 * 1/1001 of them
  EXPECT_EQ(SyncOne("small", 1, {.want = 1}).granted(), 1u);
}

TEST_F(BudgetCoreTest, InstancesSilentForALeaseTtlLeaveTheShare) {
  MakeCore(100, 10, 0, 0);
  SyncOne("gone", 1, {.want = 90});
  SyncOne("here", 1, {.want = 10});
  clock_.Advance(absl::Seconds(6));  // > lease TTL of 5 s: "gone" is no longer active
  auto g = SyncOne("here", 2, {.want = 10});
  EXPECT_EQ(g.granted(), 10u);
  EXPECT_EQ(g.active_instances(), 1u);
}

TEST_F(BudgetCoreTest, SafeShareSplitsCapacityAndRefillAmongActiveInstances) {
  MakeCore(100, 8, 0);
  SyncOne("a", 1, {.want = 1});
  auto g = SyncOne("b", 1, {.want = 1});
  EXPECT_EQ(g.active_instances(), 2u);
  EXPECT_DOUBLE_EQ(g.safe_share().capacity(), 50);
  EXPECT_DOUBLE_EQ(g.safe_share().refill_per_second(), 4);
}

// After a hang longer than the lease TTL every instance is swept, and they rejoin one by one.
// The first to come back must not be handed the whole budget as its fallback share: if the
// server goes away again, the whole fleet falls back at once.
TEST_F(BudgetCoreTest, SafeShareDividesAmongTheLargestFleetOfTheLastMinute) {
  MakeCore(100, 8, 0);
  for (const char* id : {"a", "b", "c", "d"}) SyncOne(id, 1, {.want = 1});
  clock_.Advance(absl::Seconds(8));  // the server hung; leases (5 s) expired meanwhile
  auto g = SyncOne("a", 2, {.received = 1, .want = 1});
  EXPECT_EQ(g.active_instances(), 1u);
  EXPECT_DOUBLE_EQ(g.safe_share().capacity(), 25);
  EXPECT_DOUBLE_EQ(g.safe_share().refill_per_second(), 2);
  // A fleet that really shrank gets its larger shares once the old size is out of memory:
  // after at most two minutes of "a" alone.
  uint64_t seq = 3;
  for (int i = 0; i < 30; ++i) {
    clock_.Advance(absl::Seconds(4));
    g = SyncOne("a", seq, {.received = seq - 1, .want = 1});
    ++seq;
  }
  EXPECT_DOUBLE_EQ(g.safe_share().capacity(), 100);
  EXPECT_DOUBLE_EQ(g.safe_share().refill_per_second(), 8);
}

// A tenant's active set (with its largest recent fleet and credit rate) is let go once nothing
// is active and no fleet is remembered, so that idle tenants cost less memory. Letting it go
// must change nothing a client sees: the tokens the fleet held come back to the bucket as
// their leases end, and the next instance is treated as by a tenant that never had a fleet.
TEST_F(BudgetCoreTest, AnIdleTenantsLetGoActiveSetLeavesNothingBehind) {
  MakeCore(100, 0, 1);
  uint64_t granted = 0;
  for (const char* id : {"a", "b", "c", "d"}) granted += SyncOne(id, 1, {.want = 5}).granted();
  EXPECT_EQ(granted, 20u);
  EXPECT_EQ(Status().active_instances(), 4u);
  EXPECT_DOUBLE_EQ(Status().leased_tokens(), 20);
  // Leases end after 5 s; the fleet of four is remembered for a minute or two after.
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(Status().active_instances(), 0u);
  EXPECT_DOUBLE_EQ(Status().leased_tokens(), 0);
  auto g = SyncOne("e", 1, {.want = 1});
  EXPECT_DOUBLE_EQ(g.safe_share().capacity(), 25);  // 100 among the four remembered
  clock_.Advance(absl::Minutes(3));
  EXPECT_EQ(Status().active_instances(), 0u);  // swept, and the set let go
  EXPECT_DOUBLE_EQ(Status().leased_tokens(), 0);
  EXPECT_DOUBLE_EQ(Tokens(), 79);  // no refill: 100 - 20 - 1 granted, nothing given back
  // "a" reports its 5 tokens returned: credited back (its ledger is kept by the instance).
  g = SyncOne("a", 2, {.returned = 5, .received = 5, .want = 1});
  EXPECT_EQ(g.active_instances(), 1u);
  EXPECT_DOUBLE_EQ(g.safe_share().capacity(), 100);  // a fleet of one, as for a new tenant
  EXPECT_DOUBLE_EQ(Tokens(), 83);                      // 79 + 5 returned - 1 granted
  EXPECT_EQ(Status().active_instances(), 1u);
  EXPECT_DOUBLE_EQ(Status().leased_tokens(), 1);
}

TEST_F(BudgetCoreTest, ADryBucketAsksTheClientToComeBackLater) {
  MakeCore(100, 4, 0, 0);
  auto g = SyncOne("a", 1, {.want = 1});
  EXPECT_EQ(g.granted(), 0u);
  EXPECT_EQ(g.next_sync_ms(), 250);  // one token at 4/s, capped at 250 ms
  MakeCore(100, 1000, 0, 0);
  g = SyncOne("a", 1, {.want = 1});
  EXPECT_EQ(g.next_sync_ms(), 10);  // one token in 1 ms, raised to the 10 ms floor
}

TEST_F(BudgetCoreTest, FinalRequestReturnsEverythingOnceAndForgetsTheInstance) {
  MakeCore(100, 0, 0);
  SyncOne("a", 1, {.want = 40});
  v1::SyncRequest final_req = Request("a", 2, "t", {.spent = 10, .returned = 30, .received = 40});
  final_req.set_final(true);
  ASSERT_TRUE(core_->Sync(final_req).ok());
  EXPECT_DOUBLE_EQ(Tokens(), 90);
  EXPECT_EQ(core_->instance_count(), 0u);
  EXPECT_EQ(Status().active_instances(), 0u);
  // A retry of the final request after the server forgot the instance credits nothing again.
  ASSERT_TRUE(core_->Sync(final_req).ok());
  EXPECT_DOUBLE_EQ(Tokens(), 90);
}

TEST_F(BudgetCoreTest, StrictServerRefusesUnknownTenantsOneByOne) {
  MakeStrictCoreListingKnown();
  v1::SyncRequest r = Request("a", 1, "known", {.want = 3});
  *r.add_tenants() = Entry("unknown", {.want = 3});
  auto resp = core_->Sync(r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->tenants(0).granted(), 3u);
  EXPECT_EQ(resp->tenants(0).capacity(), 10);
  EXPECT_EQ(resp->tenants(1).error().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(resp->tenants(1).error().message(), HasSubstr("\"unknown\""));
  EXPECT_EQ(resp->tenants(1).granted(), 0u);
  EXPECT_FALSE(core_->GetBudget("unknown").ok());
}

TEST_F(BudgetCoreTest, TenantLimitRefusesNewTenantsWithResourceExhausted) {
  CoreOptions options;
  options.max_tenants = 2;
  MakeCore(100, 0, 0, -1, options);
  SyncOne("a", 1, {.want = 1}, "t1");
  SyncOne("a", 2, {.want = 1}, "t2");
  auto g = SyncOne("a", 3, {.want = 1}, "t3");
  EXPECT_EQ(g.error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(core_->tenant_count(), 2u);
}

TEST_F(BudgetCoreTest, ForgottenInstancesComeBackAsABaseline) {
  CoreOptions options;
  options.max_instances = 2;
  MakeCore(100, 0, 0.1, 0, options);
  SyncOne("old", 1, {});
  clock_.Advance(absl::Seconds(1));
  SyncOne("b", 1, {});
  clock_.Advance(absl::Seconds(1));
  SyncOne("c", 1, {});  // evicts "old", the least recently seen
  EXPECT_EQ(core_->instance_count(), 2u);
  SyncOne("old", 2, {.successes = 1000});
  EXPECT_DOUBLE_EQ(Tokens(), 0);  // the forgotten history earns nothing
}

// An evicted instance's lease still runs on its client: what it holds counts against the
// capacity until its lease TTL is over. Also when a new instance takes its place in memory: a
// freed record is reused at once by the allocator (glibc's per-thread cache), so the tenant's
// active set must not know its instances by their address.
TEST_F(BudgetCoreTest, AnEvictedInstancesHoldingsCountUntilItsLeaseEnds) {
  CoreOptions options;
  options.max_instances = 2;
  MakeCore(100, 10, 0, -1, options);  // lease TTL 5 s, 10 tokens/s
  EXPECT_EQ(SyncOne("holder", 1, {.want = 30}).granted(), 30u);
  EXPECT_EQ(Status().leased_tokens(), 30);
  clock_.Advance(absl::Seconds(1));
  SyncOne("b", 1, {});
  clock_.Advance(absl::Seconds(1));
  SyncOne("c", 1, {});  // evicts "holder", the least recently seen
  SyncOne("d", 1, {});  // evicts "b"; its record may be where "holder"'s was
  SyncOne("e", 1, {});  // and again
  EXPECT_EQ(core_->instance_count(), 2u);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Status().leased_tokens(), 30);
  EXPECT_DOUBLE_EQ(Tokens(), 70);  // 3 s of refill had no room: the bucket and the lease are 100
  // Its lease is over 5 s after its last Sync: from then on the room is the bucket's again.
  clock_.Advance(absl::Seconds(2) + absl::Milliseconds(200));
  EXPECT_EQ(Status().leased_tokens(), 0);
  EXPECT_GT(Tokens(), 70);
}

// With the longest lease TTL a policy allows (600 s) the active set's slices span a 128th of it
// (4.6875 s): a holding counts for the whole TTL after its last report, however many reports of
// others came between, and for at most a slice's span more.
TEST_F(BudgetCoreTest, ALongLeasesHoldingsCountForItsWholeTtlAndAtMostASliceMore) {
  MakeCore(100, 10, 0);
  v1::BudgetPolicy policy;
  policy.set_capacity(100);
  policy.set_refill_per_second(10);
  policy.set_lease_ttl_ms(600'000);
  ASSERT_TRUE(core_->PutPolicy("t", policy).ok());
  EXPECT_EQ(SyncOne("holder", 1, {.want = 30}).granted(), 30u);
  uint64_t seq = 0;
  for (int second = 1; second < 600; ++second) {
    clock_.Advance(absl::Seconds(1));
    if (second % 7 == 0) SyncOne("other", ++seq, {});
  }
  clock_.Advance(absl::Milliseconds(990));  // 599.99 s after the holder's report
  EXPECT_EQ(Status().leased_tokens(), 30);
  EXPECT_DOUBLE_EQ(Tokens(), 70);  // ten minutes of refill had no room
  EXPECT_EQ(Status().active_instances(), 2u);
  clock_.Advance(absl::Milliseconds(10) + absl::Microseconds(4'687'500) + absl::Milliseconds(1));
  EXPECT_EQ(Status().leased_tokens(), 0);
  EXPECT_GT(Tokens(), 70);
  EXPECT_EQ(Status().active_instances(), 1u);
}

struct BadRequestCase {
  const char* name;
  std::function<void(v1::SyncRequest&)> mutate;
  const char* expected;
};

class BadSyncRequestTest : public BudgetCoreTest,
                           public ::testing::WithParamInterface<BadRequestCase> {};

TEST_P(BadSyncRequestTest, IsRefusedWithInvalidArgumentNamingTheFieldAndChangesNothing) {
  MakeCore(100, 1, 0.1);
  SyncOne("a", 1, {.successes = 5, .want = 10});
  const std::string before = Status().SerializeAsString();
  v1::SyncRequest r = Request("a", 2, "t", {.successes = 6, .received = 10, .want = 1});
  GetParam().mutate(r);
  auto resp = core_->Sync(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(resp.status().message()), HasSubstr(GetParam().expected));
  EXPECT_EQ(Status().SerializeAsString(), before);
  EXPECT_EQ(core_->tenant_count(), 1u);
  EXPECT_EQ(core_->instance_count(), 1u);
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadSyncRequestTest,
    ::testing::Values(
        BadRequestCase{"EmptyTenant", [](auto& r) { r.mutable_tenants(0)->set_tenant(""); },
                       "tenants[0].tenant is empty"},
        BadRequestCase{"LongTenant",
                       [](auto& r) { r.mutable_tenants(0)->set_tenant(std::string(129, 'x')); },
                       "has 129 characters"},
        BadRequestCase{"BadCharacter",
                       [](auto& r) { r.mutable_tenants(0)->set_tenant("a b"); },
                       "tenants[0].tenant \"a b\" has character 0x20"},
        BadRequestCase{"TooManyTenants",
                       [](auto& r) {
                         for (int i = 0; i < 300; ++i) {
                           *r.add_tenants() = Entry("x" + std::to_string(i), {});
                         }
                       },
                       "tenants has 301 entries"},
        BadRequestCase{"DuplicateTenant",
                       [](auto& r) { *r.add_tenants() = r.tenants(0); },
                       "appears more than once"},
        BadRequestCase{"AbsurdWant",
                       [](auto& r) { r.mutable_tenants(0)->set_want(1'000'000'000'000); },
                       "tenants[0].want = 1000000000000"},
        BadRequestCase{"SeqZero", [](auto& r) { r.set_seq(0); }, "seq = 0"},
        BadRequestCase{"EmptyInstance", [](auto& r) { r.set_instance_id(""); },
                       "instance_id is empty"},
        BadRequestCase{"InstanceWithSpace", [](auto& r) { r.set_instance_id("a b"); },
                       "instance_id \"a b\" has character 0x20"},
        BadRequestCase{"FallbackOverSpent",
                       [](auto& r) { r.mutable_tenants(0)->set_fallback_spent(3); },
                       "fallback_spent = 3 exceeds retries_spent = 0"},
        BadRequestCase{"RefundedOverSpent",
                       [](auto& r) { r.mutable_tenants(0)->set_retries_refunded(2); },
                       "retries_refunded = 2 exceeds retries_spent = 0"},
        BadRequestCase{"FallbackRefundedOverFallbackSpent",
                       [](auto& r) {
                         r.mutable_tenants(0)->set_retries_spent(3);
                         r.mutable_tenants(0)->set_retries_refunded(3);
                         r.mutable_tenants(0)->set_fallback_refunded(1);
                       },
                       "fallback_refunded = 1 exceeds fallback_spent = 0"},
        BadRequestCase{"LeaseRefundsOverLeaseSpent",
                       [](auto& r) {
                         auto* t = r.mutable_tenants(0);
                         t->set_retries_spent(3);
                         t->set_fallback_spent(3);
                         t->set_retries_refunded(1);
                       },
                       "refunds of lease tokens (retries_refunded - fallback_refunded = 1) "
                       "exceed retries spent from leases (retries_spent - fallback_spent = 0)"},
        BadRequestCase{"Backwards",
                       [](auto& r) { r.mutable_tenants(0)->set_successes(4); },
                       "tenants[0].successes = 4"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(BudgetCoreTest, PutPolicyKeepsTheLevelCappedAtTheNewCapacity) {
  MakeCore(100, 0, 0);
  SyncOne("a", 1, {.want = 20});
  v1::BudgetPolicy p;
  p.set_capacity(50);
  p.set_refill_per_second(5);
  auto s = core_->PutPolicy("t", p);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(s->tokens(), 50);
  EXPECT_TRUE(s->explicit_policy());
  EXPECT_EQ(s->policy().refill_per_second(), 5);
}

TEST_F(BudgetCoreTest, PutPolicyRefusesAnInvalidPolicyAndKeepsTheOld) {
  MakeCore(100, 0, 0);
  SyncOne("a", 1, {.want = 20});
  v1::BudgetPolicy p;
  p.set_capacity(-5);
  auto s = core_->PutPolicy("t", p);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("policy.capacity = -5"));
  EXPECT_EQ(Status().policy().capacity(), 100);
}

TEST_F(BudgetCoreTest, AdminCallsOnMissingTenantsAreNotFound) {
  MakeCore(100, 0, 0);
  EXPECT_EQ(core_->GetBudget("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->DeleteBudget("nope").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->GetBudget("bad name").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BudgetCoreTest, ListBudgetsPagesInNameOrder) {
  MakeCore(100, 0, 0);
  for (const char* t : {"c", "a", "b"}) ASSERT_TRUE(core_->PutPolicy(t, {}).ok());
  v1::ListBudgetsRequest req;
  req.set_page_size(2);
  auto page1 = core_->ListBudgets(req);
  ASSERT_TRUE(page1.ok());
  ASSERT_EQ(page1->budgets_size(), 2);
  EXPECT_EQ(page1->budgets(0).tenant(), "a");
  EXPECT_EQ(page1->budgets(1).tenant(), "b");
  req.set_page_token(page1->next_page_token());
  auto page2 = core_->ListBudgets(req);
  ASSERT_EQ(page2->budgets_size(), 1);
  EXPECT_EQ(page2->budgets(0).tenant(), "c");
  EXPECT_TRUE(page2->next_page_token().empty());
}

TEST_F(BudgetCoreTest, PolicyReloadKeepsLevelsAndAdminPolicies) {
  MakeCore(100, 0, 0);
  SyncOne("a", 1, {.want = 30}, "auto");
  v1::BudgetPolicy admin;
  admin.set_capacity(7);
  ASSERT_TRUE(core_->PutPolicy("admin", admin).ok());
  v1::PolicyConfig next;
  next.mutable_default_policy()->set_capacity(200);
  ASSERT_TRUE(core_->ReplacePolicy(next).ok());
  EXPECT_DOUBLE_EQ(Tokens("auto"), 70);
  EXPECT_EQ(Status("auto").policy().capacity(), 200);
  EXPECT_EQ(Status("admin").policy().capacity(), 7);
  // An invalid reload changes nothing.
  next.mutable_default_policy()->set_capacity(-1);
  EXPECT_FALSE(core_->ReplacePolicy(next).ok());
  EXPECT_EQ(Status("auto").policy().capacity(), 200);
}

TEST_F(BudgetCoreTest, DeletedBudgetIsRecreatedOnNextUse) {
  MakeCore(10, 0, 0);
  SyncOne("a", 1, {.want = 10});
  ASSERT_TRUE(core_->DeleteBudget("t").ok());
  EXPECT_FALSE(core_->GetBudget("t").ok());
  // Instance "a" used the deleted budget last time: its next Sync must go to the new one.
  EXPECT_EQ(SyncOne("a", 2, {.received = 10, .want = 4}).granted(), 4u);
  EXPECT_EQ(Status().granted_total(), 4u);
  EXPECT_DOUBLE_EQ(Tokens(), 6);
  // And keeps using it.
  EXPECT_EQ(SyncOne("a", 3, {.received = 14, .want = 4}).granted(), 4u);
  EXPECT_EQ(Status().granted_total(), 8u);
}

TEST_F(BudgetCoreTest, DeletingOneTenantLeavesTheInstancesOtherTenantsAlone) {
  MakeCore(10, 0, 0);
  v1::SyncRequest r = Request("a", 1, "t", {.want = 3});
  *r.add_tenants() = Entry("u", {.want = 5});
  ASSERT_TRUE(core_->Sync(r).ok());
  ASSERT_TRUE(core_->DeleteBudget("t").ok());
  v1::SyncRequest next = Request("a", 2, "t", {.received = 3, .want = 3});
  *next.add_tenants() = Entry("u", {.received = 5, .want = 5});
  auto resp = core_->Sync(next);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->tenants(0).granted(), 3u);  // a new "t", full
  EXPECT_EQ(resp->tenants(1).granted(), 5u);  // the same "u": 10 - 5 - 5
  EXPECT_EQ(Status("t").granted_total(), 3u);
  EXPECT_EQ(Status("u").granted_total(), 10u);
  EXPECT_DOUBLE_EQ(Tokens("u"), 0);
}

// Sync finds each entry's record once, to check its counters, and applies the entry to the same
// record, unless an earlier entry of the request added a record meanwhile (the instance's map
// of records may then have moved them). Here 40 new tenants come before three known ones: the
// known ones are still applied as known (their successes credited), the new ones as baselines,
// and the next request finds all 43. (Under AddressSanitizer, a record used after the map moved
// it is a use-after-free.)
TEST_F(BudgetCoreTest, KnownTenantsAfterNewOnesInOneRequestAreAppliedToTheirOwnRecords) {
  MakeCore(1000, 0, 0.1, 0);
  const std::vector<std::string> known = {"k0", "k1", "k2"};
  v1::SyncRequest first;
  first.set_instance_id("a");
  first.set_seq(1);
  for (const std::string& k : known) *first.add_tenants() = Entry(k, {});
  ASSERT_TRUE(core_->Sync(first).ok());

  std::vector<std::string> all;
  for (int i = 0; i < 40; ++i) all.push_back("new-" + std::to_string(i));
  all.insert(all.end(), known.begin(), known.end());
  auto sync_all = [&](uint64_t seq, uint64_t successes) {
    v1::SyncRequest r;
    r.set_instance_id("a");
    r.set_seq(seq);
    for (const std::string& t : all) *r.add_tenants() = Entry(t, {.successes = successes});
    auto resp = core_->Sync(r);
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->tenants_size(), static_cast<int>(all.size()));
    for (int i = 0; i < resp->tenants_size(); ++i) {
      EXPECT_EQ(resp->tenants(i).tenant(), all[i]);
      EXPECT_FALSE(resp->tenants(i).has_error()) << resp->tenants(i).ShortDebugString();
    }
  };
  sync_all(2, 50);
  for (const std::string& k : known) EXPECT_NEAR(Tokens(k), 5, 1e-9) << k;  // 50 x 0.1
  for (int i = 0; i < 40; ++i) EXPECT_NEAR(Tokens(all[i]), 0, 1e-9) << all[i];  // baselines
  sync_all(3, 60);  // every tenant known now: 10 more successes each
  for (const std::string& k : known) EXPECT_NEAR(Tokens(k), 6, 1e-9) << k;
  for (int i = 0; i < 40; ++i) EXPECT_NEAR(Tokens(all[i]), 1, 1e-9) << all[i];
}

TEST_F(BudgetCoreTest, ARetriedRequestGetsItsRefusedEntriesBackToo) {
  MakeStrictCoreListingKnown();
  v1::SyncRequest r = Request("a", 1, "unknown", {.want = 3});
  *r.add_tenants() = Entry("known", {.want = 4});
  auto first = core_->Sync(r);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->tenants(0).error().code(), static_cast<int>(absl::StatusCode::kNotFound));
  auto again = core_->Sync(r);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), first->SerializeAsString());
  EXPECT_EQ(Status("known").granted_total(), 4u);
  // The refused tenant gained no history: when it is listed later, the instance's first report
  // of it is applied as a known all-zero history only because the instance started at seq 1.
  v1::SyncRequest later = Request("a", 2, "known", {.received = 4, .want = 4});
  auto resp = core_->Sync(later);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->tenants(0).granted(), 4u);
}

// A kept response holds the policy it was granted under and the fleet it divided the safe share
// among, and computes the rest again when replayed: a retry after the policy changed, the fleet
// grew, an entry went from refused to granted and back, still gets the very same bytes.
TEST_F(BudgetCoreTest, ARetryGetsTheAnswerOfThePolicyAndFleetItWasGrantedUnder) {
  MakeStrictCoreListingKnown();
  v1::SyncRequest r1 = Request("a", 1, "known", {.want = 2});
  *r1.add_tenants() = Entry("other", {.want = 1});
  auto first = core_->Sync(r1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->tenants(0).granted(), 2u);
  ASSERT_EQ(first->tenants(0).safe_share().capacity(), 10);  // a fleet of one
  ASSERT_EQ(first->tenants(1).error().code(), static_cast<int>(absl::StatusCode::kNotFound));

  // Another instance joins, the policy changes, the refused tenant gets a budget.
  ASSERT_EQ(SyncOne("b", 1, {.want = 1}, "known").safe_share().capacity(), 5);
  v1::BudgetPolicy p;
  p.set_capacity(40);
  p.set_refill_per_second(8);
  p.set_success_credit(0.5);
  p.set_lease_ttl_ms(7000);
  ASSERT_TRUE(core_->PutPolicy("known", p).ok());
  ASSERT_TRUE(core_->PutPolicy("other", p).ok());
  auto again = core_->Sync(r1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), first->SerializeAsString());

  // The next request is answered under the new policy and fleet, its refused entry granted.
  v1::SyncRequest r2 = Request("a", 2, "known", {.received = 2, .want = 2});
  *r2.add_tenants() = Entry("other", {.want = 1});
  auto second = core_->Sync(r2);
  ASSERT_TRUE(second.ok()) << second.status();
  const v1::TenantGrant& known = second->tenants(0);
  EXPECT_EQ(known.tenant(), "known");
  EXPECT_EQ(known.capacity(), 40);
  EXPECT_EQ(known.lease_ttl_ms(), 7000);
  EXPECT_EQ(known.safe_share().capacity(), 20);
  EXPECT_EQ(known.safe_share().refill_per_second(), 4);
  EXPECT_EQ(known.safe_share().success_credit(), 0.5);
  EXPECT_EQ(known.active_instances(), 2u);
  EXPECT_EQ(second->tenants(1).tenant(), "other");
  EXPECT_FALSE(second->tenants(1).has_error());
  EXPECT_EQ(second->tenants(1).granted(), 1u);

  // Granted, then refused (its budget deleted) and the retry of that gets the refusal back.
  ASSERT_TRUE(core_->DeleteBudget("other").ok());
  v1::SyncRequest r3 = Request("a", 3, "known", {.received = 4, .want = 2});
  *r3.add_tenants() = Entry("other", {.received = 1, .want = 1});
  auto third = core_->Sync(r3);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->tenants(1).tenant(), "other");
  EXPECT_EQ(third->tenants(1).error().code(), static_cast<int>(absl::StatusCode::kNotFound));
  ASSERT_TRUE(core_->PutPolicy("known", {}).ok());
  auto third_again = core_->Sync(r3);
  ASSERT_TRUE(third_again.ok()) << third_again.status();
  EXPECT_EQ(third_again->SerializeAsString(), third->SerializeAsString());
  EXPECT_EQ(Status("known").granted_total(), 7u);  // 2 + 1 + 2 + 2: no retry granted again
}

// A snapshot keeps the fingerprint of each instance's last request; one written before version
// 2 holds a version-1 fingerprint (and no version). After a clean restart from it, an exact
// retry still gets the kept response (nothing applied again), a changed request with the same
// seq is still refused, and the next request goes on under version 2.
TEST_F(BudgetCoreTest, ASnapshotsVersion1FingerprintStillRecognisesAnExactRetry) {
  MakeCore(100, 0, 0.1);
  const v1::SyncRequest last = Request("a", 1, "t", {.successes = 3, .want = 10});
  auto first = core_->Sync(last);
  ASSERT_TRUE(first.ok()) << first.status();
  v1::ServerState state = core_->ExportState(/*clean=*/true);
  ASSERT_EQ(state.instances_size(), 1);
  EXPECT_EQ(state.instances(0).fingerprint_version(), kFingerprintVersion);
  EXPECT_EQ(state.instances(0).last_fingerprint(), Fingerprint(last));
  // As the version before wrote it.
  state.mutable_instances(0)->clear_fingerprint_version();
  state.mutable_instances(0)->set_last_fingerprint(FingerprintV1(last));

  MakeCore(100, 0, 0.1);
  RecoveredState recovered;
  recovered.snapshot = state;
  ASSERT_TRUE(core_->Restore(recovered).ok());
  ASSERT_DOUBLE_EQ(Tokens(), 90);
  auto retry = core_->Sync(last);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->SerializeAsString(), first->SerializeAsString());
  EXPECT_DOUBLE_EQ(Tokens(), 90);
  // Written back as it was read, until a new request replaces it.
  EXPECT_EQ(core_->ExportState(true).instances(0).fingerprint_version(), 1u);
  auto changed = core_->Sync(Request("a", 1, "t", {.successes = 4, .want = 10}));
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kInvalidArgument);

  const v1::SyncRequest next = Request("a", 2, "t", {.successes = 3, .received = 10, .want = 5});
  auto second = core_->Sync(next);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->tenants(0).granted(), 5u);
  auto second_again = core_->Sync(next);
  ASSERT_TRUE(second_again.ok()) << second_again.status();
  EXPECT_EQ(second_again->SerializeAsString(), second->SerializeAsString());
  EXPECT_DOUBLE_EQ(Tokens(), 85);
  const v1::ServerState after = core_->ExportState(true);
  EXPECT_EQ(after.instances(0).fingerprint_version(), kFingerprintVersion);
  EXPECT_EQ(after.instances(0).last_fingerprint(), Fingerprint(next));
}

TEST_F(BudgetCoreTest, FillingACallersResponseGivesTheSameAnswerAsReturningOne) {
  MakeCore(100, 0, 0.1);
  v1::SyncResponse filled;
  ASSERT_TRUE(core_->Sync(Request("a", 1, "t", {.successes = 5, .want = 7}), &filled).ok());
  auto returned = core_->Sync(Request("a", 1, "t", {.successes = 5, .want = 7}));
  ASSERT_TRUE(returned.ok());
  EXPECT_EQ(filled.SerializeAsString(), returned->SerializeAsString());
  EXPECT_EQ(filled.tenants(0).granted(), 7u);
  v1::SyncResponse stale;
  ASSERT_TRUE(core_->Sync(Request("b", 5, "t", {.want = 1}), &stale).ok());
  ASSERT_TRUE(core_->Sync(Request("b", 4, "t", {.want = 1}), &stale).ok());
  EXPECT_TRUE(stale.stale());
}

}  // namespace
}  // namespace retrybudget

namespace retrybudget {
namespace {

TEST_F(BudgetCoreTest, DryHintCountsSuccessCreditAsInflow) {
  MakeCore(100, 4, 1, 0);  // 4/s refill; credit 1 per success
  uint64_t successes = 0;
  uint64_t received = 0;
  absl::Duration first;
  absl::Duration last;
  for (int seq = 1; seq <= 5; ++seq) {
    successes += 12;  // 12 successes/s: 12 tokens/s of credit on top of 4/s refill
    auto g = SyncOne("a", seq, {.successes = successes, .spent = received,
                                .received = received, .want = 1000});
    received += g.granted();  // spent at once: the bucket stays dry
    (seq == 1 ? first : last) = absl::Milliseconds(g.next_sync_ms());
    clock_.Advance(absl::Seconds(1));
  }
  // Refill alone: one token at 4/s is 250 ms; with ~16/s of inflow the client comes back sooner.
  EXPECT_EQ(first, absl::Milliseconds(250));
  EXPECT_LT(last, absl::Milliseconds(100));
}

TEST_F(BudgetCoreTest, ProportionalSharesRoundToNearest) {
  MakeCore(100, 5, 0, 0);
  SyncOne("x", 1, {.want = 2});
  SyncOne("y", 1, {.want = 2});
  SyncOne("z", 1, {.want = 2});
  clock_.Advance(absl::Seconds(1));  // 5 tokens for wants of 6: a share of 1.67 rounds to 2
  EXPECT_EQ(SyncOne("x", 2, {.want = 2}).granted(), 2u);
}


// ---- at most once, ownership, bounds (docs/DESIGN.md "Accounting") ----

TEST_F(BudgetCoreTest, AfterFinalEveryEarlierSeqIsStaleAndAHigherOneIsABaseline) {
  MakeCore(100, 0, 1, 10);
  SyncOne("a", 1, {.want = 5});
  v1::SyncRequest last = Request("a", 2, "t", {.successes = 4, .returned = 5, .received = 5});
  last.set_final(true);
  ASSERT_TRUE(core_->Sync(last).ok());
  EXPECT_DOUBLE_EQ(Tokens(), 14);
  EXPECT_EQ(core_->instance_count(), 0u);
  EXPECT_EQ(core_->tombstone_count(), 1u);
  for (uint64_t seq : {1, 2}) {
    auto r = core_->Sync(Request("a", seq, "t", {.successes = 40, .want = 5}));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->stale()) << seq;
  }
  EXPECT_DOUBLE_EQ(Tokens(), 14);
  EXPECT_EQ(Status().granted_total(), 5u);
  auto again = SyncOne("a", 3, {.successes = 40, .want = 5});
  EXPECT_EQ(again.granted(), 5u);  // a new life: a baseline, granted as usual
  EXPECT_DOUBLE_EQ(Tokens(), 9);   // its 40 successes credited nothing
}

TEST_F(BudgetCoreTest, TombstonesExpireAndAreBoundedInNumber) {
  CoreOptions options;
  options.max_instances = 3;
  options.tombstone_ttl = absl::Minutes(10);
  MakeCore(100, 0, 0, -1, options);
  for (int i = 0; i < 5; ++i) {
    v1::SyncRequest r = Request("f" + std::to_string(i), 1, "t", {});
    r.set_final(true);
    ASSERT_TRUE(core_->Sync(r).ok());
  }
  EXPECT_EQ(core_->tombstone_count(), 3u);  // the oldest two were dropped
  // The dropped ones are unknown: a resend is a baseline (credits nothing, may be granted).
  auto dropped = core_->Sync(Request("f0", 1, "t", {}));
  ASSERT_TRUE(dropped.ok());
  EXPECT_FALSE(dropped->stale());
  auto kept = core_->Sync(Request("f4", 1, "t", {}));
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->stale());
  clock_.Advance(absl::Minutes(11));
  auto expired = core_->Sync(Request("f4", 1, "t", {}));
  ASSERT_TRUE(expired.ok());
  EXPECT_FALSE(expired->stale());
}

TEST_F(BudgetCoreTest, AnInstanceIdBelongsToThePrincipalThatFirstUsedIt) {
  MakeCore(100, 0, 0);
  ASSERT_TRUE(core_->Sync(Request("a", 1, "t", {.want = 10}), "credential:alpha").ok());
  const v1::BudgetStatus before = Status();
  v1::SyncRequest jump = Request("a", uint64_t{1} << 32, "t", {.returned = 10, .received = 10});
  v1::SyncRequest last = Request("a", 2, "t", {.returned = 10, .received = 10});
  last.set_final(true);
  for (const v1::SyncRequest& r : {jump, last}) {
    auto s = core_->Sync(r, "credential:beta");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("\"a\""));
    auto anonymous = core_->Sync(r);
    EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(Status().SerializeAsString(), before.SerializeAsString());
  EXPECT_EQ(core_->instance_count(), 1u);
  // Its owner goes on at seq 2, and after its final the id stays its own.
  ASSERT_TRUE(core_->Sync(last, "credential:alpha").ok());
  EXPECT_DOUBLE_EQ(Tokens(), 100);
  auto after = core_->Sync(Request("a", 3, "t", {}), "credential:beta");
  EXPECT_EQ(after.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(BudgetCoreTest, TotalsSaturateInsteadOfWrapping) {
  MakeCore(100, 0, 0);
  constexpr uint64_t kMaxCount = uint64_t{1} << 53;
  // 2^11 instances reporting 2^53 each reach 2^64: the total stops at UINT64_MAX.
  for (int i = 0; i < 2050; ++i) {
    const std::string id = "i" + std::to_string(i);
    SyncOne(id, 1, {});
    SyncOne(id, 2, {.successes = kMaxCount, .spent = kMaxCount, .denied = kMaxCount,
                    .fallback = kMaxCount});
  }
  const v1::BudgetStatus s = Status();
  EXPECT_EQ(s.successes_total(), UINT64_MAX);
  EXPECT_EQ(s.retries_total(), UINT64_MAX);
  EXPECT_EQ(s.retries_denied_total(), UINT64_MAX);
  EXPECT_EQ(s.fallback_retries_total(), UINT64_MAX);
}

TEST_F(BudgetCoreTest, ReturnsBeyondGrantsAreRecordedAndCreditNothing) {
  MakeCore(100, 0, 0, 0);
  // A baseline claiming 1e15 tokens holds nothing against the capacity.
  SyncOne("x", 9, {.received = 1'000'000'000'000'000});
  EXPECT_EQ(Status().leased_tokens(), 0);
  SyncOne("x", 10, {.returned = 1'000'000'000'000'000, .received = 1'000'000'000'000'000});
  EXPECT_DOUBLE_EQ(Tokens(), 0);
  EXPECT_EQ(Status().uncredited_total(), 1'000'000'000'000'000u);
}

TEST_F(BudgetCoreTest, TokensOfADeletedBudgetDoNotFillItsSuccessor) {
  MakeCore(100, 0, 0, 50);
  EXPECT_EQ(SyncOne("a", 1, {.want = 10}).granted(), 10u);
  ASSERT_TRUE(core_->DeleteBudget("t").ok());
  // The budget is created again at its initial level; the 10 tokens "a" returns were the old
  // budget's: a baseline for the new one.
  SyncOne("a", 2, {.returned = 10, .received = 10});
  EXPECT_DOUBLE_EQ(Tokens(), 50);
  SyncOne("a", 3, {.returned = 10, .received = 10, .want = 5});
  EXPECT_DOUBLE_EQ(Tokens(), 45);
}

// Cluster mode, as the etcd router drives the core: a fake that serves the tenants it is told,
// names "127.0.0.1:2" as the owner of the others, and makes every reservation durable at once
// (on a thread of its own, as the router's etcd thread answers).
class ServedTenants final : public TenantRouter {
 public:
  ~ServedTenants() override { WaitIdle(); }
  bool MayServe(absl::string_view tenant, absl::Time) const override {
    MutexLock lock(&mu_);
    if (!served_.contains(tenant)) return false;
    if (lost_after_ == 0) return true;
    // The shard is lost between two questions about it.
    if (--lost_after_ == 0) served_.erase(tenant);
    return true;
  }
  TenantRefusal Refusal(absl::string_view, absl::Time) const override {
    return {.code = static_cast<int32_t>(absl::StatusCode::kFailedPrecondition),
            .message = "not the owner: 127.0.0.1:2",
            .owner = "127.0.0.1:2"};
  }
  void ReserveAhead(absl::string_view tenant, uint64_t limit,
                    DurableStore::ReservedCallback done) override {
    MutexLock lock(&mu_);
    writes_.emplace_back([done = std::move(done), tenant = std::string(tenant), limit] {
      done(tenant, limit, absl::OkStatus());
    });
  }
  void WaitIdle() override {
    std::vector<std::thread> writes;
    {
      MutexLock lock(&mu_);
      writes.swap(writes_);
    }
    for (std::thread& w : writes) w.join();
  }
  absl::Status DeleteDurably(absl::string_view,
                             const std::function<absl::Status()>& forget) override {
    return forget();  // nothing durable to remove
  }
  std::optional<v1::BudgetPolicy> AdminPolicy(absl::string_view) const override {
    return std::nullopt;
  }
  // The next `answers` questions are answered yes, then the served tenants asked about are
  // no longer served (as when a shard is lost while a request is applied).
  void LoseAfter(int answers) {
    MutexLock lock(&mu_);
    lost_after_ = answers;
  }
  void Serve(const std::string& tenant, bool serve) {
    MutexLock lock(&mu_);
    if (serve) {
      served_.insert(tenant);
    } else {
      served_.erase(tenant);
    }
  }

 private:
  mutable Mutex mu_;
  mutable absl::flat_hash_set<std::string> served_ ABSL_GUARDED_BY(mu_);
  mutable int lost_after_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> writes_ ABSL_GUARDED_BY(mu_);
};

// A core of capacity 100 (full, no refill, no credit) that serves tenant "t" through `router_`.
class ClusterCoreTest : public BudgetCoreTest {
 protected:
  void SetUp() override {
    router_.Serve("t", true);
    CoreOptions options;
    options.router = &router_;
    MakeCore(100, 0, 0, -1, options);
  }
  // The core waits for its router when destroyed: it goes first, whichever way the test ends.
  void TearDown() override { core_.reset(); }

  ServedTenants router_;
};

TEST_F(ClusterCoreTest, ARecordOfALostShardDoesNotRefuseTheTotalsAnotherOwnerGrantedSince) {
  Counters c{.want = 10};
  const v1::TenantGrant first = SyncOne("i", 1, c);
  ASSERT_GT(first.granted(), 0u);
  c.received = first.granted();
  SyncOne("i", 2, c);
  // The shard moves to another server (this one drops its budgets), which grants 500 more.
  router_.Serve("t", false);
  core_->DropTenants([](absl::string_view name) { return name == "t"; });
  c.received += 500;
  c.spent += 400;
  // Sent back here (the owner unreachable): refused with the owner's address, not rejected
  // whole for counters this server never saw granted.
  const v1::TenantGrant refused = SyncOne("i", 3, c);
  EXPECT_EQ(refused.error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(refused.error().owner(), "127.0.0.1:2");
  // The shard comes back: the instance is a baseline of the adopted budget.
  v1::TenantState state;
  state.set_tenant("t");
  state.set_level(50);
  state.set_granted_total(first.granted() + 500);
  core_->AdoptTenants({state}, clock_.Now());
  router_.Serve("t", true);
  const v1::TenantGrant back = SyncOne("i", 4, c);
  EXPECT_EQ(back.error().code(), 0) << back.error().message();
}

// The shard comes back as a new budget, and is lost again between the first look at an entry
// and its apply (the second look, under the budget's lock): the entry is refused, and the
// instance's record still belongs to the budget that granted it, so that the tokens it returns
// once the shard is back do not fill the new budget.
TEST_F(ClusterCoreTest, AShardLostWhileAnEntryIsAppliedLeavesTheRecordWithTheBudgetThatGrantedIt) {
  Counters c{.want = 10};
  const uint64_t granted = SyncOne("i", 1, c).granted();
  ASSERT_EQ(granted, 10u);
  c.want = 0;
  c.received = granted;
  // Lost, then adopted again at level 50 (the other owner's grants are its own).
  core_->DropTenants([](absl::string_view name) { return name == "t"; });
  v1::TenantState state;
  state.set_tenant("t");
  state.set_level(50);
  state.set_granted_total(granted);
  core_->AdoptTenants({state}, clock_.Now());
  router_.LoseAfter(1);
  c.returned = granted;
  const v1::TenantGrant refused = SyncOne("i", 2, c);
  EXPECT_EQ(refused.error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  router_.Serve("t", true);
  const v1::TenantGrant back = SyncOne("i", 3, c);
  EXPECT_EQ(back.error().code(), 0) << back.error().message();
  EXPECT_DOUBLE_EQ(Tokens(), 50);  // a baseline: the 10 were the dropped budget's
  EXPECT_EQ(Status().returned_total(), 0u);
}

}  // namespace
}  // namespace retrybudget
