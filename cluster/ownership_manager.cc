#include "cluster/ownership_manager.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cluster/cluster_keys.h"

namespace retrybudget::cluster {
namespace {

// After a failed pass the reconciler tries again this soon (or at its interval if shorter):
// etcd's errors are mostly an election or a dead member, over in well under a second.
constexpr absl::Duration kRetryAfterError = absl::Milliseconds(200);

absl::Status ValidateOptions(const OwnershipOptions& o) {
  if (o.prefix.empty() || o.prefix.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd prefix must be non-empty without a trailing '/', not '", o.prefix, "'"));
  }
  if (o.server_id.empty() || absl::StrContains(o.server_id, '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("server id must be non-empty without '/', not '", o.server_id, "'"));
  }
  if (o.advertise.empty()) return absl::InvalidArgumentError("advertise address is empty");
  if (o.lease_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease TTL must be at least 1s, not ", absl::FormatDuration(o.lease_ttl)));
  }
  if (o.keepalive_interval <= absl::ZeroDuration() ||
      o.reconcile_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("keep-alive and reconcile intervals must be positive");
  }
  if (o.margin <= absl::ZeroDuration() || o.margin >= o.lease_ttl - o.keepalive_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("margin must be positive and less than lease TTL - keep-alive interval (",
                     absl::FormatDuration(o.lease_ttl - o.keepalive_interval), "), not ",
                     absl::FormatDuration(o.margin)));
  }
  if (o.clock == nullptr) return absl::InvalidArgumentError("no clock");
  return absl::OkStatus();
}

OwnershipOptions WithDefaults(OwnershipOptions o) {
  if (o.keepalive_interval == absl::ZeroDuration()) o.keepalive_interval = o.lease_ttl / 4;
  if (o.reconcile_interval == absl::ZeroDuration()) o.reconcile_interval = o.lease_ttl / 4;
  if (o.margin == absl::ZeroDuration()) {
    o.margin = std::max(o.lease_ttl / 5, absl::Milliseconds(500));
  }
  return o;
}

// A server's part of the shards. With k live servers sorted by id, the one of rank r wants
// floor(N/k) + (r < N mod k ? 1 : 0) shards and keeps no more than ceil(N/k).
struct Share {
  size_t desired = 0;
  size_t ceiling = 0;
  // Where it starts looking for free shards (rank * N / k): servers look in different places,
  // so that two of them rarely race for the same shard.
  int first_shard = 0;
};

}  // namespace

// The servers and owners that balancing needs, as of one read; a pass updates it as it acquires
// and releases.
struct OwnershipManager::ClusterView {
  std::map<std::string, std::string> servers;  // id -> advertise address
  std::map<std::string, int64_t> server_leases;
  struct Owner {
    std::string server_id;
    int64_t token = 0;
    int64_t lease = 0;
  };
  std::map<int, Owner> owners;

  // The view of a transaction's two ranges: the servers' and the owners' keys.
  static ClusterView Parse(const std::string& prefix, const ShardMap& map,
                           const std::vector<etcd::KeyValue>& servers,
                           const std::vector<etcd::KeyValue>& owners) {
    ClusterView view;
    const std::string servers_prefix = ServersPrefix(prefix);
    for (const etcd::KeyValue& kv : servers) {
      absl::string_view id = kv.key;
      if (!absl::ConsumePrefix(&id, servers_prefix) || id.empty() || absl::StrContains(id, '/')) {
        continue;
      }
      view.servers[std::string(id)] = kv.value;
      view.server_leases[std::string(id)] = kv.lease;
    }
    for (const etcd::KeyValue& kv : owners) {
      std::optional<int> shard = ShardOfOwnerKey(prefix, kv.key);
      if (shard.has_value() && *shard < map.shards()) {
        view.owners[*shard] = {.server_id = kv.value, .token = kv.create_revision, .lease = kv.lease};
      }
    }
    return view;
  }

