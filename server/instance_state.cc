#include "server/instance_state.h"

#include <cstring>
#include <new>

namespace retrybudget::core_internal {

RefPtr<Instance> Instance::Create(absl::string_view instance_id, uint64_t principal_hash) {
  void* raw = ::operator new(sizeof(Instance) + instance_id.size());
  char* chars = static_cast<char*>(raw) + sizeof(Instance);
  if (!instance_id.empty()) std::memcpy(chars, instance_id.data(), instance_id.size());
  return RefPtr<Instance>::AdoptNew(new (raw) Instance(instance_id.size(), principal_hash));
}

InstanceTenant* InstanceTenants::Find(absl::string_view tenant) {
  if (first_.tenant != nullptr && first_.tenant->name == tenant) return &first_;
  if (rest_ == nullptr) return nullptr;
  auto it = rest_->find(tenant);
  return it == rest_->end() ? nullptr : &it->record;
}

InstanceTenant* InstanceTenants::Add(RefPtr<Tenant> budget) {
  InstanceTenant fresh{.ledger = {}, .tenant = std::move(budget), .active = {}};
  if (first_.tenant == nullptr) {
    first_ = std::move(fresh);
    return &first_;
  }
  if (rest_ == nullptr) rest_ = std::make_unique<Set>();
  // The key is the record's own budget's name: the record is made before it is placed.
  auto it = rest_->find(absl::string_view(fresh.tenant->name));
  if (it != rest_->end()) {
    it->record = std::move(fresh);
  } else {
    it = rest_->insert(Slot{std::move(fresh)}).first;
  }
  return &it->record;
}

void InstanceTenants::Erase(absl::string_view tenant) {
  if (first_.tenant != nullptr && first_.tenant->name == tenant) {
    first_ = InstanceTenant{};
    if (rest_ != nullptr && !rest_->empty()) {
      // One of the others takes the inline place (its name is its budget's).
      first_ = std::move(rest_->extract(rest_->begin()).value().record);
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
