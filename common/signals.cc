#include "common/signals.h"

#include <pthread.h>

#include <atomic>

namespace herd {
namespace {

// SIGUSR2 only wakes the watcher when it is being destroyed.
sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR2);
  return set;
}

std::atomic<bool> g_stopping{false};

}  // namespace

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal) : on_signal_(std::move(on_signal)) {
  sigset_t set = WatchedSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  g_stopping = false;
  thread_ = std::thread([this] {
    sigset_t set = WatchedSignals();
    while (true) {
      int signo = 0;
      if (sigwait(&set, &signo) != 0) continue;
      if (g_stopping) return;
      if (signo != SIGUSR2) on_signal_(signo);
    }
  });
}

SignalWatcher::~SignalWatcher() {
  g_stopping = true;
  pthread_kill(thread_.native_handle(), SIGUSR2);
  thread_.join();
}

}  // namespace herd
