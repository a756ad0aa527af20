// Waiting on real processes (etcd nodes, leases counted by etcd): poll in real time, bounded.
#ifndef RETRYBUDGET_TESTS_CLUSTER_WAIT_FOR_H_
#define RETRYBUDGET_TESTS_CLUSTER_WAIT_FOR_H_

#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace retrybudget::testing {

// Polls `predicate` every 20 ms until it holds (true) or `timeout` has passed (false).
template <typename Predicate>
bool WaitFor(Predicate predicate, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!predicate()) {
    if (absl::Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_CLUSTER_WAIT_FOR_H_
