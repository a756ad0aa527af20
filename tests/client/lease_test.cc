#include "client/cpp/lease.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace retrybudget::client_internal {
namespace {

using Take = Lease::Take;

TEST(LeaseTest, StartsClosedAndEmpty) {
  Lease lease;
  EXPECT_FALSE(lease.IsOpen());
  EXPECT_EQ(lease.Held(), 0u);
  EXPECT_EQ(lease.TryTake(), Take::kEmpty);
}

TEST(LeaseTest, DepositOpensAndTokensCanBeTakenUntilZero) {
  Lease lease;
  EXPECT_EQ(lease.Deposit(3, 0), 3u);
  EXPECT_TRUE(lease.IsOpen());
  EXPECT_EQ(lease.TryTake(), Take::kTaken);
  EXPECT_EQ(lease.TryTake(), Take::kTaken);
  // The last token reports "low": the lease is now empty (mark 0).
  EXPECT_EQ(lease.TryTake(), Take::kTakenLow);
  EXPECT_EQ(lease.TryTake(), Take::kEmpty);
  EXPECT_EQ(lease.Held(), 0u);
}

TEST(LeaseTest, ReportsLowExactlyWhenCountFallsToMark) {
  Lease lease;
  lease.Deposit(10, 2);
  int low = 0;
  for (int i = 0; i < 10; ++i) {
    const Take take = lease.TryTake();
    ASSERT_NE(take, Take::kEmpty);
    if (take == Take::kTakenLow) {
      ++low;
      EXPECT_EQ(lease.Held(), 2u);
    }
  }
  EXPECT_EQ(low, 1);
}

TEST(LeaseTest, ACostIsTakenAllOrNothing) {
  Lease lease;
  lease.Deposit(3, 0);
  EXPECT_EQ(lease.TryTake(5), Take::kEmpty);
  EXPECT_EQ(lease.Held(), 3u);  // never a partial take
  EXPECT_EQ(lease.TryTake(2), Take::kTaken);
  EXPECT_EQ(lease.TryTake(2), Take::kEmpty);
  EXPECT_EQ(lease.Held(), 1u);
  EXPECT_EQ(lease.TryTake(1), Take::kTakenLow);
  lease.Refund(3);
  EXPECT_EQ(lease.Held(), 3u);
  EXPECT_EQ(lease.TryTake(3), Take::kTakenLow);
}

TEST(LeaseTest, ATakeThatStepsOverTheMarkReportsLowOnce) {
  Lease lease;
  lease.Deposit(10, 4);
  EXPECT_EQ(lease.TryTake(3), Take::kTaken);     // 7
  EXPECT_EQ(lease.TryTake(5), Take::kTakenLow);  // 2: from above the mark to below it
  EXPECT_EQ(lease.TryTake(1), Take::kTaken);     // 1: already below
  EXPECT_EQ(lease.TryTake(1), Take::kTaken);     // 0
}

TEST(LeaseTest, AClosedLeaseGivesNoCost) {
  Lease lease;
  lease.Deposit(5, 0);
  lease.WithdrawAndClose();
  lease.Refund(5);
  EXPECT_EQ(lease.TryTake(5), Take::kEmpty);
  EXPECT_EQ(lease.TryTake(1), Take::kEmpty);
}

TEST(LeaseTest, WithdrawTakesEverythingAndCloses) {
  Lease lease;
  lease.Deposit(5, 1);
  lease.TryTake();
  EXPECT_EQ(lease.WithdrawAndClose(), 4u);
  EXPECT_FALSE(lease.IsOpen());
  EXPECT_EQ(lease.TryTake(), Take::kEmpty);
}

TEST(LeaseTest, RefundIntoClosedLeaseIsNotSpendable) {
  Lease lease;
  lease.Deposit(1, 0);
  ASSERT_NE(lease.TryTake(), Take::kEmpty);
  lease.WithdrawAndClose();
  lease.Refund();
  EXPECT_EQ(lease.Held(), 1u);
  EXPECT_EQ(lease.TryTake(), Take::kEmpty);
  // A new lease makes it spendable again.
  lease.Deposit(0, 0);
  EXPECT_NE(lease.TryTake(), Take::kEmpty);
}

TEST(LeaseTest, RefundPutsTokenBack) {
  Lease lease;
  lease.Deposit(1, 0);
  ASSERT_NE(lease.TryTake(), Take::kEmpty);
  lease.Refund();
  EXPECT_EQ(lease.Held(), 1u);
  EXPECT_NE(lease.TryTake(), Take::kEmpty);
}

TEST(LeaseTest, DepositIsCappedAndReportsWhatWentIn) {
  Lease lease;
  EXPECT_EQ(lease.Deposit(Lease::kMaxTokens - 1, 0), Lease::kMaxTokens - 1);
  EXPECT_EQ(lease.Deposit(10, 0), 1u);
  EXPECT_EQ(lease.Held(), Lease::kMaxTokens);
  EXPECT_EQ(lease.Deposit(10, 0), 0u);
}

}  // namespace
}  // namespace retrybudget::client_internal
