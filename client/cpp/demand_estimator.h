// How many tokens a tenant should ask for: its recent demand rate, smoothed.
#ifndef RETRYBUDGET_CLIENT_DEMAND_ESTIMATOR_H_
#define RETRYBUDGET_CLIENT_DEMAND_ESTIMATOR_H_

#include <cstdint>

#include "absl/time/time.h"

namespace retrybudget::client_internal {

// Largest `want` a request may carry (budget.proto: TenantSync.want).
inline constexpr uint64_t kMaxWant = 1'000'000;

// An exponentially decayed rate of retry demand (retries spent + retries denied) per second.
// Not thread-safe: the owner serialises calls.
class DemandEstimator {
 public:
  // Decay time constant of the rate.
  static constexpr absl::Duration kTau = absl::Seconds(1);

  // Starts counting at `start` with a cumulative demand of 0.
  explicit DemandEstimator(absl::Time start) : last_(start) {}

  // Feeds the cumulative demand observed at `now` (non-decreasing; a lower value counts as no
  // new demand; a `now` earlier than the last one counts as no time passed).
  void Observe(absl::Time now, uint64_t cumulative_demand);

  // Demand per second.
  double rate() const { return rate_; }

 private:
  absl::Time last_;
  uint64_t last_total_ = 0;
  double rate_ = 0;
};

// Tokens to ask for: enough for `rate` per second over `period`, plus `burst`, minus what is
// already `held`; never negative and at most kMaxWant.
uint64_t WantFor(double rate, absl::Duration period, uint64_t burst, uint64_t held);

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_DEMAND_ESTIMATOR_H_
