#include "client/cpp/sync_engine.h"

#include <algorithm>
#include <utility>

#include <grpc/support/log.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace retrybudget::client_internal {
namespace {

// A deadline may be reported a hair before the clock reaches it.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(1);

// Codes with which a server that did read the request refuses it (it is too large, or an entry
// in it is invalid): an answer, not an outage. The request is split, or its tenant denied.
bool IsRequestRefusal(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument ||
         code == absl::StatusCode::kResourceExhausted ||
         code == absl::StatusCode::kFailedPrecondition ||
         code == absl::StatusCode::kOutOfRange;
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

ServerState StateAfter(absl::StatusCode code) {
  if (code == absl::StatusCode::kOk) return ServerState::kAnswering;
  if (code == absl::StatusCode::kUnauthenticated ||
      code == absl::StatusCode::kPermissionDenied) {
    return ServerState::kRefusing;
  }
  return ServerState::kUnreachable;
}

}  // namespace

SyncEngine::SyncEngine(SyncEngineOptions options, TenantRegistry* tenants,
                       ClientMetrics* metrics, OwnerChannels* owners)
    : options_(std::move(options)),
      tenants_(tenants),
      metrics_(metrics),
      owner_channels_(owners) {}

// ---- a step ----

std::optional<SyncPlan> SyncEngine::BeginStep(absl::Time now) {
  step_ = Step();
  if (shut_down_) return std::nullopt;
  step_.tenants = tenants_->Snapshot();
  absl::Time next_step = absl::InfiniteFuture();
  absl::Time lease_ends = absl::InfiniteFuture();
  for (TenantBudgetImpl* tenant : step_.tenants) {
    next_step = std::min(next_step, tenant->Step(now, StateFor(tenant, now)));
    lease_ends = std::min(lease_ends, tenant->LeaseEndsAt());
  }
  // The Sync ends (or is cut short) in time for the next duty: a lease ends exactly at its
  // expiry, a fallback step runs at most kMinFallbackStepWindow late, and a server unreachable
  // since an earlier attempt turns "down" on time (a spent lease then falls back at once, not
  // when an attempt waiting for the channel gives up a sync_timeout later).
  next_step = std::min(next_step, NextDown(now));
  step_.cut = std::min(lease_ends, std::max(next_step, now + kMinFallbackStepWindow));
  step_.phase = Phase::kMainOnly;
  return NextPlan(now);
}

std::optional<SyncPlan> SyncEngine::NextPlan(absl::Time now) {
  while (true) {
    if (step_.syncing) {
      if (std::optional<SyncPlan> plan = PlanAttempt(now)) return plan;
      step_.syncing = false;
    }
    if (!NextRouteSync(now)) return std::nullopt;
  }
}

bool SyncEngine::NextRouteSync(absl::Time now) {
  Step& step = step_;
  auto start = [&step](Route& route, std::vector<TenantBudgetImpl*> tenants) {
    step.sync = RouteSync();
    step.sync.route = &route;
    step.sync.tenants = std::move(tenants);
    step.sync.chunk = route.max_tenants_per_sync;
    step.syncing = true;
  };
  while (true) {
    switch (step.phase) {
      case Phase::kMainOnly:
        // Without a redirect seen, every tenant is on the main route.
        step.phase = Phase::kRoutedStart;
        if (!step.tenants.empty() && !Routing() && SyncDue(main_, step.tenants) <= now) {
          start(main_, step.tenants);
          return true;
        }
        break;
      case Phase::kRoutedStart:
        if (step.tenants.empty() || !Routing()) {
          step.phase = Phase::kDone;
          break;
        }
        PruneRoutes();
        step.round = 0;
        step.phase = Phase::kRoundStart;
        break;
      case Phase::kRoundStart:
        // A redirected tenant goes to its owner in the same step: one more round per redirect,
        // at most kMaxRedirectHops + 1 rounds (a tenant past that many hops is parked).
        if (step.round > kMaxRedirectHops || now >= step.cut) {
          step.phase = Phase::kDone;
          break;
        }
        redirected_ = false;
        step.groups = GroupByRoute(step.tenants);
        step.next_group = 0;
        step.phase = Phase::kRound;
        break;
      case Phase::kRound:
        if (step.next_group < step.groups.size() && now < step.cut) {
          auto& [route, group] = step.groups[step.next_group++];
          if (SyncDue(*route, group) > now) break;
          start(*route, group);
          return true;
        }
        if (!redirected_) {
          step.phase = Phase::kDone;
          break;
        }
        ++step.round;
        step.phase = Phase::kRoundStart;
        break;
      case Phase::kDone:
        return false;
    }
  }
}

std::optional<SyncPlan> SyncEngine::PlanAttempt(absl::Time now) {
  RouteSync& sync = step_.sync;
  // Up to route.max_tenants_per_sync tenants per request; the rest go in the next requests of
  // this step. A request the server refuses as a whole is split (ApplyRefusal).
  if (sync.finished || sync.done >= sync.tenants.size()) return std::nullopt;
  if (sync.check_cut && now >= step_.cut) return std::nullopt;
  Route& route = *sync.route;
  const std::vector<TenantBudgetImpl*> rest(
      sync.tenants.begin() + static_cast<ptrdiff_t>(sync.done), sync.tenants.end());
  std::optional<Pending>& in_flight = route.pending;
  if (in_flight.has_value() && now - in_flight->first_sent >= options_.policy.refresh_period) {
    // Failing for a whole refresh period: a new request (abandon-after-refresh-period).
    in_flight.reset();
    if (!route.address.empty()) {
      DropRoute(route, rest);
      return std::nullopt;
    }
  }
  sync.resend = in_flight.has_value();
  if (!sync.resend) {
    // A new request: new seq, counters as of now. It is kept until a response arrives, so a
    // retry resends exactly these bytes (the server then answers it the same way).
    Pending& pending = in_flight.emplace();
    pending.request.set_instance_id(options_.instance_id);
    pending.request.set_seq(++seq_);
    const size_t n = std::min(rest.size(), std::max<size_t>(1, sync.chunk));
    for (size_t i = 0; i < n; ++i) {
      rest[i]->FillSync(now, options_.policy, pending.request.add_tenants());
      pending.tenants.push_back(rest[i]);
    }
    pending.first_sent = now;
  }
  sync.sent = in_flight->tenants.size();
  route.last_send = now;
  SyncPlan plan;
  plan.address = route.address;
  plan.request = &in_flight->request;
  plan.sent = now;
  plan.deadline = std::min(now + options_.sync_timeout, step_.cut);
  // Once an attempt failed the server is known unreachable: wait for the channel to connect
  // (and drive its handshake) instead of failing at once.
  plan.wait_for_ready = route.failures > 0;
  return plan;
}

void SyncEngine::DropRoute(Route& route, const std::vector<TenantBudgetImpl*>& tenants) {
  // An owner that cannot be reached: its tenants go back to the main target (which redirects
  // them again once the shard has an owner), unreachable until a grant.
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
}

void SyncEngine::EndAttempt(const SyncPlan& plan, AttemptOutcome outcome, absl::Time received) {
  if (!step_.syncing) return;
  RouteSync& sync = step_.sync;
  metrics_->SyncAttempted(outcome.code == absl::StatusCode::kOk);
  if (outcome.code != absl::StatusCode::kOk) metrics_->SyncFailed(outcome.code);
  switch (ApplyOutcome(sync, plan, outcome, received)) {
    case AttemptResult::kDone:
      sync.done += sync.sent;
      sync.check_cut = true;
      break;
    case AttemptResult::kSplit:
      sync.check_cut = true;
      break;
    case AttemptResult::kResentPending:  // the rest are due on their schedule
    case AttemptResult::kRetryLater:
      sync.finished = true;
      break;
  }
}

SyncEngine::AttemptResult SyncEngine::ApplyOutcome(RouteSync& sync, const SyncPlan& plan,
                                                   AttemptOutcome& outcome,
                                                   absl::Time received) {
  Route& route = *sync.route;
  NoteStatus(outcome);
  const bool cut_short = plan.deadline < plan.sent + options_.sync_timeout &&
                         outcome.code == absl::StatusCode::kDeadlineExceeded &&
                         received >= plan.deadline - kDeadlineSlack;
  if (cut_short || (outcome.woken && outcome.code == absl::StatusCode::kCancelled)) {
    // Interrupted for a duty (a lease ending, a fallback step, a worker's wake): no verdict on
    // the server and no backoff. The driver ends the step, then the same request goes out
    // again. If the server did apply it, the resend (same seq) gets the same answer.
    route.retry_at = received;
    return AttemptResult::kRetryLater;
  }
  if (IsRequestRefusal(outcome.code)) return ApplyRefusal(sync, outcome, received);
  route.server_state = StateAfter(outcome.code);
  if (outcome.code != absl::StatusCode::kOk) {
    if (route.failures == 0) route.failing_since = plan.sent;
    ++route.failures;
    // Counted from the attempt's start: one that waited out its deadline was its own backoff.
    route.retry_at =
        std::max(received, plan.sent + RetryBackoff(route.failures, options_.policy));
    if (route.failures == 1) {
      gpr_log(GPR_ERROR, "retrybudget: Sync seq %llu failed; retrying (tenants whose lease "
                          "ends meanwhile fall back): %s",
              static_cast<unsigned long long>(plan.request->seq()),
              last_status_.ToString().c_str());
    }
    return AttemptResult::kRetryLater;
  }
  if (route.failures > 0) {
    gpr_log(GPR_INFO, "retrybudget: Sync seq %llu succeeded after %d failed attempts",
            static_cast<unsigned long long>(plan.request->seq()), route.failures);
  }
  route.failures = 0;
  route.failing_since = absl::InfiniteFuture();
  const Pending done = std::move(*route.pending);
  route.pending.reset();
  const AttemptResult result =
      sync.resend ? AttemptResult::kResentPending : AttemptResult::kDone;
  if (outcome.response.stale()) {
    // The server has applied a newer seq of this instance: nothing here was applied or granted.
    gpr_log(GPR_ERROR, "retrybudget: Sync seq %llu answered as stale; ignored",
            static_cast<unsigned long long>(done.request.seq()));
    return result;
  }
  ApplyResponse(done, outcome.response, received);
  return result;
}

SyncEngine::AttemptResult SyncEngine::ApplyRefusal(RouteSync& sync,
                                                   const AttemptOutcome& outcome,
                                                   absl::Time received) {
  // The server answered: it is reachable, and this request as a whole is refused. It applied
  // nothing, so the counters simply go in the next request.
  Route& route = *sync.route;
  route.server_state = ServerState::kAnswering;
  route.failures = 0;
  route.failing_since = absl::InfiniteFuture();
  Pending refused = std::move(*route.pending);
  route.pending.reset();
  const size_t size = refused.tenants.size();
  if (size > 1) {
    // Too large, or one entry is bad: split. A limit the server names is kept for later
    // requests; otherwise halve this request only, down to single tenants.
    const size_t named = TenantLimitIn(outcome.message);
    if (named > 0 && named < size) {
      route.max_tenants_per_sync = named;
      sync.chunk = named;
    } else {
      sync.chunk = size / 2;
    }
    LogRefusal(received, absl::StrCat("Sync seq ", refused.request.seq(), " with ", size,
                                      " tenants refused; splitting it into requests of ",
                                      sync.chunk, ": ", last_status_.ToString()));
    return AttemptResult::kSplit;
  }
  // One tenant, refused: deny it until its next refresh (not fallback: the server answers).
  v1::TenantError error;
  error.set_code(static_cast<int>(outcome.code));
  error.set_message(outcome.message);
  refused.tenants[0]->ApplyRefusal(error, received, options_.policy);
  LogRefusal(received, absl::StrCat("Sync seq ", refused.request.seq(), " for tenant \"",
                                    refused.tenants[0]->tenant(),
                                    "\" refused; the tenant is denied: ",
                                    last_status_.ToString()));
  return AttemptResult::kDone;
}

void SyncEngine::ApplyResponse(const Pending& pending, const v1::SyncResponse& response,
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
    const int code = grant.has_error() ? grant.error().code() : 0;
    if (code == static_cast<int>(absl::StatusCode::kFailedPrecondition) &&
        !grant.error().owner().empty()) {
      // Not this server's shard: nothing was applied; sync the tenant with its owner.
      Redirect(pending.tenants[i], grant.error().owner(), received);
      continue;
    }
    if (code == static_cast<int>(absl::StatusCode::kUnavailable) &&
        grant.error().owner().empty()) {
      // The shard has no owner that can grant now: lease to expiry, then fallback.
      Park(pending.tenants[i], received);
      continue;
    }
    if (code != 0) {
      gpr_log(GPR_ERROR, "retrybudget: budget server refused tenant \"%s\" (code %d): %s",
              sent.tenant().c_str(), code, grant.error().message().c_str());
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

absl::Time SyncEngine::EndStep(absl::Time now) {
  if (shut_down_) return absl::InfiniteFuture();
  const std::vector<TenantBudgetImpl*>& tenants = step_.tenants;
  // A response may carry a lease that already ended (the RPC outlived the TTL): expire it now.
  // A failed attempt sends tenants without a lease into fallback now, not a step later.
  absl::Time next = absl::InfiniteFuture();
  if (!Routing()) {
    next = SyncDue(main_, tenants);
  } else {
    for (const auto& [route, group] : GroupByRoute(tenants)) {
      next = std::min(next, SyncDue(*route, group));
    }
  }
  for (TenantBudgetImpl* tenant : tenants) {
    next = std::min(next, tenant->Step(now, StateFor(tenant, now)));
  }
  next = std::min(next, NextDown(now));
  UpdateMetrics(tenants);
  return next;
}

// ---- routes ----

absl::Time SyncEngine::SyncDue(const Route& route,
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

ServerState SyncEngine::StateOf(const Route& route, absl::Time now) const {
  if (route.server_state == ServerState::kUnreachable && now >= DownAt(route.failing_since)) {
    return ServerState::kDown;
  }
  return route.server_state;
}

absl::Time SyncEngine::NextDown(absl::Time now) const {
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

ServerState SyncEngine::StateFor(const TenantBudgetImpl* tenant, absl::Time now) const {
  if (routed_.empty()) return StateOf(main_, now);
  const auto it = routed_.find(tenant);
  if (it == routed_.end()) return StateOf(main_, now);
  // A live server said the shard has no owner that can grant: a failover once it lasts.
  if (it->second.unavailable) {
    return now >= DownAt(it->second.unavailable_since) ? ServerState::kDown
                                                       : ServerState::kUnreachable;
  }
  if (it->second.owner.empty()) return StateOf(main_, now);
  const auto owner = owners_.find(it->second.owner);
  return owner == owners_.end() ? StateOf(main_, now) : StateOf(*owner->second, now);
}

SyncEngine::Groups SyncEngine::GroupByRoute(const std::vector<TenantBudgetImpl*>& tenants) {
  Groups groups;
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

void SyncEngine::PruneRoutes() {
  absl::flat_hash_map<std::string, int> used;
  for (const auto& [tenant, route] : routed_) {
    if (!route.owner.empty()) ++used[route.owner];
  }
  for (auto it = owners_.begin(); it != owners_.end();) {
    if (!used.contains(it->first) && !it->second->pending.has_value()) {
      if (owner_channels_ != nullptr) owner_channels_->Close(it->first);
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

void SyncEngine::Redirect(TenantBudgetImpl* tenant, const std::string& owner,
                          absl::Time received) {
  metrics_->Redirected();
  TenantRoute& route = routed_[tenant];
  if (++route.hops > kMaxRedirectHops || owner_channels_ == nullptr) {
    LogRefusal(received, absl::StrCat("tenant \"", tenant->tenant(), "\" redirected ",
                                      route.hops, " times without a grant (last to ", owner,
                                      "); treated as unavailable"));
    Park(tenant, received);
    return;
  }
  if (!owners_.contains(owner)) {
    if (owners_.size() >= kMaxOwnerRoutes) {
      LogRefusal(received, absl::StrCat("tenant \"", tenant->tenant(), "\" redirected to ",
                                        owner, " but ", kMaxOwnerRoutes,
                                        " owner channels are open; treated as unavailable"));
      Park(tenant, received);
      return;
    }
    if (!owner_channels_->Open(owner)) {
      Park(tenant, received);
      return;
    }
    auto added = std::make_unique<Route>();
    added->address = owner;
    owners_.emplace(owner, std::move(added));
  }
  route.owner = owner;
  route.unavailable = false;
  route.unavailable_since = absl::InfiniteFuture();
  redirected_ = true;
  tenant->SyncAgainAt(absl::InfinitePast());  // at once, on the owner's route
}

void SyncEngine::Park(TenantBudgetImpl* tenant, absl::Time received) {
  TenantRoute& route = routed_[tenant];
  route.owner.clear();
  route.hops = 0;
  if (!route.unavailable) route.unavailable_since = received;
  route.unavailable = true;
  tenant->SyncAgainAt(received + options_.policy.refresh_period);
}

// ---- the final Sync ----

void SyncEngine::BeginFinal() {
  if (shut_down_) return;
  shut_down_ = true;
  step_ = Step();
  final_ = Final();
  final_.tenants = tenants_->Snapshot();
  main_.pending.reset();
  for (auto& [address, route] : owners_) route->pending.reset();
  if (final_.tenants.empty()) return;
  if (!Routing()) {
    final_.routes.emplace_back(&main_, final_.tenants);
    return;
  }
  // Every server that holds tenants of this instance gets its final Sync.
  for (auto& group : GroupByRoute(final_.tenants)) {
    if (!group.second.empty()) final_.routes.push_back(std::move(group));
  }
}

std::optional<FinalPlan> SyncEngine::NextFinal() {
  Final& f = final_;
  while (f.route < f.routes.size()) {
    Route& route = *f.routes[f.route].first;
    if (!f.started) {
      const std::vector<TenantBudgetImpl*>& tenants = f.routes[f.route].second;
      f.entries.assign(tenants.size(), v1::TenantSync());
      for (size_t i = 0; i < tenants.size(); ++i) tenants[i]->FillFinal(&f.entries[i]);
      f.done = 0;
      f.chunk = route.max_tenants_per_sync;
      f.route_result = absl::OkStatus();
      f.started = true;
    }
    if (f.done >= f.entries.size()) {
      if (f.result.ok()) f.result = f.route_result;
      ++f.route;
      f.started = false;
      continue;
    }
    // In requests of at most max_tenants_per_sync tenants (split further if the server refuses
    // one as a whole); only the last carries final=true, since the server forgets the instance
    // on it. A new seq even if a request is still unanswered: if the server applied it, its
    // grant is reclaimed from our tokens_received; if not, the cumulative counters here cover
    // it.
    const size_t n = std::min(std::max<size_t>(1, f.chunk), f.entries.size() - f.done);
    f.request.Clear();
    f.request.set_instance_id(options_.instance_id);
    f.request.set_seq(++seq_);
    f.request.set_final(f.done + n == f.entries.size());
    for (size_t i = f.done; i < f.done + n; ++i) *f.request.add_tenants() = f.entries[i];
    f.in_request = n;
    FinalPlan plan;
    plan.address = route.address;
    plan.request = &f.request;
    plan.timeout = options_.sync_timeout;
    // With the server answering, each attempt may wait for a connection being re-made; with
    // the server known unreachable, fail fast rather than hold the caller 3 x sync_timeout.
    plan.wait_for_ready = route.server_state != ServerState::kUnreachable;
    return plan;
  }
  return std::nullopt;
}

std::optional<absl::Duration> SyncEngine::EndFinalAttempt(const AttemptOutcome& outcome,
                                                          int attempt) {
  metrics_->SyncAttempted(outcome.code == absl::StatusCode::kOk);
  if (outcome.code != absl::StatusCode::kOk) metrics_->SyncFailed(outcome.code);
  NoteStatus(outcome);
  const bool ok = outcome.code == absl::StatusCode::kOk;
  const bool refused = IsRequestRefusal(outcome.code);
  // Not again once refused (the server answered), at most kFinalSyncAttempts in all.
  if (!ok && !refused && attempt < kFinalSyncAttempts) {
    return RetryBackoff(attempt, options_.policy);
  }
  Final& f = final_;
  if (f.route >= f.routes.size()) return std::nullopt;
  Route& route = *f.routes[f.route].first;
  const size_t n = f.in_request;
  if (refused && n > 1) {
    const size_t named = TenantLimitIn(outcome.message);
    if (named > 0 && named < n) route.max_tenants_per_sync = named;
    f.chunk = named > 0 && named < n ? named : n / 2;
    return std::nullopt;
  }
  if (!ok) {
    f.route_result = last_status_;
    gpr_log(GPR_ERROR, "retrybudget: final Sync failed; unspent tokens are forfeited: %s",
            last_status_.ToString().c_str());
    if (!refused) {
      f.done = f.entries.size();  // unreachable: the rest would fail too
      return std::nullopt;
    }
  }
  f.done += n;
  return std::nullopt;
}

absl::Status SyncEngine::FinishFinal() {
  if (final_.tenants.empty()) return absl::OkStatus();
  UpdateMetrics(final_.tenants);
  return final_.result;
}

// ---- logs and metrics ----

void SyncEngine::NoteStatus(const AttemptOutcome& outcome) {
  last_status_ = outcome.code == absl::StatusCode::kOk
                     ? absl::OkStatus()
                     : absl::Status(outcome.code, absl::StrCat("Sync to the budget server failed: ",
                                                               outcome.message));
}

void SyncEngine::LogRefusal(absl::Time now, const std::string& line) {
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

void SyncEngine::UpdateMetrics(const std::vector<TenantBudgetImpl*>& tenants) {
  for (const TenantBudgetImpl* tenant : tenants) {
    metrics_->TenantUpdated(tenant->tenant(), tenant->Stats());
  }
}

}  // namespace retrybudget::client_internal
