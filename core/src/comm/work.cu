// NcclWork: completion of one communicator operation through a CUDA event.

#include <string>

#include "../cuda/cuda_check.cuh"
#include "comm_state.h"
#include "megalith/error.h"

namespace megalith::comm::detail {

NcclWork::NcclWork(std::shared_ptr<CommState> state, std::shared_ptr<EventPool> pool,
                   const OpInfo& info, void* stream)
    : state_(std::move(state)),
      pool_(std::move(pool)),
      info_(info),
      stream_(stream),
      issued_(Clock::now()) {}

NcclWork::~NcclWork() {
  if (event_) pool_->release(event_);
}

std::string NcclWork::describe() const { return state_->describe(info_); }

void NcclWork::record() {
  event_ = pool_->acquire();
  MEGALITH_CUDA_TRY(cudaEventRecord(event_, static_cast<cudaStream_t>(stream_)));
  issued_ = Clock::now();
  recorded_.store(true);
}

bool NcclWork::query() {
  if (done_.load()) return true;
  if (!recorded_.load()) return false;
  cudaError_t e = cudaEventQuery(event_);
  if (e == cudaSuccess) {
    done_.store(true);
    return true;
  }
  if (e == cudaErrorNotReady) return false;
  (void)cudaGetLastError();
  ::megalith::cuda::detail::throw_cuda_error(
      e, ("waiting for " + describe() + ": cudaEventQuery").c_str(), MEGALITH_WHERE);
}

void NcclWork::raise_failed() const {
  std::string text = state_->error_text();
  if (text.empty()) {  // the communicator is fine; this op's group was refused at group_end()
    text = "megalith NCCL: " + describe() +
           " did not run: the group it was issued in failed at group_end()";
  }
  throw ::megalith::error(text + " (unfinished: " + describe() + ")");
}

void NcclWork::wait(void* stream) {
  if (failed_.load()) raise_failed();
  MEGALITH_EXPECTS(recorded_.load(), invalid_argument, describe(),
                   ": issued inside a group; call group_end() before wait()");
  DeviceGuard guard(state_->device);
  MEGALITH_CUDA_TRY(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0));
}

void NcclWork::synchronize() {
  if (failed_.load()) raise_failed();
  MEGALITH_EXPECTS(recorded_.load(), invalid_argument, describe(),
                   ": issued inside a group; call group_end() before synchronize()");
  // The watchdog fails the communicator at issued + timeout_s; this deadline
  // is only a backstop in case it could not run.
  const auto deadline = issued_ + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(state_->timeout_s + 2.0));
  for (int iteration = 0;; backoff(iteration)) {
    if (query()) break;
    if (failed_.load()) raise_failed();
    if (Clock::now() > deadline) {
      state_->fail(state_->timeout_text(info_, seconds_since(issued_)));
      raise_failed();
    }
  }
  if (failed_.load()) raise_failed();  // completed because NCCL was aborted
}

bool NcclWork::is_completed() {
  if (failed_.load()) raise_failed();
  bool done = query();
  if (failed_.load()) raise_failed();
  return done;
}

}  // namespace megalith::comm::detail
