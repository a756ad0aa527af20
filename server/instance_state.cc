#include "server/instance_state.h"

namespace retrybudget::core_internal {

uint64_t Instance::NextSerial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

InstanceTenant* InstanceTenants::Find(absl::string_view tenant) {
  if (has_first_ && first_name_ == tenant) return &first_;
  if (rest_ == nullptr) return nullptr;
  auto it = rest_->find(tenant);
  return it == rest_->end() ? nullptr : &it->second;
}

std::pair<InstanceTenant*, bool> InstanceTenants::FindOrAdd(absl::string_view tenant) {
  if (InstanceTenant* found = Find(tenant)) return {found, false};
  if (!has_first_) {
    has_first_ = true;
    first_name_.assign(tenant.data(), tenant.size());
    first_ = InstanceTenant{};
    return {&first_, true};
  }
  if (rest_ == nullptr) rest_ = std::make_unique<Map>();
  return {&rest_->try_emplace(tenant).first->second, true};
}

void InstanceTenants::Erase(absl::string_view tenant) {
  if (has_first_ && first_name_ == tenant) {
    if (rest_ != nullptr && !rest_->empty()) {
      // One of the others takes the inline place.
      auto node = rest_->extract(rest_->begin());
      first_name_ = std::move(node.key());
      first_ = std::move(node.mapped());
    } else {
      has_first_ = false;
      std::string().swap(first_name_);
      first_ = InstanceTenant{};
    }
  } else if (rest_ != nullptr) {
    rest_->erase(tenant);
  }
  if (rest_ != nullptr && rest_->empty()) rest_.reset();
}

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
