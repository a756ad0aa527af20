#include "client/cpp/demand_estimator.h"

#include <algorithm>
#include <cmath>

namespace retrybudget::client_internal {

void DemandEstimator::Observe(absl::Time now, uint64_t cumulative_demand) {
  // An event-count EWMA: the old rate decays by exp(-dt/tau) and every new unit of demand adds
  // 1/tau. For a steady rate r this converges to r, and unlike delta/dt it stays finite when two
  // observations fall at the same instant (a wake right after a sync).
  const double dt = std::max(0.0, absl::ToDoubleSeconds(now - last_));
  const double tau = absl::ToDoubleSeconds(kTau);
  const uint64_t delta = cumulative_demand > last_total_ ? cumulative_demand - last_total_ : 0;
  rate_ = rate_ * std::exp(-dt / tau) + static_cast<double>(delta) / tau;
  if (now > last_) last_ = now;
  last_total_ = std::max(last_total_, cumulative_demand);
}

uint64_t WantFor(double rate, absl::Duration period, uint64_t burst, uint64_t held) {
  const double expected = std::ceil(std::max(0.0, rate) * absl::ToDoubleSeconds(period));
  const double total = expected + static_cast<double>(burst);
  if (total <= static_cast<double>(held)) return 0;
  const double want = total - static_cast<double>(held);
  return want >= static_cast<double>(kMaxWant) ? kMaxWant : static_cast<uint64_t>(want);
}

}  // namespace retrybudget::client_internal
