#include "server/cluster_router.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cluster/cluster_keys.h"
#include "retrybudget/names.h"

namespace retrybudget {
namespace {

// Most puts in one transaction (etcd's default --max-txn-ops is 128).
constexpr size_t kMaxOps = 100;

std::string Comparable(v1::TenantState state) {
  state.clear_level_at_unix_nanos();
  return state.SerializeAsString();
}

}  // namespace

ClusterRouter::ClusterRouter(etcd::EtcdClient* etcd, cluster::ShardMap map,
                             ClusterRouterOptions options)
    : etcd_(etcd),
      map_(map),
      options_(std::move(options)),
      ready_(new std::atomic<int64_t>[static_cast<size_t>(map.shards())]),
      unserved_(new std::atomic<int64_t>[static_cast<size_t>(map.shards())]) {
  for (int s = 0; s < map_.shards(); ++s) {
    ready_[s].store(0, std::memory_order_relaxed);
    unserved_[s].store(0, std::memory_order_relaxed);
  }
}

ClusterRouter::~ClusterRouter() { Stop(); }

std::function<void()> ClusterRouter::OnChangeCallback() {
  return [this] { OnChange(); };
}

std::function<void(int, int64_t)> ClusterRouter::BeforeReleaseCallback() {
  return [this](int shard, int64_t token) { BeforeRelease(shard, token); };
}

std::function<void(const std::map<int, int64_t>&)> ClusterRouter::BeforeReleaseAllCallback() {
  return [this](const std::map<int, int64_t>& shards) { ReleaseTogether(shards); };
}

std::optional<v1::BudgetPolicy> ClusterRouter::AdminPolicy(absl::string_view tenant) const {
  MutexLock lock(&policies_mu_);
  auto it = policies_.find(tenant);
  if (it == policies_.end()) return std::nullopt;
  return it->second.policy;
}

absl::StatusOr<v1::BudgetStatus> ClusterRouter::PutPolicy(absl::string_view tenant,
                                                          const v1::BudgetPolicy& policy,
                                                          const google::protobuf::FieldMask& mask) {
  if (tenant.empty() || tenant.size() > 256) {
    return absl::InvalidArgumentError("tenant must be 1 to 256 bytes");
  }
  if (!mask.paths().empty()) return PutMaskedPolicy(tenant, policy, mask);
  absl::StatusOr<ResolvedPolicy> resolved = ResolvePolicy(policy, "policy");
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<int64_t> put = etcd_->Put(PolicyKey(tenant), policy.SerializeAsString());
  if (!put.ok()) {
    etcd_errors_.fetch_add(1, std::memory_order_relaxed);
    return put.status();
  }
  return PolicyStored(tenant, policy, *resolved, *put);
}

absl::StatusOr<v1::BudgetStatus> ClusterRouter::PutMaskedPolicy(
    absl::string_view tenant, const v1::BudgetPolicy& policy,
    const google::protobuf::FieldMask& mask) {
  if (absl::Status s = ValidatePolicyMask(mask); !s.ok()) return s;
  // Read, merge, and write only if the key is still as read (a compare-and-swap on its
  // mod_revision; create_revision 0: still absent); a lost compare reads again after a short
  // random pause (writers that keep colliding spread out).
  constexpr int kAttempts = 8;
  const std::string key = PolicyKey(tenant);
  std::minstd_rand random(static_cast<uint32_t>(absl::ToUnixNanos(options_.clock->Now())));
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (attempt > 0) {
      std::uniform_int_distribution<int64_t> pause_ms(
          1, std::min<int64_t>(int64_t{1} << attempt, 50));
      options_.clock->SleepUntil(options_.clock->Now() + absl::Milliseconds(pause_ms(random)),
                                 std::stop_token());
    }
    absl::StatusOr<etcd::RangeResult> read = etcd_->Get(key);
    if (!read.ok()) {
      etcd_errors_.fetch_add(1, std::memory_order_relaxed);
      return read.status();
    }
    absl::StatusOr<CurrentPolicy> current = CurrentPolicyOf(tenant, *read);
    if (!current.ok()) return current.status();
    const v1::BudgetPolicy merged = MergePolicy(current->policy, policy, mask);
    absl::StatusOr<ResolvedPolicy> resolved = ResolveMergedPolicy(merged);
    if (!resolved.ok()) return resolved.status();
    absl::StatusOr<etcd::TxnResult> txn =
        etcd_->Txn({current->unchanged}, {etcd::Op::Put(key, merged.SerializeAsString())});
    if (!txn.ok()) {
      etcd_errors_.fetch_add(1, std::memory_order_relaxed);
      return txn.status();
    }
    if (txn->succeeded) return PolicyStored(tenant, merged, *resolved, txn->revision);
  }
  return absl::AbortedError(absl::StrFormat(
      "PutPolicy of tenant %s: its policy in etcd changed under each of %d attempts to merge "
      "update_mask into it; nothing changed (try again)",
      QuoteForError(tenant), kAttempts));
}

