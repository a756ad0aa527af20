// A TenantBudget decorator, one per worker thread, that measures what the harness must show
// about the client's hot path while the server is killed, hung or slow: the longest
// TryAcquire() (it must never block), and the retries allowed while the client was in fallback
// and after it (read from a FallbackMonitor's phase). Plain counters: one instance per thread,
// read after the thread is joined. Thread-compatible; the wrapped budget is thread-safe.
//
//   MeasuredBudget measured(*budget, &monitor, {.origin = t0, .slice = slice});
//   RunLogicalCall(strategy, options, backend, &measured, stop, counts);
//   measured.max_try_acquire()
#ifndef RETRYBUDGET_TOOLS_FLEET_MEASURED_BUDGET_H_
#define RETRYBUDGET_TOOLS_FLEET_MEASURED_BUDGET_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "retrybudget/client.h"
#include "tools/fleet/fallback_monitor.h"
#include "tools/fleet/start_signal.h"

namespace retrybudget::fleet {

class MeasuredBudget final : public TenantBudget {
 public:
  // The grid on which the requests and the tokens are counted (start_signal.h): slice i is
  // [origin + i * slice, origin + (i + 1) * slice). A zero slice: no timelines.
  struct Timeline {
    std::chrono::steady_clock::time_point origin = {};
    std::chrono::steady_clock::duration slice = {};
  };

  // `inner` must outlive this; `monitor` may be null (no phase counts).
  MeasuredBudget(TenantBudget& inner, const FallbackMonitor* monitor, Timeline timeline)
      : inner_(inner), monitor_(monitor), timeline_(timeline) {}

  using TenantBudget::Refund;
  using TenantBudget::TryAcquire;

  bool TryAcquire(uint32_t cost) override {
    const auto start = std::chrono::steady_clock::now();
    const bool allowed = inner_.TryAcquire(cost);
    const auto took = std::chrono::steady_clock::now() - start;
    max_try_acquire_ = std::max(max_try_acquire_, took);
    if (allowed) {
      last_phase_ = Phase();
      if (last_phase_ == FallbackPhase::kInFallback) ++retries_allowed_in_fallback_;
      if (last_phase_ == FallbackPhase::kAfterFallback) ++retries_allowed_after_fallback_;
      last_slice_ = Count(tokens_timeline_, start, cost);
    }
    return allowed;
  }
  void Refund(uint32_t cost) override {
    inner_.Refund(cost);
    // Undo the count of the token given back (taken last by this thread).
    if (last_phase_ == FallbackPhase::kInFallback && retries_allowed_in_fallback_ > 0) {
      --retries_allowed_in_fallback_;
    }
    if (last_phase_ == FallbackPhase::kAfterFallback && retries_allowed_after_fallback_ > 0) {
      --retries_allowed_after_fallback_;
    }
    if (last_slice_ < tokens_timeline_.size()) {
      tokens_timeline_[last_slice_] -= std::min<uint64_t>(tokens_timeline_[last_slice_], cost);
    }
  }
  void RecordRequest() override {
    Count(requests_timeline_, std::chrono::steady_clock::now(), 1);
    inner_.RecordRequest();
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
  // Requests recorded and tokens taken (refunds deducted) per slice of the Timeline, counted
  // when RecordRequest() / TryAcquire() was called.
  const std::vector<uint64_t>& requests_timeline() const { return requests_timeline_; }
  const std::vector<uint64_t>& tokens_timeline() const { return tokens_timeline_; }

 private:
  // Adds `n` to `timeline`'s slice of `at`; returns the slice.
  size_t Count(std::vector<uint64_t>& timeline, std::chrono::steady_clock::time_point at,
               uint64_t n) {
    if (timeline_.slice <= std::chrono::steady_clock::duration::zero()) return SIZE_MAX;
    const size_t i = TimelineSliceOf(timeline_.origin, at, timeline_.slice);
    if (timeline.size() <= i) timeline.resize(i + 1, 0);
    timeline[i] += n;
    return i;
  }

  TenantBudget& inner_;
  const FallbackMonitor* const monitor_;
  const Timeline timeline_;
  std::vector<uint64_t> requests_timeline_;
  std::vector<uint64_t> tokens_timeline_;
  size_t last_slice_ = SIZE_MAX;  // of the last token taken
  FallbackPhase last_phase_ = FallbackPhase::kBeforeFallback;
  std::chrono::steady_clock::duration max_try_acquire_{0};
  uint64_t retries_allowed_in_fallback_ = 0;
  uint64_t retries_allowed_after_fallback_ = 0;
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_MEASURED_BUDGET_H_
