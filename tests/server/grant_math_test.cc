// Table tests of the pure accounting arithmetic (server/grant_math.h), the counter table
// (server/cumulative_counters.h) and the stable fingerprint (server/replay_cache.h).
#include "server/grant_math.h"

#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/cumulative_counters.h"
#include "server/replay_cache.h"

namespace retrybudget {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

TEST(GrantForTest, Table) {
  struct Row {
    uint64_t want, want_sum;
    double level;
    uint64_t grant;
  };
  for (const Row& r : std::vector<Row>{
           {0, 0, 100, 0},        // wants nothing
           {10, 10, 0.5, 0},      // less than one whole token
           {10, 10, 100, 10},     // enough for everyone
           {10, 30, 30, 10},      // exactly enough
           {10, 40, 20, 5},       // proportional share
           {1, 1000, 10, 1},      // at least one while any is left
           {10, 3, 100, 10},      // want_sum below want (a stale sum): capped by want
           {30, 60, 10.4, 5},     // rounded to nearest
           {5, kMax, 1e6, 1},     // a huge want_sum: still at least one
       }) {
    EXPECT_EQ(GrantFor(r.want, r.want_sum, r.level), r.grant)
        << r.want << " of " << r.want_sum << " at " << r.level;
  }
}

TEST(SafeShareTest, Table) {
  struct Row {
    double capacity, refill;
    uint64_t fleet;
    double share_capacity, share_refill;
  };
  for (const Row& r : std::vector<Row>{
           {100, 10, 1, 100, 10}, {100, 10, 4, 25, 2.5}, {100, 10, 0, 100, 10}}) {
    const SafeShareOf s = SafeShare(r.capacity, r.refill, r.fleet);
    EXPECT_DOUBLE_EQ(s.capacity, r.share_capacity);
    EXPECT_DOUBLE_EQ(s.refill_per_second, r.share_refill);
  }
}

TEST(DryNextSyncTest, Table) {
  struct Row {
    double inflow;
    uint64_t want, want_sum;
    absl::Duration expected;
  };
  const absl::Duration normal = absl::Seconds(1), min = absl::Milliseconds(10);
  for (const Row& r : std::vector<Row>{
           {0, 10, 10, absl::Milliseconds(250)},     // no inflow: the dry cap
           {100, 10, 10, absl::Milliseconds(10)},    // 100 tokens/s: the floor
           {10, 10, 10, absl::Milliseconds(100)},    // one token per 100 ms
           {10, 10, 100, absl::Milliseconds(250)},   // a tenth of it: capped
       }) {
    EXPECT_EQ(DryNextSync(r.inflow, r.want, r.want_sum, normal, min), r.expected)
        << r.inflow << " " << r.want << "/" << r.want_sum;
  }
}

TEST(ClusterReservationBlockTest, Table) {
  struct Row {
    double capacity, grant_rate, inflow;
    uint64_t block;
  } rows[] = {
      {800, 0, 20, 100},           // idle: an eighth of the capacity
      {50, 20, 20, 40},            // busy: two seconds of grants
      {50, 5000, 20, 40},          // a burst counts only at the inflow it can keep up
      {50, 10, 0, 8},              // no inflow: the floor
      {10, 1, 1, 8},               // at least 8
      {8e6, 0, 0, 1'000'000},      // at most 1e6
      {50, 1e9, 1e9, 1'000'000},   // at most 1e6
  };
  for (const Row& r : rows) {
    EXPECT_EQ(ClusterReservationBlock(r.capacity, r.grant_rate, r.inflow, absl::Seconds(2)),
              r.block)
        << r.capacity << " " << r.grant_rate << " " << r.inflow;
  }
}

TEST(SaturatingAddTest, Table) {
  EXPECT_EQ(SaturatingAdd(1, 2), 3u);
  EXPECT_EQ(SaturatingAdd(kMax, 1), kMax);
  EXPECT_EQ(SaturatingAdd(kMax - 1, 1), kMax);
  EXPECT_EQ(SaturatingAdd(kMax / 2 + 1, kMax / 2 + 1), kMax);
}

CumulativeCounters C(uint64_t received, uint64_t spent = 0, uint64_t returned = 0,
                     uint64_t fallback = 0, uint64_t successes = 0, uint64_t refunded = 0,
                     uint64_t fallback_refunded = 0) {
  return {.successes = successes, .retries_spent = spent, .tokens_returned = returned,
          .tokens_received = received, .fallback_spent = fallback,
          .retries_refunded = refunded, .fallback_refunded = fallback_refunded};
}

TEST(LedgerTest, BaselineHoldsAndCreditsNothing) {
  LedgerEntry e = Baseline(C(50, 10, 5));
  EXPECT_EQ(e.outstanding, 0u);
  EXPECT_EQ(e.expected_received, 50u);
  EXPECT_EQ(CountedHoldings(e), 0u);  // it claims 35, none granted here
}

// Each row: the history of one record (grants and reports in order) and what the last report
// credits. `grant` before `report` in a step.
TEST(LedgerTest, Table) {
  struct Step {
    uint64_t grant;
    CumulativeCounters report;
  };
  struct Row {
    std::string name;
    CumulativeCounters base;
    std::vector<Step> steps;
    uint64_t credited_back, uncredited, reclaimed, outstanding, held;
  };
  for (const Row& r : std::vector<Row>{
           // A client whose whole history is here: exact.
           {"returns what it got", C(0), {{10, C(10, 0, 10)}}, 10, 0, 0, 0, 0},
           {"spends some, returns the rest", C(0), {{10, C(10, 4, 6)}}, 6, 0, 0, 0, 0},
           {"keeps some", C(0), {{10, C(10, 4, 2)}}, 2, 0, 0, 4, 4},
           {"lost response is reclaimed", C(0), {{10, C(0)}}, 10, 0, 10, 0, 0},
           {"partly lost", C(0), {{10, C(10, 3)}, {7, C(10, 3)}}, 7, 0, 7, 7, 7},
           {"fallback spending takes nothing", C(0), {{10, C(10, 5, 10, 5)}}, 10, 0, 0, 0, 0},
           // Tokens from elsewhere: returns beyond this server's grants credit nothing.
           {"returns tokens of a previous life", C(50), {{0, C(50, 0, 50)}}, 0, 50, 0, 0, 0},
           {"spends old tokens first, returns new", C(50), {{10, C(60, 10, 10)}}, 0, 10, 0, 0, 0},
           {"mixed", C(50), {{10, C(60, 0, 55)}}, 10, 45, 0, 0, 0},
           {"claims holdings", C(1'000'000), {{1, C(1'000'001)}}, 0, 0, 0, 1, 1},
           // Refunds: a token given back after a report counted it as spent is the client's
           // again; returned, it goes back into the bucket.
           {"a refund after a report is returned in full", C(0),
            {{10, C(10, 3)}, {0, C(10, 3, 8, 0, 0, 1)}}, 8, 0, 0, 0, 0},
           {"a refund held again counts as held", C(0),
            {{10, C(10, 3)}, {0, C(10, 3, 0, 0, 0, 1)}}, 0, 0, 0, 8, 8},
           {"a refunded token spent again is charged once", C(0),
            {{10, C(10, 3)}, {0, C(10, 4, 0, 0, 0, 1)}, {0, C(10, 4, 7, 0, 0, 1)}}, 7, 0, 0, 0,
            0},
           {"refunds of a previous life's tokens credit nothing", C(50, 10),
            {{0, C(50, 10, 40, 0, 0, 10)}}, 0, 40, 0, 0, 0},
           {"refunds give back at most what this server granted", C(50, 10),
            {{10, C(60, 20)}, {0, C(60, 20, 50, 0, 0, 10)}}, 10, 40, 0, 0, 0},
           {"fallback refunds move no lease token", C(0), {{10, C(10, 5, 10, 5, 0, 2, 2)}}, 10,
            0, 0, 0, 0},
       }) {
    LedgerEntry e = Baseline(r.base);
    ReportEffect last;
    for (const Step& s : r.steps) {
      RecordGrant(e, s.grant);
      last = ApplyReport(e, s.report);
    }
    EXPECT_EQ(last.credited_back, r.credited_back) << r.name;
    EXPECT_EQ(last.uncredited, r.uncredited) << r.name;
    EXPECT_EQ(last.reclaimed, r.reclaimed) << r.name;
    EXPECT_EQ(e.outstanding, r.outstanding) << r.name;
    EXPECT_EQ(CountedHoldings(e), r.held) << r.name;
  }
}

// Every field of TenantSync is a listed cumulative counter, the tenant or the want: a counter
// added to the proto without a row in kCumulativeCounters fails here (and would otherwise be
// missing from the fingerprint, the checks and the snapshot).
TEST(CumulativeCountersTest, CoverEveryFieldOfTenantSyncAndInstanceTenantState) {
  const auto* sync = v1::TenantSync::descriptor();
  for (int i = 0; i < sync->field_count(); ++i) {
    const std::string name = sync->field(i)->name();
    if (name == "tenant" || name == "want") continue;
    bool listed = false;
    for (const CounterField& f : kCumulativeCounters) listed |= f.name == name;
    EXPECT_TRUE(listed) << "TenantSync." << name << " is not in kCumulativeCounters";
  }
  const auto* state = v1::InstanceTenantState::descriptor();
  for (const CounterField& f : kCumulativeCounters) {
    EXPECT_NE(sync->FindFieldByName(std::string(f.name)), nullptr) << f.name;
    EXPECT_NE(state->FindFieldByName(std::string(f.name)), nullptr) << f.name;
  }
  // Each row reads and writes its own field.
  v1::TenantSync sent;
  v1::InstanceTenantState saved;
  const auto* reflection = sent.GetReflection();
  uint64_t value = 1;
  for (const CounterField& f : kCumulativeCounters) {
    reflection->SetUInt64(&sent, sync->FindFieldByName(std::string(f.name)), value++);
  }
  SaveCounters(CountersOf(sent), &saved);
  value = 1;
  for (const CounterField& f : kCumulativeCounters) {
    EXPECT_EQ(saved.GetReflection()->GetUInt64(saved, state->FindFieldByName(std::string(f.name))),
              value++)
        << f.name;
  }
}

TEST(FingerprintTest, IsFixedAcrossProcessesAndCoversEveryField) {
  v1::SyncRequest r;
  r.set_instance_id("i");
  r.set_seq(7);
  v1::TenantSync* t = r.add_tenants();
  t->set_tenant("t");
  t->set_want(3);
  // A constant: the same in every process and build (a snapshot keeps it).
  EXPECT_EQ(Fingerprint(r), Fingerprint(r));
  const uint64_t base = Fingerprint(r);
  EXPECT_EQ(StableHash("abc"), StableHash("abc"));
  EXPECT_NE(StableHash("ab"), StableHash("abc"));
  // Every field changes it.
  const auto* d = v1::TenantSync::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    v1::SyncRequest changed = r;
    v1::TenantSync* ct = changed.mutable_tenants(0);
    const auto* field = d->field(i);
    if (field->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      ct->GetReflection()->SetString(ct, field, "u");
    } else {
      ct->GetReflection()->SetUInt64(ct, field, 99);
    }
    EXPECT_NE(Fingerprint(changed), base) << field->name();
  }
  v1::SyncRequest final_request = r;
  final_request.set_final(true);
  EXPECT_NE(Fingerprint(final_request), base);
}