absl::StatusOr<ClusterRouter::CurrentPolicy> ClusterRouter::CurrentPolicyOf(
    absl::string_view tenant, const etcd::RangeResult& read) const {
  CurrentPolicy current;
  const std::string key = PolicyKey(tenant);
  if (read.kvs.empty()) {
    current.unchanged = etcd::Compare::CreateRevisionIs(key, 0);
    // No admin policy: the policy file's (the same on every server).
    BudgetCore* core = core_.load(std::memory_order_acquire);
    if (core != nullptr) current.policy = core->ConfiguredPolicy(tenant);
    return current;
  }
  if (!current.policy.ParseFromString(read.kvs[0].value)) {
    return absl::DataLossError(
        absl::StrCat("the admin policy of tenant ", QuoteForError(tenant), " in etcd (", key,
                     ") is not a BudgetPolicy; nothing changed"));
  }
  current.unchanged = etcd::Compare::ModRevisionIs(key, read.kvs[0].mod_revision);
  return current;
}

absl::StatusOr<v1::BudgetStatus> ClusterRouter::PolicyStored(absl::string_view tenant,
                                                             const v1::BudgetPolicy& policy,
                                                             const ResolvedPolicy& resolved,
                                                             int64_t revision) {
  BudgetCore* core = core_.load(std::memory_order_acquire);
  {
    MutexLock lock(&apply_mu_);
    const bool newest = Record(tenant, policy, revision);
    if (core != nullptr && MayServe(tenant, options_.clock->Now())) {
      if (newest) return core->ApplyAdminPolicy(tenant, resolved);
      // The watch applied it already, or a newer policy: the budget as it is now.
      if (absl::StatusOr<v1::BudgetStatus> now = core->GetBudget(tenant); now.ok()) return now;
    }
  }
  v1::BudgetStatus status;
  status.set_tenant(std::string(tenant));
  *status.mutable_policy() = resolved.ToProto();
  return status;
}

bool ClusterRouter::Record(absl::string_view tenant, std::optional<v1::BudgetPolicy> policy,
                           int64_t revision) {
  MutexLock lock(&policies_mu_);
  auto [it, inserted] = policies_.try_emplace(tenant);
  if (!inserted && it->second.revision >= revision) return false;
  it->second = {.policy = std::move(policy), .revision = revision};
  return true;
}

