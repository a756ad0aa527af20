// A stand-in for a budget server in a separate process, for tests that SIGSTOP it: it owns shards
// through an OwnershipManager and, every 10 ms, "grants" from every shard it owns while it is
// surely alive, recording each grant with a fenced write of "<id> <n>" to P/shards/<NNNN>/grant.
// It prints "ready" once it owns a shard, and runs until killed.
//
//   ownership_probe ENDPOINTS PREFIX ID TTL_SECONDS SHARDS
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cluster/cluster_keys.h"
#include "cluster/ownership_manager.h"
#include "cluster/shard_map.h"
#include "etcd/etcd_client.h"

int main(int argc, char** argv) {
  using namespace retrybudget;  // NOLINT: a test tool
  int ttl_seconds = 0;
  int shards = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[4], &ttl_seconds) ||
      !absl::SimpleAtoi(argv[5], &shards)) {
    std::fprintf(stderr, "usage: %s ENDPOINTS PREFIX ID TTL_SECONDS SHARDS\n", argv[0]);
    return 2;
  }
  const std::string prefix = argv[2];
  const std::string id = argv[3];
  auto etcd = etcd::EtcdClient::Create({.endpoints = argv[1]});
  if (!etcd.ok()) {
    std::fprintf(stderr, "%s\n", etcd.status().ToString().c_str());
    return 1;
  }
  auto map = cluster::ShardMap::Join(**etcd, prefix, shards);
  if (!map.ok()) {
    std::fprintf(stderr, "%s\n", map.status().ToString().c_str());
    return 1;
  }
  auto manager = cluster::OwnershipManager::Start(etcd->get(), *map,
                                                  {.prefix = prefix,
                                                   .server_id = id,
                                                   .advertise = absl::StrCat(id, ":50051"),
                                                   .lease_ttl = absl::Seconds(ttl_seconds)});
  if (!manager.ok()) {
    std::fprintf(stderr, "%s\n", manager.status().ToString().c_str());
    return 1;
  }
  bool ready = false;
  for (int64_t n = 0;; ++n) {
    for (const auto& [shard, token] : (*manager)->OwnedShards()) {
      if (!(*manager)->SurelyAlive(absl::Now())) break;
      (*manager)
          ->FencedTxn(
              shard, token,
              {etcd::Op::Put(absl::StrCat(cluster::ShardStatePrefix(prefix, shard), "grant"),
                             absl::StrCat(id, " ", n))})
          .IgnoreError();
      if (!ready) {
        std::printf("ready\n");
        std::fflush(stdout);
        ready = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}
