// A small client for etcd's v3 gRPC API: ranges, puts, transactions, leases with a keep-alive
// that remembers when each renewal was sent, and prefix watches. A thin layer over the stubs
// generated from etcd's own .proto files (retrybudget::etcd_proto).
//
//   absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> etcd =
//       etcd::EtcdClient::Create({.endpoints = "127.0.0.1:2379,127.0.0.1:22379"});
//   if (!etcd.ok()) return etcd.status();  // INVALID_ARGUMENT for a malformed endpoint list
//   absl::StatusOr<etcd::LeaseGrant> lease = (*etcd)->GrantLease(absl::Seconds(10));
//   absl::StatusOr<etcd::TxnResult> txn = (*etcd)->Txn(
//       {etcd::Compare::CreateRevisionIs("/rb/owners/0007", 0)},
//       {etcd::Op::Put("/rb/owners/0007", "server-a", lease->id)},
//       {etcd::Op::Get("/rb/owners/0007")});
//
// Endpoints. Every call goes to the endpoint in use; a call that fails with UNAVAILABLE (refused,
// broken connection, "no leader") moves the client to the next endpoint and is tried there, each
// endpoint at most once per call. A call that fails otherwise (DEADLINE_EXCEEDED included) also
// moves the next call to the next endpoint, but is not repeated. Because a write that failed
// with UNAVAILABLE may have been applied before the connection broke, a write may be applied by
// its first attempt and then tried again: a Put is then applied twice (harmless), and a Txn's
// second attempt sees what the first one did (its compares decide). A caller that must know
// reads the key back.
//
// An endpoint whose connection has failed with UNAVAILABLE for longer than twice
// `max_reconnect_backoff`, with no success since, gets a fresh gRPC channel, so that a member that
// comes back is reached within about a second whatever state the old channel is stuck in.
//
// Every unary call has a deadline (EtcdClientOptions::call_timeout). Errors are the gRPC status
// of the last attempt, its message prefixed with the call and the endpoint.
//
// Thread-safe: any number of threads may call one EtcdClient. The client must outlive the
// KeepAlive and Watch objects it creates.
#ifndef RETRYBUDGET_ETCD_ETCD_CLIENT_H_
#define RETRYBUDGET_ETCD_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "retrybudget/clock.h"

namespace retrybudget::etcd {

struct EtcdClientOptions {
  // "HOST:PORT,HOST:PORT,...": the members' client URLs without scheme.
  std::string endpoints;
  // The channels' credentials (e.g. grpc::SslCredentials for etcd's TLS); null for plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr;
  // Deadline of every unary call (per attempt), and of a keep-alive round unless the
  // keep-alive interval is shorter.
  absl::Duration call_timeout = absl::Seconds(2);
  // Longest pause between two attempts to reconnect to an endpoint.
  absl::Duration max_reconnect_backoff = absl::Milliseconds(500);
  // Send times of keep-alives and the pauses of the background threads. Never null.
  Clock* clock = Clock::Real();
};

// One key as etcd stores it.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // revision of the put that created this incarnation of the key
  int64_t mod_revision = 0;     // revision of its last put
  int64_t version = 0;          // puts since it was created
  int64_t lease = 0;            // the lease it is attached to, 0 for none
};

// Keys and the store's revision when they were read.
struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;
};

// A condition of a transaction on one key. A missing key has create, mod revision and version 0
// and never equals a value.
struct Compare {
  enum class Target { kCreateRevision, kModRevision, kValue, kLease };
  Target target = Target::kCreateRevision;
  std::string key;
  int64_t number = 0;  // for the revisions and the lease
  std::string value;   // for kValue

  static Compare CreateRevisionIs(std::string key, int64_t revision);
  static Compare ModRevisionIs(std::string key, int64_t revision);
  static Compare ValueIs(std::string key, std::string value);
  static Compare LeaseIs(std::string key, int64_t lease);
};

// One operation of a transaction.
struct Op {
  enum class Type { kPut, kDelete, kDeletePrefix, kGet, kGetPrefix };
  Type type = Type::kGet;
  std::string key;
  std::string value;  // for kPut
  int64_t lease = 0;  // for kPut: 0 for none

  static Op Put(std::string key, std::string value, int64_t lease = 0);
  static Op Delete(std::string key);
  static Op DeletePrefix(std::string prefix);
  static Op Get(std::string key);
  static Op GetPrefix(std::string prefix);
};

struct TxnResult {
  bool succeeded = false;  // every compare held, and the `then` ops ran (else the `otherwise` ops)
  int64_t revision = 0;    // the store's revision after the transaction
  // For each Get / GetPrefix op of the branch that ran, in order, the keys it read.
  std::vector<std::vector<KeyValue>> gets;
};

// A lease etcd granted, and when the request for it was sent (by the client's Clock).
struct LeaseGrant {
  int64_t id = 0;
  absl::Duration ttl;
  absl::Time sent;
};

