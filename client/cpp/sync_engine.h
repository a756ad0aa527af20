// The leasing protocol of one client without its transport and without a clock of its own: given
// the time, the tenants (their events reach it through TenantRegistry and TenantBudgetImpl) and
// the server's answers, it says what to send and when to wake. The same shape as the JS and
// Python clients' engines (client/js/src/sync-engine.js, client/python/retrybudget/
// _sync_engine.py). The Refresher (refresher.h) drives it from its thread and does the I/O:
//
//   std::optional<SyncPlan> plan = engine.BeginStep(clock->Now());
//   while (plan.has_value()) {                  // one attempt per route (and request) due
//     engine.EndAttempt(*plan, Send(*plan), clock->Now());
//     plan = engine.NextPlan(clock->Now());
//   }
//   absl::Time next = engine.EndStep(clock->Now());   // when to wake
//
// and at shutdown BeginFinal / NextFinal / EndFinalAttempt / FinishFinal.
//
// The rules kept here (with TenantBudgetImpl) are the client rulebook's,
// client/conformance/RULES.md, by id; tests/client/conformance_test.cc runs the conformance
// corpus that pins them through this engine and the Refresher:
//  * Requests and seq: one-request-per-route, seq-new-request, resend-unchanged (RetryBackoff),
//    abandon-after-refresh-period (resent, its lease would start at the old send time, and
//    during an outage the fresh counters carry the fallback spending; abandoning is safe:
//    counters are cumulative, a later seq makes the old one stale, and a grant of the old one
//    the server applied is reclaimed through tokens_received), server-state-from-outcome,
//    stale-dropped, grants-match-request, lease-ends-at-first-send, min-sync-interval,
//    first-sync-at-once (Tenant() wakes the refresher: workers are denied until the answer),
//    next-sync-from-grant; low-water-wakes and want-from-demand in TenantBudgetImpl.
//  * Deadlines and connections: sync-deadline (kMinFallbackStepWindow: a fallback token a few
//    milliseconds late costs nothing, a Sync that can never finish would),
//    cut-short-is-interrupted (also an attempt a Wake() cancelled: AttemptOutcome::woken),
//    fail-fast-then-wait-for-ready (SyncPlan::wait_for_ready; why: refresher.h).
//  * Refusals: request-refused-split, tenant-refused.
//  * Routing (a cluster, DESIGN.md): every rule above holds per route, the main target (address
//    "") or one owner, each with its own pending request, backoff, failures and server state;
//    seq grows across all routes. redirect-followed, redirect-hop-limit (kMaxRedirectHops),
//    owner-route-limit (kMaxOwnerRoutes), unavailable-parks, owner-unreachable-parks. Nothing of
//    it runs until a redirect is seen: a step then costs what it did without routing.
//  * final-sync: BeginFinal .. FinishFinal.
#ifndef RETRYBUDGET_CLIENT_SYNC_ENGINE_H_
#define RETRYBUDGET_CLIENT_SYNC_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/cpp/client_metrics.h"
#include "client/cpp/refresh_policy.h"
#include "client/cpp/tenant_budget_impl.h"
#include "client/cpp/tenant_registry.h"
#include "retrybudget/v1/budget.pb.h"

namespace retrybudget::client_internal {

// Most owner addresses with a route (and a channel) at once; a redirect to one more is not
// followed until a route without tenants is dropped (the tenant is parked on the main target).
inline constexpr size_t kMaxOwnerRoutes = 64;
// Redirects a tenant follows without a grant in between; past it (a redirect loop, servers
// disagreeing during a takeover) the tenant is parked: lease to expiry, then fallback, asked
// again on the main target a refresh period later.
inline constexpr int kMaxRedirectHops = 4;

// The channels to owners, kept by the driver. Called by the engine only, from the engine's
// caller.
class OwnerChannels {
 public:
  virtual ~OwnerChannels() = default;
  // A redirect to `address` starts a route: make its channel. False when the driver cannot
  // (no way to reach owners configured): the redirect is not followed.
  virtual bool Open(const std::string& address) = 0;
  // The route to `address` was dropped (no tenant uses it any more).
  virtual void Close(const std::string& address) = 0;
};

struct SyncEngineOptions {
  std::string instance_id;
  RefreshPolicy policy;
  absl::Duration sync_timeout = absl::Seconds(1);
};

// One Sync attempt to send. `request` points into the engine and stays valid until the
// EndAttempt() of this plan.
struct SyncPlan {
  std::string address;  // "" : the main target
  const v1::SyncRequest* request = nullptr;
  absl::Time sent;      // the time the plan was made for
  absl::Time deadline;  // sent + timeout
  bool wait_for_ready = false;
  absl::Duration timeout() const { return deadline - sent; }
};

// One final request to send (at most kFinalSyncAttempts times). `request` stays valid until
// the EndFinalAttempt() that ends it.
struct FinalPlan {
  std::string address;
  const v1::SyncRequest* request = nullptr;
  absl::Duration timeout;
  bool wait_for_ready = false;
};

// What an attempt gave: OK and the response, or the status code and message of its failure.
struct AttemptOutcome {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
  v1::SyncResponse response;
  bool woken = false;  // cancelled by a Wake() while it waited for the channel
};

// Not thread-safe: the driver serialises every call (the Refresher holds its mutex for a whole
// step). `tenants`, `metrics` and `owners` (not owned) must outlive the engine; `owners` may be
// null (redirects are then not followed).
class SyncEngine {
 public:
  SyncEngine(SyncEngineOptions options, TenantRegistry* tenants, ClientMetrics* metrics,
             OwnerChannels* owners);

