#include "client/cpp/tenant_ledger.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace retrybudget::client_internal {
namespace {

using Source = TenantLedger::Source;

// The wire counters of one report, as FillCounters() sends them.
struct Wire {
  uint64_t spent = 0;
  uint64_t refunded = 0;
  uint64_t fallback_spent = 0;
  uint64_t fallback_refunded = 0;
  uint64_t returned = 0;
  uint64_t received = 0;
  uint64_t allowed = 0;
};

Wire Report(TenantLedger& ledger, const WordSnapshot& word) {
  ledger.Report(word);
  return {.spent = ledger.reported_spent(),
          .refunded = ledger.reported_refunded(),
          .fallback_spent = ledger.reported_fallback_spent(),
          .fallback_refunded = ledger.reported_fallback_refunded(),
          .returned = ledger.returned(),
          .received = ledger.received(),
          .allowed = ledger.reported_allowed()};
}

Wire Report(TenantLedger& ledger, uint64_t held) { return Report(ledger, {.held = held}); }

// What the server checks of every report (sync_validation), and that nothing went backwards
// since `before`.
void ExpectValidAfter(const Wire& before, const Wire& now) {
  EXPECT_LE(now.refunded, now.spent);
  EXPECT_LE(now.fallback_refunded, now.fallback_spent);
  EXPECT_LE(now.fallback_refunded, now.refunded);
  EXPECT_LE(now.fallback_spent, now.spent);
  const uint64_t leased_net =
      (now.spent - now.fallback_spent) - (now.refunded - now.fallback_refunded);
  EXPECT_LE(leased_net + now.returned, now.received);
  EXPECT_LE(now.allowed, now.spent);
  EXPECT_GE(now.allowed, before.allowed);
  EXPECT_GE(now.spent, before.spent);
  EXPECT_GE(now.refunded, before.refunded);
  EXPECT_GE(now.fallback_spent, before.fallback_spent);
  EXPECT_GE(now.fallback_refunded, before.fallback_refunded);
  EXPECT_GE(now.returned, before.returned);
  EXPECT_GE(now.received, before.received);
}

TEST(TenantLedgerTest, SpentIsReceivedMinusReturnedMinusHeld) {
  TenantLedger ledger;
  ledger.Received(10, 10);
  EXPECT_EQ(ledger.ReportSpent(/*held=*/7), 3u);
  EXPECT_EQ(ledger.ExactSpent(7), 3u);
  ledger.Withdrew(7, 0);
  EXPECT_EQ(ledger.returned(), 7u);
  EXPECT_EQ(ledger.ReportSpent(0), 3u);
  EXPECT_EQ(ledger.reported_refunded(), 0u);
}

TEST(TenantLedgerTest, TokensCutByTheLeaseCapCountAsReturned) {
  TenantLedger ledger;
  ledger.Received(10, 8);
  EXPECT_EQ(ledger.received(), 10u);
  EXPECT_EQ(ledger.returned(), 2u);
  EXPECT_EQ(ledger.ReportSpent(8), 0u);
}

TEST(TenantLedgerTest, ARefundAfterTheReportThatCountedItIsReportedAsRefunded) {
  TenantLedger ledger;
  ledger.Received(5, 5);
  const Wire first = Report(ledger, /*held=*/2);  // 3 taken
  EXPECT_EQ(first.spent, 3u);
  EXPECT_EQ(first.refunded, 0u);
  // One refunded after that report: the word holds 3 again.
  EXPECT_EQ(ledger.ExactSpent(3), 2u);
  const Wire second = Report(ledger, 3);
  ExpectValidAfter(first, second);
  EXPECT_EQ(second.spent, 3u);  // never lower than reported
  EXPECT_EQ(second.refunded, 1u);
  EXPECT_EQ(second.spent - second.refunded, 2u);  // the retries really sent
}

TEST(TenantLedgerTest, ARefundThenASpendThenAReturnKeepsEveryReportExact) {
  TenantLedger ledger;
  ledger.Received(5, 5);
  const Wire taken = Report(ledger, /*held=*/2);  // 3 taken
  // Refunded after the report (held 3), reported.
  const Wire refunded = Report(ledger, 3);
  ExpectValidAfter(taken, refunded);
  EXPECT_EQ(refunded.spent - refunded.refunded, 2u);
  // Spent again (held 2): the spent count rises, the refunded count stays, the net is exact.
  const Wire respent = Report(ledger, 2);
  ExpectValidAfter(refunded, respent);
  EXPECT_EQ(respent.spent, 4u);
  EXPECT_EQ(respent.refunded, 1u);
  EXPECT_EQ(respent.spent - respent.refunded, 3u);
  EXPECT_EQ(ledger.ExactSpent(2), 3u);
  // Refunded once more, then the lease expires: the 3 tokens in the word go back as returned,
  // the refunded one among them.
  ledger.Withdrew(3, 0);
  EXPECT_EQ(ledger.returned(), 3u);
  const Wire returned = Report(ledger, 0);
  ExpectValidAfter(respent, returned);
  EXPECT_EQ(returned.spent, 4u);
  EXPECT_EQ(returned.refunded, 2u);
  EXPECT_EQ(returned.spent - returned.refunded, 2u);
  // Everything received is accounted for: sent, returned, held.
  EXPECT_EQ(returned.received, ledger.ExactSpent(0) + returned.returned + 0);
  EXPECT_EQ(ledger.ExactSpent(0), 2u);
}

TEST(TenantLedgerTest, ARefundedTokenWithdrawnBeforeAnyReportIsSimplyReturned) {
  TenantLedger ledger;
  ledger.Received(4, 4);
  // One taken and refunded between two reports: nothing to report as refunded.
  ledger.Withdrew(4, 0);
  const Wire wire = Report(ledger, 0);
  EXPECT_EQ(wire.spent, 0u);
  EXPECT_EQ(wire.refunded, 0u);
  EXPECT_EQ(wire.returned, 4u);
}

TEST(TenantLedgerTest, FallbackSpendingIsPartOfSpentAndNeverReturned) {
  TenantLedger ledger;
  ledger.Received(5, 5);
  ledger.Withdrew(2, 0);  // lease expired with 2 unspent: returned
  ledger.SwitchTo(Source::kFallback);
  ledger.FallbackDeposited(4);
  EXPECT_EQ(ledger.ReportSpent(/*held=*/1), 3u + 3u);
  EXPECT_EQ(ledger.reported_fallback_spent(), 3u);
  EXPECT_EQ(ledger.ExactFallbackSpent(1), 3u);
  ledger.Withdrew(1, 0);  // back to leases: the unspent fallback token vanishes
  ledger.SwitchTo(Source::kLease);
  ledger.Received(6, 6);
  EXPECT_EQ(ledger.returned(), 2u);
  EXPECT_EQ(ledger.ReportSpent(6), 6u);
  EXPECT_EQ(ledger.reported_fallback_spent(), 3u);
  EXPECT_EQ(ledger.received(), 11u);
}

TEST(TenantLedgerTest, AFallbackRefundAfterTheReportIsAFallbackRefund) {
  TenantLedger ledger;
  ledger.SwitchTo(Source::kFallback);
  ledger.FallbackDeposited(3);
  const Wire taken = Report(ledger, /*held=*/1);  // 2 taken from the fallback bucket
  EXPECT_EQ(taken.fallback_spent, 2u);
  const Wire refunded = Report(ledger, 2);  // one refunded
  ExpectValidAfter(taken, refunded);
  EXPECT_EQ(refunded.fallback_spent, 2u);
  EXPECT_EQ(refunded.fallback_refunded, 1u);
  EXPECT_EQ(refunded.refunded, 1u);
  EXPECT_EQ(refunded.returned, 0u);  // fallback tokens are never returned
}

TEST(TenantLedgerTest, AFallbackTokenRefundedIntoALeaseIsAbsorbedNeverReturned) {
  TenantLedger ledger;
  ledger.SwitchTo(Source::kFallback);
  ledger.FallbackDeposited(2);
  const Wire fallback = Report(ledger, 0);  // both taken and reported
  ledger.Withdrew(0, 0);                    // a grant arrives
  ledger.SwitchTo(Source::kLease);
  ledger.Received(10, 10);
  // One fallback token is refunded into the lease word: it holds 11 for 10 received.
  const Wire crossed = Report(ledger, 11);
  ExpectValidAfter(fallback, crossed);
  EXPECT_EQ(crossed.spent, 2u);
  ledger.Withdrew(11, 0);
  const Wire withdrawn = Report(ledger, 0);
  ExpectValidAfter(crossed, withdrawn);
  // The lease's 10 go back; the fallback token stays spent in the fallback books.
  EXPECT_EQ(withdrawn.returned, 10u);
  EXPECT_EQ(withdrawn.spent, 2u);
  EXPECT_EQ(withdrawn.fallback_spent, 2u);
  EXPECT_EQ(withdrawn.refunded, 0u);
}

TEST(TenantLedgerTest, ALeasedTokenRefundedIntoTheFallbackWordAfterItsReportKeepsTheWireValid) {
  TenantLedger ledger;
  ledger.Received(3, 3);
  const Wire leased = Report(ledger, 0);  // all 3 taken and reported
  EXPECT_EQ(leased.spent, 3u);
  ledger.Withdrew(0, 0);
  ledger.SwitchTo(Source::kFallback);
  ledger.FallbackDeposited(2);
  // A leased token is refunded into the fallback word (3 held), reported, then withdrawn.
  const Wire crossed = Report(ledger, 3);
  ExpectValidAfter(leased, crossed);
  ledger.Withdrew(3, 0);
  ledger.SwitchTo(Source::kLease);
  const Wire back = Report(ledger, 0);
  ExpectValidAfter(crossed, back);
  // The fallback books count out only their own 2; the leased token stays spent in the lease's.
  EXPECT_EQ(back.spent, 3u);
  EXPECT_EQ(back.fallback_spent, 0u);
  EXPECT_EQ(back.returned, 0u);
}

// A model of the lease word driven at random through every kind of event, with a report after
// each: every report must pass the server's checks and never go backwards; while the tokens only
// ever came from leases, the books match the word exactly (received = sent + returned + held).
void RandomWalk(uint32_t seed, bool with_fallback, uint32_t max_cost = 1) {
  SCOPED_TRACE(seed);
  std::mt19937 gen(seed);
  TenantLedger ledger;
  uint64_t held = 0;                  // tokens in the word
  std::vector<uint32_t> outstanding;  // costs taken and not refunded: a Refund() gives one back
  uint64_t sent = 0;                  // tokens taken minus refunded
  WordSnapshot word;                  // the workers' counts: refunded tokens, extra tokens
  uint64_t takes = 0;                 // retries allowed
  Wire last;
  const auto refund = [&] {
    const uint32_t cost = outstanding.back();
    outstanding.pop_back();
    held += cost;
    sent -= cost;
    word.refunded += cost;
  };
  for (int step = 0; step < 2000; ++step) {
    switch (std::uniform_int_distribution<int>(0, 6)(gen)) {
      case 0:
        if (ledger.source() == Source::kLease) {
          const uint64_t granted = std::uniform_int_distribution<uint64_t>(0, 5)(gen);
          const uint64_t deposited = std::uniform_int_distribution<uint64_t>(0, granted)(gen);
          ledger.Received(granted, deposited);
          held += deposited;
        } else {
          const uint64_t n = std::uniform_int_distribution<uint64_t>(0, 3)(gen);
          ledger.FallbackDeposited(n);
          held += n;
        }
        break;
      case 1:
      case 2: {
        const uint32_t cost = std::uniform_int_distribution<uint32_t>(1, max_cost)(gen);
        if (held >= cost) {
          held -= cost;
          outstanding.push_back(cost);
          sent += cost;
          word.extra += cost - 1;
          ++takes;
        }
        break;
      }
      case 3:
        if (!outstanding.empty()) refund();
        break;
      case 4: {  // withdrawal, sometimes with a refund racing in right after it
        const uint64_t withdrawn = held;
        held = 0;
        if (!outstanding.empty() && std::uniform_int_distribution<int>(0, 3)(gen) == 0) refund();
        ledger.Withdrew(withdrawn, held);
        break;
      }
      case 5:
        if (with_fallback && held == 0) {
          ledger.SwitchTo(ledger.source() == Source::kLease ? Source::kFallback : Source::kLease);
        }
        break;
      case 6:
        break;
    }
    word.held = held;
    EXPECT_EQ(ledger.Takes(word), takes);
    const Wire now = Report(ledger, word);
    ExpectValidAfter(last, now);
    EXPECT_EQ(now.allowed, std::max(last.allowed, std::min(takes, now.spent)));
    if (!with_fallback) {
      EXPECT_EQ(now.spent - now.refunded, sent);
      EXPECT_EQ(ledger.ExactSpent(held), sent);
      EXPECT_EQ(now.received, sent + now.returned + held);
    }
    if (::testing::Test::HasFailure()) return;
    last = now;
  }
}

TEST(TenantLedgerTest, RandomLeaseOnlyRunsAreExactAndEveryReportIsValid) {
  for (uint32_t seed = 1; seed <= 50; ++seed) RandomWalk(seed, /*with_fallback=*/false);
}

TEST(TenantLedgerTest, RandomRunsAcrossChangesOfSourceKeepEveryReportValid) {
  for (uint32_t seed = 1; seed <= 50; ++seed) RandomWalk(seed, /*with_fallback=*/true);
}

TEST(TenantLedgerTest, RandomRunsWithCostsCountTokensAndRetriesAndKeepEveryReportValid) {
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    RandomWalk(seed, /*with_fallback=*/false, /*max_cost=*/4);
    RandomWalk(seed, /*with_fallback=*/true, /*max_cost=*/4);
  }
}

