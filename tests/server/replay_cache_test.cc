// The kept response of an instance (GrantRecord, server/replay_cache.h): a grant keeps its
// budget and policy and computes the policy's values again when written; a refusal or a record
// read back from a snapshot keeps its values whole. Records change kind in place and move as the
// response grows and shrinks; what they write must not change with any of that.
#include "server/replay_cache.h"

#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/grant_math.h"

namespace retrybudget {
namespace {

using core_internal::Tenant;

class GrantRecordTest : public ::testing::Test {
 protected:
  RefPtr<Tenant> Budget(const std::string& name) {
    return MakeRef<Tenant>(name, Policy(100), v1::POLICY_SOURCE_DEFAULT, absl::UnixEpoch());
  }
  // A policy in shadow mode when `capacity` is odd, windowed (retry ratio 0.3) when it is 13.
  PolicyRef Policy(double capacity) {
    const bool windowed = capacity == 13;
    return policies_.Intern(ResolvedPolicy{.capacity = capacity,
                                           .refill_per_second = capacity / 10,
                                           .success_credit = 0.25,
                                           .initial_tokens = capacity,
                                           .lease_ttl = absl::Milliseconds(capacity * 100),
                                           .shadow = static_cast<int>(capacity) % 2 == 1,
                                           .windowed = windowed,
                                           .retry_ratio = windowed ? 0.3 : 0});
  }

  // One record of each kind a response can hold, in turn by `kind`.
  void Set(GrantRecord& r, int kind, int n) {
    switch (kind % 3) {
      case 0:
        r.SetGrantedBy(budgets_[n % budgets_.size()], Policy(10 + n % 4));
        r.granted = static_cast<uint32_t>(n);
        r.next_sync_ms = static_cast<uint32_t>(100 + n);
        r.fleet = static_cast<uint32_t>(1 + n % 7);
        r.active_instances = static_cast<uint32_t>(1 + n % 5);
        r.bucket_tokens = 0.5 * n;
        return;
      case 1:
        r.Refuse("refused-" + std::to_string(n), static_cast<int>(absl::StatusCode::kNotFound),
                 "no budget " + std::to_string(n), n % 2 == 0 ? "" : "owner-" + std::to_string(n));
        return;
      default: {
        v1::SyncResponse restored;
        v1::TenantGrant* g = restored.add_tenants();
        g->set_tenant("restored-" + std::to_string(n));
        g->set_granted(uint64_t{1} << 40);  // a value a grant of this build never sends
        g->set_lease_ttl_ms(1234 + n);
        g->set_next_sync_ms(56 + n);
        g->mutable_safe_share()->set_capacity(1.0 / 3 + n);
        g->mutable_safe_share()->set_refill_per_second(0.1 * n);
        g->mutable_safe_share()->set_success_credit(0.7);
        g->mutable_safe_share()->set_request_credit(0.01 * n);
        g->set_bucket_tokens(2.5 * n);
        g->set_capacity(99.5);
        g->set_active_instances(static_cast<uint32_t>(n));
        g->set_mode(n % 2 == 0 ? v1::MODE_SHADOW : v1::MODE_ENFORCE);
        GrantRecords one;
        ReadResponse(restored, &one);
        r = std::move(one[0]);
      }
    }
  }

