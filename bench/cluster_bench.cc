// The cluster bench (issue 12, done-when 7), three figures in one run, all through the launcher
// of tests/support/test_launcher.h:
//
//   1. Sync/s of a --servers cluster (etcd nodes + servers, same box) against a single in-memory
//      server, same load: --threads threads, each one instance syncing --tenants_per_thread
//      tenants (want 10, every token returned) back to back. In the cluster each thread syncs
//      with the owner of its tenants (tenants are picked so that each thread's all have one
//      owner, and the threads cover every server). Both are up at once and measured in turn,
//      --rounds times each; the medians are compared. Target: ratio >= 0.8 (all share the cores).
//   2. etcd writes per 1,000 Syncs in steady state: etcd's revision (every write bumps it by one)
//      read before and after each cluster run, over the Syncs answered in it; and for one tenant
//      drained at its refill rate, synced every 5 ms (the hard case), the writes of its state
//      (its key's version). Target: <= 10.
//   3. Failover time, --kills times: kill -9 of the owner of a busy tenant, then how long until
//      a surviving server grants that tenant again (a Sync with granted > 0); the killed server
//      is restarted and has rejoined before the next kill. p50 / p99.
//
// A server binary without cluster mode stops it at once with "the server has no cluster mode:
// --etcd_endpoints unknown" (exit 2).
//
// Output: {"bench":"cluster", ...} on stdout; progress on stderr.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "cluster/cluster_keys.h"
#include "cluster/shard_map.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/support/test_launcher.h"

ABSL_FLAG(int, servers, 3, "servers in the cluster");
ABSL_FLAG(int, etcd_nodes, 3, "etcd members");
ABSL_FLAG(int, shards, 64, "shards of the deployment");
ABSL_FLAG(absl::Duration, lease_ttl, absl::Seconds(3), "the servers' etcd lease TTL");
ABSL_FLAG(int, threads, 12, "load threads (each one instance; 4 per server of 3)");
ABSL_FLAG(int, tenants_per_thread, 1, "tenants in each thread's Sync");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1), "untimed load before each timed window");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(5), "timed window of each throughput run");
ABSL_FLAG(int, rounds, 3, "alternating single-server and cluster throughput runs");
ABSL_FLAG(int, kills, 10, "kill -9 of an owner, for the failover times");
ABSL_FLAG(std::string, server_bin, RETRYBUDGET_SERVER_BIN, "retry-budget-server binary");
ABSL_FLAG(std::string, etcd_bin, "/usr/bin/etcd", "etcd binary");

namespace retrybudget::bench {
namespace {

using testing::ClusterUnderTest;
using testing::ServerUnderTest;

std::unique_ptr<v1::RetryBudgetService::Stub> StubFor(const std::string& address) {
  return v1::RetryBudgetService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// One instance syncing its tenants: cumulative counters that stay valid (every token received
// is returned at the next Sync, or, with `spend`, spent on retries).
class Instance {
 public:
  Instance(std::string id, std::vector<std::string> tenants, bool spend = false)
      : id_(std::move(id)),
        tenants_(std::move(tenants)),
        spend_(spend),
        received_(tenants_.size(), 0) {}

  // One Sync; the tokens granted to `tenants_[0]`, or the RPC's error.
  absl::StatusOr<uint64_t> Sync(v1::RetryBudgetService::Stub& stub, absl::Duration timeout) {
    v1::SyncRequest request;
    request.set_instance_id(id_);
    request.set_seq(++seq_);
    for (size_t i = 0; i < tenants_.size(); ++i) {
      v1::TenantSync* t = request.add_tenants();
      t->set_tenant(tenants_[i]);
      t->set_want(10);
      t->set_tokens_received(received_[i]);
      if (spend_) {
        t->set_retries_spent(received_[i]);
      } else {
        t->set_tokens_returned(received_[i]);
      }
    }
    v1::SyncResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    grpc::Status status = stub.Sync(&context, request, &response);
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("Sync: ", status.error_message()));
    }
    uint64_t first = 0;
    for (const v1::TenantGrant& grant : response.tenants()) {
      for (size_t i = 0; i < tenants_.size(); ++i) {
        if (grant.tenant() == tenants_[i]) {
          received_[i] += grant.granted();
          if (i == 0) first = grant.granted();
        }
      }
    }
    return first;
  }