  // The shards `server_id` owns under `lease`, with their tokens. Owner keys of an older lease
  // of the same server are not its shards any more.
  std::map<int, int64_t> OwnedBy(const std::string& server_id, int64_t lease) const {
    std::map<int, int64_t> owned;
    for (const auto& [shard, owner] : owners) {
      if (owner.server_id == server_id && owner.lease == lease) owned[shard] = owner.token;
    }
    return owned;
  }

  // Whether `server_id` is registered under `lease`.
  bool Registers(const std::string& server_id, int64_t lease) const {
    const auto it = server_leases.find(server_id);
    return it != server_leases.end() && it->second == lease;
  }

  // The share of `server_id`, one of `servers`, of `shards` shards.
  Share ShareOf(const std::string& server_id, int shards) const {
    const int n = shards;
    const int k = static_cast<int>(servers.size());
    const int rank =
        static_cast<int>(std::distance(servers.begin(), servers.find(server_id)));
    return {.desired = static_cast<size_t>(n / k + (rank < n % k ? 1 : 0)),
            .ceiling = static_cast<size_t>((n + k - 1) / k),
            .first_shard = rank * n / k};
  }
};

OwnershipManager::OwnershipManager(etcd::EtcdClient* etcd, ShardMap map, OwnershipOptions options)
    : etcd_(etcd),
      map_(map),
      options_(std::move(options)),
      alive_until_nanos_(absl::ToUnixNanos(absl::InfinitePast())) {}

absl::StatusOr<std::unique_ptr<OwnershipManager>> OwnershipManager::Start(
    etcd::EtcdClient* etcd, ShardMap map, OwnershipOptions options) {
  if (etcd == nullptr) return absl::InvalidArgumentError("no etcd client");
  options = WithDefaults(std::move(options));
  if (absl::Status status = ValidateOptions(options); !status.ok()) return status;
  std::unique_ptr<OwnershipManager> manager(new OwnershipManager(etcd, map, std::move(options)));
  {
    MutexLock lock(&manager->lease_mu_);
    if (absl::Status status = manager->TakeLease(); !status.ok()) return status;
  }
  OwnershipManager* self = manager.get();
  for (const std::string& watched :
       {ServersPrefix(self->options_.prefix), OwnersPrefix(self->options_.prefix)}) {
    absl::StatusOr<std::unique_ptr<etcd::Watch>> watch =
        etcd->WatchPrefix(watched, 0, [self](const etcd::WatchBatch&) { self->Wake(); });
    if (!watch.ok()) return watch.status();
    manager->watches_.push_back(*std::move(watch));
  }
  manager->reconciler_ =
      std::jthread([self](std::stop_token stop) { self->RunReconciler(std::move(stop)); });
  return manager;
}

OwnershipManager::~OwnershipManager() {
  reconciler_.request_stop();
  Wake();
  if (reconciler_.joinable()) reconciler_.join();
  watches_.clear();
  MutexLock lock(&lease_mu_);
  keepalive_.reset();
}

absl::Status OwnershipManager::TakeLease() {
  keepalive_.reset();
  SetOwned({});  // whatever was owned under the old lease is not ours any more
  absl::StatusOr<etcd::LeaseGrant> grant = etcd_->GrantLease(options_.lease_ttl);
  if (!grant.ok()) return grant.status();
  grant_ = *grant;
  current_lease_.store(grant->id, std::memory_order_release);
  SetAliveUntil(grant->sent + grant->ttl - options_.margin);
  const int64_t lease = grant->id;
  absl::StatusOr<std::unique_ptr<etcd::KeepAlive>> keepalive = etcd_->StartKeepAlive(
      *grant, options_.keepalive_interval,
      [this, lease](const etcd::KeepAliveAnswer& answer) { OnKeepAliveAnswer(lease, answer); });
  if (!keepalive.ok()) return keepalive.status();
  keepalive_ = *std::move(keepalive);
  return etcd_->Put(ServerKey(options_.prefix, options_.server_id), options_.advertise, lease)
      .status();
}

void OwnershipManager::OnKeepAliveAnswer(int64_t lease, const etcd::KeepAliveAnswer& answer) {
  if (lease != current_lease_.load(std::memory_order_acquire)) return;
  if (answer.ttl > absl::ZeroDuration()) {
    SetAliveUntil(answer.sent + answer.ttl - options_.margin);
  } else {
    SetAliveUntil(absl::InfinitePast());
    Wake();
  }
}

void OwnershipManager::Wake() {
  {
    MutexLock lock(&mu_);
    wake_ = true;
  }
  wake_cv_.notify_all();
}

void OwnershipManager::RunReconciler(std::stop_token stop) {
  while (!stop.stop_requested()) {
    const absl::Status status = Reconcile();
    {
      MutexLock lock(&mu_);
      last_error_ = status;
    }
    const absl::Duration pause = status.ok()
                                     ? options_.reconcile_interval
                                     : std::min(options_.reconcile_interval, kRetryAfterError);
    CondVarLock lock(&mu_);
    wake_cv_.wait_for(lock, stop, absl::ToChronoNanoseconds(pause),
                      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_; });
    wake_ = false;
  }
}

