// Which shard a tenant belongs to. A deployment has a fixed number of shards, stored in etcd by
// the first server that starts and checked by every server after it, so that every server and
// every release agrees on the mapping:
//
//   shard(tenant) = FNV-1a-64(tenant name as bytes) mod shards
//
// FNV-1a 64: offset basis 14695981039346656037, prime 1099511628211, over the name's bytes. It is
// part of the deployment's contract: changing it, or the number of shards, moves tenants between
// shards, which needs every server stopped.
//
//   absl::StatusOr<ShardMap> map = ShardMap::Join(*etcd, "/retry-budget", 64);
//   int shard = map->ShardOf("payments-db");
#ifndef RETRYBUDGET_CLUSTER_SHARD_MAP_H_
#define RETRYBUDGET_CLUSTER_SHARD_MAP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "etcd/etcd_client.h"

namespace retrybudget::cluster {

// The most shards a deployment may have.
inline constexpr int kMaxShards = 4096;

// 64-bit FNV-1a of `bytes`.
uint64_t Fnv1a64(absl::string_view bytes);

// Immutable; thread-safe.
class ShardMap {
 public:
  // The deployment's map: reads the number of shards under `prefix` (see cluster_keys.h); at
  // first start (no such key) stores `shards` there, atomically, so two servers starting at once
  // agree. `shards` = 0 takes whatever is stored (NOT_FOUND if nothing is). FAILED_PRECONDITION
  // when etcd holds another number than `shards`, or a value that is not a number of shards;
  // INVALID_ARGUMENT for `shards` outside [0, kMaxShards]; etcd's error when it cannot be read.
  static absl::StatusOr<ShardMap> Join(etcd::EtcdClient& etcd, absl::string_view prefix,
                                       int shards);

  // A map of `shards` shards (1..kMaxShards), without etcd.
  explicit ShardMap(int shards) : shards_(shards) {}

  int shards() const { return shards_; }
  int ShardOf(absl::string_view tenant) const {
    return static_cast<int>(Fnv1a64(tenant) % static_cast<uint64_t>(shards_));
  }

 private:
  int shards_;
};

}  // namespace retrybudget::cluster

#endif  // RETRYBUDGET_CLUSTER_SHARD_MAP_H_
