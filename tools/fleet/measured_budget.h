// A TenantBudget decorator, one per worker thread, that measures what the harness must show
// about the client's hot path while the server is killed, hung or slow: the longest
// TryAcquire() (it must never block), and the retries allowed while the client was in fallback
// and after it (read from a FallbackMonitor's phase). Plain counters: one instance per thread,
// read after the thread is joined. Thread-compatible; the wrapped budget is thread-safe.
//
//   MeasuredBudget measured(*budget, &monitor);
//   RunLogicalCall(strategy, options, backend, &measured, stop, counts);
//   measured.max_try_acquire()
#ifndef RETRYBUDGET_TOOLS_FLEET_MEASURED_BUDGET_H_
#define RETRYBUDGET_TOOLS_FLEET_MEASURED_BUDGET_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stop_token>
#include <string>
#include <utility>

#include "retrybudget/client.h"
#include "tools/fleet/fallback_monitor.h"

namespace retrybudget::fleet {

class MeasuredBudget final : public TenantBudget {
 public:
  // `inner` must outlive this; `monitor` may be null (no phase counts).
  MeasuredBudget(TenantBudget& inner, const FallbackMonitor* monitor)
      : inner_(inner), monitor_(monitor) {}

  bool TryAcquire() override {
    const auto start = std::chrono::steady_clock::now();
    const bool allowed = inner_.TryAcquire();
    const auto took = std::chrono::steady_clock::now() - start;
    max_try_acquire_ = std::max(max_try_acquire_, took);
    if (allowed) {
      last_phase_ = Phase();
      if (last_phase_ == FallbackPhase::kInFallback) ++retries_allowed_in_fallback_;
      if (last_phase_ == FallbackPhase::kAfterFallback) ++retries_allowed_after_fallback_;
    }
    return allowed;
  }
  void Refund() override {
    inner_.Refund();
    // Undo the count of the token given back (taken last by this thread).
    if (last_phase_ == FallbackPhase::kInFallback && retries_allowed_in_fallback_ > 0) {
      --retries_allowed_in_fallback_;
    }
    if (last_phase_ == FallbackPhase::kAfterFallback && retries_allowed_after_fallback_ > 0) {
      --retries_allowed_after_fallback_;
    }
  }
  void RecordSuccess() override { inner_.RecordSuccess(); }
  const std::string& tenant() const override { return inner_.tenant(); }
  TenantStats Stats() const override { return inner_.Stats(); }
  absl::Status WaitReady(absl::Time deadline, std::stop_token stop) override {
    return inner_.WaitReady(deadline, std::move(stop));
  }

  FallbackPhase Phase() const {
    return monitor_ != nullptr ? monitor_->phase() : FallbackPhase::kBeforeFallback;
  }
  std::chrono::steady_clock::duration max_try_acquire() const { return max_try_acquire_; }
  uint64_t retries_allowed_in_fallback() const { return retries_allowed_in_fallback_; }
  uint64_t retries_allowed_after_fallback() const { return retries_allowed_after_fallback_; }

 private:
  TenantBudget& inner_;
  const FallbackMonitor* const monitor_;
  FallbackPhase last_phase_ = FallbackPhase::kBeforeFallback;
  std::chrono::steady_clock::duration max_try_acquire_{0};
  uint64_t retries_allowed_in_fallback_ = 0;
  uint64_t retries_allowed_after_fallback_ = 0;
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_MEASURED_BUDGET_H_
