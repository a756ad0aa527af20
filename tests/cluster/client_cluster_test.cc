// End to end against a real cluster: 3 real retry-budget-server processes in cluster mode on a
// real 3-node etcd (tests/support/test_launcher.h), 3 shards (one per server once balanced),
// etcd lease TTL 2 s, client lease TTL 1 s.
//
//  * The real client library (BudgetClient::Create with target = every server) leases every
//    tenant through redirects, and its workers spend within each tenant's bound across a kill -9
//    and a SIGSTOP of an owner: what they spend from leases stays within
//    initial + refill * elapsed, what they spend in fallback within the fallback share.
//  * The client's channel to the target spreads its Syncs over the servers (round_robin), and
//    a tenant of the target's first address, SIGSTOPped, is leased by its new owner while that
//    server still sleeps.
//  * Raw Sync stubs replay an instance's old requests to a new owner after a takeover, and to a
//    server a shard moved away from and back to (a restarted process, and the same process after
//    a SIGSTOP): first contact each time, nothing credited twice, no holdings resurrected, every
//    token granted across the sequence within the bound.
//
// Real processes, wall-clock time: every wait is bounded and generous; no speed is asserted
// (the failover times are printed).
#include <grpcpp/grpcpp.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/cluster_keys.h"
#include "cluster/shard_map.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "retrybudget/v1/state.pb.h"
#include "tests/cluster/wait_for.h"
#include "tests/support/test_launcher.h"

namespace retrybudget::testing {
namespace {

constexpr int kShards = 3;
constexpr int kServers = 3;
constexpr absl::Duration kEtcdLeaseTtl = absl::Seconds(2);

// A tenant's policy for the client tests: capacity large against what a failover loses (the
// refill of the gap, a reservation ahead), so that a new owner that started from a full bucket
// or granted the old owner's reservation again would overshoot the bound by far.
struct Budget {
  double capacity = 100;
  double refill = 5;
  int64_t lease_ttl_ms = 1000;
};

std::string PolicyText(const Budget& b) {
  return absl::StrCat("default_policy { capacity: ", b.capacity, " refill_per_second: ", b.refill,
                      " success_credit: 0 lease_ttl_ms: ", b.lease_ttl_ms, " }\n");
}

// The first name of the form `<stem>-<n>` whose shard is `shard`.
std::string TenantInShard(const std::string& stem, int shard) {
  const cluster::ShardMap map(kShards);
  for (int n = 0;; ++n) {
    std::string name = absl::StrCat(stem, "-", n);
    if (map.ShardOf(name) == shard) return name;
  }
}

// The value of the counter or gauge `name` (without labels) in `registry`; nullopt if none.
std::optional<double> MetricValue(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name || family.metric.empty()) continue;
    return family.type == prometheus::MetricType::Counter ? family.metric[0].counter.value
                                                          : family.metric[0].gauge.value;
  }
  return std::nullopt;
}

// Tokens a Sync response grants: none when it is stale (it then carries no entries).
uint64_t Granted(const v1::SyncResponse& response) {
  uint64_t granted = 0;
  for (const v1::TenantGrant& g : response.tenants()) granted += g.granted();
  return granted;
}

class ClusterFixture : public ::testing::Test {
 protected:
  // Starts etcd and the servers with `budget` as every tenant's policy, and waits until the
  // shards are balanced (each server owns one).
  void StartCluster(const Budget& budget) {
    auto cluster = ClusterUnderTest::Start(
        {.etcd = {.etcd_binary = RETRYBUDGET_ETCD_BIN},
         .servers = kServers,
         .server_binary = RETRYBUDGET_SERVER_BIN,
         .server_flags = {"--shutdown_grace=0s", "--log_level=warn"},
         .policy = PolicyText(budget),
         .shards = kShards,
         .lease_ttl = kEtcdLeaseTtl});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    for (int s = 0; s < kShards; ++s) shard_tenant_[s] = TenantInShard("tenant", s);
    ASSERT_NO_FATAL_FAILURE(WaitBalanced());
    for (const auto& [shard, tenant] : shard_tenant_) first_owner_[tenant] = OwnerIndex(tenant);
  }

  // Every shard owned, by a different server each.
  void WaitBalanced() {
    std::string seen;
    ASSERT_TRUE(WaitFor(
        [&] {
          std::set<int> owners;
          seen.clear();
          for (const auto& [shard, tenant] : shard_tenant_) {
            absl::StatusOr<int> owner = cluster_->OwnerOf(tenant);
            absl::StrAppend(&seen, " shard ", shard, ": ",
                            owner.ok() ? absl::StrCat(*owner) : owner.status().ToString());
            if (!owner.ok()) return false;
            owners.insert(*owner);
          }
          return static_cast<int>(owners.size()) == kShards;
        },
        absl::Seconds(20)))
        << "shards not balanced over the servers:" << seen;
  }

  // The tenant's state as its owner last wrote it to etcd; nullopt when there is none.
  std::optional<v1::TenantState> StoredState(const std::string& tenant) {
    const int shard = cluster::ShardMap(kShards).ShardOf(tenant);
    auto range = cluster_->etcd_client().GetPrefix(
        cluster::ShardStatePrefix(cluster_->etcd_prefix(), shard));
    if (!range.ok()) return std::nullopt;
    for (const auto& kv : range->kvs) {
      v1::TenantState state;
      if (state.ParseFromString(kv.value) && state.tenant() == tenant) return state;
    }
    return std::nullopt;
  }

