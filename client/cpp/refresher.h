// The refresher: one Sync RPC for all the tenants of a client (one per owning server once a
// cluster has redirected some), on a schedule, on demand, and a final one at shutdown.
#ifndef RETRYBUDGET_CLIENT_REFRESHER_H_
#define RETRYBUDGET_CLIENT_REFRESHER_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "retrybudget/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/client_metrics.h"
#include "client/cpp/refresh_policy.h"
#include "client/cpp/tenant_budget_impl.h"
#include "client/cpp/tenant_registry.h"
#include "retrybudget/clock.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget::client_internal {

// Makes the stub for a server the client was redirected to (HOST:PORT), with the same
// credentials and channel arguments as the main target's.
using StubFactory = std::function<std::unique_ptr<v1::RetryBudgetService::StubInterface>(
    const std::string& address)>;

// Most owner addresses with a cached channel at once; a redirect to one more is not followed
// until a route without tenants is dropped (the tenant stays on the main target).
inline constexpr size_t kMaxOwnerRoutes = 64;
// Redirects a tenant follows without a grant in between; past it (a redirect loop, servers
// disagreeing during a takeover) the tenant is handled as UNAVAILABLE: lease to expiry, then
// fallback, asked again on the main target a refresh period later.
inline constexpr int kMaxRedirectHops = 4;

struct RefresherOptions {
  std::string instance_id;
  RefreshPolicy policy;
  absl::Duration sync_timeout = absl::Seconds(1);
  // Sent as `authorization: Bearer <token>` with every Sync when non-empty.
  std::string bearer_token;
  // Stubs for owner addresses named in redirects; null: redirects are not followed (the
  // tenant is handled as UNAVAILABLE).
  StubFactory owner_stubs;
};

// Thread-safe. RunOnce() is the whole protocol step; Start() runs it on a background thread
// that sleeps (through the Clock) until the next step is due or Wake() interrupts it. Tests call
// RunOnce() themselves instead of Start(), with a FakeClock and a mock stub.
//
// The protocol rules kept here are the client rulebook's, client/conformance/RULES.md, by id
// (each pinned by scenarios of the conformance corpus, which tests/client/conformance_test.cc
// runs through this class):
//  * Requests and seq: one-request-per-route, seq-new-request, resend-unchanged (RetryBackoff),
//    abandon-after-refresh-period, server-state-from-outcome (the ServerState each tenant's
//    Step() sees), stale-dropped, grants-match-request, lease-ends-at-first-send,
//    min-sync-interval, first-sync-at-once (Tenant() wakes the refresher), next-sync-from-grant,
//    low-water-wakes and want-from-demand (the last two in TenantBudgetImpl).
//  * Deadlines and connections: sync-deadline (kMinFallbackStepWindow),
//    cut-short-is-interrupted (also an attempt Wake() cancelled), fail-fast-then-wait-for-ready.
//  * Refusals: request-refused-split, tenant-refused.
//  * Routing (a cluster): every rule above holds per route, the main target or one owner
//    address, each with its own pending request, backoff, failures and ServerState:
//    redirect-followed, redirect-hop-limit (kMaxRedirectHops), owner-route-limit
//    (kMaxOwnerRoutes), unavailable-parks, owner-unreachable-parks.
//  * final-sync: Shutdown().
// Why some of them are as they are (the rulebook says what, not why):
//  * Abandoning a request failing for a refresh period is safe: counters are cumulative, a later
//    seq makes the old one stale, and a grant of the old one that the server applied is
//    reclaimed through tokens_received. Resending it instead would start its lease at the old
//    send time, and during an outage the fresh counters carry the fallback spending.
//  * A Sync never holds up the tenants' duties (its deadline): a fallback token a few
//    milliseconds late costs nothing, a Sync that can never finish would, so a spent lease falls
//    back on time even while an attempt waits for the channel.
//  * Reconnecting: the first attempt after a success is fail-fast, so a refused connection is
//    known at once (tenants whose lease ends fall back without waiting for a deadline). Later
//    attempts are wait_for_ready, and while one waits its thread drives the connection's
//    handshake (a fail-fast call on a channel in TRANSIENT_FAILURE fails at once, and nothing but
//    gRPC's backup poller, every 5 s, would read the new connection's SETTINGS). With the
//    backoff counted from the attempt's start, the refresher keeps waiting on the channel during
//    an outage, and a restarted server is seen as soon as the channel reconnects.
//  * seq is per instance across all routes, so every server sees increasing seqs; a redirected
//    tenant moves alone (counters are cumulative). Nothing of the routing runs until a redirect
//    is seen: without one, every tenant is on the main route and a step costs what it did
//    without routing.
class Refresher final : public SyncWaker {
 public:
  // `stub`, owned. `clock` and `tenants` (not owned) must outlive the refresher. `metrics`,
  // owned, is updated after every step (NoClientMetrics if null).
  Refresher(RefresherOptions options, std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
            Clock* clock, TenantRegistry* tenants,
            std::unique_ptr<ClientMetrics> metrics = nullptr);
  // Stops the thread if Shutdown() was not called (without a final Sync).
  ~Refresher() override;

