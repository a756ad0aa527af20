// Which shards this server owns, kept in etcd (keys in cluster_keys.h), and whether it can still
// be sure of it.
//
//   absl::StatusOr<std::unique_ptr<OwnershipManager>> ownership = OwnershipManager::Start(
//       etcd.get(), *map, {.prefix = "/retry-budget", .server_id = "b1",
//                          .advertise = "10.0.0.7:50051", .lease_ttl = absl::Seconds(10)});
//   ...
//   std::optional<int64_t> token = (*ownership)->FencingToken(shard);
//   if (token && (*ownership)->SurelyAlive(clock->Now())) { grant; }
//   (*ownership)->FencedTxn(shard, *token, {etcd::Op::Put(state_key, state)});  // durable write
//   ...
//   (*ownership)->Shutdown();  // hands every shard over at once
//
// Protocol.
// - The server holds one etcd lease, renewed by a keep-alive every `keepalive_interval`. Its
//   registration P/servers/<id> and the owner keys of its shards are attached to that lease, so
//   when the server stops renewing (crash, pause, cut off from etcd) all of them vanish together
//   once etcd's leader counts the lease out.
// - A shard is acquired with a transaction "if P/owners/<NNNN> does not exist, create it
//   with my id on my lease". The owner key's create revision is the fencing token: it changes
//   whenever the shard changes hands, so FencedTxn() ("if the owner key's create revision is my
//   token, write") fails for a deposed owner.
// - Balancing: with k live servers sorted by id, the server of rank r wants
//   floor(N/k) + (r < N mod k ? 1 : 0) shards. It acquires unowned shards while it owns fewer,
//   and releases (deletes its owner key, after `before_release`) those above ceil(N/k), so a
//   joining server gets its share as the others shed theirs. Every server runs this on every
//   change of servers or owners (two watches) and every `reconcile_interval`.
// - Surely alive. The lease is alive on etcd at least until (send time of the last answered
//   keep-alive) + TTL, because etcd restarts the countdown after the request arrives. The server
//   counts itself alive until that instant minus `margin`: SurelyAlive(now) turns false by
//   itself when renewals stop being answered, before any other server can have acquired its
//   shards. The margin covers the time between the check and the tokens leaving the server, and
//   the clocks' rates: it must exceed the longest stall between deciding a grant and sending it.
// - When etcd says the lease is gone, the server forgets its shards, takes a new lease,
//   registers again and acquires afresh (new tokens). When etcd comes back with the lease still
//   alive (it outlived the outage), the server resumes with the shards and tokens it had.
//
// Thread-safe. Background threads: the keep-alive, the reconciler, and two watches (servers,
// owners) that only wake the reconciler.
#ifndef RETRYBUDGET_CLUSTER_OWNERSHIP_MANAGER_H_
#define RETRYBUDGET_CLUSTER_OWNERSHIP_MANAGER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/shard_map.h"
#include "etcd/etcd_client.h"
#include "retrybudget/clock.h"
#include "retrybudget/mutex.h"

