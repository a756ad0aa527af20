// A tenant's active set (tenant_state.h): entries kept in the instances' records, counted by the
// tenant in time slices. Random reports, final requests, evictions (an entry dropped with its
// record, still counting) and clock steps, against a model of every entry's last report:
// whatever was seen within the lease TTL is counted, nothing older than the TTL plus one
// slice's span is, and the sums are those of the entries counted.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/compact_mutex.h"
#include "server/policy.h"
#include "server/ref_ptr.h"
#include "server/tenant_state.h"

namespace retrybudget::core_internal {
namespace {

struct Reported {
  int64_t last_ns = 0;
  uint32_t want = 0;
  uint64_t held = 0;
};

struct Sums {
  uint64_t count = 0;
  absl::uint128 want = 0;
  absl::uint128 held = 0;
};

class ActiveSetTest : public ::testing::TestWithParam<absl::Duration> {
 protected:
  ActiveSetTest() {
    ResolvedPolicy policy;
    policy.lease_ttl = GetParam();
    tenant_ = MakeRef<Tenant>("t", policies_.Intern(policy), v1::POLICY_SOURCE_DEFAULT, now_);
  }

  // The model's entries seen at or after `since`.
  Sums SeenSince(absl::Time since) const {
    Sums out;
    const int64_t since_ns = absl::ToUnixNanos(since);
    for (const auto& [key, r] : model_) {
      if (r.last_ns < since_ns) continue;
      out.count += 1;
      out.want += r.want;
      out.held += r.held;
    }
    return out;
  }

