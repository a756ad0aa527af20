// A 4-byte exclusive mutex for the records the server keeps one of per tenant and per instance
// (a million tenants, a hundred thousand instances): std::shared_mutex, behind the project's
// Mutex (retrybudget/mutex.h), takes 56 bytes, a tenth of such a record.
//
// The classic three-state futex lock (0 free, 1 held, 2 held with waiters; U. Drepper, "Futexes
// Are Tricky", mutex 3): an uncontended Lock and Unlock are one atomic operation each; a waiter
// spins briefly, then sleeps in the kernel. Not recursive; no reader mode (no record needs one).
//
// ThreadSanitizer sees every hand-over: Unlock's release store and Lock's acquire exchange are
// instrumented atomics (the futex calls only sleep and wake), so a guarded access is ordered
// after the previous holder's, as with std::mutex. Outside Linux the wait is C++20's
// std::atomic::wait.
#ifndef RETRYBUDGET_SERVER_COMPACT_MUTEX_H_
#define RETRYBUDGET_SERVER_COMPACT_MUTEX_H_

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace retrybudget {

class ABSL_LOCKABLE CompactMutex {
 public:
  CompactMutex() = default;
  CompactMutex(const CompactMutex&) = delete;
  CompactMutex& operator=(const CompactMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    uint32_t free = kFree;
    if (!state_.compare_exchange_strong(free, kHeld, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
      LockSlow();
    }
  }

  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (state_.exchange(kFree, std::memory_order_release) == kContended) Wake();
  }

 private:
  static constexpr uint32_t kFree = 0;
  static constexpr uint32_t kHeld = 1;
  static constexpr uint32_t kContended = 2;  // held, and someone may be asleep waiting

  void LockSlow() {
    // A holder usually leaves within the few hundred nanoseconds of one tenant entry: try a
    // little before sleeping.
    for (int i = 0; i < 64; ++i) {
      uint32_t free = kFree;
      if (state_.load(std::memory_order_relaxed) == kFree &&
          state_.compare_exchange_weak(free, kHeld, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
        return;
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    // From here on the lock is taken as contended (2), so that its Unlock wakes a sleeper; a
    // thread that finds it free this way holds it, marked contended, which costs at most one
    // needless wake.
    while (state_.exchange(kContended, std::memory_order_acquire) != kFree) Wait();
  }

  void Wait() {
#if defined(__linux__)
    // Sleeps only while the word is still 2; a spurious or early return just tries again.
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&state_), FUTEX_WAIT_PRIVATE, kContended,
            nullptr, nullptr, 0);
#else
    state_.wait(kContended, std::memory_order_relaxed);
#endif
  }

  void Wake() {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
#else
    state_.notify_one();
#endif
  }

  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  std::atomic<uint32_t> state_{kFree};
};

// Holds a CompactMutex for its lifetime.
class ABSL_SCOPED_LOCKABLE CompactMutexLock {
 public:
  explicit CompactMutexLock(CompactMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~CompactMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  CompactMutexLock(const CompactMutexLock&) = delete;
  CompactMutexLock& operator=(const CompactMutexLock&) = delete;

 private:
  CompactMutex* const mu_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_COMPACT_MUTEX_H_
