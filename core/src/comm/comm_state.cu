// The shared state of a communicator: failure recording, the abort, and the
// checked NCCL call path (including non-blocking NCCL's ncclInProgress).

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "../cuda/cuda_check.cuh"
#include "comm_state.h"
#include "megalith/error.h"

namespace megalith::comm::detail {

namespace {

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

}  // namespace

void backoff(int& iteration) {
  // Spin briefly (small collectives finish in microseconds), then sleep so a
  // long wait does not burn a core.
  if (iteration < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(iteration < 2000 ? 20 : 500));
  }
  ++iteration;
}

DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  MEGALITH_CUDA_TRY(cudaGetDevice(&current));
  if (current != device) {
    MEGALITH_CUDA_TRY(cudaSetDevice(device));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

EventPool::~EventPool() {
  for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);  // errors at process exit are moot
}

cudaEvent_t EventPool::acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  MEGALITH_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void EventPool::release(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(e);
}

std::string CommState::label() const {
  return "'" + name + "' (rank " + std::to_string(rank) + " of " + std::to_string(size);
}

std::string CommState::describe(const OpInfo& info) const {
  if (info.group_ops >= 0) {
    return std::string(info.op) + " of a group of " + std::to_string(info.group_ops) +
           " operations on " + label() + ")";
  }
  std::string out = info.op;
  if (info.peer >= 0) {
    if (std::strcmp(info.op, "send") == 0) {
      out += " to rank ";
    } else if (std::strcmp(info.op, "recv") == 0) {
      out += " from rank ";
    } else {
      out += " with root ";
    }
    out += std::to_string(info.peer);
  }
  return out + " on " + label() + ", " + std::to_string(info.count) + " x " +
         dtype_name(info.dtype) + ")";
}

std::string CommState::timeout_text(const OpInfo& info, double waited) const {
  return "megalith NCCL: " + describe(info) + " did not finish within " + seconds(timeout_s) +
         " (waited " + seconds(waited) +
         "); the other ranks may not have called it, or one died. Communicator aborted.";
}

std::string CommState::async_text(nccl::Result r, const OpInfo* oldest, double waited) const {
  std::string out =
      "megalith NCCL: communicator " + label() + ") failed: " + nccl::explain(*api, r);
  if (oldest) {
    out += ", while " + describe(*oldest) + " was outstanding for " + seconds(waited);
  } else {
    out += ", with no operation outstanding";
  }
  return out + ". A peer may have died or the network failed. Communicator aborted.";
}

std::string CommState::error_text() const {
  std::lock_guard<std::mutex> lock(error_mu);
  return error;
}

void CommState::raise_if_failed() const {
  if (failed.load()) throw ::megalith::error(error_text());
}

bool CommState::fail(const std::string& text) {
  {
    std::lock_guard<std::mutex> lock(error_mu);
    if (failed.load()) return false;
    error = text;
    failed.store(true);
  }
  std::deque<std::shared_ptr<NcclWork>> unfinished;
  {
    std::lock_guard<std::mutex> lock(works_mu);
    unfinished.swap(outstanding);
    for (auto& w : group_pending) w->mark_failed();
  }
  // Marked before the abort: an aborted kernel returns and completes its
  // event, and that must not read as success.
  for (auto& w : unfinished) {
    bool done = false;
    try {
      done = w->query();
    } catch (...) {
    }
    if (!done) w->mark_failed();
  }
  abort_nccl();
  return true;
}

void CommState::abort_nccl() {
  // A host call stuck inside NCCL (blocking mode: a peer that never comes)
  // holds handle_mu, and ncclCommAbort is what makes it return; so after a
  // short wait the abort goes ahead without the lock.
  std::unique_lock<std::timed_mutex> lock(handle_mu, std::defer_lock);
  (void)lock.try_lock_for(std::chrono::milliseconds(500));
  nccl::Comm c = comm.exchange(nullptr);
  if (!c) return;
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device) (void)cudaSetDevice(device);
  (void)api->CommAbort(c);
  if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
}

void CommState::wait_ready(const OpInfo& info, Clock::time_point since) {
  if (!nonblocking) return;
  for (int iteration = 0;; backoff(iteration)) {
    nccl::Result state = nccl::success;
    nccl::Result r = call(info, [&](nccl::Comm c) { return api->CommGetAsyncError(c, &state); });
    if (r != nccl::success) state = r;
    if (state == nccl::success) return;
    if (state != nccl::in_progress) {
      fail("megalith NCCL: " + describe(info) + " failed: " + nccl::explain(*api, state) +
           ". Communicator aborted.");
      raise_if_failed();
    }
    double waited = seconds_since(since);
    if (waited > timeout_s) {
      fail(timeout_text(info, waited));
      raise_if_failed();
    }
  }
}

void CommState::check(nccl::Result r, const OpInfo& info, Clock::time_point since, bool wait) {
  if (r == nccl::success) return;
  if (r == nccl::in_progress) {
    if (wait) wait_ready(info, since);
    return;
  }
  std::string text = "megalith NCCL: " + describe(info) + " failed: " + nccl::explain(*api, r);
  if (r == nccl::invalid_argument || r == nccl::invalid_usage) {
    // NCCL refused the call before starting it: the communicator is still usable.
    MEGALITH_FAIL(::megalith::error, text);
  }
  fail(text + ". Communicator aborted.");
  raise_if_failed();
}

}  // namespace megalith::comm::detail
