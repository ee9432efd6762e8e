#pragma once
// One thread per communicator that turns hangs and asynchronous NCCL errors
// into a stored error (see [Note: watchdog] in watchdog.cu).

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "comm_state.h"

namespace megalith::comm::detail {

class Watchdog {
 public:
  explicit Watchdog(std::shared_ptr<CommState> state);
  ~Watchdog();  // stops and joins the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Stops and joins the thread (idempotent). Also run for every live watchdog
  /// at process exit, before the CUDA runtime tears down, for communicators
  /// that were never destroyed (a Python object leaked at interpreter exit).
  void stop();

  /// How often the thread looks: 50 ms, or a quarter of a short timeout.
  static std::chrono::milliseconds interval(double timeout_s);

 private:
  void run();
  void tick();

  std::shared_ptr<CommState> state_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace megalith::comm::detail