absl::Status OwnershipManager::last_error() const {
  ReaderMutexLock lock(&mu_);
  return last_error_;
}

absl::Status OwnershipManager::Reconcile() {
  absl::StatusOr<std::optional<int64_t>> pass_lease = LeaseForPass();
  if (!pass_lease.ok()) return pass_lease.status();
  if (!pass_lease->has_value()) return absl::OkStatus();
  const int64_t lease = **pass_lease;

  absl::StatusOr<ClusterView> view = ReadClusterView();
  if (!view.ok()) return view.status();
  std::map<int, int64_t> owned = view->OwnedBy(options_.server_id, lease);
  const bool sure = SurelyAlive(options_.clock->Now());
  if (sure && !view->Registers(options_.server_id, lease)) {
    if (absl::Status status = Reregister(lease, *view); !status.ok()) {
      Publish(*view, owned);
      return status;
    }
  }
  Publish(*view, owned);
  // Neither acquire nor release without being sure of the lease: a shard acquired on a lease
  // that is running out would be owned by nobody able to serve it.
  if (!sure || view->servers.count(options_.server_id) == 0) return absl::OkStatus();

  const Share share = view->ShareOf(options_.server_id, map_.shards());
  // On a failed release nothing is published: the owned set already went without the shard.
  if (absl::Status status = ShedAbove(share.ceiling, *view, owned); !status.ok()) return status;
  const absl::Status acquired =
      AcquireUpTo(share.desired, share.first_shard, lease, *view, owned);
  Publish(*view, owned);
  return acquired;
}

absl::StatusOr<std::optional<int64_t>> OwnershipManager::LeaseForPass() {
  MutexLock lock(&lease_mu_);
  if (paused_ || shut_down_) return std::nullopt;
  if (keepalive_ == nullptr || keepalive_->lost()) {
    if (absl::Status status = TakeLease(); !status.ok()) return status;
  }
  return grant_->id;
}

absl::StatusOr<OwnershipManager::ClusterView> OwnershipManager::ReadClusterView() {
  // Servers and owners as of one revision.
  absl::StatusOr<etcd::TxnResult> read =
      etcd_->Txn({}, {etcd::Op::GetPrefix(ServersPrefix(options_.prefix)),
                      etcd::Op::GetPrefix(OwnersPrefix(options_.prefix))});
  if (!read.ok()) return read.status();
  if (read->gets.size() != 2) {
    return absl::InternalError(
        absl::StrCat("etcd answered ", read->gets.size(), " ranges to a transaction of 2"));
  }
  return ClusterView::Parse(options_.prefix, map_, read->gets[0], read->gets[1]);
}

