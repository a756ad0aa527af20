#include "client/refresher.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <grpc/support/log.h>
#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"

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
      metrics_(metrics != nullptr ? std::move(metrics) : std::make_unique<NoClientMetrics>()) {}

// Sends one Sync attempt with its own deadline and credentials, and counts it. The deadline is
// wall-clock time (it is gRPC's), never the injected Clock.
grpc::Status Refresher::CallSyncLocked(const v1::SyncRequest& request,
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
  const grpc::Status status = stub_->Sync(&context, request, response);
  if (wait_for_ready && woken != nullptr) {
    MutexLock lock(&wake_mu_);
    waiting_call_ = nullptr;
    *woken = waiting_call_woken_;
  }
  metrics_->SyncAttempted(status.ok());
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
    next_step = std::min(next_step, tenant->Step(now, server_state_));
    lease_ends = std::min(lease_ends, tenant->LeaseEndsAt());
  }
  if (!tenants.empty() && SyncDueLocked(tenants) <= now) {
    // The Sync ends (or is cut short) in time for the next duty: a lease ends exactly at its
    // expiry, a fallback step runs at most kMinFallbackStepWindow late.
    const absl::Time cut = std::min(lease_ends, std::max(next_step, now + kMinFallbackStepWindow));
    SyncLocked(tenants, now, cut);
    now = clock_->Now();
  }
  // A response may carry a lease that already ended (the RPC outlived the TTL): expire it now.
  // A failed attempt sends tenants without a lease into fallback now, not a step later.
  absl::Time next = SyncDueLocked(tenants);
  for (TenantBudgetImpl* tenant : tenants) {
    next = std::min(next, tenant->Step(now, server_state_));
  }
  UpdateMetricsLocked(tenants);
  return next;
}

absl::Time Refresher::SyncDueLocked(const std::vector<TenantBudgetImpl*>& tenants) const {
  if (pending_.has_value()) return retry_at_;
  if (tenants.empty()) return absl::InfiniteFuture();
  absl::Time due = absl::InfiniteFuture();
  for (const TenantBudgetImpl* tenant : tenants) due = std::min(due, tenant->SyncDueAt());
  if (due == absl::InfiniteFuture()) return due;
  return std::max(due, last_send_ + options_.policy.min_sync_interval);
}

void Refresher::SyncLocked(const std::vector<TenantBudgetImpl*>& tenants, absl::Time now,
                           absl::Time cut) {
  if (pending_.has_value() && now - pending_->first_sent >= options_.policy.refresh_period) {
    // Failing for a whole refresh period: a new request (see the class comment).
    pending_.reset();
  }
  if (!pending_.has_value()) {
    // A new request: new seq, counters as of now. It is kept until a response arrives, so a
    // retry resends exactly these bytes (the server then answers it the same way).
    Pending& pending = pending_.emplace();
    pending.request.set_instance_id(options_.instance_id);
    pending.request.set_seq(++seq_);
    for (TenantBudgetImpl* tenant : tenants) {
      tenant->FillSync(now, options_.policy, pending.request.add_tenants());
    }
    pending.tenants = tenants;
    pending.first_sent = now;
  }
  last_send_ = now;
  const absl::Time deadline = std::min(now + options_.sync_timeout, cut);
  // Once an attempt failed the server is known unreachable: wait for the channel to connect
  // (and drive its handshake) instead of failing at once (see the class comment).
  const bool wait_for_ready = failures_ > 0;
  bool woken = false;
  v1::SyncResponse response;
  const grpc::Status status =
      CallSyncLocked(pending_->request, &response, deadline - now, wait_for_ready, &woken);
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
    retry_at_ = received;
    return;
  }
  server_state_ = StateAfter(status);
  if (!status.ok()) {
    ++failures_;
    // Counted from the attempt's start: one that waited out its deadline was its own backoff.
    retry_at_ = std::max(received, now + RetryBackoff(failures_, options_.policy));
    if (failures_ == 1) {
      gpr_log(GPR_ERROR, "retrybudget: Sync seq %llu failed; retrying (tenants whose lease "
                          "ends meanwhile fall back): %s",
              static_cast<unsigned long long>(pending_->request.seq()),
              last_status_.ToString().c_str());
    }
    return;
  }
  if (failures_ > 0) {
    gpr_log(GPR_INFO, "retrybudget: Sync seq %llu succeeded after %d failed attempts",
            static_cast<unsigned long long>(pending_->request.seq()), failures_);
  }
  failures_ = 0;
  const Pending done = std::move(*pending_);
  pending_.reset();
  if (response.stale()) {
    // The server has applied a newer seq of this instance: nothing here was applied or granted.
    gpr_log(GPR_ERROR, "retrybudget: Sync seq %llu answered as stale; ignored",
            static_cast<unsigned long long>(done.request.seq()));
    return;
  }
  ApplyResponseLocked(done, response, received);
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
    if (grant.has_error() && grant.error().code() != 0) {
      gpr_log(GPR_ERROR, "retrybudget: budget server refused tenant \"%s\" (code %d): %s",
              sent.tenant().c_str(), grant.error().code(), grant.error().message().c_str());
      pending.tenants[i]->ApplyRefusal(grant.error(), received, options_.policy);
      continue;
    }
    pending.tenants[i]->ApplyGrant(grant, sent, pending.first_sent, received, options_.policy);
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
  v1::SyncRequest request;
  request.set_instance_id(options_.instance_id);
  // A new seq even if a request is still unanswered: if the server applied it, its grant is
  // reclaimed from our tokens_received; if not, the cumulative counters here cover it.
  request.set_seq(++seq_);
  request.set_final(true);
  for (TenantBudgetImpl* tenant : tenants) tenant->FillFinal(request.add_tenants());
  pending_.reset();
  if (tenants.empty()) return absl::OkStatus();
  grpc::Status status;
  // With the server answering, each attempt may wait for a connection being re-made; with the
  // server known unreachable, fail fast rather than hold the caller 3 x sync_timeout.
  const bool wait_for_ready = server_state_ != ServerState::kUnreachable;
  for (int attempt = 1; attempt <= kFinalSyncAttempts; ++attempt) {
    v1::SyncResponse response;
    status = CallSyncLocked(request, &response, options_.sync_timeout, wait_for_ready);
    last_status_ = ToAbsl(status);
    if (status.ok() || attempt == kFinalSyncAttempts) break;
    clock_->SleepUntil(clock_->Now() + RetryBackoff(attempt, options_.policy), std::stop_token());
  }
  if (!status.ok()) {
    gpr_log(GPR_ERROR, "retrybudget: final Sync failed; unspent tokens are forfeited: %s",
            last_status_.ToString().c_str());
  }
  UpdateMetricsLocked(tenants);
  return last_status_;
}

}  // namespace retrybudget::client_internal