  int OwnerIndex(const std::string& tenant) {
    absl::StatusOr<int> owner = cluster_->OwnerOf(tenant);
    return owner.ok() ? *owner : -1;
  }

  std::unique_ptr<v1::RetryBudgetService::Stub> BudgetStub(int server) {
    return v1::RetryBudgetService::NewStub(grpc::CreateChannel(cluster_->server(server).address(),
                                                               grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<v1::BudgetAdminService::Stub> AdminStub(int server) {
    return v1::BudgetAdminService::NewStub(grpc::CreateChannel(cluster_->server(server).address(),
                                                               grpc::InsecureChannelCredentials()));
  }

  std::unique_ptr<ClusterUnderTest> cluster_;
  std::map<int, std::string> shard_tenant_;  // one tenant per shard
  std::map<std::string, int> first_owner_;   // tenant -> its owner once balanced
};

// ---------------------------------------------------------------------------------------------
// The real client library against the real cluster.
// ---------------------------------------------------------------------------------------------

// A worker thread spending one tenant's tokens as fast as TryAcquire allows, counting what it
// was allowed; and a record of the tenant's modes, sampled by the test.
struct Spender {
  TenantBudget* budget = nullptr;
  std::atomic<uint64_t> allowed{0};
  std::thread thread;
};

// How often the test saw a tenant in each mode.
struct ModeCounts {
  std::map<BudgetMode, int> samples;
  int Of(BudgetMode m) const {
    auto it = samples.find(m);
    return it == samples.end() ? 0 : it->second;
  }
};

class ClientClusterTest : public ClusterFixture {
 protected:
  void StartClient() {
    ClientOptions options;
    options.target = cluster_->target();
    options.instance_id = "client-cluster-test";
    options.metrics_registry = &registry_;
    auto client = BudgetClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    started_ = absl::Now();
    for (const auto& [shard, tenant] : shard_tenant_) {
      auto budget = client_->Tenant(tenant);
      ASSERT_TRUE(budget.ok()) << budget.status();
      auto spender = std::make_unique<Spender>();
      spender->budget = *budget;
      spenders_[tenant] = std::move(spender);
    }
    for (auto& [tenant, spender] : spenders_) {
      Spender* s = spender.get();
      s->thread = std::thread([this, s] {
        while (!stop_.load()) {
          if (s->budget->TryAcquire()) {
            s->allowed.fetch_add(1);
          } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
      });
    }
  }

  void StopSpending() {
    stop_ = true;
    for (auto& [tenant, spender] : spenders_) {
      if (spender->thread.joinable()) spender->thread.join();
    }
    stopped_ = absl::Now();
  }

  void TearDown() override {
    StopSpending();
    client_.reset();
  }

  // Every tenant on a lease from its owner.
  bool AllLeased() {
    for (const auto& [tenant, spender] : spenders_) {
      const TenantStats stats = spender->budget->Stats();
      if (stats.mode != BudgetMode::kLease || stats.tokens_received == 0) return false;
    }
    return true;
  }

  double Redirects() {
    return MetricValue(registry_, "retry_budget_client_redirects_total").value_or(0);
  }

  // The bound of what the workers spent from leases over the run, for `budget`.
  double LeaseBound(const Budget& budget) const {
    return budget.capacity + budget.refill * absl::ToDoubleSeconds(stopped_ - started_);
  }

  // One tenant's spending, printed and checked against its bounds: what it spent from leases
  // within LeaseBound, what it spent in fallback within one instance's share (the whole capacity
  // and refill) over `outage`. `role` is the tenant's part ("killed", "stopped" or empty),
  // `during` names the time `modes` were sampled in. Returns the tenant's stats.
  TenantStats ExpectWithinBounds(const Budget& budget, const std::string& tenant,
                                 absl::Duration outage, const std::string& role,
                                 const char* during, const ModeCounts& modes) {
    const TenantStats stats = spenders_.at(tenant)->budget->Stats();
    const uint64_t leased = spenders_.at(tenant)->allowed.load() - stats.fallback_allowed;
    const double fallback_bound =
        budget.capacity + budget.refill * absl::ToDoubleSeconds(outage) + 1;
    std::printf(
        "%s (server %d%s): spent %llu from leases (bound %.0f), %llu in fallback "
        "(bound %.0f); modes %s: lease %d, no_lease %d, fallback %d\n",
        tenant.c_str(), first_owner_[tenant], role.empty() ? "" : (", " + role).c_str(),
        static_cast<unsigned long long>(leased), LeaseBound(budget),
        static_cast<unsigned long long>(stats.fallback_allowed), fallback_bound, during,
        modes.Of(BudgetMode::kLease), modes.Of(BudgetMode::kNoLease),
        modes.Of(BudgetMode::kFallback));
    EXPECT_LE(static_cast<double>(leased), LeaseBound(budget)) << tenant;
    EXPECT_LE(static_cast<double>(stats.fallback_allowed), fallback_bound) << tenant;
    return stats;
  }

  prometheus::Registry registry_;
  std::unique_ptr<BudgetClient> client_;
  std::map<std::string, std::unique_ptr<Spender>> spenders_;
  std::atomic<bool> stop_{false};
  absl::Time started_;
  absl::Time stopped_;
};

// Mode samples of one tenant over a window.
TEST_F(ClientClusterTest, KillOfAnOwnerLeavesOtherTenantsOnLeasesAndEveryTenantWithinItsBound) {
  const Budget budget;
  ASSERT_NO_FATAL_FAILURE(StartCluster(budget));
  ASSERT_NO_FATAL_FAILURE(StartClient());

  // Every tenant gets leased, through redirects: a server the target's Syncs reach owns one of
  // the three shards and names the owners of the other two.
  ASSERT_TRUE(WaitFor([&] { return AllLeased(); }, absl::Seconds(10)))
      << "not every tenant leased within 10 s";
  const double redirects_at_lease = Redirects();
  std::printf("every tenant leased after %s, %.0f redirects\n",
              absl::FormatDuration(absl::Now() - started_).c_str(), redirects_at_lease);
  EXPECT_GE(redirects_at_lease, kShards - 1);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // steady state: spending the refill

  // kill -9 of server 0: the first address of the target, and the owner of one tenant.
  const int victim = 0;
  std::string victim_tenant;
  for (const auto& [shard, tenant] : shard_tenant_) {
    if (OwnerIndex(tenant) == victim) victim_tenant = tenant;
  }
  ASSERT_FALSE(victim_tenant.empty());
  std::map<std::string, uint64_t> received_at_kill;
  for (const auto& [tenant, spender] : spenders_) {
    received_at_kill[tenant] = spender->budget->Stats().tokens_received;
  }
  const std::optional<v1::TenantState> stored = StoredState(victim_tenant);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster_->KillServer(victim).ok());
  if (stored) {
    std::printf("%s in etcd at the kill: level %.1f, granted_total %llu, grant_limit %llu\n",
                victim_tenant.c_str(), stored->level(),
                static_cast<unsigned long long>(stored->granted_total()),
                static_cast<unsigned long long>(stored->grant_limit()));
  }

  // Sample every tenant's mode until the victim's tenant has a new owner, is on a lease from it
  // again (the new owner answered), and has been granted tokens again (the new owner counts the
  // old owner's reservations as granted, so the bucket may first have to refill them).
  std::map<std::string, ModeCounts> modes;
  std::optional<absl::Time> new_owner_at, fell_back_at, leased_again_at, tokens_again_at;
  int new_owner = -1;
  const bool recovered = WaitFor(
      [&] {
        const absl::Time now = absl::Now();
        for (const auto& [tenant, spender] : spenders_) {
          const TenantStats stats = spender->budget->Stats();
          ++modes[tenant].samples[stats.mode];
          if (tenant != victim_tenant) continue;
          if (!fell_back_at && stats.mode == BudgetMode::kFallback) fell_back_at = now;
          if (!new_owner_at) {
            new_owner = OwnerIndex(victim_tenant);
            if (new_owner >= 0 && new_owner != victim) new_owner_at = now;
          }
          if (new_owner_at && fell_back_at && !leased_again_at &&
              stats.mode == BudgetMode::kLease) {
            leased_again_at = now;
          }
          if (leased_again_at && stats.tokens_received > received_at_kill[tenant]) {
            tokens_again_at = now;
          }
        }
        return tokens_again_at.has_value();
      },
      absl::Seconds(30));
  ASSERT_TRUE(new_owner_at.has_value()) << "the killed server's shard has no new owner";
  ASSERT_TRUE(fell_back_at.has_value()) << "the victim's tenant never fell back";
  ASSERT_TRUE(leased_again_at.has_value()) << "the victim's tenant is not on a lease again";
  std::printf(
      "kill -9 of server %d: %s fell back after %s (its lease ran to expiry); new owner "
      "(server %d) in etcd after %s; on a lease from it %s after that, first tokens %s "
      "after that\n",
      victim, victim_tenant.c_str(), absl::FormatDuration(*fell_back_at - killed).c_str(),
      new_owner, absl::FormatDuration(*new_owner_at - killed).c_str(),
      absl::FormatDuration(*leased_again_at - *new_owner_at).c_str(),
      tokens_again_at ? absl::FormatDuration(*tokens_again_at - *new_owner_at).c_str() : "never");
  EXPECT_LT(*leased_again_at - *new_owner_at, absl::Seconds(10));
  EXPECT_TRUE(recovered) << "no tokens from the new owner within 30 s of the kill";

  // Steady again for a second, then stop and count.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double redirects_at_end = Redirects();
  StopSpending();
  const absl::Duration outage = *leased_again_at - killed;
  for (const auto& [tenant, spender] : spenders_) {
    const TenantStats stats =
        ExpectWithinBounds(budget, tenant, outage, tenant == victim_tenant ? "killed" : "",
                           "after the kill", modes[tenant]);
    ASSERT_EQ(spender->allowed.load(), stats.retries_allowed) << tenant;
    if (tenant != victim_tenant) {
      // Unaffected: on leases from their own owners, granted all along. (At most a blip of
      // fallback: on a loaded machine a Sync starved of CPU past sync_timeout counts its
      // server as unreachable. The victim's tenant is in fallback for the whole outage, over
      // 10% of the samples.)
      int samples = 0;
      for (const auto& [mode, n] : modes[tenant].samples) samples += n;
      EXPECT_LE(modes[tenant].Of(BudgetMode::kFallback), samples / 20) << tenant;
      EXPECT_EQ(modes[tenant].Of(BudgetMode::kDenyFallback), 0) << tenant;
      EXPECT_GT(stats.tokens_received, received_at_kill[tenant]) << tenant;
    }
  }
  std::printf("redirects: %.0f when every tenant was first leased, %.0f at the end\n",
              redirects_at_lease, redirects_at_end);
}

TEST_F(ClientClusterTest, SigstoppedOwnerGrantsNothingLateAndEveryTenantStaysWithinItsBound) {
  const Budget budget;
  ASSERT_NO_FATAL_FAILURE(StartCluster(budget));
  ASSERT_NO_FATAL_FAILURE(StartClient());
  ASSERT_TRUE(WaitFor([&] { return AllLeased(); }, absl::Seconds(10)))
      << "not every tenant leased within 10 s";
  std::this_thread::sleep_for(std::chrono::seconds(1));

  // SIGSTOP of the owner of a tenant other than the target's first address, for twice the etcd
  // lease TTL.
  std::string victim_tenant;
  int victim = -1;
  for (const auto& [shard, tenant] : shard_tenant_) {
    const int owner = OwnerIndex(tenant);
    if (owner > 0) {
      victim_tenant = tenant;
      victim = owner;
      break;
    }
  }
  ASSERT_GE(victim, 0);
  ASSERT_TRUE(cluster_->PauseServer(victim).ok());
  const absl::Time paused = absl::Now();

  // Requests that reach the stopped server and wait in its socket until it wakes up (several,
  // each from an instance of its own: they race the server's own discovery that its lease is
  // gone).
  constexpr int kLate = 4;
  auto late_stub = BudgetStub(victim);
  std::vector<v1::SyncResponse> late_responses(kLate);
  std::vector<grpc::Status> late_statuses(kLate);
  std::vector<std::thread> late_syncs;
  for (int i = 0; i < kLate; ++i) {
    late_syncs.emplace_back([&, i] {
      v1::SyncRequest late;
      late.set_instance_id(absl::StrCat("late-instance-", i));
      late.set_seq(1);
      late.add_tenants()->set_tenant(victim_tenant);
      late.mutable_tenants(0)->set_want(50);
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(15)));
      late_statuses[i] = late_stub->Sync(&context, late, &late_responses[i]);
    });
  }

  std::map<std::string, ModeCounts> modes;
  std::optional<absl::Time> new_owner_at;
  WaitFor(
      [&] {
        for (const auto& [tenant, spender] : spenders_) {
          ++modes[tenant].samples[spender->budget->Stats().mode];
        }
        if (!new_owner_at) {
          const int owner = OwnerIndex(victim_tenant);
          if (owner >= 0 && owner != victim) new_owner_at = absl::Now();
        }
        return absl::Now() - paused >= 2 * kEtcdLeaseTtl;
      },
      absl::Seconds(30));
  ASSERT_TRUE(cluster_->ResumeServer(victim).ok());
  const absl::Time resumed = absl::Now();
  for (std::thread& t : late_syncs) t.join();
  ASSERT_TRUE(new_owner_at.has_value()) << "the stopped server's shard did not move";
  std::printf("SIGSTOP of server %d: new owner after %s, resumed after %s\n", victim,
              absl::FormatDuration(*new_owner_at - paused).c_str(),
              absl::FormatDuration(resumed - paused).c_str());

  // The stopped owner's lease ran out while it slept: the requests it finds on waking are
  // refused (UNAVAILABLE or FAILED_PRECONDITION) or cut to nothing.
  for (int i = 0; i < kLate; ++i) {
    ASSERT_TRUE(late_statuses[i].ok()) << late_statuses[i].error_message();
    EXPECT_EQ(Granted(late_responses[i]), 0u) << late_responses[i].DebugString();
  }

  // The victim's tenant is leased again (by whoever owns its shard now).
  const uint64_t received_at_resume = spenders_[victim_tenant]->budget->Stats().tokens_received;
  EXPECT_TRUE(WaitFor(
      [&] {
        const TenantStats stats = spenders_[victim_tenant]->budget->Stats();
        return stats.mode == BudgetMode::kLease && stats.tokens_received > received_at_resume;
      },
      absl::Seconds(20)));
  const absl::Duration outage = absl::Now() - paused;
  std::this_thread::sleep_for(std::chrono::seconds(1));
  StopSpending();
  for (const auto& [tenant, spender] : spenders_) {
    ExpectWithinBounds(budget, tenant, outage, tenant == victim_tenant ? "stopped" : "",
                       "while stopped", modes[tenant]);
  }
}

// The channel BudgetClient::Create() makes for a target of several servers spreads its Syncs
// over them (round_robin): a fleet's first Syncs do not all land on the target's first address.
TEST_F(ClientClusterTest, TheClientsChannelSpreadsItsSyncsOverTheTargetsServers) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Budget{}));
  ClientOptions options;
  options.target = cluster_->target();
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateBudgetChannel(options);
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto stub = v1::RetryBudgetService::NewStub(*channel);
  std::set<std::string> peers;
  uint64_t seq = 0;
  // Connections open one by one: a few rounds until every server has answered.
  WaitFor(
      [&] {
        v1::SyncRequest request;
        request.set_instance_id("spread-test");
        request.set_seq(++seq);
        request.add_tenants()->set_tenant(shard_tenant_[0]);
        grpc::ClientContext context;
        context.set_wait_for_ready(true);
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
        v1::SyncResponse response;
        if (stub->Sync(&context, request, &response).ok()) peers.insert(context.peer());
        return static_cast<int>(peers.size()) == kServers;
      },
      absl::Seconds(5));
  std::string seen;
  for (const std::string& peer : peers) absl::StrAppend(&seen, " ", peer);
  std::printf("%llu Syncs on one channel reached %zu servers:%s\n",
              static_cast<unsigned long long>(seq), peers.size(), seen.c_str());
  EXPECT_EQ(static_cast<int>(peers.size()), kServers) << seen;
}