absl::Status OwnershipManager::Reregister(int64_t lease, ClusterView& view) {
  absl::StatusOr<int64_t> put =
      etcd_->Put(ServerKey(options_.prefix, options_.server_id), options_.advertise, lease);
  if (!put.ok()) return put.status();
  view.servers[options_.server_id] = options_.advertise;
  view.server_leases[options_.server_id] = lease;
  return absl::OkStatus();
}

void OwnershipManager::Publish(const ClusterView& view, const std::map<int, int64_t>& owned) {
  std::map<int, ShardOwner> owners;
  for (const auto& [shard, owner] : view.owners) {
    const auto server = view.servers.find(owner.server_id);
    owners[shard] = {.server_id = owner.server_id,
                     .address = server == view.servers.end() ? "" : server->second,
                     .token = owner.token};
  }
  std::vector<std::string> live;
  for (const auto& [id, address] : view.servers) live.push_back(id);
  {
    MutexLock lock(&mu_);
    owners_ = std::move(owners);
    live_servers_ = std::move(live);
  }
  SetOwned(owned);
}

absl::Status OwnershipManager::ShedAbove(size_t ceiling, ClusterView& view,
                                         std::map<int, int64_t>& owned) {
  // Highest numbers first, so a joining server finds them free. Each one leaves the owned set
  // (its grants stop) before its state is written and its owner key deleted, so nothing is
  // granted from it after the state another owner will start from.
  while (owned.size() > ceiling) {
    const auto last = std::prev(owned.end());
    const int shard = last->first;
    const int64_t token = last->second;
    owned.erase(last);
    SetOwned(owned);
    if (options_.before_release) options_.before_release(shard, token);
    absl::StatusOr<etcd::TxnResult> released =
        FencedTxn(shard, token, {etcd::Op::Delete(ShardOwnerKey(options_.prefix, shard))});
    if (!released.ok() && !absl::IsFailedPrecondition(released.status())) {
      // Still held on etcd but no longer served: the next pass sees it as owned and sheds it
      // again.
      return released.status();
    }
    view.owners.erase(shard);
  }
  return absl::OkStatus();
}

absl::Status OwnershipManager::AcquireUpTo(size_t desired, int first_shard, int64_t lease,
                                           ClusterView& view, std::map<int, int64_t>& owned) {
  const int n = map_.shards();
  for (int i = 0; i < n && owned.size() < desired; ++i) {
    const int shard = (first_shard + i) % n;
    if (view.owners.count(shard) > 0) continue;
    const std::string key = ShardOwnerKey(options_.prefix, shard);
    absl::StatusOr<etcd::TxnResult> txn =
        etcd_->Txn({etcd::Compare::CreateRevisionIs(key, 0)},
                   {etcd::Op::Put(key, options_.server_id, lease)}, {etcd::Op::Get(key)});
    if (!txn.ok()) return txn.status();
    if (txn->succeeded) {
      // A transaction's puts all carry its revision: the key's create revision.
      owned[shard] = txn->revision;
      view.owners[shard] = {
          .server_id = options_.server_id, .token = txn->revision, .lease = lease};
      continue;
    }
    if (!txn->gets.empty() && !txn->gets[0].empty()) {
      const etcd::KeyValue& kv = txn->gets[0][0];
      // Ours after all when an earlier attempt of this transaction was applied.
      view.owners[shard] = {.server_id = kv.value, .token = kv.create_revision, .lease = kv.lease};
      if (kv.value == options_.server_id && kv.lease == lease) owned[shard] = kv.create_revision;
    }
  }
  return absl::OkStatus();
}

void OwnershipManager::SetOwned(std::map<int, int64_t> owned) {
  int64_t changes = 0;
  {
    MutexLock lock(&mu_);
    for (const auto& [shard, token] : owned) {
      const auto it = owned_.find(shard);
      if (it == owned_.end() || it->second != token) ++changes;
    }
    for (const auto& [shard, token] : owned_) {
      const auto it = owned.find(shard);
      if (it == owned.end() || it->second != token) ++changes;
    }
    owned_ = std::move(owned);
  }
  if (changes == 0) return;
  ownership_changes_.fetch_add(changes, std::memory_order_relaxed);
  if (options_.on_change) options_.on_change();
}