void ClusterRouter::OnPolicies(const etcd::WatchBatch& batch) {
  const std::string prefix = PolicyKey("");
  BudgetCore* core = core_.load(std::memory_order_acquire);
  for (const etcd::WatchEvent& e : batch.events) {
    if (e.kv.key.size() <= prefix.size()) continue;
    const std::string tenant = e.kv.key.substr(prefix.size());
    MutexLock apply_lock(&apply_mu_);
    if (e.type == etcd::WatchEvent::Type::kDelete) {
      Record(tenant, std::nullopt, e.kv.mod_revision);
      continue;
    }
    v1::BudgetPolicy policy;
    if (!policy.ParseFromString(e.kv.value)) continue;
    absl::StatusOr<ResolvedPolicy> resolved = ResolvePolicy(policy, "policy");
    if (!resolved.ok()) continue;
    if (Record(tenant, policy, e.kv.mod_revision) && core != nullptr &&
        MayServe(tenant, options_.clock->Now())) {
      (void)core->ApplyAdminPolicy(tenant, *resolved);
    }
  }
}

void ClusterRouter::Start(BudgetCore* core, cluster::OwnershipManager* ownership) {
  core_.store(core, std::memory_order_release);
  // The admin policies: read them all, then watch from the next revision.
  absl::StatusOr<etcd::RangeResult> policies = etcd_->GetPrefix(PolicyKey(""));
  int64_t from = 0;
  if (policies.ok()) {
    etcd::WatchBatch initial;
    for (const etcd::KeyValue& kv : policies->kvs) {
      initial.events.push_back({.type = etcd::WatchEvent::Type::kPut, .kv = kv});
    }
    OnPolicies(initial);
    from = policies->revision + 1;
  } else {
    Log(absl::StrCat("cannot read the admin policies yet: ", policies.status().message()));
  }
  absl::StatusOr<std::unique_ptr<etcd::Watch>> watch = etcd_->WatchPrefix(
      PolicyKey(""), from, [this](const etcd::WatchBatch& b) { OnPolicies(b); });
  if (watch.ok()) {
    policy_watch_ = *std::move(watch);
  } else {
    Log(absl::StrCat("cannot watch the admin policies: ", watch.status().message()));
  }
  ownership_.store(ownership, std::memory_order_release);
  writer_ = std::jthread([this](std::stop_token stop) { Run(stop); });
  OnChange();
}

void ClusterRouter::Stop() {
  policy_watch_.reset();
  if (!writer_.joinable()) return;
  writer_.request_stop();
  {
    MutexLock lock(&queue_mu_);
    wake_ = true;
  }
  queue_cv_.notify_all();
  writer_.join();
}

bool ClusterRouter::MayServe(absl::string_view tenant, absl::Time now) const {
  const cluster::OwnershipManager* ownership = ownership_.load(std::memory_order_acquire);
  if (ownership == nullptr) return false;
  return ready_[map_.ShardOf(tenant)].load(std::memory_order_acquire) != 0 &&
         ownership->SurelyAlive(now);
}

TenantRefusal ClusterRouter::Refusal(absl::string_view tenant, absl::Time) const {
  TenantRefusal r;
  r.code = static_cast<int32_t>(absl::StatusCode::kUnavailable);
  const int shard = map_.ShardOf(tenant);
  const cluster::OwnershipManager* ownership = ownership_.load(std::memory_order_acquire);
  if (ownership == nullptr) {
    r.message = "this server has not joined the cluster yet";
    return r;
  }
  if (ready_[shard].load(std::memory_order_acquire) != 0) {
    r.message = absl::StrFormat(
        "this server owns shard %d but cannot be sure its etcd lease is alive; nothing applied",
        shard);
    return r;
  }
  std::optional<cluster::ShardOwner> owner = ownership->OwnerOf(shard);
  if (owner.has_value() && owner->server_id != ownership->options().server_id &&
      !owner->address.empty()) {
    r.code = static_cast<int32_t>(absl::StatusCode::kFailedPrecondition);
    r.owner = owner->address;
    r.message = absl::StrFormat("shard %d of tenant %s is owned by %s", shard, tenant,
                                owner->address);
    return r;
  }
  r.message = owner.has_value()
                  ? absl::StrFormat("shard %d is being taken over; nothing applied", shard)
                  : absl::StrFormat("shard %d has no owner right now; nothing applied", shard);
  return r;
}