  // What `kind` and `n` must write, built independently of GrantRecord.
  v1::TenantGrant Expected(int kind, int n) {
    v1::TenantGrant g;
    switch (kind % 3) {
      case 0: {
        const double capacity = 10 + n % 4;
        const SafeShareOf share = SafeShare(capacity, capacity / 10, 1 + n % 7);
        g.set_tenant(budgets_[n % budgets_.size()]->name);
        g.set_granted(static_cast<uint64_t>(n));
        g.set_lease_ttl_ms(static_cast<int64_t>(capacity * 100));
        g.set_next_sync_ms(100 + n);
        g.mutable_safe_share()->set_capacity(share.capacity);
        g.mutable_safe_share()->set_refill_per_second(share.refill_per_second);
        g.mutable_safe_share()->set_success_credit(0.25);
        g.mutable_safe_share()->set_request_credit(capacity == 13 ? 0.3 : 0);
        g.set_bucket_tokens(0.5 * n);
        g.set_capacity(capacity);
        g.set_active_instances(static_cast<uint32_t>(1 + n % 5));
        g.set_mode(static_cast<int>(capacity) % 2 == 1 ? v1::MODE_SHADOW : v1::MODE_ENFORCE);
        return g;
      }
      case 1:
        g.set_tenant("refused-" + std::to_string(n));
        g.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kNotFound));
        g.mutable_error()->set_message("no budget " + std::to_string(n));
        if (n % 2 != 0) g.mutable_error()->set_owner("owner-" + std::to_string(n));
        return g;
      default:
        g.set_tenant("restored-" + std::to_string(n));
        g.set_granted(uint64_t{1} << 40);
        g.set_lease_ttl_ms(1234 + n);
        g.set_next_sync_ms(56 + n);
        g.mutable_safe_share()->set_capacity(1.0 / 3 + n);
        g.mutable_safe_share()->set_refill_per_second(0.1 * n);
        g.mutable_safe_share()->set_success_credit(0.7);
        g.mutable_safe_share()->set_request_credit(0.01 * n);
        g.set_bucket_tokens(2.5 * n);
        g.set_capacity(99.5);
        g.set_active_instances(static_cast<uint32_t>(n));
        g.set_mode(n % 2 == 0 ? v1::MODE_SHADOW : v1::MODE_ENFORCE);
        return g;
    }
  }

  PolicyTable policies_;
  std::vector<RefPtr<Tenant>> budgets_ = {Budget("t0"), Budget("t1"), Budget("t2")};
};

TEST_F(GrantRecordTest, WritesWhatEachKindRecordedThroughChangesOfKindAndMoves) {
  std::mt19937 rng(20);
  GrantRecords records;
  std::vector<std::pair<int, int>> model;  // (kind, n) of each record
  for (int step = 0; step < 5000; ++step) {
    const size_t size = std::uniform_int_distribution<size_t>(0, 6)(rng);
    records.resize(size);  // moves the records when it grows past its inline one
    model.resize(size, {-1, 0});
    for (size_t i = 0; i < size; ++i) {
      if (model[i].first >= 0 && rng() % 3 != 0) continue;  // left as it was
      const int kind = static_cast<int>(rng() % 3);
      const int n = static_cast<int>(rng() % 1000);
      Set(records[i], kind, n);
      model[i] = {kind, n};
    }
    if (step % 7 == 0) {  // moved whole, as a record is when the vector is
      GrantRecords moved = std::move(records);
      records = std::move(moved);
    }
    v1::SyncResponse written;
    WriteResponse(records, &written);
    ASSERT_EQ(written.tenants_size(), static_cast<int>(size));
    for (size_t i = 0; i < size; ++i) {
      ASSERT_EQ(written.tenants(static_cast<int>(i)).SerializeAsString(),
                Expected(model[i].first, model[i].second).SerializeAsString())
          << "step " << step << " record " << i << " kind " << model[i].first;
    }
  }
}

// A response cleared by ClearForReuse and written again (as each Sync on a thread does) holds
// exactly what a fresh response would: the safe_share submessages it keeps for the next one
// carry nothing over, and an entry without a grant (a refusal) gets none of them.
TEST_F(GrantRecordTest, AReusedResponseWritesTheSameBytesAsAFreshOne) {
  std::mt19937 rng(21);
  GrantRecords records;
  v1::SyncResponse reused;
  for (int step = 0; step < 3000; ++step) {
    const size_t size = std::uniform_int_distribution<size_t>(0, 10)(rng);
    records.resize(size);
    for (size_t i = 0; i < size; ++i) {
      Set(records[i], static_cast<int>(rng() % 3), static_cast<int>(rng() % 1000));
    }
    if (step % 5 == 0) {  // a stray entry, with a field this build does not know
      v1::SafeShare* stray = reused.add_tenants()->mutable_safe_share();
      stray->set_capacity(-1);
      stray->GetReflection()->MutableUnknownFields(stray)->AddVarint(99, 1);
    }
    ClearForReuse(&reused);
    ASSERT_EQ(reused.ByteSizeLong(), 0u) << "step " << step;
    ASSERT_LE(KeptSafeSharesOnThisThread(), kKeptSafeShares);
    WriteResponse(records, &reused);
    v1::SyncResponse fresh;
    WriteResponse(records, &fresh);
    ASSERT_EQ(reused.SerializeAsString(), fresh.SerializeAsString()) << "step " << step;
    for (const v1::TenantGrant& g : reused.tenants()) {
      ASSERT_EQ(g.has_safe_share(), !g.has_error()) << "step " << step;
    }
  }
}

