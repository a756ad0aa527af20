#include "client/cpp/refresher.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <grpc/support/log.h>
#include <grpcpp/client_context.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace retrybudget::client_internal {
namespace {

// The thread never sleeps longer than this in one go, so a far-away (or infinite) deadline
// never reaches the clock's arithmetic.
constexpr absl::Duration kMaxIdleSleep = absl::Minutes(1);

// gRPC may report a deadline a hair before the Clock reaches it.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(1);

absl::Status ToAbsl(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("Sync to the budget server failed: ", status.error_message()));
}

// Codes with which a server that did read the request refuses it (it is too large, or an entry
// in it is invalid): an answer, not an outage. The request is split, or its tenant denied.
bool IsRequestRefusal(grpc::StatusCode code) {
  return code == grpc::StatusCode::INVALID_ARGUMENT ||
         code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         code == grpc::StatusCode::FAILED_PRECONDITION ||
         code == grpc::StatusCode::OUT_OF_RANGE;
}

// The tenant limit a refusal names ("... at most N are allowed in one request"), or 0.
size_t TenantLimitIn(const std::string& message) {
  static constexpr char kAtMost[] = "at most ";
  const size_t at = message.find(kAtMost);
  if (at == std::string::npos || message.find("request", at) == std::string::npos) return 0;
  size_t limit = 0;
  for (size_t i = at + sizeof(kAtMost) - 1; i < message.size() && absl::ascii_isdigit(message[i]);
       ++i) {
    limit = std::min<size_t>(limit * 10 + static_cast<size_t>(message[i] - '0'), 1u << 20);
  }
  return limit;
}

ServerState StateAfter(const grpc::Status& status) {
  if (status.ok()) return ServerState::kAnswering;
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
      status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    return ServerState::kRefusing;
  }
  return ServerState::kUnreachable;
}

}  // namespace

Refresher::Refresher(RefresherOptions options,
                     std::unique_ptr<v1::RetryBudgetService::StubInterface> stub, Clock* clock,
                     TenantRegistry* tenants, std::unique_ptr<ClientMetrics> metrics)
    : options_(std::move(options)),
      stub_(std::move(stub)),
      clock_(clock),
      tenants_(tenants),
      metrics_(metrics != nullptr ? std::move(metrics) : std::make_unique<NoClientMetrics>()) {
  main_.stub = stub_.get();
}

// Sends one Sync attempt with its own deadline and credentials, and counts it. The deadline is
// wall-clock time (it is gRPC's), never the injected Clock.
grpc::Status Refresher::CallSyncLocked(Route& route, const v1::SyncRequest& request,
                                       v1::SyncResponse* response, absl::Duration timeout,
                                       bool wait_for_ready, bool* woken) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())));
  context.set_wait_for_ready(wait_for_ready);
  if (!options_.bearer_token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.bearer_token));
  }
  if (wait_for_ready && woken != nullptr) {
    MutexLock lock(&wake_mu_);
    waiting_call_ = &context;
    waiting_call_woken_ = false;
  }
  const grpc::Status status = route.stub->Sync(&context, request, response);
  if (wait_for_ready && woken != nullptr) {
    MutexLock lock(&wake_mu_);
    waiting_call_ = nullptr;
    *woken = waiting_call_woken_;
  }
  metrics_->SyncAttempted(status.ok());
  if (!status.ok()) metrics_->SyncFailed(static_cast<absl::StatusCode>(status.error_code()));
  return status;
}

void Refresher::UpdateMetricsLocked(const std::vector<TenantBudgetImpl*>& tenants) {
  for (const TenantBudgetImpl* tenant : tenants) {
    metrics_->TenantUpdated(tenant->tenant(), tenant->Stats());
  }
}

Refresher::~Refresher() { StopThread(); }