  SyncEngine(const SyncEngine&) = delete;
  SyncEngine& operator=(const SyncEngine&) = delete;

  // Starts a step at `now`: steps every tenant (ends expired leases, enters, refills or leaves
  // fallback) and returns the first attempt due, if any.
  std::optional<SyncPlan> BeginStep(absl::Time now);
  // Applies the outcome of `plan`'s attempt, which ended at `received`.
  void EndAttempt(const SyncPlan& plan, AttemptOutcome outcome, absl::Time received);
  // The next attempt of this step at `now` (another request of a split, another route, a
  // redirected tenant's owner), or none.
  std::optional<SyncPlan> NextPlan(absl::Time now);
  // Ends the step at `now`: steps the tenants again with the outcomes, updates the metrics.
  // Returns when the next step is due (a sync, a retry, a lease expiry, a fallback token, a
  // route turning down; InfiniteFuture when nothing is scheduled: no tenants, or shut down).
  absl::Time EndStep(absl::Time now);

  // Shuts every tenant down and prepares the final requests (final=true on the last of each
  // route, every counter, every unspent token returned, want 0). Once only: later calls prepare
  // nothing.
  void BeginFinal();
  // The next final request to send, or none.
  std::optional<FinalPlan> NextFinal();
  // Applies attempt number `attempt` (from 1) of the current final request. Returns how long
  // to wait before sending it again (same seq), or none when it is done.
  std::optional<absl::Duration> EndFinalAttempt(const AttemptOutcome& outcome, int attempt);
  // The final Sync's status (OK when there was no tenant to report); updates the metrics.
  absl::Status FinishFinal();

  bool shut_down() const { return shut_down_; }
  // The seq of the last request built (0 before the first).
  uint64_t last_seq() const { return seq_; }
  // Status of the last Sync attempt (OK before the first).
  const absl::Status& last_status() const { return last_status_; }

 private:
  struct Pending {
    v1::SyncRequest request;
    std::vector<TenantBudgetImpl*> tenants;  // request.tenants(i) belongs to tenants[i]
    absl::Time first_sent;
  };

  // One destination: the main target (address "") or an owner. The state of the rules.
  struct Route {
    std::string address;
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
    bool unavailable = false;  // parked: unreachable until a grant
    // Since when (InfiniteFuture while not parked): down once a refresh period old, so a shard
    // without an owner for a moment (shards moving while servers join) is a blip.
    absl::Time unavailable_since = absl::InfiniteFuture();
  };

  using Groups = std::vector<std::pair<Route*, std::vector<TenantBudgetImpl*>>>;

  // Where a step is: the main route alone (no redirect seen yet), then the rounds over every
  // route (one more round per redirect, at most kMaxRedirectHops + 1).
  enum class Phase { kMainOnly, kRoutedStart, kRoundStart, kRound, kDone };

  // The route being synced in a step: its due tenants go out in requests of at most `chunk`.
  struct RouteSync {
    Route* route = nullptr;
    std::vector<TenantBudgetImpl*> tenants;
    size_t done = 0;     // tenants answered
    size_t chunk = 0;    // tenants per request (lowered by a split)
    size_t sent = 0;     // tenants in the attempt in flight
    bool resend = false;  // the attempt in flight resends the route's pending request
    bool check_cut = false;  // a request of this route ended: stop at the cut
    bool finished = false;   // failed, cut short, or a resend answered: nothing more this step
  };

