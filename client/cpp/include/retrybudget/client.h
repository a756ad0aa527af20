// The client library that worker processes link: one BudgetClient per process, one TenantBudget
// handle per tenant the process retries against.
//
//   auto client = retrybudget::BudgetClient::Create({.target = "127.0.0.1:50051"});
//   if (!client.ok()) return client.status();
//   retrybudget::TenantBudget* budget = (*client)->Tenant("payments-db").value();
//   ...
//   budget->RecordRequest();                  // once per logical call (its first attempt)
//   if (call failed && budget->TryAcquire()) { retry(); } else { fail now; }
//   if (call succeeded) budget->RecordSuccess();
//
// A retry may cost more than one token (TryAcquire(cost): e.g. AWS's 5 per retryable error and
// 10 per timeout, or an LLM call priced by its size); the budget counts tokens.
//
// Tenant() sends the tenant's first Sync at once; until its answer (about one round trip on a
// live server) TryAcquire() denies. A program whose first action may be a retry waits for it
// with TenantBudget::WaitReady(); Retry() (retrybudget/retry.h) does so within its backoff.
//
// The hot path (TryAcquire, RecordRequest, RecordSuccess) is local: one atomic operation (a
// second one for a cost above 1), no RPC, no lock, no allocation. A background refresher (one
// thread per BudgetClient, whatever the number of tenants) leases tokens from the server with one
// Sync RPC for all tenants, reports successes and requests, returns unspent tokens, and is woken
// at once when a worker finds its lease empty.
//
// When the server is unreachable the client never fails open: it spends its current lease until
// the lease expires, then falls back to a local token bucket sized by the `safe_share` the server
// sent for the tenant (the smallest of the kSafeShareMemory before its last answer;
// ClientOptions::fallback), and goes back to leases, reporting what it spent in fallback, as
// soon as the server answers again.
#ifndef RETRYBUDGET_CLIENT_H_
#define RETRYBUDGET_CLIENT_H_

#include <cstdint>
#include <memory>
#include <stop_token>
#include <string>
#include "absl/strings/string_view.h"

#include <grpcpp/security/credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "retrybudget/clock.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace retrybudget {

namespace v1 {
class RetryBudgetService;
}  // namespace v1

// Where a tenant's retry tokens come from right now.
enum class BudgetMode {
  kNoLease,       // no lease in force and the server is answering (none yet, expired, refused,
                  // shut down): TryAcquire() denies until a grant arrives
  kLease,         // a lease from the server is in force
  kFallback,      // the server is unreachable and no lease is in force: tokens come from the
                  // local fallback bucket
  kDenyFallback,  // the server is unreachable, no lease is in force, and fallback = kDeny
};

// "no_lease", "lease", "fallback", "deny_fallback" (the `mode` label of the client metrics).
inline absl::string_view BudgetModeName(BudgetMode mode) {
  switch (mode) {
    case BudgetMode::kNoLease:
      return "no_lease";
    case BudgetMode::kLease:
      return "lease";
    case BudgetMode::kFallback:
      return "fallback";
    case BudgetMode::kDenyFallback:
      return "deny_fallback";
  }
  return "unknown";
}

// A fallback bucket is the smallest SafeShare (in capacity and in refill) the server sent for the
// tenant within this long before its last answer, not simply the last one: a server that
// restarted or hung sees the fleet rejoin one by one and may offer the first instances back the
// share of a smaller fleet.
inline constexpr int64_t kSafeShareMemoryMillis = 60'000;
inline constexpr absl::Duration kSafeShareMemory = absl::Milliseconds(kSafeShareMemoryMillis);

// What a client does once the server is unreachable and its lease has expired.
enum class FallbackMode {
  // Allow retries from a local token bucket: the SafeShare the server sent for the tenant (this
  // instance's share of capacity and refill, so a fleet in fallback still spends about one
  // budget; see kSafeShareMemory), or ClientOptions::fallback_capacity /
  // fallback_refill_per_second when the server never answered for the tenant.
  kLocalBucket,
  // Deny every retry until the server answers again.
  kDeny,
};

