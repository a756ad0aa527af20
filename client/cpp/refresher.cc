#include "client/cpp/refresher.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace retrybudget::client_internal {
namespace {

// The thread never sleeps longer than this in one go, so a far-away (or infinite) deadline
// never reaches the clock's arithmetic.
constexpr absl::Duration kMaxIdleSleep = absl::Minutes(1);

SyncEngineOptions ToEngineOptions(const RefresherOptions& options) {
  return SyncEngineOptions{.instance_id = options.instance_id,
                           .policy = options.policy,
                           .sync_timeout = options.sync_timeout};
}

}  // namespace

bool OwnerStubs::Open(const std::string& address) {
  if (!factory_) return false;
  std::unique_ptr<v1::RetryBudgetService::StubInterface> stub = factory_(address);
  if (stub == nullptr) return false;
  stubs_[address] = std::move(stub);
  return true;
}

v1::RetryBudgetService::StubInterface* OwnerStubs::Get(const std::string& address) const {
  const auto it = stubs_.find(address);
  return it == stubs_.end() ? nullptr : it->second.get();
}

Refresher::Refresher(RefresherOptions options,
                     std::unique_ptr<v1::RetryBudgetService::StubInterface> stub, Clock* clock,
                     TenantRegistry* tenants, std::unique_ptr<ClientMetrics> metrics)
    : options_(std::move(options)),
      stub_(std::move(stub)),
      clock_(clock),
      tenants_(tenants),
      metrics_(metrics != nullptr ? std::move(metrics) : std::make_unique<NoClientMetrics>()),
      owner_stubs_(options_.owner_stubs),
      engine_(ToEngineOptions(options_), tenants_, metrics_.get(), &owner_stubs_) {}

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
  return engine_.last_seq();
}

absl::Status Refresher::last_sync_status() const {
  MutexLock lock(&mu_);
  return engine_.last_status();
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
  std::optional<SyncPlan> plan = engine_.BeginStep(clock_->Now());
  while (plan.has_value()) {
    AttemptOutcome outcome = SendLocked(plan->address, *plan->request, plan->timeout(),
                                        plan->wait_for_ready, /*cancellable=*/true);
    engine_.EndAttempt(*plan, std::move(outcome), clock_->Now());
    plan = engine_.NextPlan(clock_->Now());
  }
  return engine_.EndStep(clock_->Now());
}

// The deadline is wall-clock time (it is gRPC's), never the injected Clock.
AttemptOutcome Refresher::SendLocked(const std::string& address, const v1::SyncRequest& request,
                                     absl::Duration timeout, bool wait_for_ready,
                                     bool cancellable) {
  AttemptOutcome outcome;
  v1::RetryBudgetService::StubInterface* stub =
      address.empty() ? stub_.get() : owner_stubs_.Get(address);
  if (stub == nullptr) {
    outcome.code = absl::StatusCode::kUnavailable;
    outcome.message = absl::StrCat("no channel to ", address);
    return outcome;
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())));
  context.set_wait_for_ready(wait_for_ready);
  if (!options_.bearer_token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.bearer_token));
  }
  const bool may_cancel = wait_for_ready && cancellable;
  if (may_cancel) {
    MutexLock lock(&wake_mu_);
    waiting_call_ = &context;
    waiting_call_woken_ = false;
  }
  const grpc::Status status = stub->Sync(&context, request, &outcome.response);
  if (may_cancel) {
    MutexLock lock(&wake_mu_);
    waiting_call_ = nullptr;
    outcome.woken = waiting_call_woken_;
  }
  outcome.code = static_cast<absl::StatusCode>(status.error_code());
  outcome.message = status.error_message();
  return outcome;
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
  engine_.BeginFinal();
  while (std::optional<FinalPlan> plan = engine_.NextFinal()) {
    for (int attempt = 1;; ++attempt) {
      const AttemptOutcome outcome = SendLocked(plan->address, *plan->request, plan->timeout,
                                                plan->wait_for_ready, /*cancellable=*/false);
      const std::optional<absl::Duration> delay = engine_.EndFinalAttempt(outcome, attempt);
      if (!delay.has_value()) break;
      clock_->SleepUntil(clock_->Now() + *delay, std::stop_token());
    }
  }
  return engine_.FinishFinal();
}

}  // namespace retrybudget::client_internal