 private:
  std::string id_;
  std::vector<std::string> tenants_;
  bool spend_;
  std::vector<uint64_t> received_;
  uint64_t seq_ = 0;
};

// What one load run measured.
struct LoadRun {
  double syncs_per_second = 0;  // over the timed window
  int64_t syncs = 0;            // answered Syncs of the whole run, warm-up included
  double server_cpu_seconds = 0;  // CPU the servers used over the whole run
};

// Syncs/s of `threads` instances, instance i syncing `tenants[i]` with `addresses[i]`; `run` numbers
// the instance ids, so that every run's instances are new to the servers.
LoadRun SyncRate(const std::vector<std::string>& addresses,
                 const std::vector<std::vector<std::string>>& tenants, int run,
                 const std::vector<pid_t>& servers) {
  auto cpu = [&] {
    double sum = 0;
    for (pid_t pid : servers) sum += ProcessCpuSeconds(pid);
    return sum;
  };
  const double cpu_before = cpu();
  std::atomic<bool> timing{false};
  std::atomic<bool> done{false};
  std::atomic<int64_t> syncs{0};
  std::atomic<int64_t> all{0};
  std::atomic<int64_t> errors{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < addresses.size(); ++i) {
    threads.emplace_back([&, i] {
      auto stub = StubFor(addresses[i]);
      Instance instance(absl::StrFormat("%016x%016x", run + 1, i + 1), tenants[i]);
      while (!done.load()) {
        const bool counted = timing.load();
        absl::StatusOr<uint64_t> granted = instance.Sync(*stub, absl::Seconds(2));
        if (!granted.ok()) {
          errors.fetch_add(1);
          continue;
        }
        all.fetch_add(1);
        if (counted) syncs.fetch_add(1);
      }
    });
  }
  absl::SleepFor(absl::GetFlag(FLAGS_warmup));
  timing.store(true);
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::GetFlag(FLAGS_duration));
  timing.store(false);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  done.store(true);
  for (std::thread& t : threads) t.join();
  if (errors.load() > 0) std::fprintf(stderr, "%ld Syncs failed\n", static_cast<long>(errors));
  return {.syncs_per_second = static_cast<double>(syncs.load()) / seconds,
          .syncs = all.load(),
          .server_cpu_seconds = cpu() - cpu_before};
}

std::string PolicyFile(const std::string& dir) {
  const std::string path = dir + "/policy.textproto";
  std::ofstream(path) << kUnlimitedPolicy;
  return path;
}