void ClusterRouter::ReserveAhead(absl::string_view tenant, uint64_t grant_limit,
                                 DurableStore::ReservedCallback done) {
  {
    MutexLock lock(&queue_mu_);
    Pending& p = pending_[tenant];
    p.grant_limit = std::max(p.grant_limit, grant_limit);
    p.done.push_back(std::move(done));
    wake_ = true;
  }
  queue_cv_.notify_all();
}

void ClusterRouter::WaitIdle() {
  MutexLock lock(&queue_mu_);
  const int64_t target = flushes_started_ + (pending_.empty() ? 0 : 1);
  while (flushes_done_ < target && writer_.joinable()) {
    queue_cv_.wait_for(queue_mu_, std::chrono::milliseconds(50));
  }
}

absl::Status ClusterRouter::DeleteDurably(absl::string_view tenant,
                                          const std::function<absl::Status()>& forget) {
  const int shard = map_.ShardOf(tenant);
  // Under write_mu_: a state write that exported the budget before `forget` has landed, and the
  // writer exports nothing more of it (a budget made again by a later Sync is written after).
  MutexLock lock(&write_mu_);
  if (absl::Status s = forget(); !s.ok()) return s;
  const std::string key = TenantKey(shard, tenant);
  written_.erase(key);
  {
    // Forgotten, but its revision kept: a put older than the deletion cannot bring it back.
    MutexLock policies_lock(&policies_mu_);
    if (auto it = policies_.find(tenant); it != policies_.end()) it->second.policy.reset();
  }
  const int64_t token = ready_[shard].load(std::memory_order_acquire);
  cluster::OwnershipManager* ownership = ownership_.load(std::memory_order_acquire);
  if (token == 0 || ownership == nullptr) {
    return absl::UnavailableError(absl::StrFormat(
        "tenant %s was deleted here, but shard %d is not served here any more: its state in "
        "etcd stays and its next owner may bring it back",
        tenant, shard));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<etcd::TxnResult> r = ownership->FencedTxn(
      shard, token, {etcd::Op::Delete(key), etcd::Op::Delete(PolicyKey(tenant))});
  if (latency_observer_) latency_observer_(absl::ToDoubleSeconds(absl::Now() - start));
  etcd_writes_.fetch_add(1, std::memory_order_relaxed);
  if (!r.ok()) {
    etcd_errors_.fetch_add(1, std::memory_order_relaxed);
    if (absl::IsFailedPrecondition(r.status())) Lose(shard, r.status().message());
    return absl::UnavailableError(absl::StrFormat(
        "tenant %s was deleted here, but not in etcd (%s): its next owner may bring it back",
        tenant, r.status().message()));
  }
  return absl::OkStatus();
}

ClusterRouterStats ClusterRouter::stats() const {
  ClusterRouterStats s;
  for (int i = 0; i < map_.shards(); ++i) {
    s.shards_ready += ready_[i].load(std::memory_order_relaxed) != 0 ? 1 : 0;
  }
  s.etcd_writes = etcd_writes_.load(std::memory_order_relaxed);
  s.etcd_errors = etcd_errors_.load(std::memory_order_relaxed);
  s.reservation_writes = reservation_writes_.load(std::memory_order_relaxed);
  return s;
}

void ClusterRouter::OnChange() {
  cluster::OwnershipManager* ownership = ownership_.load(std::memory_order_acquire);
  if (ownership == nullptr) return;
  // Synchronously: a shard that is not ours under the same token any more is not served from
  // this instant (the lease may be replaced right after this returns).
  const std::map<int, int64_t> owned = ownership->OwnedShards();
  for (int s = 0; s < map_.shards(); ++s) {
    const int64_t token = ready_[s].load(std::memory_order_acquire);
    if (token == 0) continue;
    auto it = owned.find(s);
    if (it == owned.end() || it->second != token) {
      unserved_[s].store(token, std::memory_order_release);
      ready_[s].store(0, std::memory_order_release);
    }
  }
  {
    MutexLock lock(&queue_mu_);
    wake_ = true;
  }
  queue_cv_.notify_all();
}

void ClusterRouter::BeforeRelease(int shard, int64_t token) {
  if (core_.load(std::memory_order_acquire) == nullptr) return;
  ready_[shard].store(0, std::memory_order_release);
  MutexLock lock(&write_mu_);
  WriteFinalStateAndDrop(shard, token);
}

void ClusterRouter::WriteFinalStateAndDrop(int shard, int64_t token) {
  unserved_[shard].store(0, std::memory_order_release);
  BudgetCore* core = core_.load(std::memory_order_acquire);
  auto pick = [&](absl::string_view name) { return map_.ShardOf(name) == shard; };
  // Exported under each tenant's lock, after ready_ went to 0: a grant that passed MayServe
  // before that has finished, and none starts after it. So the granted totals are final, and
  // what was reserved ahead and not granted is given back: the next owner starts from the level
  // as it is, not in debt by this server's reservation (as it must be after a crash, when
  // nothing says how much of the reservation was granted).
  std::vector<v1::TenantState> states = core->ExportTenants(pick);
  for (v1::TenantState& ts : states) ts.set_grant_limit(ts.granted_total());
  if (absl::Status s = WriteStates(shard, token, states); !s.ok()) {
    Log(absl::StrCat("shard ", shard, ": final state not written: ", s.message()));
  }
  core->DropTenants(pick);
}

void ClusterRouter::ReleaseTogether(const std::map<int, int64_t>& shards) {
  BudgetCore* core = core_.load(std::memory_order_acquire);
  cluster::OwnershipManager* ownership = ownership_.load(std::memory_order_acquire);
  if (core == nullptr || ownership == nullptr) return;
  for (const auto& [shard, token] : shards) ready_[shard].store(0, std::memory_order_release);
  MutexLock lock(&write_mu_);
  struct Release {
    int shard = 0;
    int64_t token = 0;
    std::vector<std::vector<etcd::Op>> txns;  // at most kMaxOps puts each
    absl::Status status;
  };
  std::vector<Release> releases;
  for (const auto& [shard, token] : shards) {
    unserved_[shard].store(0, std::memory_order_release);
    const int s = shard;
    // Exported as in WriteFinalStateAndDrop: no grant follows, nothing is reserved ahead.
    std::vector<v1::TenantState> states =
        core->ExportTenants([&](absl::string_view name) { return map_.ShardOf(name) == s; });
    Release& r = releases.emplace_back(
        Release{.shard = shard, .token = token, .txns = {}, .status = absl::OkStatus()});
    for (v1::TenantState& ts : states) {
      ts.set_grant_limit(ts.granted_total());
      if (r.txns.empty() || r.txns.back().size() >= kMaxOps) r.txns.emplace_back();
      r.txns.back().push_back(etcd::Op::Put(TenantKey(shard, ts.tenant()), ts.SerializeAsString()));
    }
  }
  // Together: with etcd slow or gone the release costs one etcd deadline (the one EndCallsBy
  // set at shutdown), not one per shard.
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < releases.size(); i = next++) {
      Release& r = releases[i];
      for (const std::vector<etcd::Op>& ops : r.txns) {
        const absl::Time start = absl::Now();
        absl::StatusOr<etcd::TxnResult> t = ownership->FencedTxn(r.shard, r.token, ops);
        if (latency_observer_) latency_observer_(absl::ToDoubleSeconds(absl::Now() - start));
        etcd_writes_.fetch_add(1, std::memory_order_relaxed);
        if (!t.ok()) {
          etcd_errors_.fetch_add(1, std::memory_order_relaxed);
          r.status = t.status();
          break;
        }
      }
    }
  };
  {
    std::vector<std::jthread> workers;
    for (size_t i = 0; i < std::min<size_t>(releases.size(), 16); ++i) workers.emplace_back(work);
  }
  // A shard whose final state did not make it (refused, or not answered by the deadline) is left
  // as after a crash: etcd keeps an earlier state of it, whose reservation its next owner counts
  // as granted (AdoptTenants), so no token is created; what is lost is utilisation (the refill
  // and credit since that write, the reservation not granted). A write not answered may still be
  // applied later, and only while this server's token holds: it is the exact final state.
  int failed = 0;
  std::string first_error;
  for (const Release& r : releases) {
    if (r.status.ok()) continue;
    if (failed++ == 0) first_error = absl::StrCat("shard ", r.shard, ": ", r.status.message());
  }
  if (failed > 0) {
    Log(absl::StrFormat("final state of %d of %d shard(s) not written (%s): left to their next "
                        "owner's takeover",
                        failed, releases.size(), first_error));
  }
  core->DropTenants([&](absl::string_view name) { return shards.contains(map_.ShardOf(name)); });
}