// SIGSTOP of the target's first address while it owns a tenant: the tenant goes back to the
// target, whose Syncs to the hung server time out while those to the others are answered; the
// tenant is leased by the new owner while the paused server still sleeps (with pick_first every
// Sync of the target waited on the hung connection until the server resumed or keepalive closed
// it, 30 s).
TEST_F(ClientClusterTest, TenantOfAPausedFirstAddressIsLeasedByItsNewOwnerWhileTheServerSleeps) {
  const Budget budget;
  ASSERT_NO_FATAL_FAILURE(StartCluster(budget));
  ASSERT_NO_FATAL_FAILURE(StartClient());
  ASSERT_TRUE(WaitFor([&] { return AllLeased(); }, absl::Seconds(10)))
      << "not every tenant leased within 10 s";

  const int victim = 0;  // the first address of cluster_->target()
  ASSERT_EQ(cluster_->target().find(cluster_->server(victim).address()),
            std::string("ipv4:").size())
      << cluster_->target();
  std::string victim_tenant;
  for (const auto& [shard, tenant] : shard_tenant_) {
    if (OwnerIndex(tenant) == victim) victim_tenant = tenant;
  }
  ASSERT_FALSE(victim_tenant.empty()) << "server 0 owns no tenant";
  ASSERT_TRUE(cluster_->PauseServer(victim).ok());
  const absl::Time paused = absl::Now();

  int new_owner = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        new_owner = OwnerIndex(victim_tenant);
        return new_owner >= 0 && new_owner != victim;
      },
      absl::Seconds(15)))
      << "the paused server's shard did not move";
  const absl::Time new_owner_at = absl::Now();
  TenantBudget& victim_budget = *spenders_[victim_tenant]->budget;
  const uint64_t received_at_new_owner = victim_budget.Stats().tokens_received;

  // Bounded by the client's lease TTL + 5 s, with the server still paused.
  const absl::Duration bound = absl::Milliseconds(budget.lease_ttl_ms) + absl::Seconds(5);
  const bool leased_again = WaitFor(
      [&] {
        const TenantStats stats = victim_budget.Stats();
        return stats.mode == BudgetMode::kLease && stats.tokens_received > received_at_new_owner;
      },
      bound);
  const absl::Time leased_again_at = absl::Now();
  ASSERT_TRUE(cluster_->ResumeServer(victim).ok());
  std::printf("SIGSTOP of server %d (first address): new owner (server %d) after %s; %s on a "
              "lease from it %s after that\n",
              victim, new_owner, absl::FormatDuration(new_owner_at - paused).c_str(),
              victim_tenant.c_str(),
              leased_again ? absl::FormatDuration(leased_again_at - new_owner_at).c_str()
                           : "not yet");
  EXPECT_TRUE(leased_again) << victim_tenant << " not leased by server " << new_owner << " within "
                            << bound << " of its takeover, server " << victim << " still paused";
}

