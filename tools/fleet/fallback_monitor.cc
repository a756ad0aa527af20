#include "tools/fleet/fallback_monitor.h"

#include <stop_token>
#include <utility>

namespace retrybudget::fleet {
namespace {

// The most a fresh fallback bucket of `share` holds (client/cpp/fallback_bucket.h).
double EffectiveCapacity(const SafeShareView& share) {
  const double capacity = share.capacity > 0 ? share.capacity : 0;
  if (share.refill_per_second > 0 && capacity < 1) return 1;
  return capacity;
}

}  // namespace

FallbackMonitor::FallbackMonitor(const TenantBudget& budget, FallbackSources sources,
                                 Clock* clock)
    : budget_(budget),
      sources_(std::move(sources)),
      clock_(clock != nullptr ? clock : Clock::Real()) {}

FallbackMonitor::~FallbackMonitor() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

void FallbackMonitor::Start(absl::Duration period) {
  thread_ = std::jthread([this, period](std::stop_token stop) {
    while (!stop.stop_requested()) {
      const absl::Time now = clock_->Now();
      Poll(now);
      clock_->SleepUntil(now + period, stop);
    }
  });
}

void FallbackMonitor::OpenEpisodeLocked(absl::Time start) {
  std::optional<SafeShareView> share =
      sources_.safe_share ? sources_.safe_share() : std::nullopt;
  episode_share_ = share.value_or(sources_.never_reached);
  episode_start_ = start;
  ++report_.fallback_entries;
  report_.fallback_allowance += EffectiveCapacity(episode_share_);
  report_.safe_share_capacity = episode_share_.capacity;
  report_.safe_share_refill = episode_share_.refill_per_second;
}

void FallbackMonitor::CloseEpisodeLocked(absl::Time end) {
  if (!episode_start_.has_value()) return;
  const double seconds = absl::ToDoubleSeconds(end - *episode_start_);
  if (seconds > 0) {
    report_.fallback_seconds += seconds;
    report_.fallback_allowance += episode_share_.refill_per_second * seconds;
  }
  episode_start_.reset();
}

void FallbackMonitor::Poll(absl::Time now) {
  const TenantStats stats = budget_.Stats();
  MutexLock lock(&mu_);
  const bool in_fallback = stats.mode == BudgetMode::kFallback;
  // An episode may have begun right after the previous poll.
  const absl::Time since = last_poll_.value_or(now);
  if (in_fallback) {
    if (!episode_start_.has_value()) {
      OpenEpisodeLocked(since);
    } else if (stats.tokens_received > last_tokens_received_) {
      // The tenant was granted during the episode: the client may have left fallback for the
      // lease and entered it again with a full bucket in between. Count a new episode (the
      // generous reading).
      CloseEpisodeLocked(now);
      OpenEpisodeLocked(since);
    }
  } else {
    if (episode_start_.has_value()) {
      CloseEpisodeLocked(now);
    } else if (stats.fallback_allowed > last_fallback_allowed_) {
      // Fallback spending with no episode seen: one began and ended between two polls.
      OpenEpisodeLocked(since);
      CloseEpisodeLocked(now);
    }
    if (report_.fallback_entries > 0 && stats.mode == BudgetMode::kLease) {
      report_.lease_after_fallback = true;
    }
  }
  last_poll_ = now;
  last_fallback_allowed_ = stats.fallback_allowed;
  last_tokens_received_ = stats.tokens_received;
  phase_.store(in_fallback                       ? FallbackPhase::kInFallback
               : report_.fallback_entries > 0    ? FallbackPhase::kAfterFallback
                                                 : FallbackPhase::kBeforeFallback,
               std::memory_order_relaxed);
}

FallbackReport FallbackMonitor::Finish() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
  const absl::Time now = clock_->Now();
  Poll(now);
  MutexLock lock(&mu_);
  CloseEpisodeLocked(now);
  return report_;
}

}  // namespace retrybudget::fleet