std::string ClusterRouter::PolicyKey(absl::string_view tenant) const {
  return absl::StrCat(options_.prefix, "/policies/", tenant);
}

std::string ClusterRouter::TenantKey(int shard, absl::string_view tenant) const {
  return absl::StrCat(cluster::ShardStatePrefix(options_.prefix, shard), "t/", tenant);
}

absl::Status ClusterRouter::WriteStates(int shard, int64_t token,
                                        const std::vector<v1::TenantState>& states) {
  cluster::OwnershipManager* ownership = ownership_.load(std::memory_order_acquire);
  std::vector<etcd::Op> ops;
  std::vector<std::pair<std::string, std::string>> written;
  const absl::Time now = options_.clock->Now();
  auto send = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) -> absl::Status {
    if (ops.empty()) return absl::OkStatus();
    const absl::Time start = absl::Now();
    absl::StatusOr<etcd::TxnResult> r = ownership->FencedTxn(shard, token, ops);
    if (latency_observer_) latency_observer_(absl::ToDoubleSeconds(absl::Now() - start));
    etcd_writes_.fetch_add(1, std::memory_order_relaxed);
    ops.clear();
    if (!r.ok()) {
      etcd_errors_.fetch_add(1, std::memory_order_relaxed);
      written.clear();
      return r.status();
    }
    for (auto& [k, v] : written) written_[k] = Written{std::move(v), now};
    written.clear();
    return absl::OkStatus();
  };
  for (const v1::TenantState& ts : states) {
    std::string key = TenantKey(shard, ts.tenant());
    written.emplace_back(key, Comparable(ts));
    ops.push_back(etcd::Op::Put(std::move(key), ts.SerializeAsString()));
    if (ops.size() >= kMaxOps) {
      if (absl::Status s = send(); !s.ok()) return s;
    }
  }
  return send();
}