// ---------------------------------------------------------------------------------------------
// Replays across takeovers, with raw stubs.
// ---------------------------------------------------------------------------------------------

// No refill: every level is exact, and the bound over any run is the capacity.
constexpr Budget kReplayBudget = {.capacity = 40, .refill = 0, .lease_ttl_ms = 5000};

// One instance's history with a server: seq 1 takes `g1` tokens; seq 2 gives them all back
// (credited: the server granted them to this instance) and asks for 5 more. The two requests,
// as sent, for a replay.
struct History {
  v1::SyncRequest first;
  v1::SyncRequest second;
  uint64_t g1 = 0;
  uint64_t g2 = 0;
};

class ReplayClusterTest : public ClusterFixture {
 protected:
  // Plays History (below) of one instance with `server` for `tenant`, counting its grants and
  // returns.
  void PlayHistory(int server, const std::string& tenant, History* h) {
    h->first.set_instance_id("replayed-instance");
    h->first.set_seq(1);
    h->first.add_tenants()->set_tenant(tenant);
    h->first.mutable_tenants(0)->set_want(10);
    h->first = SyncUntilGranted(server, h->first, &h->g1);
    ASSERT_GT(h->g1, 0u);
    h->second = h->first;
    h->second.set_seq(h->first.seq() + 1);
    v1::TenantSync* t = h->second.mutable_tenants(0);
    t->set_tokens_received(h->g1);
    t->set_tokens_returned(h->g1);
    t->set_want(5);
    v1::SyncResponse response;
    ASSERT_TRUE(Sync(server, h->second, &response).ok());
    ASSERT_EQ(response.tenants_size(), 1);
    ASSERT_FALSE(response.tenants(0).has_error()) << response.DebugString();
    h->g2 = response.tenants(0).granted();
    granted_ += h->g2;
    returned_ += h->g1;
  }