// Counters of one tenant in this process, cumulative since the client was created. While every
// token came from leases (fallback_allowed == 0, no fallback tokens held), they add up:
//
//     tokens_received = tokens_spent + tokens_returned + tokens_held
//
// (with every retry of cost 1, tokens_spent == retries_allowed). A refunded token is back in the
// lease (tokens_held) and goes back to the server with the rest (tokens_returned) when the lease
// is given back or expires, whichever Sync reported it spent.
struct TenantStats {
  uint64_t successes = 0;
  uint64_t requests = 0;          // RecordRequest() calls
  // Retries allowed with tokens (TryAcquire() true, whatever the cost), minus Refund() calls that
  // gave tokens back (lease + fallback). A count of retries.
  uint64_t retries_allowed = 0;
  uint64_t retries_denied = 0;    // TryAcquire() false (enforce mode), a count of retries
  // Shadow mode: TryAcquire() calls that returned true without a token because enforcement
  // would have denied them (would-be denials). A count of retries.
  uint64_t shadow_denied = 0;
  uint64_t tokens_spent = 0;      // tokens taken by the allowed retries, minus refunded tokens
  uint64_t fallback_allowed = 0;  // of tokens_spent, tokens from the local fallback bucket
  uint64_t tokens_received = 0;   // granted by the server and received
  uint64_t tokens_returned = 0;   // leased tokens given back unspent (refunded ones included)
  int64_t tokens_held = 0;        // in the lease right now
  uint64_t refunds = 0;           // Refund() calls that gave tokens back (not unbacked ones)
  // Of successes, those whose credit this process's fallback buckets deposited locally
  // (success-funded fallback; the server does not credit them again).
  uint64_t successes_credited_locally = 0;
  // Of requests, those whose credit (SafeShare.request_credit) the fallback buckets deposited.
  uint64_t requests_credited_locally = 0;
  // The tenant is in shadow mode (the server's last applied answer said MODE_SHADOW): every
  // TryAcquire() returns true; those enforcement would deny count in shadow_denied.
  bool shadow = false;
  bool lease_active = false;      // a lease from the server is in force (tokens may be taken)
  BudgetMode mode = BudgetMode::kNoLease;  // where tokens come from right now
  // Why the server refused this tenant in the last Sync (e.g. NOT_FOUND on a strict server);
  // OK when the last answer for the tenant was a grant or none came yet.
  absl::Status error;
};

// A tenant's budget as seen from this process. Thread-safe; owned by its BudgetClient and valid
// until the client is destroyed.
class TenantBudget {
 public:
  virtual ~TenantBudget() = default;

  // Costs a retry may have: [1, kMaxCost].
  static constexpr uint32_t kMaxCost = 1'000'000;

  // Asks for one retry of `cost` tokens (1 to kMaxCost). Returns true when `cost` tokens were
  // taken, all or nothing (the retry may be sent), false when fewer are available (the retry
  // must not be sent: fail the call now). Never blocks, never performs I/O; on false it wakes
  // the refresher so a grant arrives within one round trip. A cost out of range returns false,
  // counts nothing and is logged (rate-limited).
  //
  // A tenant in shadow mode (the server's policy says MODE_SHADOW; TenantStats::shadow) takes
  // the tokens when it can, exactly as in enforce mode; where enforce mode would return false it
  // returns TRUE without a token, counts a would-be denial (TenantStats::shadow_denied) and
  // wakes the refresher as a denial would (so leases evolve as if enforced).
  virtual bool TryAcquire(uint32_t cost) = 0;
  // TryAcquire(1).
  bool TryAcquire() { return TryAcquire(1); }

  // Gives back the `cost` tokens a TryAcquire(cost) took for a retry that was then never sent
  // (for example cancelled during backoff). Call at most once per successful TryAcquire(), with
  // its cost. The tokens may be taken again; if not, they go back to the server's bucket with
  // the rest of the lease, and the server does not count them as spent
  // (TenantSync.retries_refunded), whether or not a Sync had already reported them. In shadow
  // mode a refund first cancels permits given without a token: while at least `cost` such
  // tokens are out, it only lowers that count. Never blocks. A cost out of range does nothing
  // (logged, rate-limited).
  virtual void Refund(uint32_t cost) = 0;
  // Refund(1).
  void Refund() { Refund(1); }