void Refresher::Start() {
  MutexLock lock(&shutdown_mu_);
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void Refresher::StopThread() {
  {
    MutexLock lock(&wake_mu_);
    stopping_ = true;
    if (sleep_stop_ != nullptr) sleep_stop_->request_stop();
  }
  MutexLock lock(&shutdown_mu_);
  if (thread_.joinable()) thread_.join();
}

void Refresher::Wake() {
  MutexLock lock(&wake_mu_);
  wake_pending_ = true;
  if (sleep_stop_ != nullptr) sleep_stop_->request_stop();
  if (waiting_call_ != nullptr && !waiting_call_woken_) {
    // A Sync waiting for the channel to connect (the server is unreachable) would hold the
    // wake up to its deadline: cancel it; the refresher steps and sends it again at once.
    // TryCancel() is thread-safe and a no-op once the call has finished.
    waiting_call_woken_ = true;
    waiting_call_->TryCancel();
  }
}

bool Refresher::wake_requested() const {
  MutexLock lock(&wake_mu_);
  return wake_pending_;
}

uint64_t Refresher::last_seq() const {
  MutexLock lock(&mu_);
  return seq_;
}

absl::Status Refresher::last_sync_status() const {
  MutexLock lock(&mu_);
  return last_status_;
}

void Refresher::Loop() {
  while (true) {
    const absl::Time next = RunOnce();
    // A fresh stop_source per sleep: Wake() stops it, and the next sleep starts un-stopped.
    std::stop_source wake;
    {
      MutexLock lock(&wake_mu_);
      if (stopping_) return;
      // Woken while the step ran: plan again before sleeping.
      if (wake_pending_) continue;
      sleep_stop_ = &wake;
    }
    clock_->SleepUntil(std::min(next, clock_->Now() + kMaxIdleSleep), wake.get_token());
    MutexLock lock(&wake_mu_);
    sleep_stop_ = nullptr;
    if (stopping_) return;
  }
}

absl::Time Refresher::RunOnce() {
  {
    MutexLock lock(&wake_mu_);
    wake_pending_ = false;
  }
  MutexLock lock(&mu_);
  if (shut_down_) return absl::InfiniteFuture();
  const std::vector<TenantBudgetImpl*> tenants = tenants_->Snapshot();
  absl::Time now = clock_->Now();
  absl::Time next_step = absl::InfiniteFuture();
  absl::Time lease_ends = absl::InfiniteFuture();
  for (TenantBudgetImpl* tenant : tenants) {
    next_step = std::min(next_step, tenant->Step(now, StateForLocked(tenant, now)));
    lease_ends = std::min(lease_ends, tenant->LeaseEndsAt());
  }
  // The Sync ends (or is cut short) in time for the next duty: a lease ends exactly at its
  // expiry, a fallback step runs at most kMinFallbackStepWindow late, and a server unreachable
  // since an earlier attempt turns "down" on time (a spent lease then falls back at once, not
  // when an attempt waiting for the channel gives up a sync_timeout later).
  const absl::Time down_at = NextDownLocked(now);
  next_step = std::min(next_step, down_at);
  const absl::Time cut = std::min(lease_ends, std::max(next_step, now + kMinFallbackStepWindow));
  if (!tenants.empty() && routed_.empty() && owners_.empty()) {
    if (SyncDueLocked(main_, tenants) <= now) {
      SyncLocked(main_, tenants, now, cut);
      now = clock_->Now();
    }
  }
  if (!tenants.empty() && (!routed_.empty() || !owners_.empty())) {
    PruneRoutesLocked();
    // A redirected tenant goes to its owner in the same step: one more round per redirect,
    // at most kMaxRedirectHops + 1 rounds (a tenant past that many hops is parked).
    for (int round = 0; round <= kMaxRedirectHops && now < cut; ++round) {
      redirected_ = false;
      for (auto& [route, group] : GroupByRouteLocked(tenants)) {
        if (now >= cut) break;
        if (SyncDueLocked(*route, group) > now) continue;
        SyncLocked(*route, group, now, cut);
        now = clock_->Now();
      }
      if (!redirected_) break;
    }
  }
  // A response may carry a lease that already ended (the RPC outlived the TTL): expire it now.
  // A failed attempt sends tenants without a lease into fallback now, not a step later.
  absl::Time next = absl::InfiniteFuture();
  if (routed_.empty() && owners_.empty()) {
    next = SyncDueLocked(main_, tenants);
  } else {
    for (const auto& [route, group] : GroupByRouteLocked(tenants)) {
      next = std::min(next, SyncDueLocked(*route, group));
    }
  }
  for (TenantBudgetImpl* tenant : tenants) {
    next = std::min(next, tenant->Step(now, StateForLocked(tenant, now)));
  }
  next = std::min(next, NextDownLocked(now));
  UpdateMetricsLocked(tenants);
  return next;
}

ServerState Refresher::StateOf(const Route& route, absl::Time now) const {
  if (route.server_state == ServerState::kUnreachable &&
      now >= DownAt(route.failing_since)) {
    return ServerState::kDown;
  }
  return route.server_state;
}

absl::Time Refresher::NextDownLocked(absl::Time now) const {
  absl::Time next = absl::InfiniteFuture();
  auto consider = [&](absl::Time since) {
    if (since == absl::InfiniteFuture()) return;
    const absl::Time down = DownAt(since);
    if (down > now) next = std::min(next, down);
  };
  if (main_.server_state == ServerState::kUnreachable) consider(main_.failing_since);
  for (const auto& [address, route] : owners_) {
    if (route->server_state == ServerState::kUnreachable) consider(route->failing_since);
  }
  for (const auto& [tenant, route] : routed_) {
    if (route.unavailable) consider(route.unavailable_since);
  }
  return next;
}

ServerState Refresher::StateForLocked(const TenantBudgetImpl* tenant, absl::Time now) const {
  if (routed_.empty()) return StateOf(main_, now);
  const auto it = routed_.find(tenant);
  if (it == routed_.end()) return StateOf(main_, now);
  // A live server said the shard has no owner that can grant: a failover once it lasts.
  if (it->second.unavailable) {
    return now >= DownAt(it->second.unavailable_since)
               ? ServerState::kDown
               : ServerState::kUnreachable;
  }
  if (it->second.owner.empty()) return StateOf(main_, now);
  const auto owner = owners_.find(it->second.owner);
  return owner == owners_.end() ? StateOf(main_, now) : StateOf(*owner->second, now);
}

std::vector<std::pair<Refresher::Route*, std::vector<TenantBudgetImpl*>>>
Refresher::GroupByRouteLocked(const std::vector<TenantBudgetImpl*>& tenants) {
  std::vector<std::pair<Route*, std::vector<TenantBudgetImpl*>>> groups;
  groups.emplace_back(&main_, std::vector<TenantBudgetImpl*>());
  absl::flat_hash_map<Route*, size_t> index;
  for (TenantBudgetImpl* tenant : tenants) {
    Route* route = &main_;
    if (const auto it = routed_.find(tenant); it != routed_.end() && !it->second.owner.empty()) {
      if (const auto owner = owners_.find(it->second.owner); owner != owners_.end()) {
        route = owner->second.get();
      }
    }
    if (route == &main_) {
      groups[0].second.push_back(tenant);
      continue;
    }
    auto [at, added] = index.try_emplace(route, groups.size());
    if (added) groups.emplace_back(route, std::vector<TenantBudgetImpl*>());
    groups[at->second].second.push_back(tenant);
  }
  return groups;
}

void Refresher::PruneRoutesLocked() {
  absl::flat_hash_map<std::string, int> used;
  for (const auto& [tenant, route] : routed_) {
    if (!route.owner.empty()) ++used[route.owner];
  }
  for (auto it = owners_.begin(); it != owners_.end();) {
    if (!used.contains(it->first) && !it->second->pending.has_value()) {
      owners_.erase(it++);
    } else {
      ++it;
    }
  }
  // Tenants back on the main target with nothing to remember: the plain path again.
  for (auto it = routed_.begin(); it != routed_.end();) {
    if (it->second.owner.empty() && it->second.hops == 0 && !it->second.unavailable) {
      routed_.erase(it++);
    } else {
      ++it;
    }
  }
}

void Refresher::RedirectLocked(TenantBudgetImpl* tenant, const std::string& owner,
                               absl::Time received) {
  metrics_->Redirected();
  TenantRoute& route = routed_[tenant];
  if (++route.hops > kMaxRedirectHops || !options_.owner_stubs) {
    LogRefusalLocked(received, absl::StrCat("tenant \"", tenant->tenant(), "\" redirected ",
                                            route.hops, " times without a grant (last to ",
                                            owner, "); treated as unavailable"));
    ParkLocked(tenant, received);
    return;
  }
  if (!owners_.contains(owner)) {
    if (owners_.size() >= kMaxOwnerRoutes) {
      LogRefusalLocked(received, absl::StrCat("tenant \"", tenant->tenant(), "\" redirected to ",
                                              owner, " but ", kMaxOwnerRoutes,
                                              " owner channels are open; treated as unavailable"));
      ParkLocked(tenant, received);
      return;
    }
    auto added = std::make_unique<Route>();
    added->address = owner;
    added->owned_stub = options_.owner_stubs(owner);
    added->stub = added->owned_stub.get();
    if (added->stub == nullptr) {
      ParkLocked(tenant, received);
      return;
    }
    owners_.emplace(owner, std::move(added));
  }
  route.owner = owner;
  route.unavailable = false;
  route.unavailable_since = absl::InfiniteFuture();
  redirected_ = true;
  tenant->SyncAgainAt(absl::InfinitePast());  // at once, on the owner's route
}

void Refresher::ParkLocked(TenantBudgetImpl* tenant, absl::Time received) {
  TenantRoute& route = routed_[tenant];
  route.owner.clear();
  route.hops = 0;
  if (!route.unavailable) route.unavailable_since = received;
  route.unavailable = true;
  tenant->SyncAgainAt(received + options_.policy.refresh_period);
}

absl::Time Refresher::SyncDueLocked(const Route& route,
                                    const std::vector<TenantBudgetImpl*>& tenants) const {
  if (route.pending.has_value()) return route.retry_at;
  if (tenants.empty()) return absl::InfiniteFuture();
  absl::Time due = absl::InfiniteFuture();
  bool first = false;
  for (const TenantBudgetImpl* tenant : tenants) {
    bool never_synced = false;
    due = std::min(due, tenant->SyncDueAt(&never_synced));
    first = first || never_synced;
  }
  if (due == absl::InfiniteFuture()) return due;
  // A new tenant's first Sync goes out at once, not after min_sync_interval: its workers are
  // denied until it is answered. Once per tenant, at most kMaxTenantsPerClient times.
  if (first) return due;
  return std::max(due, route.last_send + options_.policy.min_sync_interval);
}

void Refresher::SyncLocked(Route& route, const std::vector<TenantBudgetImpl*>& tenants,
                           absl::Time now, absl::Time cut) {
  // Up to route.max_tenants_per_sync tenants per request; the rest go in the next requests of this
  // step. A request the server refuses as a whole is split (see SyncOnceLocked).
  size_t chunk = route.max_tenants_per_sync;
  size_t done = 0;
  while (done < tenants.size()) {
    const std::vector<TenantBudgetImpl*> rest(tenants.begin() + static_cast<ptrdiff_t>(done),
                                              tenants.end());
    size_t sent = 0;
    const SyncOutcome outcome = SyncOnceLocked(route, rest, now, cut, &chunk, &sent);
    if (outcome == SyncOutcome::kRetryLater || outcome == SyncOutcome::kRouteDropped) return;
    if (outcome == SyncOutcome::kResentPending) return;  // the rest are due on their schedule
    if (outcome == SyncOutcome::kDone) done += sent;
    now = clock_->Now();
    if (now >= cut) return;
  }
}

Refresher::SyncOutcome Refresher::SyncOnceLocked(Route& route,
                                                 const std::vector<TenantBudgetImpl*>& tenants,
                                                 absl::Time now, absl::Time cut, size_t* chunk,
                                                 size_t* sent) {
  std::optional<Pending>& in_flight = route.pending;
  if (in_flight.has_value() && now - in_flight->first_sent >= options_.policy.refresh_period) {
    // Failing for a whole refresh period: a new request (see the class comment).
    in_flight.reset();
    if (!route.address.empty()) {
      // An owner that cannot be reached: its tenants go back to the main target (which
      // redirects them again once the shard has an owner), unreachable until a grant.
      gpr_log(GPR_ERROR, "retrybudget: owner %s unreachable for a refresh period; its tenants "
                          "go back to the main target", route.address.c_str());
      for (TenantBudgetImpl* tenant : tenants) {
        TenantRoute& moved = routed_[tenant];
        moved.owner.clear();
        moved.hops = 0;
        // Unreachable since the owner's first failure: already down for a refresh period.
        if (!moved.unavailable) moved.unavailable_since = route.failing_since;
        moved.unavailable = true;
      }
      route.failures = 0;
      route.failing_since = absl::InfiniteFuture();
      route.server_state = ServerState::kAnswering;
      return SyncOutcome::kRouteDropped;
    }
  }
  const bool resend = in_flight.has_value();
  if (!resend) {
    // A new request: new seq, counters as of now. It is kept until a response arrives, so a
    // retry resends exactly these bytes (the server then answers it the same way).
    Pending& pending = in_flight.emplace();
    pending.request.set_instance_id(options_.instance_id);
    pending.request.set_seq(++seq_);
    const size_t n = std::min(tenants.size(), std::max<size_t>(1, *chunk));
    for (size_t i = 0; i < n; ++i) {
      tenants[i]->FillSync(now, options_.policy, pending.request.add_tenants());
      pending.tenants.push_back(tenants[i]);
    }
    pending.first_sent = now;
  }
  *sent = in_flight->tenants.size();
  route.last_send = now;
  const absl::Time deadline = std::min(now + options_.sync_timeout, cut);
  // Once an attempt failed the server is known unreachable: wait for the channel to connect
  // (and drive its handshake) instead of failing at once (see the class comment).
  const bool wait_for_ready = route.failures > 0;
  bool woken = false;
  v1::SyncResponse response;
  const grpc::Status status =
      CallSyncLocked(route, in_flight->request, &response, deadline - now, wait_for_ready, &woken);
  const absl::Time received = clock_->Now();
  last_status_ = ToAbsl(status);
  const bool cut_short =
      deadline < now + options_.sync_timeout &&
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      received >= deadline - kDeadlineSlack;
  if (cut_short || (woken && status.error_code() == grpc::StatusCode::CANCELLED)) {
    // Interrupted for a duty (a lease ending, a fallback step, a worker's wake): no verdict on
    // the server and no backoff. The caller steps the tenants, then the same request goes out
    // again. If the server did apply it, the resend (same seq) gets the same answer.
    route.retry_at = received;
    return SyncOutcome::kRetryLater;
  }
  if (IsRequestRefusal(status.error_code())) {
    // The server answered: it is reachable, and this request as a whole is refused. It applied
    // nothing, so the counters simply go in the next request.
    route.server_state = ServerState::kAnswering;
    route.failures = 0;
    route.failing_since = absl::InfiniteFuture();
    Pending refused = std::move(*in_flight);
    in_flight.reset();
    const size_t size = refused.tenants.size();
    if (size > 1) {
      // Too large, or one entry is bad: split. A limit the server names is kept for later
      // requests; otherwise halve this request only, down to single tenants.
      const size_t named = TenantLimitIn(status.error_message());
      if (named > 0 && named < size) {
        route.max_tenants_per_sync = named;
        *chunk = named;
      } else {
        *chunk = size / 2;
      }
      LogRefusalLocked(received, absl::StrCat("Sync seq ", refused.request.seq(), " with ", size,
                                              " tenants refused; splitting it into requests of ",
                                              *chunk, ": ", last_status_.ToString()));
      return SyncOutcome::kSplit;
    }
    // One tenant, refused: deny it until its next refresh (not fallback: the server answers).
    v1::TenantError error;
    error.set_code(status.error_code());
    error.set_message(status.error_message());
    refused.tenants[0]->ApplyRefusal(error, received, options_.policy);
    LogRefusalLocked(received, absl::StrCat("Sync seq ", refused.request.seq(), " for tenant \"",
                                            refused.tenants[0]->tenant(),
                                            "\" refused; the tenant is denied: ",
                                            last_status_.ToString()));
    return SyncOutcome::kDone;
  }
  route.server_state = StateAfter(status);
  if (!status.ok()) {
    if (route.failures == 0) route.failing_since = now;
    ++route.failures;
    // Counted from the attempt's start: one that waited out its deadline was its own backoff.
    route.retry_at = std::max(received, now + RetryBackoff(route.failures, options_.policy));
    if (route.failures == 1) {
      gpr_log(GPR_ERROR, "retrybudget: Sync seq %llu failed; retrying (tenants whose lease "
                          "ends meanwhile fall back): %s",
              static_cast<unsigned long long>(in_flight->request.seq()),
              last_status_.ToString().c_str());
    }
    return SyncOutcome::kRetryLater;
  }
  if (route.failures > 0) {
    gpr_log(GPR_INFO, "retrybudget: Sync seq %llu succeeded after %d failed attempts",
            static_cast<unsigned long long>(in_flight->request.seq()), route.failures);
  }
  route.failures = 0;
  route.failing_since = absl::InfiniteFuture();
  const Pending done = std::move(*in_flight);
  in_flight.reset();
  if (response.stale()) {
    // The server has applied a newer seq of this instance: nothing here was applied or granted.
    gpr_log(GPR_ERROR, "retrybudget: Sync seq %llu answered as stale; ignored",
            static_cast<unsigned long long>(done.request.seq()));
    return resend ? SyncOutcome::kResentPending : SyncOutcome::kDone;
  }
  ApplyResponseLocked(done, response, received);
  return resend ? SyncOutcome::kResentPending : SyncOutcome::kDone;
}

void Refresher::LogRefusalLocked(absl::Time now, const std::string& line) {
  // At most one line a minute; the lines left out are counted in the next.
  if (now - last_refusal_log_ < kRefusalLogInterval) {
    ++refusals_not_logged_;
    return;
  }
  gpr_log(GPR_ERROR, "retrybudget: %s (%llu more refusals since the last such line)",
          line.c_str(), static_cast<unsigned long long>(refusals_not_logged_));
  last_refusal_log_ = now;
  refusals_not_logged_ = 0;
}

void Refresher::ApplyResponseLocked(const Pending& pending, const v1::SyncResponse& response,
                                    absl::Time received) {
  if (response.tenants_size() != pending.request.tenants_size()) {
    gpr_log(GPR_ERROR, "retrybudget: Sync response has %d tenant entries for %d in the request",
            response.tenants_size(), pending.request.tenants_size());
  }
  const int n = std::min(response.tenants_size(), pending.request.tenants_size());
  for (int i = 0; i < n; ++i) {
    const v1::TenantGrant& grant = response.tenants(i);
    const v1::TenantSync& sent = pending.request.tenants(i);
    if (grant.tenant() != sent.tenant()) {
      // Not this tenant's answer: take nothing. A grant dropped here is never counted as
      // received, so the server reclaims it; the tenant asks again on its schedule.
      gpr_log(GPR_ERROR, "retrybudget: Sync response entry %d is for tenant \"%s\", not \"%s\"",
              i, grant.tenant().c_str(), sent.tenant().c_str());
      continue;
    }
    if (grant.has_error() &&
        grant.error().code() == static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION) &&
        !grant.error().owner().empty()) {
      // Not this server's shard: nothing was applied; sync the tenant with its owner.
      RedirectLocked(pending.tenants[i], grant.error().owner(), received);
      continue;
    }
    if (grant.has_error() &&
        grant.error().code() == static_cast<int>(grpc::StatusCode::UNAVAILABLE) &&
        grant.error().owner().empty()) {
      // The shard has no owner that can grant now: lease to expiry, then fallback.
      ParkLocked(pending.tenants[i], received);
      continue;
    }
    if (grant.has_error() && grant.error().code() != 0) {
      gpr_log(GPR_ERROR, "retrybudget: budget server refused tenant \"%s\" (code %d): %s",
              sent.tenant().c_str(), grant.error().code(), grant.error().message().c_str());
      pending.tenants[i]->ApplyRefusal(grant.error(), received, options_.policy);
      continue;
    }
    pending.tenants[i]->ApplyGrant(grant, sent, pending.first_sent, received, options_.policy);
    if (!routed_.empty()) {
      if (const auto it = routed_.find(pending.tenants[i]); it != routed_.end()) {
        it->second.hops = 0;
        it->second.unavailable = false;
        it->second.unavailable_since = absl::InfiniteFuture();
      }
    }
  }
}