  // One Sync of `request` to `server`; the response, or a failed status.
  grpc::Status Sync(int server, const v1::SyncRequest& request, v1::SyncResponse* response) {
    auto stub = BudgetStub(server);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    return stub->Sync(&context, request, response);
  }

  // The tenant's budget as `server` holds it; NOT_FOUND / FAILED_PRECONDITION until it does.
  absl::StatusOr<v1::BudgetStatus> GetBudget(int server, const std::string& tenant) {
    auto admin = AdminStub(server);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    v1::GetBudgetRequest request;
    request.set_tenant(tenant);
    v1::GetBudgetResponse response;
    const grpc::Status s = admin->GetBudget(&context, request, &response);
    if (!s.ok())
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    return response.budget();
  }

  // Waits until `server` has loaded the tenant's shard and holds its budget.
  absl::StatusOr<v1::BudgetStatus> WaitForBudget(int server, const std::string& tenant) {
    absl::StatusOr<v1::BudgetStatus> budget;
    WaitFor(
        [&] {
          budget = GetBudget(server, tenant);
          return budget.ok();
        },
        absl::Seconds(10));
    return budget;
  }

  // Sends `request` (seq bumped each time) to `server` until a grant arrives; the response of
  // that grant. Every grant is added to granted_.
  v1::SyncRequest SyncUntilGranted(int server, v1::SyncRequest request, uint64_t* granted) {
    *granted = 0;
    WaitFor(
        [&] {
          v1::SyncResponse response;
          if (!Sync(server, request, &response).ok() || response.tenants_size() != 1) {
            request.set_seq(request.seq() + 1);
            return false;
          }
          *granted = response.tenants(0).granted();
          granted_ += *granted;
          if (*granted > 0) return true;
          request.set_seq(request.seq() + 1);
          return false;
        },
        absl::Seconds(5));
    return request;
  }

