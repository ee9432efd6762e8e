// [Note: watchdog]
// A collective that one rank never joins does not fail in NCCL: the other
// ranks' kernels spin forever and their host threads block in the next
// synchronisation, with nothing said. So each communicator has one thread that,
// every interval():
//   1. drops finished operations from the front of the outstanding queue and
//      looks at the oldest unfinished one; if it was issued more than
//      timeout_s ago, the communicator fails with a text naming the op, the
//      communicator, rank and size, element count and dtype, and the wait;
//   2. asks ncclCommGetAsyncError, so a dead peer or network error found by
//      NCCL's proxy thread fails the communicator too, with NCCL's own text;
//   3. in blocking mode, checks that no host call has been stuck in NCCL for
//      longer than timeout_s (a lazy connection to a peer that never comes).
// Failing = storing the text (CommState::fail), marking unfinished Works, and
// ncclCommAbort, which makes blocked kernels return. The next call on the
// communicator, and Work::synchronize() of any unfinished op, raise the text.
// The timeout counts from when the op was issued on the host, so it includes
// time queued behind earlier work on its stream; keep it well above a step.

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm_state.h"
#include "watchdog.h"

namespace megalith::comm::detail {

std::chrono::milliseconds Watchdog::interval(double timeout_s) {
  auto quarter = static_cast<long long>(timeout_s * 250.0);
  return std::chrono::milliseconds(std::clamp<long long>(quarter, 1, 50));
}

namespace {

// Live watchdogs, stopped by an atexit handler (registered after CUDA was
// initialised, so it runs before the runtime's own teardown).
std::mutex g_live_mu;
std::vector<Watchdog*>* g_live = nullptr;  // never freed: used during exit

void stop_all_at_exit() {
  std::lock_guard<std::mutex> lock(g_live_mu);
  for (Watchdog* w : *g_live) w->stop();
}

}  // namespace

Watchdog::Watchdog(std::shared_ptr<CommState> state)
    : state_(std::move(state)), thread_([this] { run(); }) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  if (!g_live) {
    g_live = new std::vector<Watchdog*>();
    std::atexit(stop_all_at_exit);
  }
  g_live->push_back(this);
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    g_live->erase(std::remove(g_live->begin(), g_live->end(), this), g_live->end());
  }
  stop();
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Watchdog::run() {
  // Event queries need no current device, but NCCL's abort may touch it.
  (void)cudaSetDevice(state_->device);
  const auto period = interval(state_->timeout_s);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, period, [this] { return stop_; });
    if (stop_) break;
    lock.unlock();
    try {
      tick();
    } catch (const std::exception& e) {
      state_->fail(std::string("megalith NCCL: the watchdog of communicator ") + state_->label() +
                   ") failed: " + e.what() + ". Communicator aborted.");
    }
    lock.lock();
  }
}

void Watchdog::tick() {
  CommState& s = *state_;
  if (s.failed.load()) return;

  // 1. Finished work leaves the queue; the oldest unfinished op may time out.
  std::shared_ptr<NcclWork> oldest;
  std::string cuda_failure;
  {
    std::lock_guard<std::mutex> lock(s.works_mu);
    try {
      while (!s.outstanding.empty()) {
        if (!s.outstanding.front()->query()) {
          oldest = s.outstanding.front();
          break;
        }
        s.outstanding.pop_front();
      }
    } catch (const std::exception& e) {
      cuda_failure = e.what();
    }
  }
  if (!cuda_failure.empty()) {
    s.fail("megalith NCCL: a CUDA error on communicator " + s.label() + "): " + cuda_failure +
           ". Communicator aborted.");
    return;
  }
  double waited = oldest ? seconds_since(oldest->issued()) : 0.0;

  // 2. Asynchronous NCCL errors. A busy handle (a call in progress) is checked next time.
  nccl::Result async = nccl::success;
  {
    std::unique_lock<std::timed_mutex> lock(s.handle_mu, std::try_to_lock);
    nccl::Comm c = lock.owns_lock() ? s.comm.load() : nullptr;
    if (c) {
      nccl::Result st = nccl::success;
      nccl::Result r = s.api->CommGetAsyncError(c, &st);
      async = r == nccl::success ? st : r;
    }
  }
  if (async != nccl::success && async != nccl::in_progress) {
    s.fail(s.async_text(async, oldest ? &oldest->info() : nullptr, waited));
    return;
  }

  // 3. Timeout of the oldest unfinished op.
  if (oldest && waited > s.timeout_s) {
    s.fail(s.timeout_text(oldest->info(), waited));
    return;
  }

  // 4. A host call stuck inside NCCL (blocking mode).
  std::int64_t since = s.call_since_ns.load();
  if (since != 0) {
    double stuck = static_cast<double>(now_ns() - since) * 1e-9;
    if (stuck > s.timeout_s) {
      OpInfo info;
      {
        std::lock_guard<std::mutex> lock(s.call_mu);
        info = s.call_info;
      }
      s.fail(s.timeout_text(info, stuck));
    }
  }
}

}  // namespace megalith::comm::detail