namespace retrybudget::cluster {

struct OwnershipOptions {
  // The deployment's key prefix in etcd, e.g. "/retry-budget" (no trailing '/').
  std::string prefix;
  // This server's id: unique among the deployment's servers, stable across its restarts (e.g.
  // its advertise address). Decides its rank in balancing. Not empty, no '/'.
  std::string server_id;
  // HOST:PORT that clients reach this server at.
  std::string advertise;
  // The lease's TTL (whole seconds, etcd's unit): how long a dead server's shards stay owned.
  absl::Duration lease_ttl = absl::Seconds(10);
  // Between keep-alives; zero for lease_ttl / 4.
  absl::Duration keepalive_interval = absl::ZeroDuration();
  // Between two reconciliations when nothing changes; zero for lease_ttl / 4.
  absl::Duration reconcile_interval = absl::ZeroDuration();
  // SurelyAlive() ends this long before the lease can end on etcd; zero for
  // max(lease_ttl / 5, 500 ms). Must be less than lease_ttl - keepalive_interval.
  absl::Duration margin = absl::ZeroDuration();
  // The EtcdClient's clock (keep-alive send times come from it). Never null.
  Clock* clock = Clock::Real();
  // Called when one of this server's shards is being released (balancing: from the reconciler
  // thread; Shutdown: from its caller), after the shard has left OwnedShards() (grants from it
  // must have stopped) and before its owner key is deleted, so its token still holds: the place
  // to write the shard's final state with FencedTxn(). Not called for shards lost to an expired
  // lease.
  std::function<void(int shard, int64_t token)> before_release = {};
  // Shutdown's form of before_release, when set: called once with every shard Shutdown releases
  // (shard -> token), from Shutdown's caller, after they left OwnedShards(), so that their final
  // states can be written together (concurrently) rather than one after another. Shutdown then
  // revokes the lease, which frees every owner key at once.
  std::function<void(const std::map<int, int64_t>&)> before_release_all = {};
  // Called, from the reconciler thread, after the set of owned shards changed.
  std::function<void()> on_change = {};
};

// A shard's owner as this server last saw it.
struct ShardOwner {
  std::string server_id;
  std::string address;  // its advertise address; empty if its registration is not seen
  int64_t token = 0;    // the owner key's create revision
};

class OwnershipManager {
 public:
  // Takes a lease, registers this server and starts the keep-alive, the watch and the
  // reconciler (which acquires shards in the background). INVALID_ARGUMENT for bad options;
  // etcd's error when the lease or the registration fails. `etcd` must outlive the manager.
  static absl::StatusOr<std::unique_ptr<OwnershipManager>> Start(etcd::EtcdClient* etcd,
                                                                 ShardMap map,
                                                                 OwnershipOptions options);

  OwnershipManager(const OwnershipManager&) = delete;
  OwnershipManager& operator=(const OwnershipManager&) = delete;
  // Stops the threads without releasing anything: the lease and the keys run out on etcd after
  // the TTL, as after a crash. Call Shutdown() first to hand the shards over at once.
  ~OwnershipManager();

  const ShardMap& map() const { return map_; }
  const OwnershipOptions& options() const { return options_; }

  // Shards this server owns under its current lease, with their fencing tokens. An owned shard
  // may be granted from only while SurelyAlive().
  std::map<int, int64_t> OwnedShards() const;
  // The token of `shard` if this server owns it, else nullopt.
  std::optional<int64_t> FencingToken(int shard) const;
  // Who owns `shard` as last seen (nullopt: nobody). Lags etcd by a watch round trip.
  std::optional<ShardOwner> OwnerOf(int shard) const;
  // The live servers' ids as last seen, sorted.
  std::vector<std::string> LiveServers() const;

  // True while `now` is before SurelyAliveUntil(). Lock-free.
  bool SurelyAlive(absl::Time now) const { return now < SurelyAliveUntil(); }
  // (Send time of the last answered keep-alive) + TTL - margin; InfinitePast() once etcd said
  // the lease is gone and until a new one is granted.
  absl::Time SurelyAliveUntil() const {
    return absl::FromUnixNanos(alive_until_nanos_.load(std::memory_order_acquire));
  }
  // Transitions of the owned set since Start (acquired + released + lost).
  int64_t ownership_changes() const { return ownership_changes_.load(std::memory_order_relaxed); }
  // The reconciler's last pass: OK, or the etcd error that ended it early.
  absl::Status last_error() const;

  // Runs `ops` atomically if this server still owns `shard` with `token` (the owner key's create
  // revision is `token`). FAILED_PRECONDITION "shard N has another owner" when it does not:
  // the caller must stop granting from the shard. etcd's error otherwise (the write may or may
  // not have happened when that is UNAVAILABLE or DEADLINE_EXCEEDED).
  absl::StatusOr<etcd::TxnResult> FencedTxn(int shard, int64_t token,
                                            const std::vector<etcd::Op>& ops);

