#include "client/tenant_ledger.h"

#include "gtest/gtest.h"

namespace retrybudget::client_internal {
namespace {

TEST(TenantLedgerTest, SpentIsReceivedMinusReturnedMinusHeld) {
  TenantLedger ledger;
  ledger.Received(10, 10);
  EXPECT_EQ(ledger.ReportSpent(/*held=*/7), 3u);
  EXPECT_EQ(ledger.ExactSpent(7), 3u);
  ledger.Withdrew(7, 0);
  EXPECT_EQ(ledger.returned(), 7u);
  EXPECT_EQ(ledger.ReportSpent(0), 3u);
}

TEST(TenantLedgerTest, TokensCutByTheLeaseCapCountAsReturned) {
  TenantLedger ledger;
  ledger.Received(10, 8);
  EXPECT_EQ(ledger.received(), 10u);
  EXPECT_EQ(ledger.returned(), 2u);
  EXPECT_EQ(ledger.ReportSpent(8), 0u);
}

TEST(TenantLedgerTest, ReportedSpentNeverGoesBackwardsAfterARefund) {
  TenantLedger ledger;
  ledger.Received(5, 5);
  EXPECT_EQ(ledger.ReportSpent(2), 3u);  // 3 taken
  // One refunded: the lease holds 3 again.
  EXPECT_EQ(ledger.ExactSpent(3), 2u);
  EXPECT_EQ(ledger.ReportSpent(3), 3u);
  // Spent again: the report catches up without counting it twice.
  EXPECT_EQ(ledger.ReportSpent(2), 3u);
  EXPECT_EQ(ledger.ExactSpent(2), 3u);
}

TEST(TenantLedgerTest, RefundedThenWithdrawnTokenIsAbsorbedSoTheWireAddsUp) {
  TenantLedger ledger;
  ledger.Received(5, 5);
  EXPECT_EQ(ledger.ReportSpent(2), 3u);
  // Refund after the report: held 3; then the lease expires and all 3 are withdrawn.
  ledger.Withdrew(3, 0);
  EXPECT_EQ(ledger.ExactSpent(0), 2u);
  const uint64_t spent = ledger.ReportSpent(0);
  EXPECT_EQ(spent, 3u);
  EXPECT_EQ(ledger.returned(), 2u);
  EXPECT_EQ(spent + ledger.returned(), ledger.received());
}

using Source = TenantLedger::Source;

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

TEST(TenantLedgerTest, AFallbackTokenRefundedIntoALeaseIsNeverReturned) {
  TenantLedger ledger;
  ledger.SwitchTo(Source::kFallback);
  ledger.FallbackDeposited(2);
  ledger.Withdrew(0, 0);  // both were taken; a grant arrives
  ledger.SwitchTo(Source::kLease);
  ledger.Received(10, 10);
  // One fallback token is refunded into the lease word: it holds 11 for 10 received.
  EXPECT_EQ(ledger.ReportSpent(11), 2u);
  ledger.Withdrew(11, 0);
  const uint64_t spent = ledger.ReportSpent(0);
  const uint64_t leased_spent = spent - ledger.reported_fallback_spent();
  EXPECT_LE(leased_spent + ledger.returned(), ledger.received());
  EXPECT_EQ(ledger.returned(), 10u);
}

TEST(TenantLedgerTest, ALeasedTokenRefundedIntoTheFallbackBucketKeepsTheWireValid) {
  TenantLedger ledger;
  ledger.Received(3, 3);
  EXPECT_EQ(ledger.ReportSpent(0), 3u);  // all 3 taken and reported
  ledger.Withdrew(0, 0);
  ledger.SwitchTo(Source::kFallback);
  ledger.FallbackDeposited(2);
  // A leased token is refunded into the fallback word (3 held), then withdrawn.
  EXPECT_EQ(ledger.ReportSpent(3), 3u);
  ledger.Withdrew(3, 0);
  ledger.SwitchTo(Source::kLease);
  EXPECT_EQ(ledger.ReportSpent(0), 3u);
  EXPECT_EQ(ledger.reported_fallback_spent(), 0u);
  EXPECT_EQ(ledger.returned(), 0u);
}

}  // namespace
}  // namespace retrybudget::client_internal
