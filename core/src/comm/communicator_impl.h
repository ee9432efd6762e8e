#pragma once
// The private half of Communicator, shared by communicator.cu (lifetime,
// groups, abort) and collectives.cu (the operations).

#include <memory>
#include <mutex>
#include <utility>

#include "comm_state.h"
#include "megalith/comm/communicator.h"
#include "watchdog.h"

namespace megalith::comm {

struct Communicator::Impl {
  std::shared_ptr<detail::CommState> state;
  std::shared_ptr<detail::EventPool> pool;
  std::unique_ptr<detail::Watchdog> watchdog;
  int group_depth = 0;             // group_start() minus group_end() calls
  void* barrier_buffer = nullptr;  // one float on the device, for barrier()

  /// Issues one operation: launch(comm, stream) -> nccl::Result makes the NCCL
  /// call(s). Outside a group the Work's event is recorded right after;
  /// inside one, at the outermost group_end().
  template <class Launch>
  Communicator::WorkPtr issue(const detail::OpInfo& info, void* stream, Launch&& launch) {
    detail::CommState& s = *state;
    s.raise_if_failed();
    detail::DeviceGuard guard(s.device);
    const auto since = detail::Clock::now();
    auto work = std::make_shared<detail::NcclWork>(state, pool, info, stream);
    nccl::Result r =
        s.call(info, [&](nccl::Comm c) { return launch(c, static_cast<nccl::Stream>(stream)); });
    // In non-blocking mode the launch may still be in progress: wait for it
    // before recording the event, or the event would precede the kernel.
    s.check(r, info, since, group_depth == 0);
    std::lock_guard<std::mutex> lock(s.works_mu);
    if (group_depth > 0) {
      s.group_pending.push_back(work);
    } else {
      work->record();
      s.outstanding.push_back(work);
    }
    return work;
  }
};

}  // namespace megalith::comm