void ClusterRouter::Lose(int shard, absl::string_view why) {
  ready_[shard].store(0, std::memory_order_release);
  BudgetCore* core = core_.load(std::memory_order_acquire);
  core->DropTenants([&](absl::string_view name) { return map_.ShardOf(name) == shard; });
  Log(absl::StrCat("shard ", shard, " not served here any more: ", why));
}

void ClusterRouter::Load(int shard, int64_t token) {
  BudgetCore* core = core_.load(std::memory_order_acquire);
  auto pick = [&](absl::string_view name) { return map_.ShardOf(name) == shard; };
  // Budgets of this shard made here while it was not served (none granted) go first; so does
  // any final state still to write from an earlier token (it would be refused now).
  unserved_[shard].store(0, std::memory_order_release);
  core->DropTenants(pick);
  const std::string prefix = absl::StrCat(cluster::ShardStatePrefix(options_.prefix, shard), "t/");
  const absl::Time start = absl::Now();
  absl::StatusOr<etcd::RangeResult> range = etcd_->GetPrefix(prefix);
  if (latency_observer_) latency_observer_(absl::ToDoubleSeconds(absl::Now() - start));
  if (!range.ok()) {
    etcd_errors_.fetch_add(1, std::memory_order_relaxed);
    Log(absl::StrCat("shard ", shard, ": cannot load its state yet: ", range.status().message()));
    return;
  }
  std::vector<v1::TenantState> states;
  for (const etcd::KeyValue& kv : range->kvs) {
    v1::TenantState ts;
    if (!ts.ParseFromString(kv.value) || ts.tenant().empty() || map_.ShardOf(ts.tenant()) != shard) {
      Log(absl::StrCat("shard ", shard, ": ignoring unreadable state at ", kv.key));
      continue;
    }
    written_[kv.key] = Written{Comparable(ts), options_.clock->Now()};
    states.push_back(std::move(ts));
  }
  // The ownership may have moved on while reading: serve only under the token still held.
  cluster::OwnershipManager* ownership = ownership_.load(std::memory_order_acquire);
  if (ownership->FencingToken(shard) != token) return;
  core->AdoptTenants(states, options_.clock->Now());
  // An admin policy in etcd wins over the one stored with the state.
  {
    // Under apply_mu_ until the shard is served: a put or watch event is either applied here
    // or after (by its own thread, MayServe being true by then), never undone by an older copy.
    MutexLock apply_lock(&apply_mu_);
    std::vector<std::pair<std::string, v1::BudgetPolicy>> policies;
    {
      MutexLock lock(&policies_mu_);
      for (const auto& [tenant, known] : policies_) {
        if (known.policy.has_value() && map_.ShardOf(tenant) == shard) {
          policies.emplace_back(tenant, *known.policy);
        }
      }
    }
    for (const auto& [tenant, policy] : policies) {
      if (absl::StatusOr<ResolvedPolicy> p = ResolvePolicy(policy, "policy"); p.ok()) {
        (void)core->ApplyAdminPolicy(tenant, *p);
      }
    }
    ready_[shard].store(token, std::memory_order_release);
  }
  if (ownership->FencingToken(shard) != token) {  // lost meanwhile: OnChange may have missed it
    Lose(shard, "lost while loading");
    return;
  }
  Log(absl::StrFormat("shard %d: serving, %d tenant(s) taken over", shard, states.size()));
}

