#include "retrybudget/clock.h"

#include <chrono>
#include <mutex>

#include "absl/time/clock.h"

namespace retrybudget {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }

  bool SleepUntil(absl::Time deadline, std::stop_token stop) override {
    std::unique_lock lock(mu_);
    // condition_variable_any wakes on stop_requested() through the stop_token overload.
    const auto until = absl::ToChronoTime(deadline);
    return !cv_.wait_until(lock, stop, until, [] { return false; }) && !stop.stop_requested();
  }

 private:
  std::mutex mu_;
  std::condition_variable_any cv_;
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();
  return clock;
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() {
  MutexLock lock(&mu_);
  return now_;
}

bool FakeClock::SleepUntil(absl::Time deadline, std::stop_token stop) {
  MutexLock lock(&mu_);
  sleeps_.push_back(deadline - now_);
  if (stop.stop_requested()) return false;
  if (deadline > now_) now_ = deadline;
  return true;
}

void FakeClock::Advance(absl::Duration d) {
  MutexLock lock(&mu_);
  now_ += d;
}

void FakeClock::Set(absl::Time t) {
  MutexLock lock(&mu_);
  now_ = t;
}

std::vector<absl::Duration> FakeClock::sleeps() {
  MutexLock lock(&mu_);
  return sleeps_;
}

}  // namespace retrybudget