TEST(FingerprintTest, KnownValue) {
  // Pinned: a change of the hash would make every snapshot's fingerprint stale.
  v1::SyncRequest r;
  r.set_instance_id("pinned");
  r.set_seq(1);
  r.add_tenants()->set_tenant("t");
  EXPECT_EQ(StableHash("pinned"), 18315277304480523026u) << std::hex << StableHash("pinned");
  EXPECT_EQ(Fingerprint(r), 17687164385488340745u) << std::hex << Fingerprint(r);
  // Version 1 stays as it was: snapshots written before version 2 hold it.
  EXPECT_EQ(FingerprintV1(r), 4777980825347592404u) << std::hex << FingerprintV1(r);
}

TEST(FingerprintTest, StringsOfEveryLengthAndOneChangedByteGiveDifferentValues) {
  // The word hasher reads strings 8 bytes at a time and the last word zero-filled: lengths
  // around a word's edge, and a change of any byte, must all differ.
  std::set<uint64_t> seen;
  std::string id;
  for (int length = 1; length <= 40; ++length) {
    id.push_back(static_cast<char>('a' + length % 26));
    v1::SyncRequest r;
    r.set_instance_id(id);
    r.set_seq(1);
    EXPECT_TRUE(seen.insert(Fingerprint(r)).second) << "length " << length;
    for (int at = 0; at < length; ++at) {
      v1::SyncRequest changed = r;
      (*changed.mutable_instance_id())[at] ^= 1;
      EXPECT_NE(Fingerprint(changed), Fingerprint(r)) << "length " << length << " byte " << at;
    }
  }
  // A trailing zero byte is not the zero fill.
  v1::SyncRequest a, b;
  a.set_instance_id(std::string("abc", 3));
  b.set_instance_id(std::string("abc\0", 4));
  EXPECT_NE(Fingerprint(a), Fingerprint(b));
}

}  // namespace
}  // namespace retrybudget