  Refresher(const Refresher&) = delete;
  Refresher& operator=(const Refresher&) = delete;

  // Starts the background thread. Call at most once.
  void Start();

  // One step at clock->Now(): steps every tenant (ends expired leases, enters, refills or
  // leaves fallback), then sends one Sync attempt if one is due (blocking for at most
  // sync_timeout, and never past the next lease expiry or fallback step), steps the tenants
  // again with its outcome, and updates the metrics. Returns
  // when the next step is due (a sync, a retry, a lease expiry or the next fallback token);
  // InfiniteFuture when nothing is scheduled (no tenants, or shut down).
  absl::Time RunOnce();

  // Interrupts the thread's sleep so that it re-plans at once (a worker found a lease low or
  // empty, or a tenant was created). Cheap; callable from any thread.
  void Wake() override;

  // Stops the thread, then sends the final Sync (final=true, every counter, every unspent token
  // returned, want 0), at most kFinalSyncAttempts times with the same seq, each bounded by
  // sync_timeout. Returns the status of the final Sync (OK when there was no tenant to report).
  // Idempotent: later calls return the first result.
  absl::Status Shutdown();

  // For tests: whether Wake() was called since the last RunOnce() began.
  bool wake_requested() const;
  // For tests: the seq of the last request built (0 before the first).
  uint64_t last_seq() const;
  // For tests: status of the last Sync attempt (OK before the first).
  absl::Status last_sync_status() const;

 private:
  struct Pending {
    v1::SyncRequest request;
    std::vector<TenantBudgetImpl*> tenants;  // request.tenants(i) belongs to tenants[i]
    absl::Time first_sent;
  };

  // One destination: the main target (address "") or an owner. The state of the protocol
  // rules in the class comment.
  struct Route {
    std::string address;
    v1::RetryBudgetService::StubInterface* stub = nullptr;
    std::unique_ptr<v1::RetryBudgetService::StubInterface> owned_stub;  // owners only
    std::optional<Pending> pending;  // sent, no response yet
    absl::Time last_send = absl::InfinitePast();
    absl::Time retry_at = absl::InfinitePast();
    int failures = 0;  // consecutive failed attempts
    // Start of the first of those failed attempts (InfiniteFuture while answering).
    absl::Time failing_since = absl::InfiniteFuture();
    // Tenants per request: the server's limit once it named one in a refusal.
    size_t max_tenants_per_sync = std::numeric_limits<size_t>::max();
    ServerState server_state = ServerState::kAnswering;
  };

  // A tenant that is not simply on the main route.
  struct TenantRoute {
    std::string owner;         // "" : the main target
    int hops = 0;              // redirects since the last grant
    bool unavailable = false;  // no owner could grant: unreachable until a grant
    // Since when (InfiniteFuture while not unavailable): down once a refresh period old, so a
    // shard without an owner for a moment (shards moving while servers join) is a blip.
    absl::Time unavailable_since = absl::InfiniteFuture();
  };