void ClusterRouter::Reconcile() {
  cluster::OwnershipManager* ownership = ownership_.load(std::memory_order_acquire);
  const std::map<int, int64_t> owned = ownership->OwnedShards();
  MutexLock lock(&write_mu_);
  BudgetCore* core = core_.load(std::memory_order_acquire);
  // Shards that stopped being served since the last pass: a release on its way (the ownership
  // manager stops serving a shard before it calls BeforeRelease) or a loss. Their final state
  // first, while the fence may still hold, so that a drop here never beats the release's write.
  for (int s = 0; s < map_.shards(); ++s) {
    const int64_t token = unserved_[s].load(std::memory_order_acquire);
    if (token != 0 && ready_[s].load(std::memory_order_acquire) == 0) {
      WriteFinalStateAndDrop(s, token);
    }
  }
  // Budgets of shards not served here (lost, or created by a request racing a loss) go.
  core->DropTenants([&](absl::string_view name) {
    const int s = map_.ShardOf(name);
    return ready_[s].load(std::memory_order_acquire) == 0 && !owned.contains(s);
  });
  for (const auto& [shard, token] : owned) {
    if (ready_[shard].load(std::memory_order_acquire) == token) continue;
    Load(shard, token);
  }
}

void ClusterRouter::FlushReservations() {
  absl::flat_hash_map<std::string, Pending> batch;
  {
    MutexLock lock(&queue_mu_);
    if (pending_.empty()) return;
    batch.swap(pending_);
    ++flushes_started_;
  }
  BudgetCore* core = core_.load(std::memory_order_acquire);
  std::map<int, std::vector<std::string>> by_shard;
  for (const auto& [name, p] : batch) by_shard[map_.ShardOf(name)].push_back(name);
  {
    MutexLock lock(&write_mu_);
    for (auto& [shard, names] : by_shard) {
      const int64_t token = ready_[shard].load(std::memory_order_acquire);
      absl::Status status;
      if (token == 0) {
        status = absl::UnavailableError(absl::StrCat("shard ", shard, " is not served here"));
      } else {
        absl::flat_hash_map<std::string, bool> wanted;
        for (const std::string& n : names) wanted[n] = true;
        std::vector<v1::TenantState> states =
            core->ExportTenants([&](absl::string_view name) { return wanted.contains(name); });
        for (v1::TenantState& ts : states) {
          ts.set_grant_limit(std::max(ts.grant_limit(), batch[ts.tenant()].grant_limit));
        }
        reservation_writes_.fetch_add(1, std::memory_order_relaxed);
        status = WriteStates(shard, token, states);
        if (absl::IsFailedPrecondition(status)) Lose(shard, status.message());
      }
      for (const std::string& n : names) {
        Pending& p = batch[n];
        for (auto& done : p.done) done(n, p.grant_limit, status);
      }
    }
  }
  {
    MutexLock lock(&queue_mu_);
    ++flushes_done_;
  }
  queue_cv_.notify_all();
}