  // Records one logical call (its first attempt, before it is sent): the windowed policy's
  // deposit (retry_ratio per request). The retry helpers call it once per call.
  virtual void RecordRequest() = 0;

  // Records one successful logical call; it earns the budget `success_credit`.
  virtual void RecordSuccess() = 0;

  virtual const std::string& tenant() const = 0;

  // A snapshot of this process's counters for the tenant (not a hot-path call).
  virtual TenantStats Stats() const = 0;

  // Waits for this tenant's first answer: a lease from the server, a refusal (Stats().error),
  // or the client's verdict that the server cannot be reached, after which the configured
  // fallback applies (ClientOptions::fallback: the local bucket, or deny; never fail open); or
  // the client's shutdown. Before it TryAcquire() denies: no lease is in force yet. The first
  // Sync goes out when Tenant() creates the handle, so on a live server the wait is about one
  // round trip (a connection set-up the first time).
  //
  // Returns OK when that answer is in (at once, with one atomic load, once it is: call it
  // freely), DEADLINE_EXCEEDED when `deadline` comes first, CANCELLED when `stop` is requested
  // first. OK says nothing about whether a token is available: TryAcquire() decides. Blocks the
  // calling thread through the client's Clock (ClientOptions::clock, whose time `deadline` is
  // in); never performs I/O itself. Thread-safe. Retry() calls it within the backoff of its
  // first retry. This default, for budgets with no server to wait for, returns OK at once.
  // (Inline: the retry helper uses this interface without linking the client.)
  virtual absl::Status WaitReady(absl::Time /*deadline*/, std::stop_token /*stop*/) {
    return absl::OkStatus();
  }
};

struct ClientOptions {
  // gRPC target of the budget server, e.g. "127.0.0.1:50051", or of several servers of a
  // cluster: "ipv4:127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", "dns:///budget.example:50051".
  // The channel uses gRPC's round_robin policy: a connection to every address of the target,
  // each Sync to the next one that is connected (a dead address is skipped until it connects
  // again). Any server of a cluster answers for any tenant (it redirects the tenants it does not
  // own); once redirected, a tenant is synced with its owner over a channel of its own (one
  // address, pick_first; same credentials and channel arguments), one Sync per owner per
  // refresh. The target carries only new tenants and those whose owner route failed, so
  // spreading it costs each client one idle connection per address and buys two things: a
  // fleet's first Syncs are spread over the servers, and a server that hangs with its
  // connections open (SIGSTOP, a stalled process) holds only the Syncs sent to it: such a Sync
  // fails after sync_timeout and its resend goes to the next address at once (the wait was its
  // own backoff), so a tenant sent back to the target reaches a live server within about one
  // sync_timeout. (With pick_first every Sync of the target would wait on the hung connection
  // until keepalive closes it, 30 s.) A single address behaves as with pick_first. Name a few
  // servers of a large cluster, not all: each is a connection per client. Name servers of one
  // cluster only: independent single-mode servers would each grant a tenant from their own bucket.
  std::string target = "127.0.0.1:50051";
  // Random if empty. 1-128 printable ASCII characters.
  std::string instance_id;
  // How often the refresher syncs when nothing wakes it earlier (the server may ask for less).
  absl::Duration refresh_period = absl::Milliseconds(200);
  // Never sync more often than this, even when woken (protects the server from a hot loop). A
  // new tenant's first Sync is the exception: it goes out at once.
  absl::Duration min_sync_interval = absl::Milliseconds(5);
  // Deadline of one Sync RPC. A Sync in flight is cut short (and resent with the same seq)
  // when a lease ends or a fallback token is due before it: a blocked Sync never keeps a lease
  // alive past its expiry nor holds up the fallback bucket.
  absl::Duration sync_timeout = absl::Seconds(1);
  // Longest wait between two attempts to (re)connect to the server (gRPC's reconnect backoff,
  // which starts at 100 ms and grows 1.6x per failed attempt, with jitter, up to this). gRPC's
  // own default is 120 s, which would leave a client in fallback for minutes after the server
  // restarts. Range [1 ms, 1 h]. Ignored by CreateBudgetClientForTesting().
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
  // Tokens asked for on top of the estimated spend of one refresh period.
  uint64_t lease_burst = 2;
  // Time source; Clock::Real() if null. Not owned.
  Clock* clock = nullptr;