  // A fresh instance takes every token `server` will still grant for `tenant`.
  uint64_t Drain(int server, const std::string& tenant, const std::string& instance) {
    v1::SyncRequest request;
    request.set_instance_id(instance);
    v1::TenantSync* t = request.add_tenants();
    t->set_tenant(tenant);
    uint64_t received = 0;
    int empty = 0;
    for (uint64_t seq = 1; empty < 5 && seq < 200; ++seq) {
      request.set_seq(seq);
      t->set_want(1000);
      t->set_tokens_received(received);
      t->set_retries_spent(received);
      v1::SyncResponse response;
      if (!Sync(server, request, &response).ok() || response.tenants_size() != 1) break;
      const uint64_t g = response.tenants(0).granted();
      received += g;
      empty = g == 0 ? empty + 1 : 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    granted_ += received;
    return received;
  }

  // Every token any server granted in the test, and the tokens given back and credited to an
  // instance that held them.
  uint64_t granted_ = 0;
  uint64_t returned_ = 0;
};


TEST_F(ReplayClusterTest, OldSyncReplayedToTheNewOwnerAfterAKillIsAFirstContact) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(kReplayBudget));
  const std::string tenant = shard_tenant_.at(1);
  const int old_owner = OwnerIndex(tenant);
  ASSERT_GE(old_owner, 0);

  History h;
  ASSERT_NO_FATAL_FAILURE(PlayHistory(old_owner, tenant, &h));
  absl::StatusOr<v1::BudgetStatus> before = GetBudget(old_owner, tenant);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->returned_total(), h.g1);
  // Another instance takes all that is left right before the kill: granted from reservations,
  // mostly after the level in etcd was last written (the new owner must count it as granted).
  v1::SyncRequest burst;
  burst.set_instance_id("burst-instance");
  burst.add_tenants()->set_tenant(tenant);
  uint64_t burst_granted = 0;
  WaitFor(
      [&] {
        burst.set_seq(burst.seq() + 1);
        burst.mutable_tenants(0)->set_tokens_received(burst_granted);
        burst.mutable_tenants(0)->set_retries_spent(burst_granted);
        burst.mutable_tenants(0)->set_want(1000);
        v1::SyncResponse r;
        if (Sync(old_owner, burst, &r).ok()) burst_granted += Granted(r);
        return static_cast<double>(burst_granted) >= before->tokens();
      },
      absl::Seconds(3));
  granted_ += burst_granted;

  // kill -9 of the owner; another server takes the shard over from etcd.
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster_->KillServer(old_owner).ok());
  // The state the dead owner wrote last: what the next owner loads (nobody writes the shard
  // until it is taken over).
  const std::optional<v1::TenantState> last_written = StoredState(tenant);
  ASSERT_TRUE(last_written.has_value());
  int new_owner = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        new_owner = OwnerIndex(tenant);
        return new_owner >= 0 && new_owner != old_owner;
      },
      kEtcdLeaseTtl + absl::Seconds(5)));
  absl::StatusOr<v1::BudgetStatus> adopted = WaitForBudget(new_owner, tenant);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  std::printf(
      "kill -9: server %d took the shard over after %s, level %.1f (the old owner's: "
      "%.1f at the kill; in etcd: level %.1f, granted_total %llu, grant_limit %llu)\n",
      new_owner, absl::FormatDuration(absl::Now() - killed).c_str(), adopted->tokens(),
      before->tokens() - static_cast<double>(burst_granted), last_written->level(),
      static_cast<unsigned long long>(last_written->granted_total()),
      static_cast<unsigned long long>(last_written->grant_limit()));
  // The new owner counts every reserved token as granted (the old owner may have granted up to
  // grant_limit after it wrote the level): never more than the old owner's level at the kill
  // (no refill).
  EXPECT_LE(adopted->tokens(),
            last_written->level() -
                static_cast<double>(last_written->grant_limit() - last_written->granted_total()));
  EXPECT_LE(adopted->tokens(), before->tokens() - static_cast<double>(burst_granted));

  // The second request replayed to the new owner: a baseline. Its return of g1 credits nothing,
  // and it is granted at most its want.
  v1::SyncResponse replayed;
  ASSERT_TRUE(Sync(new_owner, h.second, &replayed).ok());
  ASSERT_EQ(replayed.tenants_size(), 1);
  const uint64_t replay_granted = replayed.tenants(0).granted();
  granted_ += replay_granted;
  EXPECT_LE(replay_granted, h.second.tenants(0).want());
  absl::StatusOr<v1::BudgetStatus> after = GetBudget(new_owner, tenant);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->returned_total(), adopted->returned_total()) << "the replayed return counted";
  EXPECT_DOUBLE_EQ(after->tokens(), adopted->tokens() - static_cast<double>(replay_granted))
      << "the replayed return was credited";
  // The first request replayed after it: stale for the same instance now, nothing granted.
  v1::SyncResponse stale;
  ASSERT_TRUE(Sync(new_owner, h.first, &stale).ok());
  EXPECT_TRUE(stale.stale()) << stale.DebugString();
  EXPECT_EQ(Granted(stale), 0u) << stale.DebugString();

  // Everything left goes to a fresh instance: over the whole sequence, what was granted and not
  // given back is at most the capacity (no refill).
  const uint64_t drained = Drain(new_owner, tenant, "drainer");
  std::printf(
      "granted %llu (returned and credited %llu; burst before the kill %llu, replay "
      "granted %llu, drained %llu) of a bound of %.0f\n",
      static_cast<unsigned long long>(granted_), static_cast<unsigned long long>(returned_),
      static_cast<unsigned long long>(burst_granted),
      static_cast<unsigned long long>(replay_granted), static_cast<unsigned long long>(drained),
      kReplayBudget.capacity);
  EXPECT_LE(static_cast<double>(granted_ - returned_), kReplayBudget.capacity);
}

