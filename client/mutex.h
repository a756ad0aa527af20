// The client's mutex: std::mutex with Abseil's thread-safety annotations.
#ifndef RETRYBUDGET_CLIENT_MUTEX_H_
#define RETRYBUDGET_CLIENT_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace retrybudget::client_internal {

// Why not absl::Mutex: Debian's Abseil is a prebuilt library without ThreadSanitizer
// instrumentation, so TSan cannot see the happens-before edges of absl::Mutex and reports false
// races between accesses that are in fact guarded. std::mutex goes through pthread, which TSan
// intercepts, so the concurrent tests under TSan report only real races. The annotations keep
// ABSL_GUARDED_BY meaningful (Clang's -Wthread-safety checks them).
//
// Thread-safe (it is a mutex). Not recursive.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds `mu` for its lifetime.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_MUTEX_H_
