#pragma once
// What a communicator, its Works and its watchdog share. Internal to core/src/comm.

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "megalith/comm/work.h"
#include "megalith/dtype.h"
#include "nccl_api.h"

namespace megalith::comm::detail {

using Clock = std::chrono::steady_clock;

/// What one operation was, for error texts.
struct OpInfo {
  const char* op = "";
  std::int64_t count = 0;
  DType dtype = DType::f32;
  int peer = -1;       // send/recv peer, broadcast/reduce root; -1: none
  int group_ops = -1;  // group_end: how many operations the group held; -1: not a group
};

/// Sets the current CUDA device for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// Completion events, reused: creating one per operation would cost more than
/// a small collective. Shared by the communicator and its Works (a Work may
/// outlive its communicator).
class EventPool {
 public:
  EventPool() = default;
  ~EventPool();
  cudaEvent_t acquire();  // the caller has set the communicator's device
  void release(cudaEvent_t e);

 private:
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

class NcclWork;

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

/// Seconds from `since` to now.
inline double seconds_since(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

/// One step of a host wait loop: yields at first, then sleeps.
void backoff(int& iteration);

struct CommState {
  std::string name;
  int rank = 0;
  int size = 1;
  int device = 0;
  double timeout_s = 600.0;
  const nccl::Api* api = nullptr;
  bool nonblocking = false;

  // The NCCL handle; nullptr once aborted or destroyed. Every call through it
  // holds handle_mu, so abort never frees it under a running call (but see
  // abort_nccl() for a call that blocks the host).
  std::timed_mutex handle_mu;
  std::atomic<nccl::Comm> comm{nullptr};

  // The host call in flight (for the watchdog in blocking mode): since when, and what.
  std::atomic<std::int64_t> call_since_ns{0};
  std::mutex call_mu;
  OpInfo call_info;

  // The first failure, kept for every later call.
  std::atomic<bool> failed{false};
  mutable std::mutex error_mu;
  std::string error;

  // Issued, not yet seen complete, oldest first (the watchdog pops finished
  // ones); and those issued inside a group, recorded at group_end().
  std::mutex works_mu;
  std::deque<std::shared_ptr<NcclWork>> outstanding;
  std::vector<std::shared_ptr<NcclWork>> group_pending;

  /// "'dp' (rank 1 of 2"  (the caller closes the parenthesis).
  std::string label() const;
  /// "all_reduce on 'dp' (rank 1 of 2, 1048576 x float32)".
  std::string describe(const OpInfo& info) const;
  /// The watchdog's text for an operation that outlived timeout_s.
  std::string timeout_text(const OpInfo& info, double waited) const;
  /// The text for an asynchronous NCCL error (oldest: the unfinished op, if any).
  std::string async_text(nccl::Result r, const OpInfo* oldest, double waited) const;
  std::string error_text() const;
  /// Throws megalith::error with the stored failure, if any.
  void raise_if_failed() const;
  /// Records the first failure: marks unfinished works failed, then aborts NCCL
  /// so kernels blocked on a peer return. Returns false when already failed.
  bool fail(const std::string& text);
  /// ncclCommAbort once (no-op when already gone).
  void abort_nccl();

  /// Runs fn(comm) -> nccl::Result holding handle_mu, with the call recorded for the watchdog.
  template <class Fn>
  nccl::Result call(const OpInfo& info, Fn&& fn);
  /// In non-blocking mode: polls ncclCommGetAsyncError until the comm is no
  /// longer ncclInProgress, failing the communicator after timeout_s.
  void wait_ready(const OpInfo& info, Clock::time_point since);
  /// Throws for an NCCL result (after waiting out ncclInProgress when `wait`).
  void check(nccl::Result r, const OpInfo& info, Clock::time_point since, bool wait);
};

/// The Work of one operation: a CUDA event recorded on its stream after it.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<CommState> state, std::shared_ptr<EventPool> pool, const OpInfo& info,
           void* stream);
  ~NcclWork() override;

  void wait(void* stream) override;
  void synchronize() override;
  bool is_completed() override;
  std::string describe() const override;

  /// Records the event on the op's stream (the communicator's device is current).
  void record();
  /// Whether the event completed (false before record()); throws cuda_error on a CUDA failure.
  bool query();
  void mark_failed() { failed_.store(true); }
  bool failed() const { return failed_.load(); }
  Clock::time_point issued() const { return issued_; }
  const OpInfo& info() const { return info_; }

 private:
  void raise_failed() const;

  std::shared_ptr<CommState> state_;
  std::shared_ptr<EventPool> pool_;
  OpInfo info_;
  void* stream_;
  cudaEvent_t event_ = nullptr;
  Clock::time_point issued_;
  std::atomic<bool> recorded_{false};
  std::atomic<bool> done_{false};
  std::atomic<bool> failed_{false};
};

template <class Fn>
nccl::Result CommState::call(const OpInfo& info, Fn&& fn) {
  std::lock_guard<std::timed_mutex> lock(handle_mu);
  nccl::Comm c = comm.load();
  if (!c) {
    raise_if_failed();
    return nccl::invalid_usage;  // unreachable: a missing handle always comes with a failure
  }
  {
    std::lock_guard<std::mutex> info_lock(call_mu);
    call_info = info;
  }
  call_since_ns.store(now_ns());
  nccl::Result r = fn(c);
  call_since_ns.store(0);
  return r;
}

}  // namespace megalith::comm::detail
