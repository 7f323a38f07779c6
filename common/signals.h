// Turns SIGINT / SIGTERM into a callback on a thread of its own, so that a
// process can shut its job down in order (tell the coordinator, close UCX)
// instead of dying mid-write. Construct it in main() before any other thread
// starts: the signals are blocked in every thread created afterwards.
#pragma once

#include <csignal>
#include <functional>
#include <thread>

namespace herd {

class SignalWatcher {
 public:
  // `on_signal(signo)` runs on the watcher's thread, once per signal.
  explicit SignalWatcher(std::function<void(int)> on_signal);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  std::function<void(int)> on_signal_;
  std::thread thread_;
};

}  // namespace herd