// One answer to a keep-alive: the lease is alive on etcd at least until `sent + ttl` as etcd's
// leader counts (it restarted its countdown after the request arrived, which is after `sent`).
// `ttl <= 0` when etcd no longer has the lease (it expired or was revoked).
struct KeepAliveAnswer {
  absl::Time sent;
  absl::Duration ttl;
};

// Renews one lease in the background: every `interval` it sends a keep-alive (one short stream
// per renewal, whose deadline is the shorter of the call timeout and the interval) and records
// the answer; a failed round is tried again on
// the next endpoint after a short pause. Stops renewing once etcd says the lease is gone.
// Thread-safe. Destruction stops the thread (it does not revoke the lease).
class KeepAlive {
 public:
  virtual ~KeepAlive() = default;
  // The lease id.
  virtual int64_t lease() const = 0;
  // The latest successful answer, seeded with the grant itself (its send time and TTL).
  virtual KeepAliveAnswer last_answer() const = 0;
  // True once etcd answered that the lease does not exist.
  virtual bool lost() const = 0;
};

// One change under a watched prefix.
struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: the key and the deletion's mod_revision
};

// What a watch delivers: events of one or more revisions, in order, or the news that the history
// from the requested revision was compacted away (the watcher must read the current state; the
// watch goes on from the compaction revision).
struct WatchBatch {
  std::vector<WatchEvent> events;
  int64_t revision = 0;  // the store's revision when etcd sent the batch
  bool compacted = false;
};

// A watch on a prefix, running in a background thread that reconnects (to the next endpoint)
// when its stream breaks, resuming after the last revision it delivered, so no event is lost or
// delivered twice across a reconnect. Watch streams ask etcd to end them when their member loses
// its leader, so a watch does not hang on a member cut off from the quorum; a member that hangs
// altogether is noticed by gRPC pings, within 15 s. Thread-safe.
// Destruction stops the thread; the callback is never called after the destructor returns.
class Watch {
 public:
  virtual ~Watch() = default;
};

class EtcdClient {
 public:
  // INVALID_ARGUMENT when `options.endpoints` is empty or an endpoint is not HOST:PORT. Does not
  // connect (the first call does).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(EtcdClientOptions options);

  virtual ~EtcdClient() = default;

  // The endpoints, in the order given.
  virtual const std::vector<std::string>& endpoints() const = 0;
  // The index in endpoints() of the endpoint in use (the one the next call goes to first).
  virtual size_t endpoint_in_use() const = 0;

  // The key (RangeResult::kvs holds it, or nothing when it does not exist).
  virtual absl::StatusOr<RangeResult> Get(absl::string_view key) = 0;
  // Every key that starts with `prefix`, sorted by key.
  virtual absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix) = 0;
  // Sets `key` to `value`, attached to `lease` (0: none). Returns the store's revision after it.
  virtual absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value,
                                      int64_t lease = 0) = 0;
  // Deletes `key`. Returns how many keys were deleted (0 or 1).
  virtual absl::StatusOr<int64_t> Delete(absl::string_view key) = 0;
  // If every compare holds, runs `then`, else `otherwise`; atomically.
  virtual absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                        const std::vector<Op>& then,
                                        const std::vector<Op>& otherwise = {}) = 0;

  // A new lease of (about) `ttl`, whole seconds, at least 1 s.
  virtual absl::StatusOr<LeaseGrant> GrantLease(absl::Duration ttl) = 0;
  // Ends the lease and deletes every key attached to it. NOT_FOUND if etcd has no such lease.
  virtual absl::Status RevokeLease(int64_t lease) = 0;
  // Starts renewing `grant` every `interval`. `on_answer` (may be empty) is called from the
  // background thread after every answer etcd gave (not after a failed round), without locks
  // held. INVALID_ARGUMENT for an interval that is not positive.
  virtual absl::StatusOr<std::unique_ptr<KeepAlive>> StartKeepAlive(
      const LeaseGrant& grant, absl::Duration interval,
      std::function<void(const KeepAliveAnswer&)> on_answer = {}) = 0;

  // Ends every call by `deadline`, for a bounded shutdown: the unary calls and keep-alive rounds
  // in flight are cancelled now (CANCELLED; a write may or may not have been applied), later
  // ones get `deadline` as their deadline when it is sooner than the call timeout
  // (DEADLINE_EXCEEDED at once once it has passed). Watches are not affected. For good: a later
  // call of it can only bring the end sooner.
  virtual void EndCallsBy(absl::Time deadline) = 0;

  // Watches every key under `prefix` from `start_revision` (0: from now). `on_batch` is called
  // from the watch's thread, one batch at a time, in revision order.
  virtual absl::StatusOr<std::unique_ptr<Watch>> WatchPrefix(
      absl::string_view prefix, int64_t start_revision,
      std::function<void(const WatchBatch&)> on_batch) = 0;
};

// The end of the key range that holds every key starting with `prefix`.
std::string PrefixRangeEnd(absl::string_view prefix);

}  // namespace retrybudget::etcd

#endif  // RETRYBUDGET_ETCD_ETCD_CLIENT_H_
