// The most conservative of the values seen lately: the server's largest fleet size of the last
// minute, a client's smallest fallback share of the last minute. Both size a fallback bucket,
// and both must not forget a value the moment a restart or a hang makes a smaller fleet visible.
#ifndef RETRYBUDGET_RECENT_EXTREME_H_
#define RETRYBUDGET_RECENT_EXTREME_H_

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/time/time.h"

namespace retrybudget {

// Merges the values noted within the last window (kWindowMillis) with `Merge` (an associative,
// commutative "the more conservative of the two", such as max). Get(now) covers every value
// noted in [now - window, now], and none noted 2 * window or more before now: two slots, the
// merge of the current window [start, start + window) and that of the one before it. O(1) per
// call, no allocation.
//
// Not thread-safe: the owner serialises calls. A clock that goes back never rolls a window.
// The window is a template argument and `Merge` an empty function object: a tenant holds one of
// these, and a million tenants should not pay for a copy of a constant each.
template <typename T, typename Merge, int64_t kWindowMillis>
class RecentExtreme {
 public:
  static constexpr absl::Duration kWindow = absl::Milliseconds(kWindowMillis);

  void Note(const T& value, absl::Time now) { Note(value, absl::ToUnixNanos(now)); }
  // The same with `now` in Unix nanoseconds (a caller that has them saves the conversion).
  void Note(const T& value, int64_t now_ns) {
    Roll(now_ns);
    current_ = current_.has_value() ? merge_(*current_, value) : value;
  }

  // The merge of the recent values; nullopt when none was noted within the last window.
  std::optional<T> Get(absl::Time now) { return Get(absl::ToUnixNanos(now)); }
  std::optional<T> Get(int64_t now_ns) {
    Roll(now_ns);
    if (!previous_.has_value()) return current_;
    if (!current_.has_value()) return previous_;
    return merge_(*current_, *previous_);
  }

 private:
  // Windows are aligned: a roll moves `start_` by exactly one window, so `previous_` holds
  // [start_ - window, start_) and `current_` holds [start_, now] with now < start_ + window.
  // After an idle gap of two windows or more both are empty and the next window starts at `now`.
  void Roll(int64_t now_ns) {
    const bool started = start_ns_ != kNotStarted;
    if (started && now_ns - start_ns_ < kWindowNanos) return;
    if (started && now_ns - start_ns_ < 2 * kWindowNanos) {
      previous_ = std::move(current_);
      start_ns_ += kWindowNanos;
    } else {
      previous_.reset();
      start_ns_ = now_ns;
    }
    current_.reset();
  }

  static constexpr int64_t kWindowNanos = kWindowMillis * 1'000'000;
  static constexpr int64_t kNotStarted = INT64_MIN;

  [[no_unique_address]] Merge merge_;
  // In Unix nanoseconds (8 bytes, where an absl::Time takes 16).
  int64_t start_ns_ = kNotStarted;
  std::optional<T> current_;
  std::optional<T> previous_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_RECENT_EXTREME_H_