  struct Step {
    std::vector<TenantBudgetImpl*> tenants;
    absl::Time cut = absl::InfiniteFuture();
    Phase phase = Phase::kDone;
    int round = 0;
    Groups groups;  // this round's routes (fixed for the round)
    size_t next_group = 0;
    bool syncing = false;  // `sync` is a route being synced
    RouteSync sync;
  };

  // What an ended attempt means for the rest of its route's Sync in this step.
  enum class AttemptResult {
    kDone,           // a new request was answered (granted, or refused and its tenant denied)
    kSplit,          // refused as a whole: the chunk is smaller, the same tenants go again
    kResentPending,  // an earlier request was resent and answered
    kRetryLater,     // failed or cut short: retry_at is set
  };

  // Picks the next route of the step to sync (or none: the step sends nothing more).
  bool NextRouteSync(absl::Time now);
  // The next attempt of the route being synced, or none (the route is done; it may have been
  // dropped: owner-unreachable-parks).
  std::optional<SyncPlan> PlanAttempt(absl::Time now);
  AttemptResult ApplyOutcome(RouteSync& sync, const SyncPlan& plan, AttemptOutcome& outcome,
                             absl::Time received);
  AttemptResult ApplyRefusal(RouteSync& sync, const AttemptOutcome& outcome,
                             absl::Time received);
  void ApplyResponse(const Pending& pending, const v1::SyncResponse& response,
                     absl::Time received);
  // An owner route whose request failed for a refresh period: its tenants go back to main.
  void DropRoute(Route& route, const std::vector<TenantBudgetImpl*>& tenants);

  bool Routing() const { return !routed_.empty() || !owners_.empty(); }
  // The tenants of each route (main first).
  Groups GroupByRoute(const std::vector<TenantBudgetImpl*>& tenants);
  absl::Time SyncDue(const Route& route, const std::vector<TenantBudgetImpl*>& tenants) const;
  // What `tenant`'s route says of its server at `now`: kDown once it has been unreachable for a
  // refresh period (or the tenant parked for a refresh period).
  ServerState StateFor(const TenantBudgetImpl* tenant, absl::Time now) const;
  ServerState StateOf(const Route& route, absl::Time now) const;
  // The earliest time after `now` at which a route or a parked tenant turns kDown.
  absl::Time NextDown(absl::Time now) const;
  // When a route unreachable since `since`, or a tenant parked since then, turns kDown. The
  // checks and NextDown use this one sum, so the step scheduled for then sees the server down.
  absl::Time DownAt(absl::Time since) const { return since + options_.policy.refresh_period; }
  void Redirect(TenantBudgetImpl* tenant, const std::string& owner, absl::Time received);
  void Park(TenantBudgetImpl* tenant, absl::Time received);
  // Drops owner routes no tenant uses any more.
  void PruneRoutes();
  void NoteStatus(const AttemptOutcome& outcome);
  void LogRefusal(absl::Time now, const std::string& line);
  void UpdateMetrics(const std::vector<TenantBudgetImpl*>& tenants);

  const SyncEngineOptions options_;
  TenantRegistry* const tenants_;
  ClientMetrics* const metrics_;
  OwnerChannels* const owner_channels_;

  uint64_t seq_ = 0;  // per instance, across every route
  Route main_;
  // Owner routes by address (unique_ptr: a Route* stays valid while the map grows).
  absl::flat_hash_map<std::string, std::unique_ptr<Route>> owners_;
  // Tenants not simply on the main route; empty until a redirect is seen.
  absl::flat_hash_map<const TenantBudgetImpl*, TenantRoute> routed_;
  bool redirected_ = false;  // a redirect in this round of a step
  Step step_;
  static constexpr absl::Duration kRefusalLogInterval = absl::Minutes(1);
  absl::Time last_refusal_log_ = absl::InfinitePast();
  uint64_t refusals_not_logged_ = 0;
  absl::Status last_status_;
  bool shut_down_ = false;

  // The final Sync: the routes with tenants, the one being reported, its entries and request.
  struct Final {
    std::vector<TenantBudgetImpl*> tenants;
    Groups routes;
    size_t route = 0;
    bool started = false;  // routes[route]'s entries are filled
    std::vector<v1::TenantSync> entries;
    size_t done = 0;
    size_t chunk = 0;
    size_t in_request = 0;
    v1::SyncRequest request;
    absl::Status route_result;
    absl::Status result;
  };
  Final final_;
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_SYNC_ENGINE_H_
