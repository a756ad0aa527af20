#include "server/instance_state.h"

namespace retrybudget::core_internal {

void Tombstones::Put(absl::string_view id, const Tombstone& t) {
  if (max_ == 0) return;
  const uint64_t generation = next_generation_++;
  by_id_[id] = Stored{t, generation};
  order_.push_back({std::string(id), t.at, generation});
  while (order_.size() > max_) Pop();
}

const Tombstone* Tombstones::Find(absl::string_view id, absl::Time now) {
  DropExpired(now);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second.tombstone;
}

void Tombstones::DropExpired(absl::Time now) {
  while (!order_.empty() && now - order_.front().at > ttl_) Pop();
}

void Tombstones::Pop() {
  const Entry& e = order_.front();
  auto it = by_id_.find(e.id);
  // A later Put of the same id has its own, younger entry in the queue.
  if (it != by_id_.end() && it->second.generation == e.generation) by_id_.erase(it);
  order_.pop_front();
}

void Tombstones::Clear() {
  by_id_.clear();
  order_.clear();
}

}  // namespace retrybudget::core_internal