TEST_F(ReplayClusterTest, ShardThatMovesAwayAndBackCreditsAReplayedRequestOnlyOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(kReplayBudget));
  // The highest-numbered shard: when its owner rejoins, the server that took it over holds two
  // shards and sheds its highest-numbered one, which the rejoined server takes.
  const std::string tenant = shard_tenant_.at(kShards - 1);
  const int a = OwnerIndex(tenant);
  ASSERT_GE(a, 0);

  History h;
  ASSERT_NO_FATAL_FAILURE(PlayHistory(a, tenant, &h));

  // SIGTERM: A writes the shard's state and hands it over.
  absl::StatusOr<int> stopped = cluster_->server(a).Stop(SIGTERM, absl::Seconds(10));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  int b = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        b = OwnerIndex(tenant);
        return b >= 0 && b != a;
      },
      kEtcdLeaseTtl + absl::Seconds(5)));
  ASSERT_TRUE(WaitForBudget(b, tenant).ok());
  // Someone else spends a little on B meanwhile.
  uint64_t g3 = 0;
  v1::SyncRequest other;
  other.set_instance_id("other-instance");
  other.set_seq(1);
  other.add_tenants()->set_tenant(tenant);
  other.mutable_tenants(0)->set_want(3);
  SyncUntilGranted(b, other, &g3);
  // The replayed second request on B: a baseline there too.
  v1::SyncResponse on_b;
  ASSERT_TRUE(Sync(b, h.second, &on_b).ok());
  ASSERT_EQ(on_b.tenants_size(), 1);
  granted_ += on_b.tenants(0).granted();

  // A comes back and takes its shard back.
  ASSERT_TRUE(cluster_->RestartServer(a).ok());
  ASSERT_TRUE(cluster_->WaitUntilJoined(a, absl::Seconds(10)).ok());
  ASSERT_TRUE(WaitFor([&] { return OwnerIndex(tenant) == a; }, absl::Seconds(15)))
      << "the shard did not move back to server " << a << " (owner: " << OwnerIndex(tenant) << ")";
  absl::StatusOr<v1::BudgetStatus> back = WaitForBudget(a, tenant);
  ASSERT_TRUE(back.ok()) << back.status();

  // Replays to A: the second request is a baseline (A's earlier life credited its return once;
  // it is not credited again and brings back no holdings), the first is then stale, and the
  // second again is an exact duplicate.
  v1::SyncResponse replayed;
  ASSERT_TRUE(Sync(a, h.second, &replayed).ok());
  ASSERT_EQ(replayed.tenants_size(), 1);
  const uint64_t replay_granted = replayed.tenants(0).granted();
  granted_ += replay_granted;
  EXPECT_LE(replay_granted, h.second.tenants(0).want());
  v1::SyncResponse first_again;
  ASSERT_TRUE(Sync(a, h.first, &first_again).ok());
  EXPECT_TRUE(first_again.stale()) << first_again.DebugString();
  EXPECT_EQ(Granted(first_again), 0u) << first_again.DebugString();
  v1::SyncResponse second_again;
  ASSERT_TRUE(Sync(a, h.second, &second_again).ok());
  EXPECT_EQ(Granted(second_again), replay_granted);  // the same answer again, no new tokens
  absl::StatusOr<v1::BudgetStatus> after = GetBudget(a, tenant);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->returned_total(), back->returned_total()) << "the replayed return counted";
  EXPECT_DOUBLE_EQ(after->tokens(), back->tokens() - static_cast<double>(replay_granted))
      << "the replayed return was credited";
  EXPECT_DOUBLE_EQ(after->leased_tokens(), back->leased_tokens() + replay_granted)
      << "holdings came back with the replay";

  const uint64_t drained = Drain(a, tenant, "drainer");
  std::printf(
      "moved away and back: granted %llu (returned and credited %llu; on B %llu + "
      "replay %llu, replays on A %llu, drained %llu) of a bound of %.0f\n",
      static_cast<unsigned long long>(granted_), static_cast<unsigned long long>(returned_),
      static_cast<unsigned long long>(g3),
      static_cast<unsigned long long>(on_b.tenants(0).granted()),
      static_cast<unsigned long long>(replay_granted), static_cast<unsigned long long>(drained),
      kReplayBudget.capacity);
  EXPECT_LE(static_cast<double>(granted_ - returned_), kReplayBudget.capacity);
}

