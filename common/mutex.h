// A mutex, its scoped lock and a condition variable that clang's
// thread-safety analysis understands (common/thread_annotations.h).
// libstdc++'s std::mutex carries no capability attributes, so members
// guarded by one cannot be checked; these wrap the std types and add
// nothing else.
//
// Promises:
// - Mutex is std::mutex: exclusive, not recursive, unlocked by its holder.
// - MutexLock holds a Mutex from construction to destruction
//   (std::lock_guard).
// - CondVar waits with a Mutex the caller holds: it releases it while
//   asleep and holds it again when the wait returns
//   (std::condition_variable). Wake-ups may be spurious: wait in a loop on
//   the condition. Notifying needs no lock.
// - AssertHeld checks nothing at run time; it tells the analysis that the
//   caller holds the mutex where it cannot see so itself.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace herd {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  // False when `deadline` passed first (steady clock, as the std waits).
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace herd
