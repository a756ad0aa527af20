// Where a deployment keeps its cluster state in etcd, all under one prefix P (--etcd_prefix):
//
//   P/config/shards   number of shards, decimal; written once, by the first server
//   P/servers/<id>    a live server: value its advertise address (HOST:PORT); attached to the
//                     server's lease, so it vanishes when the server stops renewing
//   P/owners/<NNNN>   the shard's owner: value the owner's server id; attached to the owner's
//                     lease. Its create revision is the owner's fencing token.
//   P/shards/<NNNN>/  the shard's state (written by its owner, conditioned on the token)
//
// <NNNN> is the shard number, zero-padded to four digits so that keys sort by shard. Servers and
// owners have prefixes of their own so that balancing reads and watches them without the
// shards' state.
#ifndef RETRYBUDGET_CLUSTER_CLUSTER_KEYS_H_
#define RETRYBUDGET_CLUSTER_CLUSTER_KEYS_H_

#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace retrybudget::cluster {

inline std::string ShardCountKey(absl::string_view prefix) {
  return absl::StrCat(prefix, "/config/shards");
}
inline std::string ServersPrefix(absl::string_view prefix) {
  return absl::StrCat(prefix, "/servers/");
}
inline std::string ServerKey(absl::string_view prefix, absl::string_view server_id) {
  return absl::StrCat(ServersPrefix(prefix), server_id);
}
inline std::string OwnersPrefix(absl::string_view prefix) {
  return absl::StrCat(prefix, "/owners/");
}
inline std::string ShardOwnerKey(absl::string_view prefix, int shard) {
  return absl::StrFormat("%s%04d", OwnersPrefix(prefix), shard);
}
// P/shards/<NNNN>/: the prefix of one shard's state.
inline std::string ShardStatePrefix(absl::string_view prefix, int shard) {
  return absl::StrFormat("%s/shards/%04d/", prefix, shard);
}

// The shard of an owner key (P/owners/<NNNN>), nullopt for any other key.
inline std::optional<int> ShardOfOwnerKey(absl::string_view prefix, absl::string_view key) {
  if (!absl::ConsumePrefix(&key, OwnersPrefix(prefix))) return std::nullopt;
  int shard = 0;
  if (key.size() < 4 || !absl::SimpleAtoi(key, &shard) || shard < 0) return std::nullopt;
  return shard;
}

}  // namespace retrybudget::cluster

#endif  // RETRYBUDGET_CLUSTER_CLUSTER_KEYS_H_
