// Time, injected. Buckets, leases, the refresher and the retry helper read time only through a
// Clock, so tests move a FakeClock instead of sleeping.
#ifndef RETRYBUDGET_CLOCK_H_
#define RETRYBUDGET_CLOCK_H_

#include <condition_variable>
#include <stop_token>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "retrybudget/mutex.h"

namespace retrybudget {

// Thread-safe. Implementations must be usable from any thread.
class Clock {
 public:
  virtual ~Clock() = default;

  // The current time.
  virtual absl::Time Now() = 0;

  // Blocks until Now() >= deadline or until `stop` is requested, whichever comes first.
  // Returns true when the deadline was reached, false when stopped early. Never blocks when
  // `stop` is already requested.
  virtual bool SleepUntil(absl::Time deadline, std::stop_token stop) = 0;

  // The process-wide real clock (never null, never destroyed).
  static Clock* Real();
};

// A clock for tests: time moves only when the test advances it, or when a caller sleeps (a
// sleep jumps the time to its deadline at once and records the duration asked for).
// Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000));

  absl::Time Now() override;
  bool SleepUntil(absl::Time deadline, std::stop_token stop) override;

  void Advance(absl::Duration d);
  void Set(absl::Time t);

  // Durations that SleepUntil was asked to sleep, in call order.
  std::vector<absl::Duration> sleeps();

 private:
  Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_CLOCK_H_