  // Stops the reconciler, releases every owned shard (before_release_all, or before_release and
  // a fenced delete per shard) and revokes the lease, which deletes the registration and every
  // owner key left. Other servers take the shards over as soon as they see them free.
  // Idempotent; the manager owns nothing afterwards. Its time is the etcd calls': to bound it,
  // EtcdClient::EndCallsBy() first (a shard whose release did not make it stays owned on etcd
  // until the lease runs out, then is taken over as after a crash).
  absl::Status Shutdown();

  // Test hook standing in for SIGSTOP: while paused, the keep-alive and the reconciler do
  // nothing (the lease runs out on etcd, and SurelyAlive() turns false by itself); readers and
  // FencedTxn() still work, as a paused process that wakes up would see them. Unpausing
  // resumes renewals of the same lease (etcd may answer that it is gone).
  void SetPausedForTesting(bool paused);

 private:
  OwnershipManager(etcd::EtcdClient* etcd, ShardMap map, OwnershipOptions options);

  // Grants a lease, starts its keep-alive, registers.
  absl::Status TakeLease() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lease_mu_);
  void OnKeepAliveAnswer(int64_t lease, const etcd::KeepAliveAnswer& answer);
  void RunReconciler(std::stop_token stop);
  // One pass: read the prefix, update the views, release and acquire to balance.
  absl::Status Reconcile();
  // The servers and owners as one pass sees them (ownership_manager.cc).
  struct ClusterView;
  // The lease the pass works under, taken anew when etcd said it is gone; nullopt while paused
  // or shut down (the pass then does nothing).
  absl::StatusOr<std::optional<int64_t>> LeaseForPass();
  // The servers' and owners' keys, read in one transaction.
  absl::StatusOr<ClusterView> ReadClusterView();
  // Puts this server's registration back under `lease` (it was deleted while the lease lives).
  absl::Status Reregister(int64_t lease, ClusterView& view);
  // Makes `view` and `owned` what OwnerOf(), LiveServers() and OwnedShards() answer.
  void Publish(const ClusterView& view, const std::map<int, int64_t>& owned);
  // Releases owned shards while there are more than `ceiling`.
  absl::Status ShedAbove(size_t ceiling, ClusterView& view, std::map<int, int64_t>& owned);
  // Acquires free shards, looking from `first_shard` on, while fewer than `desired` are owned.
  absl::Status AcquireUpTo(size_t desired, int first_shard, int64_t lease, ClusterView& view,
                           std::map<int, int64_t>& owned);
  void Wake();
  void SetAliveUntil(absl::Time t) {
    alive_until_nanos_.store(absl::ToUnixNanos(t), std::memory_order_release);
  }
  void SetOwned(std::map<int, int64_t> owned);

  etcd::EtcdClient* const etcd_;
  const ShardMap map_;
  const OwnershipOptions options_;

  // The lease and its keep-alive: the reconciler, Shutdown() and the pause hook replace them.
  Mutex lease_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<etcd::KeepAlive> keepalive_ ABSL_GUARDED_BY(lease_mu_);
  std::optional<etcd::LeaseGrant> grant_ ABSL_GUARDED_BY(lease_mu_);  // with the last answer
  bool paused_ ABSL_GUARDED_BY(lease_mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(lease_mu_) = false;

  std::atomic<int64_t> alive_until_nanos_;
  std::atomic<int64_t> current_lease_{0};  // the lease whose answers count
  std::atomic<int64_t> ownership_changes_{0};

  mutable Mutex mu_;
  std::map<int, int64_t> owned_ ABSL_GUARDED_BY(mu_);
  std::map<int, ShardOwner> owners_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> live_servers_ ABSL_GUARDED_BY(mu_);
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::condition_variable_any wake_cv_;

  std::vector<std::unique_ptr<etcd::Watch>> watches_;  // servers and owners
  std::jthread reconciler_;                            // last: stopped before the members it uses
};

}  // namespace retrybudget::cluster

#endif  // RETRYBUDGET_CLUSTER_OWNERSHIP_MANAGER_H_
