// What the servers of a real cluster (3 etcd nodes, 3 retry-budget-server processes, started by
// tests/support/test_launcher.h) keep in etcd: how few writes a busy tenant costs, and that a
// budget deleted or created through the admin API is so in etcd too, for its next owner.
// Every wait is bounded; no speed is asserted (the write rate is counted per Sync, and printed).
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/cluster_keys.h"
#include "cluster/shard_map.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "retrybudget/v1/state.pb.h"
#include "tests/cluster/wait_for.h"
#include "tests/support/server_connection.h"
#include "tests/support/sync_spender.h"
#include "tests/support/test_launcher.h"

namespace retrybudget::testing {
namespace {

constexpr int kShards = 8;
constexpr double kCapacity = 50;
constexpr double kRefill = 20;

class ClusterStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ClusterUnderTest>> cluster =
        ClusterUnderTest::Start(TimeBoundClusterOptions({.etcd_binary = RETRYBUDGET_ETCD_BIN,
                                                         .server_binary = RETRYBUDGET_SERVER_BIN,
                                                         .shards = kShards,
                                                         .capacity = kCapacity,
                                                         .refill_per_second = kRefill,
                                                         .server_flags = {"--shutdown_grace=0s"}}));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    // Balanced: every shard owned, each server owning 2 or 3 (no ownership write is left).
    ASSERT_TRUE(WaitFor(
        [&] {
          int owned[3] = {0, 0, 0};
          for (int s = 0; s < kShards; ++s) {
            absl::StatusOr<int> owner = cluster_->OwnerOf(TenantOfShard(s));
            if (!owner.ok()) return false;
            ++owned[*owner];
          }
          for (int n : owned) {
            if (n < kShards / 3) return false;
          }
          return true;
        },
        absl::Seconds(20)));
  }

  // A tenant name that falls into `shard`.
  static std::string TenantOfShard(int shard) {
    const cluster::ShardMap map(kShards);
    for (int i = 0;; ++i) {
      std::string name = absl::StrCat("shard-probe-", i);
      if (map.ShardOf(name) == shard) return name;
    }
  }

  std::string StateKey(const std::string& tenant) const {
    return absl::StrCat(cluster::ShardStatePrefix(cluster_->etcd_prefix(),
                                                  cluster::ShardMap(kShards).ShardOf(tenant)),
                        "t/", tenant);
  }
  std::string PolicyKey(const std::string& tenant) const {
    return absl::StrCat(cluster_->etcd_prefix(), "/policies/", tenant);
  }

  // The tenant's state as etcd has it; nullopt when there is no key.
  std::optional<v1::TenantState> StoredState(const std::string& tenant) {
    absl::StatusOr<etcd::RangeResult> r = cluster_->etcd_client().Get(StateKey(tenant));
    if (!r.ok() || r->kvs.empty()) return std::nullopt;
    v1::TenantState state;
    if (!state.ParseFromString(r->kvs[0].value)) return std::nullopt;
    return state;
  }

  // Both stubs of server `server`, each call within `deadline` (short for the reads polled
  // while a shard moves).
  ServerConnection Connect(int server, absl::Duration deadline = absl::Seconds(10)) {
    ServerConnection c = ServerConnection::Create(cluster_->server(server).address(),
                                                  grpc::InsecureChannelCredentials());
    c.deadline = deadline;
    return c;
  }

  std::unique_ptr<ClusterUnderTest> cluster_;
};