TEST_F(GrantRecordTest, ClearForReuseKeepsEachThreadsSafeSharesForItsNextResponse) {
  std::thread([this] {  // a thread of its own: it starts with none kept
    GrantRecords records(8);
    for (int i = 0; i < 8; ++i) Set(records[i], 0, i);
    v1::SyncResponse response;
    WriteResponse(records, &response);
    std::set<const v1::SafeShare*> made;
    for (const v1::TenantGrant& g : response.tenants()) made.insert(&g.safe_share());
    ASSERT_EQ(made.size(), 8u);
    EXPECT_EQ(KeptSafeSharesOnThisThread(), 0u);

    ClearForReuse(&response);
    EXPECT_EQ(KeptSafeSharesOnThisThread(), 8u);
    WriteResponse(records, &response);  // takes them back: nothing allocated
    std::set<const v1::SafeShare*> used;
    for (const v1::TenantGrant& g : response.tenants()) used.insert(&g.safe_share());
    EXPECT_EQ(used, made);
    EXPECT_EQ(KeptSafeSharesOnThisThread(), 0u);

    // A response of more grants than a thread keeps: the rest are freed with it.
    GrantRecords many(100);
    for (int i = 0; i < 100; ++i) Set(many[i], 2, i);
    ClearForReuse(&response);
    WriteResponse(many, &response);
    ClearForReuse(&response);
    EXPECT_EQ(KeptSafeSharesOnThisThread(), kKeptSafeShares);
  }).join();
  // Another thread's are not this one's.
  std::thread([] { EXPECT_EQ(KeptSafeSharesOnThisThread(), 0u); }).join();
}

TEST_F(GrantRecordTest, ASnapshotsCopyWritesTheSameBytesAsTheRecordsItWasWrittenFrom) {
  GrantRecords records(4);
  Set(records[0], 0, 5);
  Set(records[1], 1, 6);
  Set(records[2], 2, 7);
  Set(records[3], 0, 8);
  v1::SyncResponse sent;
  WriteResponse(records, &sent);
  GrantRecords read;
  ReadResponse(sent, &read);
  v1::SyncResponse replayed;
  WriteResponse(read, &replayed);
  EXPECT_EQ(replayed.SerializeAsString(), sent.SerializeAsString());
  EXPECT_EQ(read[0].budget(), nullptr);  // kept whole: a later build may compute otherwise
  EXPECT_EQ(read[0].tenant(), "t2");
}

TEST_F(GrantRecordTest, AGrantHoldsItsBudgetAndPolicyUntilTheRecordChanges) {
  RefPtr<Tenant> budget = Budget("kept");
  PolicyRef policy = Policy(77);
  const Tenant* raw = budget.get();
  GrantRecord r;
  EXPECT_EQ(r.tenant(), "");
  r.SetGrantedBy(budget, policy);
  budget.reset();  // deleted from the core's table: the record still names it
  policy.reset();
  EXPECT_EQ(r.budget(), raw);
  EXPECT_EQ(r.tenant(), "kept");
  EXPECT_EQ(r.policy()->capacity, 77);
  EXPECT_EQ(r.cold(), nullptr);
  r.Refuse("kept", static_cast<int>(absl::StatusCode::kUnavailable), "deleted");
  EXPECT_EQ(r.budget(), nullptr);
  EXPECT_EQ(r.policy(), nullptr);
  EXPECT_EQ(r.cold()->message, "deleted");
  EXPECT_EQ(r.tenant(), "kept");
}

TEST_F(GrantRecordTest, ARecordNeverSetWritesAnErrorNotAGrant) {
  GrantRecords records(1);
  v1::SyncResponse written;
  WriteResponse(records, &written);
  ASSERT_EQ(written.tenants_size(), 1);
  EXPECT_EQ(written.tenants(0).error().code(), static_cast<int>(absl::StatusCode::kInternal));
  EXPECT_EQ(written.tenants(0).granted(), 0u);
}

}  // namespace
}  // namespace retrybudget