  // ---- When the server is unreachable (see FallbackMode) ----
  // A tenant enters fallback when its lease has expired (or it never had one) and the last Sync
  // attempt failed with anything but UNAUTHENTICATED or PERMISSION_DENIED (those mean the
  // server answered and refuses this client: deny). It stays there, with the refresher retrying
  // Sync at most 1 s apart, until a response grants it a lease again; the next Sync then reports
  // the retries allowed in fallback (TenantSync.fallback_spent). A tenant the server refused
  // (TenantStats::error) stays denied. A lease still in force is spent first, to its expiry.
  FallbackMode fallback = FallbackMode::kLocalBucket;
  // The local bucket of a tenant the server never answered for (no SafeShare known), per
  // process: starts full, at most `fallback_capacity` tokens, refilled at
  // `fallback_refill_per_second`. Conservative on purpose (one retry now, then one per 10 s):
  // the process does not know how large the fleet is. Ranges [0, 1e9].
  double fallback_capacity = 1;
  double fallback_refill_per_second = 0.1;

  // ---- Observability ----
  // Where the client registers its metrics (retry_budget_client_*: retries allowed, denied and
  // allowed in fallback, shadow mode's would-be denials, requests, tokens held, mode per tenant;
  // syncs by result). Not owned; must outlive the client. Null: no metrics. The refresher
  // updates them after each of its steps, never the hot path, so they lag by at most one step.
  // Two clients must not share one registry.
  prometheus::Registry* metrics_registry = nullptr;

  // ---- Security ----
  // Credentials of the channel to `target`. Null means insecure (plaintext), fit only for
  // loopback and tests: production uses TLS, e.g. grpc::SslCredentials(...) (mutual TLS with a
  // client certificate and key in the SslCredentialsOptions). Ignored by
  // CreateBudgetClientForTesting().
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  // When non-empty, every Sync carries the metadata `authorization: Bearer <bearer_token>` (the
  // tenant credential the server checks). Sent in the clear unless the channel is TLS.
  // 1-4096 printable ASCII characters, no spaces.
  std::string bearer_token;
};

// Thread-safe. Destroying it stops the refresher after a final Sync that reports every counter
// and returns every unspent token (at most 3 attempts with the same seq, each bounded by
// `sync_timeout`). See retrybudget/client_testing.h to drive a client step by step in tests.
class BudgetClient {
 public:
  // Creates a client with its own channel to `options.target` and starts the refresher. Does not
  // wait for the server: until a lease arrives, TryAcquire() denies. Returns INVALID_ARGUMENT for
  // bad options (naming the field and value).
  //
  // The channel reconnects on its own: a restarted server is noticed within about
  // `max_reconnect_backoff` (plus one round trip), with no environment variable or channel
  // argument to set. gRPC's transparent retries are off (the refresher resends a failed Sync
  // itself, with the same seq), and HTTP/2 keepalive pings detect a connection that went dead
  // silently while a Sync is in flight.
  static absl::StatusOr<std::unique_ptr<BudgetClient>> Create(ClientOptions options);

  virtual ~BudgetClient() = default;

  // The handle for `tenant` (created on first call; later calls return the same pointer, valid
  // until the client is destroyed). INVALID_ARGUMENT for a malformed tenant name,
  // RESOURCE_EXHAUSTED past 256 tenants (one Sync carries at most 256), FAILED_PRECONDITION for a
  // new tenant after Shutdown(). Takes a lock: keep the pointer instead of calling it per retry.
  virtual absl::StatusOr<TenantBudget*> Tenant(absl::string_view tenant) = 0;

  // Reports everything and returns all unspent tokens now, then stops the refresher; after it,
  // TryAcquire() denies. Idempotent. Returns the status of the final Sync.
  virtual absl::Status Shutdown() = 0;

  virtual const std::string& instance_id() const = 0;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_CLIENT_H_
