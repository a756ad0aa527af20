#include "cluster/shard_map.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cluster/cluster_keys.h"

namespace retrybudget::cluster {

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (const char c : bytes) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

absl::StatusOr<ShardMap> ShardMap::Join(etcd::EtcdClient& etcd, absl::string_view prefix,
                                        int shards) {
  if (shards < 0 || shards > kMaxShards) {
    return absl::InvalidArgumentError(absl::StrCat("number of shards must be in [1, ", kMaxShards,
                                                   "] (or 0: take etcd's), not ", shards));
  }
  const std::string key = ShardCountKey(prefix);
  std::vector<etcd::Op> create;
  if (shards > 0) create.push_back(etcd::Op::Put(key, absl::StrCat(shards)));
  absl::StatusOr<etcd::TxnResult> txn =
      etcd.Txn({etcd::Compare::CreateRevisionIs(key, 0)}, create, {etcd::Op::Get(key)});
  if (!txn.ok()) return txn.status();
  if (txn->succeeded) {
    if (shards == 0) {
      return absl::NotFoundError(
          absl::StrCat("etcd holds no number of shards at ", key, " and none was given"));
    }
    return ShardMap(shards);
  }
  const std::string stored =
      txn->gets.empty() || txn->gets[0].empty() ? std::string() : txn->gets[0][0].value;
  int stored_shards = 0;
  if (!absl::SimpleAtoi(stored, &stored_shards) || stored_shards < 1 ||
      stored_shards > kMaxShards) {
    return absl::FailedPreconditionError(absl::StrCat("etcd key ", key, " holds '", stored,
                                                      "', not a number of shards in [1, ",
                                                      kMaxShards, "]"));
  }
  if (shards != 0 && shards != stored_shards) {
    return absl::FailedPreconditionError(
        absl::StrCat("this deployment has ", stored_shards, " shards (etcd key ", key,
                     "), but this server was started with ", shards));
  }
  return ShardMap(stored_shards);
}

}  // namespace retrybudget::cluster