// The same server process loses the shard (SIGSTOP past its etcd lease) and takes it back (it
// re-registers on waking, and the server that took the shard sheds it again): what an instance
// held from the server's earlier ownership is not resurrected, so returning it credits nothing.
TEST_F(ReplayClusterTest, ShardRegainedByTheSameProcessCreditsNothingItGrantedBefore) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(kReplayBudget));
  const std::string tenant = shard_tenant_.at(kShards - 1);
  const int a = OwnerIndex(tenant);
  ASSERT_GE(a, 0);

  // The instance takes g1 tokens and keeps them.
  v1::SyncRequest first;
  first.set_instance_id("holding-instance");
  first.set_seq(1);
  first.add_tenants()->set_tenant(tenant);
  first.mutable_tenants(0)->set_want(10);
  uint64_t g1 = 0;
  first = SyncUntilGranted(a, first, &g1);
  ASSERT_GT(g1, 0u);

  // SIGSTOP for twice the etcd lease TTL: another server takes the shard over (counting every
  // token reserved so far as granted, g1 with them).
  ASSERT_TRUE(cluster_->PauseServer(a).ok());
  const absl::Time paused = absl::Now();
  int b = -1;
  const bool moved = WaitFor(
      [&] {
        b = OwnerIndex(tenant);
        return b >= 0 && b != a;
      },
      kEtcdLeaseTtl + absl::Seconds(5));
  ASSERT_TRUE(moved) << "the shard did not move away from the stopped server";
  // Read before the stopped server wakes up and takes the shard back.
  absl::StatusOr<v1::BudgetStatus> on_b = WaitForBudget(b, tenant);
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  absl::SleepFor(paused + 2 * kEtcdLeaseTtl - absl::Now());
  ASSERT_TRUE(cluster_->ResumeServer(a).ok());

  // The same process takes the shard back.
  ASSERT_TRUE(WaitFor([&] { return OwnerIndex(tenant) == a; }, absl::Seconds(15)))
      << "the shard did not move back to server " << a << " (owner: " << OwnerIndex(tenant) << ")";
  absl::StatusOr<v1::BudgetStatus> back = WaitForBudget(a, tenant);
  ASSERT_TRUE(back.ok()) << back.status();
  std::printf(
      "regained by the same process %s after the SIGSTOP: level %.1f (on server %d: "
      "%.1f)\n",
      absl::FormatDuration(absl::Now() - paused).c_str(), back->tokens(), b, on_b->tokens());

  // The instance now returns what it held: a first contact for the regained shard.
  v1::SyncRequest second = first;
  second.set_seq(first.seq() + 1);
  second.mutable_tenants(0)->set_tokens_received(g1);
  second.mutable_tenants(0)->set_tokens_returned(g1);
  second.mutable_tenants(0)->set_want(0);
  v1::SyncResponse returned;
  ASSERT_TRUE(Sync(a, second, &returned).ok());
  ASSERT_EQ(returned.tenants_size(), 1);
  EXPECT_FALSE(returned.tenants(0).has_error()) << returned.DebugString();
  absl::StatusOr<v1::BudgetStatus> after = GetBudget(a, tenant);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->returned_total(), back->returned_total()) << "the return counted";
  EXPECT_DOUBLE_EQ(after->tokens(), back->tokens()) << "the earlier grant was credited back";

  const uint64_t drained = Drain(a, tenant, "drainer");
  std::printf(
      "regained: granted %llu (held and returned %llu, drained %llu) of a bound of "
      "%.0f\n",
      static_cast<unsigned long long>(granted_), static_cast<unsigned long long>(g1),
      static_cast<unsigned long long>(drained), kReplayBudget.capacity);
  EXPECT_LE(static_cast<double>(granted_), kReplayBudget.capacity);
}

}  // namespace
}  // namespace retrybudget::testing