std::map<int, int64_t> OwnershipManager::OwnedShards() const {
  ReaderMutexLock lock(&mu_);
  return owned_;
}

std::optional<int64_t> OwnershipManager::FencingToken(int shard) const {
  ReaderMutexLock lock(&mu_);
  const auto it = owned_.find(shard);
  if (it == owned_.end()) return std::nullopt;
  return it->second;
}

std::optional<ShardOwner> OwnershipManager::OwnerOf(int shard) const {
  ReaderMutexLock lock(&mu_);
  const auto it = owners_.find(shard);
  if (it == owners_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> OwnershipManager::LiveServers() const {
  ReaderMutexLock lock(&mu_);
  return live_servers_;
}

absl::StatusOr<etcd::TxnResult> OwnershipManager::FencedTxn(int shard, int64_t token,
                                                            const std::vector<etcd::Op>& ops) {
  if (shard < 0 || shard >= map_.shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no shard ", shard, " (the deployment has ", map_.shards(), ")"));
  }
  absl::StatusOr<etcd::TxnResult> txn = etcd_->Txn(
      {etcd::Compare::CreateRevisionIs(ShardOwnerKey(options_.prefix, shard), token)}, ops);
  if (!txn.ok()) return txn.status();
  if (!txn->succeeded) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard, " has another owner (this server's token ", token, " is stale)"));
  }
  return txn;
}

absl::Status OwnershipManager::Shutdown() {
  {
    MutexLock lock(&lease_mu_);
    if (shut_down_) return absl::OkStatus();
    shut_down_ = true;
  }
  reconciler_.request_stop();
  Wake();
  if (reconciler_.joinable()) reconciler_.join();
  watches_.clear();

  // As when balancing: stop serving the shards first, then write their state, then free them.
  const std::map<int, int64_t> owned = OwnedShards();
  SetOwned({});
  absl::Status result;
  if (options_.before_release_all) {
    // All together; the revoke below frees their owner keys in one revision.
    options_.before_release_all(owned);
  } else {
    for (const auto& [shard, token] : owned) {
      if (options_.before_release) options_.before_release(shard, token);
      absl::StatusOr<etcd::TxnResult> released =
          FencedTxn(shard, token, {etcd::Op::Delete(ShardOwnerKey(options_.prefix, shard))});
      if (!released.ok() && !absl::IsFailedPrecondition(released.status()) && result.ok()) {
        result = released.status();
      }
    }
  }
  MutexLock lock(&lease_mu_);
  keepalive_.reset();
  current_lease_.store(0, std::memory_order_release);
  SetAliveUntil(absl::InfinitePast());
  if (grant_.has_value()) {
    absl::Status revoked = etcd_->RevokeLease(grant_->id);
    if (!revoked.ok() && !absl::IsNotFound(revoked) && result.ok()) result = revoked;
  }
  return result;
}

void OwnershipManager::SetPausedForTesting(bool paused) {
  {
    MutexLock lock(&lease_mu_);
    if (paused == paused_ || shut_down_) return;
    paused_ = paused;
    if (paused) {
      if (keepalive_ != nullptr) {
        const etcd::KeepAliveAnswer last = keepalive_->last_answer();
        grant_->sent = last.sent;
        grant_->ttl = last.ttl;
      }
      keepalive_.reset();
    } else if (grant_.has_value()) {
      const int64_t lease = grant_->id;
      absl::StatusOr<std::unique_ptr<etcd::KeepAlive>> keepalive = etcd_->StartKeepAlive(
          *grant_, options_.keepalive_interval,
          [this, lease](const etcd::KeepAliveAnswer& answer) { OnKeepAliveAnswer(lease, answer); });
      if (keepalive.ok()) keepalive_ = *std::move(keepalive);
    }
  }
  Wake();
}

}  // namespace retrybudget::cluster
