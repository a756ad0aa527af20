// The project's mutex: std::shared_mutex with Abseil's thread-safety annotations.
//
// Why not absl::Mutex: Debian's Abseil is a prebuilt library without ThreadSanitizer
// instrumentation, so TSan cannot see the happens-before edges of absl::Mutex and reports false
// races between accesses that are in fact guarded. std::shared_mutex goes through pthread, which
// TSan intercepts, so the concurrent tests under TSan report only real races. The annotations
// keep ABSL_GUARDED_BY meaningful (Clang's -Wthread-safety checks them).
#ifndef RETRYBUDGET_MUTEX_H_
#define RETRYBUDGET_MUTEX_H_

#include <shared_mutex>

#include "absl/base/thread_annotations.h"

namespace retrybudget {

// Thread-safe (it is a mutex). Not recursive. Also a BasicLockable (lock/unlock), so it works
// with std::condition_variable_any.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::shared_mutex mu_;
};

// Holds `mu` exclusively for its lifetime.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Holds `mu` shared for its lifetime.
// A scoped lock that std::condition_variable_any can release while it waits (it has lock() and
// unlock()), and that a caller may release and take again itself. Held while it exists unless
// unlocked.
//   CondVarLock lock(&mu_);
//   cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_; });
class ABSL_SCOPED_LOCKABLE CondVarLock {
 public:
  explicit CondVarLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~CondVarLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_->Unlock();
  }
  CondVarLock(const CondVarLock&) = delete;
  CondVarLock& operator=(const CondVarLock&) = delete;

  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_->Lock();
    held_ = true;
  }
  void unlock() ABSL_UNLOCK_FUNCTION() {
    held_ = false;
    mu_->Unlock();
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_MUTEX_H_