int Run() {
  const std::string server_bin = absl::GetFlag(FLAGS_server_bin);
  // Cluster mode first: without it there is nothing to compare.
  if (!testing::BinaryHasFlag(server_bin, "etcd_endpoints")) {
    std::fprintf(stderr, "the server has no cluster mode: --etcd_endpoints unknown\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<testing::TempDir>> dir = testing::TempDir::Make();
  if (!dir.ok()) {
    std::fprintf(stderr, "%s\n", dir.status().ToString().c_str());
    return 1;
  }
  const std::string policy = PolicyFile((*dir)->path());
  const int threads = absl::GetFlag(FLAGS_threads);
  const int per_thread = absl::GetFlag(FLAGS_tenants_per_thread);

  // 1. The single in-memory server and the cluster, both started first and measured in
  // alternation (--rounds times each), so that a change of the box's load (it is shared) hits
  // both alike; the medians are compared.
  std::vector<std::vector<std::string>> single_tenants;
  for (int i = 0; i < threads; ++i) {
    std::vector<std::string> mine;
    for (int j = 0; j < per_thread; ++j) mine.push_back(absl::StrCat("t-", i, "-", j));
    single_tenants.push_back(std::move(mine));
  }
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> single = ServerUnderTest::Start(
      {.binary = server_bin, .flags = {absl::StrCat("--policy=", policy)}});
  if (!single.ok()) {
    std::fprintf(stderr, "single server: %s\n", single.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<ClusterUnderTest>> cluster =
      ClusterUnderTest::Start({.etcd = {.etcd_nodes = absl::GetFlag(FLAGS_etcd_nodes),
                                        .etcd_binary = absl::GetFlag(FLAGS_etcd_bin)},
                               .servers = absl::GetFlag(FLAGS_servers),
                               .server_binary = server_bin,
                               .server_flags = {absl::StrCat("--policy=", policy)},
                               .shards = absl::GetFlag(FLAGS_shards),
                               .lease_ttl = absl::GetFlag(FLAGS_lease_ttl)});
  if (!cluster.ok()) {
    std::fprintf(stderr, "cluster: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  ClusterUnderTest& c = **cluster;
  // Thread i takes tenants owned by server i % servers.
  std::vector<std::vector<std::string>> cluster_tenants(threads);
  std::vector<std::string> addresses(threads);
  for (int i = 0; i < threads; ++i) {
    const int want_owner = i % c.server_count();
    addresses[i] = c.server(want_owner).address();
    for (int n = 0; static_cast<int>(cluster_tenants[i].size()) < per_thread; ++n) {
      const std::string tenant = absl::StrCat("t-", i, "-", n);
      // A shard gets its owner when first asked for; one Sync makes sure it is.
      Instance probe(absl::StrFormat("%032x", 1000 + i), {tenant});
      auto stub = StubFor(c.server(want_owner).address());
      (void)probe.Sync(*stub, absl::Seconds(2));
      absl::StatusOr<int> owner = c.WaitForOwner(tenant, absl::Seconds(10));
      if (owner.ok() && *owner == want_owner) cluster_tenants[i].push_back(tenant);
      if (n > 10'000) {
        std::fprintf(stderr, "no tenant owned by server %d among 10,000 names\n", want_owner);
        return 1;
      }
    }
  }
  std::vector<pid_t> cluster_pids;
  for (int i = 0; i < c.server_count(); ++i) cluster_pids.push_back(c.server(i).pid());
  std::vector<double> single_rates;
  std::vector<double> cluster_rates;
  // Server CPU per Sync (the servers' processes only, not etcd's), less noisy than Syncs/s on a
  // shared box.
  std::vector<double> single_cpu_us;
  std::vector<double> cluster_cpu_us;
  // 2. etcd writes: the revision's advance over every cluster run (warm-ups included), over the
  // Syncs answered in them.
  int64_t cluster_writes = 0;
  int64_t cluster_syncs = 0;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    const LoadRun one = SyncRate(std::vector<std::string>(threads, (*single)->address()),
                                 single_tenants, 2 * r, {(*single)->pid()});
    single_rates.push_back(one.syncs_per_second);
    single_cpu_us.push_back(1e6 * one.server_cpu_seconds / static_cast<double>(one.syncs));
    absl::StatusOr<int64_t> revision_before = c.EtcdRevision();
    const LoadRun many = SyncRate(addresses, cluster_tenants, 2 * r + 1, cluster_pids);
    absl::StatusOr<int64_t> revision_after = c.EtcdRevision();
    if (!revision_before.ok() || !revision_after.ok()) {
      std::fprintf(stderr, "etcd revision unreadable\n");
      return 1;
    }
    cluster_rates.push_back(many.syncs_per_second);
    cluster_cpu_us.push_back(1e6 * many.server_cpu_seconds / static_cast<double>(many.syncs));
    cluster_writes += *revision_after - *revision_before;
    cluster_syncs += many.syncs;
    std::fprintf(stderr,
                 "round %d: single server %.0f Syncs/s (%.1f us CPU each), cluster %.0f Syncs/s "
                 "(%.1f us CPU each), %lld etcd writes over %lld cluster Syncs\n",
                 r, one.syncs_per_second, single_cpu_us.back(), many.syncs_per_second,
                 cluster_cpu_us.back(),
                 static_cast<long long>(*revision_after - *revision_before),
                 static_cast<long long>(many.syncs));
  }
  single.value().reset();  // the failover part runs on the cluster alone
  const double single_rate = Median(single_rates, 0);
  const double cluster_rate = Median(cluster_rates, 0);
  const double writes_per_1000 =
      cluster_syncs > 0 ? 1000.0 * static_cast<double>(cluster_writes) /
                              static_cast<double>(cluster_syncs)
                        : 0.0;
  std::fprintf(stderr, "median: single %.0f, cluster %.0f Syncs/s; %.2f etcd writes per 1,000 "
               "Syncs\n", single_rate, cluster_rate, writes_per_1000);

  // 2b. The hard case of the writes: one tenant drained at its refill rate (an admin policy of
  // capacity 50, refill 20/s), synced on a fixed schedule of one Sync every 5 ms by one instance
  // that spends every token. Its writes follow its grants and time, not its Syncs.
  double drained_per_1000 = 0;
  {
    const std::string drained = "drained-0";
    auto put_stub = v1::BudgetAdminService::NewStub(
        grpc::CreateChannel(c.server(0).address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::PutPolicyRequest put;
    put.set_tenant(drained);
    put.mutable_policy()->set_capacity(50);
    put.mutable_policy()->set_refill_per_second(20);
    v1::PutPolicyResponse put_response;
    if (grpc::Status st = put_stub->PutPolicy(&context, put, &put_response); !st.ok()) {
      std::fprintf(stderr, "PutPolicy %s: %s\n", drained.c_str(), st.error_message().c_str());
      return 1;
    }
    absl::StatusOr<int> owner = c.WaitForOwner(drained, absl::Seconds(10));
    if (!owner.ok()) {
      std::fprintf(stderr, "%s: %s\n", drained.c_str(), owner.status().ToString().c_str());
      return 1;
    }
    auto stub = StubFor(c.server(*owner).address());
    Instance spender(absl::StrFormat("%032x", 9000), {drained}, /*spend=*/true);
    absl::Time next = absl::Now();
    auto run_for = [&](int syncs) {
      int64_t failed = 0;
      for (int i = 0; i < syncs; ++i) {
        if (!spender.Sync(*stub, absl::Seconds(2)).ok()) ++failed;
        next += absl::Milliseconds(5);
        const absl::Time now = absl::Now();
        if (next > now) absl::SleepFor(next - now);
      }
      return failed;
    };
    // Its own writes: the version of its state key counts the transactions that wrote it (the
    // revision would also count the other tenants' last writes after the load above).
    const std::string key =
        absl::StrCat(cluster::ShardStatePrefix(c.etcd_prefix(),
                                               cluster::ShardMap(absl::GetFlag(FLAGS_shards))
                                                   .ShardOf(drained)),
                     "t/", drained);
    auto version = [&]() -> absl::StatusOr<int64_t> {
      absl::StatusOr<etcd::RangeResult> r = c.etcd_client().Get(key);
      if (!r.ok()) return r.status();
      return r->kvs.empty() ? 0 : r->kvs[0].version;
    };
    (void)run_for(600);  // 3 s: the bucket drained, the reservation block sized
    absl::StatusOr<int64_t> before = version();
    absl::StatusOr<int64_t> revision_before = c.EtcdRevision();
    const int64_t failed = run_for(1200);
    absl::StatusOr<int64_t> after = version();
    absl::StatusOr<int64_t> revision_after = c.EtcdRevision();
    if (!before.ok() || !after.ok() || !revision_before.ok() || !revision_after.ok() ||
        failed > 0) {
      std::fprintf(stderr, "drained tenant: %lld Syncs failed or etcd unreadable\n",
                   static_cast<long long>(failed));
      return 1;
    }
    drained_per_1000 = 1000.0 * static_cast<double>(*after - *before) / 1200.0;
    std::fprintf(stderr,
                 "drained tenant: %lld etcd writes of its state over 1,200 Syncs (%.2f per "
                 "1,000); all writes meanwhile: %lld\n",
                 static_cast<long long>(*after - *before), drained_per_1000,
                 static_cast<long long>(*revision_after - *revision_before));
  }

  // 3. Failover: kill -9 of the owner of a busy tenant, until a survivor grants it again.
  std::vector<double> failover_seconds;
  const std::string busy = cluster_tenants[0][0];
  for (int k = 0; k < absl::GetFlag(FLAGS_kills); ++k) {
    absl::StatusOr<int> owner = c.WaitForOwner(busy, absl::Seconds(30));
    if (!owner.ok()) {
      std::fprintf(stderr, "kill %d: %s\n", k, owner.status().ToString().c_str());
      return 1;
    }
    const absl::Time killed = absl::Now();
    if (absl::Status st = c.KillServer(*owner); !st.ok()) {
      std::fprintf(stderr, "kill %d: %s\n", k, st.ToString().c_str());
      return 1;
    }
    Instance instance(absl::StrFormat("%032x", 5000 + k), {busy});
    bool granted = false;
    while (!granted && absl::Now() - killed < absl::Seconds(60)) {
      for (int s = 0; s < c.server_count() && !granted; ++s) {
        if (s == *owner) continue;
        auto stub = StubFor(c.server(s).address());
        absl::StatusOr<uint64_t> got = instance.Sync(*stub, absl::Milliseconds(500));
        granted = got.ok() && *got > 0;
      }
      if (!granted) absl::SleepFor(absl::Milliseconds(20));
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - killed);
    if (!granted) {
      std::fprintf(stderr, "kill %d: not granted again within 60 s\n", k);
      return 1;
    }
    failover_seconds.push_back(seconds);
    std::fprintf(stderr, "kill %d of server %d: granted again after %.3f s\n", k, *owner, seconds);
    if (absl::Status st = c.RestartServer(*owner); !st.ok()) {
      std::fprintf(stderr, "restart %d: %s\n", k, st.ToString().c_str());
      return 1;
    }
    (void)c.WaitUntilJoined(*owner, absl::Seconds(30));
  }
  std::vector<double> sorted = failover_seconds;
  const double p50 = Percentile(sorted, 50);
  const double p99 = Percentile(sorted, 99);

  std::printf(
      "{\"bench\":\"cluster\",\"servers\":%d,\"etcd_nodes\":%d,\"shards\":%d,"
      "\"lease_ttl_s\":%.3f,\"threads\":%d,\"rounds\":%d,\"single_syncs_per_s\":%.0f,"
      "\"cluster_syncs_per_s\":%.0f,\"cluster_vs_single\":%.3f,"
      "\"single_server_cpu_us_per_sync\":%.1f,\"cluster_server_cpu_us_per_sync\":%.1f,"
      "\"etcd_writes_per_1000_syncs\":%.3f,\"drained_tenant_etcd_writes_per_1000_syncs\":%.3f,"
      "\"kills\":%zu,\"failover_p50_s\":%.3f,"
      "\"failover_p99_s\":%.3f}\n",
      c.server_count(), absl::GetFlag(FLAGS_etcd_nodes), absl::GetFlag(FLAGS_shards),
      absl::ToDoubleSeconds(absl::GetFlag(FLAGS_lease_ttl)), threads, absl::GetFlag(FLAGS_rounds),
      single_rate, cluster_rate,
      single_rate > 0 ? cluster_rate / single_rate : 0.0, Median(single_cpu_us, 0),
      Median(cluster_cpu_us, 0), writes_per_1000, drained_per_1000, failover_seconds.size(),
      p50, p99);
  return 0;
}

}  // namespace
}  // namespace retrybudget::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return retrybudget::bench::Run();
}