TEST_F(ClusterStateTest, BusyTenantCostsAtMostTenEtcdWritesPerThousandSyncs) {
  const std::string tenant = "checkout";
  absl::StatusOr<int> owner = cluster_->OwnerOf(tenant);
  ASSERT_TRUE(owner.ok()) << owner.status();
  ServerConnection rpc = Connect(*owner);
  SyncSpender spender({tenant}, {.instance_id = "spender-1"});
  // Syncs on a fixed schedule, one every 5 ms (a tenant synced by a couple of busy workers); a
  // late Sync is caught up at once, so that the Syncs over the window do not depend on how loaded
  // the box is (unless a Sync takes more than 5 ms on average).
  absl::Time next = absl::Now();
  auto sync_on_schedule = [&] {
    const bool ok = spender.Sync(*rpc.budget).ok();
    next += absl::Milliseconds(5);
    const absl::Time now = absl::Now();
    if (next > now) absl::SleepFor(next - now);
    return ok;
  };
  // Steady state: the bucket drained, grants at the refill rate, reservations sized to it.
  for (int i = 0; i < 600; ++i) ASSERT_TRUE(sync_on_schedule());
  const uint64_t received0 = spender.received(tenant);

  // The writes follow the grants (the refill, 20/s) and time, not the Syncs.
  constexpr int kSyncs = 1200;
  absl::StatusOr<int64_t> rev0 = cluster_->EtcdRevision();
  ASSERT_TRUE(rev0.ok()) << rev0.status();
  const absl::Time start = absl::Now();
  for (int i = 0; i < kSyncs; ++i) ASSERT_TRUE(sync_on_schedule()) << "Sync " << i;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  absl::StatusOr<int64_t> rev1 = cluster_->EtcdRevision();
  ASSERT_TRUE(rev1.ok()) << rev1.status();
  const int64_t writes = *rev1 - *rev0;
  const double per_1000 = 1000.0 * static_cast<double>(writes) / kSyncs;
  std::printf(
      "%d Syncs in %.1f s, %llu tokens granted: %lld etcd writes (%.2f per 1,000 Syncs, "
      "%.2f per second)\n",
      kSyncs, seconds, static_cast<unsigned long long>(spender.received(tenant) - received0),
      static_cast<long long>(writes), per_1000, static_cast<double>(writes) / seconds);
  EXPECT_GT(spender.received(tenant), received0);  // busy: granted all along
  EXPECT_LE(per_1000, 10.0);
}

TEST_F(ClusterStateTest, DeletedBudgetStaysDeletedAfterItsOwnerIsKilled) {
  const std::string tenant = "ephemeral";
  absl::StatusOr<int> owner = cluster_->OwnerOf(tenant);
  ASSERT_TRUE(owner.ok()) << owner.status();
  ServerConnection rpc = Connect(*owner);
  v1::BudgetPolicy small;
  small.set_capacity(7);
  small.set_refill_per_second(1);
  const grpc::Status put = rpc.PutPolicy(tenant, small);
  ASSERT_TRUE(put.ok()) << put.error_message();
  SyncSpender spender({tenant}, {.instance_id = "spender-1"});
  ASSERT_TRUE(
      WaitFor([&] { return spender.Sync(*rpc.budget).ok() && spender.received(tenant) > 0; },
              absl::Seconds(2)));
  ASSERT_TRUE(WaitFor([&] { return StoredState(tenant).has_value(); }, absl::Seconds(5)));

  const grpc::Status deleted = rpc.DeleteBudget(tenant);
  ASSERT_TRUE(deleted.ok()) << deleted.error_message();
  EXPECT_FALSE(StoredState(tenant).has_value()) << "the state key outlived DeleteBudget";
  absl::StatusOr<etcd::RangeResult> policy = cluster_->etcd_client().Get(PolicyKey(tenant));
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_TRUE(policy->kvs.empty()) << "the admin policy outlived DeleteBudget";

  ASSERT_TRUE(cluster_->KillServer(*owner).ok());
  int next = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<int> o = cluster_->OwnerOf(tenant);
        if (!o.ok() || *o == *owner) return false;
        next = *o;
        return true;
      },
      absl::Seconds(10)));
  // Once the new owner has loaded the shard it answers for the tenant: no budget.
  grpc::Status got;
  v1::BudgetStatus budget;
  ASSERT_TRUE(WaitFor(
      [&] {
        budget.Clear();
        got = Connect(next, absl::Seconds(1)).GetBudget(tenant, &budget);
        return got.error_code() != grpc::StatusCode::UNAVAILABLE &&
               got.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
      },
      absl::Seconds(10)))
      << got.error_message();
  EXPECT_EQ(got.error_code(), grpc::StatusCode::NOT_FOUND)
      << got.error_message() << " " << budget.DebugString();
}