  // The tenants of each route (main first); only called once a redirect was seen.
  std::vector<std::pair<Route*, std::vector<TenantBudgetImpl*>>> GroupByRouteLocked(
      const std::vector<TenantBudgetImpl*>& tenants) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What `tenant`'s route says of its server at `now`: kDown once it has been unreachable for
  // a refresh period (or the tenant parked, its shard without an owner, for a refresh period).
  ServerState StateForLocked(const TenantBudgetImpl* tenant, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ServerState StateOf(const Route& route, absl::Time now) const;
  // The earliest time after `now` at which a route or a parked tenant turns kDown (InfiniteFuture
  // when none will): a step is due then, and a Sync attempt is cut short for it.
  absl::Time NextDownLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When a route unreachable since `since` (its first failed attempt), or a tenant parked since
  // then, turns kDown: a refresh period later. StateOf, StateForLocked and NextDownLocked all
  // use it, so the step scheduled for that moment sees the server down.
  absl::Time DownAt(absl::Time since) const { return since + options_.policy.refresh_period; }
  // Per-entry answers of a cluster: follow a redirect, or park the tenant (UNAVAILABLE).
  void RedirectLocked(TenantBudgetImpl* tenant, const std::string& owner, absl::Time received)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ParkLocked(TenantBudgetImpl* tenant, absl::Time received)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops owner routes no tenant uses any more.
  void PruneRoutesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  enum class SyncOutcome {
    kDone,           // a new request was answered (granted, or refused and its tenant denied)
    kSplit,          // refused as a whole: *chunk is smaller, the same tenants go again
    kResentPending,  // an earlier request was resent and answered
    kRetryLater,     // failed or cut short: retry_at is set
    kRouteDropped,   // an owner failing for a refresh period: its tenants went back to main
  };

  void Loop();
  absl::Time SyncDueLocked(const Route& route,
                           const std::vector<TenantBudgetImpl*>& tenants) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Syncs `tenants` at `now`, in requests of at most max_tenants_per_sync_ tenants, ending no
  // later than `cut` (the next duty).
  void SyncLocked(Route& route, const std::vector<TenantBudgetImpl*>& tenants, absl::Time now,
                  absl::Time cut)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one attempt: the pending request again, or a new one with the first *chunk of
  // `tenants`; *sent is the number of tenants it carried. A server that refuses the request
  // (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, OUT_OF_RANGE) is answering, not
  // unreachable: a request of several tenants is split (*chunk lowered: to the limit the error
  // names, which later requests keep, or else to half), a single tenant is denied
  // (ApplyRefusal) until its next refresh.
  SyncOutcome SyncOnceLocked(Route& route, const std::vector<TenantBudgetImpl*>& tenants,
                             absl::Time now, absl::Time cut, size_t* chunk, size_t* sent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogRefusalLocked(absl::Time now, const std::string& line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyResponseLocked(const Pending& pending, const v1::SyncResponse& response,
                           absl::Time received) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FinalSyncLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The final requests of one route's tenants (the last carries final=true).
  absl::Status FinalSyncRouteLocked(Route& route, const std::vector<TenantBudgetImpl*>& tenants)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One request of the final Sync, at most kFinalSyncAttempts times (not again once refused).
  grpc::Status SendFinalLocked(Route& route, const v1::SyncRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One attempt with a deadline `timeout` from now. With `wait_for_ready`, Wake() may cancel
  // it; *woken is then true.
  grpc::Status CallSyncLocked(Route& route, const v1::SyncRequest& request,
                              v1::SyncResponse* response, absl::Duration timeout,
                              bool wait_for_ready, bool* woken = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateMetricsLocked(const std::vector<TenantBudgetImpl*>& tenants)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopThread();

  const RefresherOptions options_;
  const std::unique_ptr<v1::RetryBudgetService::StubInterface> stub_;
  Clock* const clock_;
  TenantRegistry* const tenants_;
  const std::unique_ptr<ClientMetrics> metrics_;

  // Held for a whole step (including its RPC): steps never overlap.
  mutable Mutex mu_;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;  // per instance, across every route
  Route main_ ABSL_GUARDED_BY(mu_);
  // Owner routes by address (unique_ptr: a Route* stays valid while the map grows).
  absl::flat_hash_map<std::string, std::unique_ptr<Route>> owners_ ABSL_GUARDED_BY(mu_);
  // Tenants not simply on the main route; empty until a redirect is seen.
  absl::flat_hash_map<const TenantBudgetImpl*, TenantRoute> routed_ ABSL_GUARDED_BY(mu_);
  bool redirected_ ABSL_GUARDED_BY(mu_) = false;  // a redirect in this round of a step
  static constexpr absl::Duration kRefusalLogInterval = absl::Minutes(1);
  absl::Time last_refusal_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t refusals_not_logged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_status_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);

  // Sleep / wake of the thread.
  mutable Mutex wake_mu_;
  bool wake_pending_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::stop_source* sleep_stop_ ABSL_GUARDED_BY(wake_mu_) = nullptr;  // the sleep in progress
  // The wait_for_ready attempt in progress (Wake() cancels it), and whether Wake() did.
  grpc::ClientContext* waiting_call_ ABSL_GUARDED_BY(wake_mu_) = nullptr;
  bool waiting_call_woken_ ABSL_GUARDED_BY(wake_mu_) = false;

  // Serialises Shutdown() callers (the thread is joined under it).
  Mutex shutdown_mu_;
  std::thread thread_ ABSL_GUARDED_BY(shutdown_mu_);
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_REFRESHER_H_