  // After a sweep at now_: everything seen within the TTL counts, nothing older than TTL + span.
  void CheckBounds(const std::string& step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tenant_->mu) {
    tenant_->Advance(absl::ToUnixNanos(now_));
    const absl::Duration ttl = tenant_->policy->lease_ttl;
    const Sums must = SeenSince(now_ - ttl);
    const Sums may = SeenSince(now_ - ttl - absl::Nanoseconds(tenant_->SliceSpanNanos()));
    const uint64_t count = tenant_->ActiveSize();
    const absl::uint128 held = tenant_->HeldSum();
    const uint64_t want = tenant_->WantSum();
    ASSERT_GE(count, must.count) << step;
    ASSERT_LE(count, may.count) << step;
    ASSERT_GE(held, must.held) << step;
    ASSERT_LE(held, may.held) << step;
    ASSERT_GE(absl::uint128(want), must.want) << step;
    ASSERT_LE(absl::uint128(want), may.want) << step;
    // The admin's count: the slices seen within the TTL, so between the same bounds.
    const uint32_t seen = tenant_->ActiveCount(absl::ToUnixNanos(now_));
    ASSERT_GE(seen, must.count) << step;
    ASSERT_LE(seen, may.count) << step;
  }

  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  PolicyTable policies_;
  RefPtr<Tenant> tenant_;
  // Key: a record's number. An evicted record's entry stays in the model (it counts until its
  // lease ends) under a key no live record uses any more.
  std::map<int, Reported> model_;
};

TEST_P(ActiveSetTest, CountsWhatWasSeenWithinTheTtlToASlicesSpan) {
  CompactMutexLock lock(&tenant_->mu);
  std::mt19937_64 rng(GetParam() / absl::Milliseconds(1));
  const absl::Duration ttl = GetParam();
  const absl::Duration span = absl::Nanoseconds(tenant_->SliceSpanNanos());
  // The lateness DESIGN.md promises: 100 ms, or a 128th of a longer TTL.
  ASSERT_EQ(span, std::max(absl::Milliseconds(100), ttl / 128));
  constexpr int kRecords = 40;
  std::vector<ActiveEntry> entries(kRecords);
  std::vector<int> key(kRecords);
  int next_key = 0;
  for (int& k : key) k = next_key++;

  for (int step = 0; step < 20'000; ++step) {
    const int i = static_cast<int>(rng() % kRecords);
    const std::string what = absl::StrCat("step ", step, " record ", i);
    switch (rng() % 8) {
      case 0:  // a final request: out of the set at once
        tenant_->RemoveActive(entries[i]);
        model_.erase(key[i]);
        break;
      case 1:  // evicted: the record (and its entry) is gone, what it held counts on
        entries[i] = ActiveEntry{};
        key[i] = next_key++;
        break;
      case 2: {  // the clock: mostly a fraction of a span, sometimes past the TTL
        const uint64_t r = rng() % 100;
        now_ += r < 90   ? span * (static_cast<double>(rng() % 1000) / 2000)
                : r < 98 ? ttl / 3
                         : ttl + span;
        break;
      }
      default: {  // a report, and (as Grant does) the holdings once the grant is known
        const auto want = static_cast<uint32_t>(rng() % 100);
        const uint64_t held = rng() % 1000;
        tenant_->SetActive(entries[i], want, held, absl::ToUnixNanos(now_));
        model_[key[i]] = Reported{absl::ToUnixNanos(now_), want, held};
        if (rng() % 2 == 0) {
          const uint64_t after_grant = held + rng() % 50;
          tenant_->SetHeld(entries[i], after_grant);
          model_[key[i]].held = after_grant;
        }
        break;
      }
    }
    CheckBounds(what);
    // Entries older than the longest any can count are out of the model's bounds for good.
    const int64_t gone_ns = absl::ToUnixNanos(now_ - ttl - span);
    std::erase_if(model_, [gone_ns](const auto& kv) { return kv.second.last_ns < gone_ns; });
    if (HasFatalFailure()) return;
  }

  // Everything final or silent: nothing counts after TTL + span, and once no fleet is
  // remembered either (RecentExtreme forgets within two windows), the set itself is let go.
  for (ActiveEntry& e : entries) tenant_->RemoveActive(e);
  model_.clear();
  now_ += ttl + span;
  CheckBounds("after the last");
  EXPECT_EQ(tenant_->ActiveSize(), 0u);
  EXPECT_EQ(tenant_->HeldSum(), 0);
  now_ += 2 * absl::Milliseconds(kFleetSizeWindowMillis);
  tenant_->Advance(absl::ToUnixNanos(now_));
  EXPECT_EQ(tenant_->active, nullptr);
}

// The lease TTLs the slices' span is 100 ms for (1 s, 12.8 s) and a 128th of the TTL for (the
// longest a policy allows, 600 s).
INSTANTIATE_TEST_SUITE_P(Ttls, ActiveSetTest,
                         ::testing::Values(absl::Seconds(1), absl::Milliseconds(12'800),
                                           absl::Seconds(600)),
                         [](const auto& info) {
                           return absl::StrCat(info.param / absl::Milliseconds(1), "ms");
                         });

// An instance reporting more often than a slice's span, for many spans, is one entry: its
// earlier slices give it back as it moves to the newest.
TEST(ActiveSetEntryTest, AnEntryMovingAcrossSlicesCountsOnce) {
  PolicyTable policies;
  absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  auto tenant = MakeRef<Tenant>("t", policies.Intern(ResolvedPolicy{}), v1::POLICY_SOURCE_DEFAULT,
                                now);
  CompactMutexLock lock(&tenant->mu);
  ActiveEntry a, b;
  for (int k = 0; k < 1000; ++k) {
    tenant->SetActive(a, 7, 30, absl::ToUnixNanos(now));
    tenant->SetActive(b, 5, 0, absl::ToUnixNanos(now));
    tenant->SetHeld(b, 11);
    now += absl::Milliseconds(30);
    tenant->Advance(absl::ToUnixNanos(now));
    ASSERT_EQ(tenant->ActiveSize(), 2u) << k;
    ASSERT_EQ(tenant->HeldSum(), 41) << k;
    ASSERT_EQ(tenant->WantSum(), 12u) << k;
    ASSERT_EQ(tenant->RecentFleetSize(absl::ToUnixNanos(now)), 2u) << k;
  }
  // An entry of another set (another budget of the same name, or this one's set let go and
  // made again) changes nothing here when it is reported or taken out: its slice is not here.
  auto other = MakeRef<Tenant>("t", policies.Intern(ResolvedPolicy{}), v1::POLICY_SOURCE_DEFAULT,
                               now);
  CompactMutexLock other_lock(&other->mu);
  ActiveEntry elsewhere = a;
  other->RemoveActive(elsewhere);
  EXPECT_EQ(elsewhere.slice, 0u);
  elsewhere = b;
  other->SetActive(elsewhere, 1, 2, absl::ToUnixNanos(now));
  EXPECT_EQ(other->ActiveSize(), 1u);
  EXPECT_EQ(other->HeldSum(), 2);
  EXPECT_EQ(tenant->ActiveSize(), 2u);
  EXPECT_EQ(tenant->HeldSum(), 41);
  // Where the other set has a slice at the same position: the id tells them apart.
  ActiveEntry there;
  other->SetActive(there, 3, 4, absl::ToUnixNanos(now));  // the same slice, at position 0
  auto third = MakeRef<Tenant>("t", policies.Intern(ResolvedPolicy{}), v1::POLICY_SOURCE_DEFAULT,
                               now);
  CompactMutexLock third_lock(&third->mu);
  ActiveEntry first_there;
  third->SetActive(first_there, 1, 1, absl::ToUnixNanos(now));
  ASSERT_EQ(first_there.position, there.position);
  other->RemoveActive(first_there);
  EXPECT_EQ(other->ActiveSize(), 2u);
  EXPECT_EQ(other->HeldSum(), 6);
}

}  // namespace
}  // namespace retrybudget::core_internal