TEST_F(ClusterStateTest, BudgetCreatedByPutPolicyHasItsFirstBlockReservedInEtcd) {
  const std::string tenant = "new-by-policy";
  absl::StatusOr<int> owner = cluster_->OwnerOf(tenant);
  ASSERT_TRUE(owner.ok()) << owner.status();
  v1::BudgetPolicy policy;
  policy.set_capacity(800);
  policy.set_refill_per_second(10);
  const grpc::Status put = Connect(*owner).PutPolicy(tenant, policy);
  ASSERT_TRUE(put.ok()) << put.error_message();
  // No Sync yet: the reservation of its first block (800 / 8) is in etcd all the same.
  std::optional<v1::TenantState> state;
  EXPECT_TRUE(WaitFor(
      [&] {
        state = StoredState(tenant);
        return state.has_value() && state->grant_limit() >= 100;
      },
      absl::Seconds(5)))
      << (state.has_value() ? state->DebugString() : "no state in etcd");
}

TEST_F(ClusterStateTest, SigtermedOwnerHandsOverItsExactLevelNotItsReservation) {
  const std::string tenant = "handed-over";
  absl::StatusOr<int> owner = cluster_->OwnerOf(tenant);
  ASSERT_TRUE(owner.ok()) << owner.status();
  ServerConnection rpc = Connect(*owner);
  SyncSpender spender({tenant}, {.instance_id = "spender-1"});
  // A few grants, well inside the capacity, until etcd holds a reservation ahead of them.
  std::optional<v1::TenantState> state;
  ASSERT_TRUE(WaitFor(
      [&] {
        if (spender.received(tenant) < 20) spender.Sync(*rpc.budget);
        state = StoredState(tenant);
        return spender.received(tenant) >= 20 && state.has_value() &&
               state->grant_limit() > state->granted_total();
      },
      absl::Seconds(10)))
      << (state.has_value() ? state->DebugString() : "no state in etcd");

  // Another instance reports requests, would-be denials and retries allowed after its baseline:
  // the totals travel with the state.
  for (uint64_t seq : {1, 2}) {
    v1::SyncRequest report;
    report.set_instance_id("reporter-1");
    report.set_seq(seq);
    v1::TenantSync* t = report.add_tenants();
    t->set_tenant(tenant);
    t->set_requests(seq == 2 ? 12 : 0);
    t->set_shadow_denied(seq == 2 ? 3 : 0);
    v1::SyncResponse answer;
    const grpc::Status s = rpc.Sync(report, &answer);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_FALSE(answer.tenants(0).has_error()) << answer.DebugString();
  }

  // SIGTERM: the owner stops granting, writes the shard's state and hands it over. Nothing is
  // granted after that write, so nothing of the reservation ahead is left to count as spent.
  absl::StatusOr<int> stopped = cluster_->server(*owner).Stop(SIGTERM, absl::Seconds(10));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  state = StoredState(tenant);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->granted_total(), spender.received(tenant));
  EXPECT_EQ(state->grant_limit(), state->granted_total()) << state->DebugString();
  EXPECT_GT(state->level(), 0);
  EXPECT_EQ(state->requests_total(), 12u);
  EXPECT_EQ(state->shadow_denied_total(), 3u);

  // The next owner starts from that level (refill restarts at the takeover): not lower, as it
  // would be after a kill -9, when the whole reservation counts as granted.
  int next = -1;
  v1::BudgetStatus got;
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<int> o = cluster_->OwnerOf(tenant);
        if (!o.ok() || *o == *owner) return false;
        next = *o;
        return Connect(next, absl::Seconds(1)).GetBudget(tenant, &got).ok();
      },
      absl::Seconds(10)));
  std::printf("handed over at level %.3f (granted %llu); the next owner starts at %.3f\n",
              state->level(), static_cast<unsigned long long>(state->granted_total()),
              got.tokens());
  EXPECT_GE(got.tokens(), state->level() - 1e-9);
  EXPECT_EQ(got.granted_total(), state->granted_total());
  EXPECT_EQ(got.requests_total(), 12u);
  EXPECT_EQ(got.shadow_denied_total(), 3u);
}

}  // namespace
}  // namespace retrybudget::testing
