#include "tools/fleet/owner_watch.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "cluster/cluster_keys.h"
#include "cluster/shard_map.h"

namespace retrybudget::fleet {

OwnerWatch::OwnerWatch(etcd::EtcdClient& etcd, std::string prefix,
                       std::vector<std::string> addresses, std::vector<std::string> tenants,
                       std::chrono::steady_clock::time_point start, absl::Duration period)
    : etcd_(etcd),
      prefix_(std::move(prefix)),
      addresses_(std::move(addresses)),
      tenants_(std::move(tenants)),
      start_(start),
      period_(period) {
  thread_ = std::jthread([this](std::stop_token stop) { Poll(stop); });
}

OwnerWatch::~OwnerWatch() { Finish(); }

std::vector<OwnerSample> OwnerWatch::Finish() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
  return samples_;
}

void OwnerWatch::Poll(std::stop_token stop) {
  std::optional<cluster::ShardMap> shards;
  std::mutex mu;
  std::condition_variable_any cv;
  auto next = std::chrono::steady_clock::now();
  while (!stop.stop_requested()) {
    const double at =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::vector<int> owners(tenants_.size(), kOwnerUnknown);
    if (!shards.has_value()) {
      absl::StatusOr<etcd::RangeResult> count = etcd_.Get(cluster::ShardCountKey(prefix_));
      int n = 0;
      if (count.ok() && !count->kvs.empty() && absl::SimpleAtoi(count->kvs[0].value, &n) &&
          n > 0) {
        shards.emplace(n);
      }
    }
    absl::StatusOr<etcd::RangeResult> owner_keys =
        shards.has_value() ? etcd_.GetPrefix(cluster::OwnersPrefix(prefix_))
                           : absl::StatusOr<etcd::RangeResult>(absl::UnavailableError("no map"));
    absl::StatusOr<etcd::RangeResult> server_keys =
        owner_keys.ok() ? etcd_.GetPrefix(cluster::ServersPrefix(prefix_)) : owner_keys;
    if (owner_keys.ok() && server_keys.ok()) {
      absl::flat_hash_map<std::string, int> server_index;  // server id -> address index
      for (const etcd::KeyValue& kv : server_keys->kvs) {
        absl::string_view id = kv.key;
        if (!absl::ConsumePrefix(&id, cluster::ServersPrefix(prefix_))) continue;
        auto it = std::find(addresses_.begin(), addresses_.end(), kv.value);
        if (it != addresses_.end()) server_index[id] = static_cast<int>(it - addresses_.begin());
      }
      absl::flat_hash_map<int, int> shard_owner;
      for (const etcd::KeyValue& kv : owner_keys->kvs) {
        std::optional<int> shard = cluster::ShardOfOwnerKey(prefix_, kv.key);
        if (!shard.has_value()) continue;
        auto it = server_index.find(kv.value);
        shard_owner[*shard] = it == server_index.end() ? kOwnerUnknown : it->second;
      }
      for (size_t i = 0; i < tenants_.size(); ++i) {
        auto it = shard_owner.find(shards->ShardOf(tenants_[i]));
        owners[i] = it == shard_owner.end() ? kNoOwnerKey : it->second;
      }
    }
    if (samples_.empty() || samples_.back().owners != owners) {
      samples_.push_back({.at = at, .owners = std::move(owners)});
    }
    next += absl::ToChronoNanoseconds(period_);
    std::unique_lock lock(mu);
    cv.wait_until(lock, stop, next, [] { return false; });
  }
}

std::vector<OwnerLoss> OwnerLosses(const std::vector<OwnerSample>& samples,
                                   const std::vector<ServerHit>& hits,
                                   const std::vector<GrantGapView>& gaps) {
  // One poll of the watch: how far a gap's end may precede the owner the watch saw.
  constexpr double kPollSlack = 0.2;
  std::vector<OwnerLoss> out;
  for (const ServerHit& hit : hits) {
    OwnerLoss loss{.at = hit.at, .server = hit.server, .what = hit.what};
    // The sample in force at the hit.
    const OwnerSample* before = nullptr;
    for (const OwnerSample& s : samples) {
      if (s.at <= hit.at) before = &s;
    }
    if (before == nullptr) {
      out.push_back(loss);
      continue;
    }
    bool all_found = true;
    double longest = 0;
    std::optional<double> leases_back;
    for (size_t t = 0; t < before->owners.size(); ++t) {
      if (before->owners[t] != hit.server) continue;
      ++loss.tenants;
      // Another server, or the same one again after its owner key was gone (a restarted
      // server that took the shard back).
      std::optional<double> found;
      bool key_gone = false;
      for (const OwnerSample& s : samples) {
        if (s.at <= hit.at) continue;
        if (s.owners[t] == kNoOwnerKey) key_gone = true;
        if (s.owners[t] >= 0 && (s.owners[t] != hit.server || key_gone)) {
          found = s.at;
          break;
        }
      }
      if (!found.has_value()) {
        all_found = false;
        continue;
      }
      longest = std::max(longest, *found - hit.at);
      if (t < gaps.size() && gaps[t].ended_at > 0) {
        const GrantGapView& gap = gaps[t];
        const bool spans = gap.ended_at - gap.longest <= *found &&
                           gap.ended_at >= *found - kPollSlack;
        const double back = spans ? gap.ended_at - *found : 0;
        leases_back = leases_back.has_value() ? std::max(*leases_back, back) : back;
      }
    }
    if (loss.tenants > 0 && all_found) {
      loss.new_owner_after_seconds = longest;
      loss.leases_back_after_owner_seconds = leases_back;
    }
    out.push_back(loss);
  }
  return out;
}

double MaxSecondsWithoutOwnerKey(const std::vector<OwnerSample>& samples, double end) {
  if (samples.empty()) return 0;
  double longest = 0;
  const size_t tenants = samples.front().owners.size();
  for (size_t t = 0; t < tenants; ++t) {
    double since = -1;  // < 0: the tenant has an owner (or it is unknown)
    for (const OwnerSample& s : samples) {
      if (s.owners[t] == kNoOwnerKey) {
        if (since < 0) since = s.at;
      } else if (s.owners[t] >= 0 && since >= 0) {
        longest = std::max(longest, s.at - since);
        since = -1;
      }
    }
    if (since >= 0) longest = std::max(longest, end - since);
  }
  return longest;
}

}  // namespace retrybudget::fleet