absl::Status Refresher::Shutdown() {
  StopThread();
  tenants_->Close();
  MutexLock lock(&mu_);
  if (!shut_down_) {
    shut_down_ = true;
    final_status_ = FinalSyncLocked();
  }
  return final_status_;
}

absl::Status Refresher::FinalSyncLocked() {
  const std::vector<TenantBudgetImpl*> tenants = tenants_->Snapshot();
  main_.pending.reset();
  for (auto& [address, route] : owners_) route->pending.reset();
  if (tenants.empty()) return absl::OkStatus();
  absl::Status result;
  if (routed_.empty() && owners_.empty()) {
    result = FinalSyncRouteLocked(main_, tenants);
  } else {
    // Every server that holds tenants of this instance gets its final Sync.
    for (auto& [route, group] : GroupByRouteLocked(tenants)) {
      if (group.empty()) continue;
      absl::Status status = FinalSyncRouteLocked(*route, group);
      if (result.ok()) result = std::move(status);
    }
  }
  UpdateMetricsLocked(tenants);
  return result;
}

absl::Status Refresher::FinalSyncRouteLocked(Route& route,
                                             const std::vector<TenantBudgetImpl*>& tenants) {
  std::vector<v1::TenantSync> entries(tenants.size());
  for (size_t i = 0; i < tenants.size(); ++i) tenants[i]->FillFinal(&entries[i]);
  // In requests of at most max_tenants_per_sync tenants (split further if the server refuses
  // one as a whole); only the last carries final=true, since the server forgets the instance on
  // it.
  size_t chunk = route.max_tenants_per_sync;
  size_t done = 0;
  absl::Status result;
  while (done < entries.size()) {
    const size_t n = std::min(std::max<size_t>(1, chunk), entries.size() - done);
    v1::SyncRequest request;
    request.set_instance_id(options_.instance_id);
    // A new seq even if a request is still unanswered: if the server applied it, its grant is
    // reclaimed from our tokens_received; if not, the cumulative counters here cover it.
    request.set_seq(++seq_);
    request.set_final(done + n == entries.size());
    for (size_t i = done; i < done + n; ++i) *request.add_tenants() = entries[i];
    const grpc::Status status = SendFinalLocked(route, request);
    if (IsRequestRefusal(status.error_code()) && n > 1) {
      const size_t named = TenantLimitIn(status.error_message());
      if (named > 0 && named < n) route.max_tenants_per_sync = named;
      chunk = named > 0 && named < n ? named : n / 2;
      continue;
    }
    if (!status.ok()) {
      result = last_status_;
      gpr_log(GPR_ERROR, "retrybudget: final Sync failed; unspent tokens are forfeited: %s",
              last_status_.ToString().c_str());
      if (!IsRequestRefusal(status.error_code())) break;  // unreachable: the rest would fail too
    }
    done += n;
  }
  return result;
}

grpc::Status Refresher::SendFinalLocked(Route& route, const v1::SyncRequest& request) {
  grpc::Status status;
  // With the server answering, each attempt may wait for a connection being re-made; with the
  // server known unreachable, fail fast rather than hold the caller 3 x sync_timeout.
  const bool wait_for_ready = route.server_state != ServerState::kUnreachable;
  for (int attempt = 1; attempt <= kFinalSyncAttempts; ++attempt) {
    v1::SyncResponse response;
    status = CallSyncLocked(route, request, &response, options_.sync_timeout, wait_for_ready);
    last_status_ = ToAbsl(status);
    if (status.ok() || IsRequestRefusal(status.error_code()) || attempt == kFinalSyncAttempts) {
      break;
    }
    clock_->SleepUntil(clock_->Now() + RetryBackoff(attempt, options_.policy), std::stop_token());
  }
  return status;
}

}  // namespace retrybudget::client_internal
