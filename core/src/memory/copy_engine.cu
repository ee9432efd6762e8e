// Chunk copies that involve a GPU: cudaMemcpyAsync (cudaMemcpyDefault: unified
// addressing tells the direction) on the caller's stream, then an event.
#include <cuda_runtime_api.h>

#include "copy_engine.h"
#include "cuda_support.cuh"

namespace megalith::memory::detail {

namespace {

class CudaCopyEvent final : public CopyEvent {
 public:
  explicit CudaCopyEvent(int device) : device_(device) {
    DeviceGuard guard(device_);
    MEGALITH_CUDA_TRY(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~CudaCopyEvent() override { (void)cudaEventDestroy(event_); }

  cudaEvent_t get() const { return event_; }

  bool done() override {
    cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    MEGALITH_CUDA_TRY(e);
    return true;
  }

  void wait() override { MEGALITH_CUDA_TRY(cudaEventSynchronize(event_)); }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace

std::shared_ptr<CopyEvent> copy_async(void* dst, const void* src, std::size_t bytes, int device,
                                      void* stream, CopyEvent* after) {
  DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  if (after != nullptr) {
    MEGALITH_CUDA_TRY(cudaStreamWaitEvent(s, static_cast<CudaCopyEvent*>(after)->get(), 0));
  }
  MEGALITH_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  auto event = std::make_shared<CudaCopyEvent>(device);
  MEGALITH_CUDA_TRY(cudaEventRecord(event->get(), s));
  return event;
}

}  // namespace megalith::memory::detail
