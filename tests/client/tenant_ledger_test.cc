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

}  // namespace
}  // namespace retrybudget::client_internal