TEST(TenantLedgerTest, RetriesAllowedCountsTakesWhateverTheirCostCappedAtSpent) {
  TenantLedger ledger;
  ledger.Received(10, 10);
  // A take of 1 refunded before any report: left out of retries_spent, so out of
  // retries_allowed too (the server checks allowed <= spent).
  Wire w = Report(ledger, {.refunded = 1, .held = 10, .extra = 0});
  EXPECT_EQ(w.spent, 0u);
  EXPECT_EQ(w.allowed, 0u);
  // Then a take of cost 5: 5 tokens, one retry (two takes in all, capped at... 5 spent).
  w = Report(ledger, {.refunded = 1, .held = 5, .extra = 4});
  EXPECT_EQ(w.spent, 5u);
  EXPECT_EQ(w.allowed, 2u);
  EXPECT_EQ(ledger.Takes({.refunded = 1, .held = 5, .extra = 4}), 2u);
  // Its refund after the report: refunded, and retries_allowed does not go down.
  w = Report(ledger, {.refunded = 6, .held = 10, .extra = 4});
  EXPECT_EQ(w.spent, 5u);
  EXPECT_EQ(w.refunded, 5u);
  EXPECT_EQ(w.allowed, 2u);
}

}  // namespace
}  // namespace retrybudget::client_internal