void ClusterRouter::WriteChangedStates() {
  BudgetCore* core = core_.load(std::memory_order_acquire);
  MutexLock lock(&write_mu_);
  const absl::Time now = options_.clock->Now();
  std::map<int, std::vector<v1::TenantState>> by_shard;
  for (v1::TenantState& ts : core->ExportTenants([](absl::string_view) { return true; })) {
    const int shard = map_.ShardOf(ts.tenant());
    if (ready_[shard].load(std::memory_order_acquire) == 0) continue;
    // Unchanged, or written (by a reservation) within the interval: not now.
    auto it = written_.find(TenantKey(shard, ts.tenant()));
    if (it != written_.end() && (it->second.value == Comparable(ts) ||
                                 now - it->second.at < options_.state_interval)) {
      continue;
    }
    by_shard[shard].push_back(std::move(ts));
  }
  for (auto& [shard, states] : by_shard) {
    const int64_t token = ready_[shard].load(std::memory_order_acquire);
    if (token == 0) continue;
    absl::Status s = WriteStates(shard, token, states);
    if (absl::IsFailedPrecondition(s)) Lose(shard, s.message());
  }
}

void ClusterRouter::Run(std::stop_token stop) {
  // Checked every second at most: a tenant is written once its last write is state_interval old.
  const absl::Duration check_every = std::min(options_.state_interval, absl::Seconds(1));
  absl::Time next_state = options_.clock->Now() + check_every;
  while (!stop.stop_requested()) {
    {
      MutexLock lock(&queue_mu_);
      if (!wake_ && pending_.empty()) {
        queue_cv_.wait_for(queue_mu_, std::chrono::milliseconds(100));
      }
      wake_ = false;
    }
    if (stop.stop_requested()) break;
    Reconcile();
    FlushReservations();
    if (options_.clock->Now() >= next_state) {
      WriteChangedStates();
      next_state = options_.clock->Now() + check_every;
    }
  }
  // Reservations asked for after the last flush fail: nothing is granted on them.
  absl::flat_hash_map<std::string, Pending> left;
  {
    MutexLock lock(&queue_mu_);
    left.swap(pending_);
  }
  for (auto& [n, p] : left) {
    for (auto& done : p.done) done(n, p.grant_limit, absl::CancelledError("server stopping"));
  }
  MutexLock lock(&queue_mu_);
  ++flushes_started_;
  ++flushes_done_;
  queue_cv_.notify_all();
}

}  // namespace retrybudget
