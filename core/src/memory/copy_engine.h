#pragma once
// Asynchronous copies for chunk moves that involve a GPU (copy_engine.cu; a
// build without CUDA throws from no_cuda.cpp).
#include <cstddef>
#include <memory>

namespace megalith::memory::detail {

/// Completion of one copy (a CUDA event recorded after it).
class CopyEvent {
 public:
  virtual ~CopyEvent() = default;
  /// Whether the copy finished; throws megalith::cuda_error if it failed.
  virtual bool done() = 0;
  /// Blocks until the copy finished.
  virtual void wait() = 0;
};

/// cudaMemcpyAsync(dst, src, bytes) on `stream` (a cudaStream_t of `device`;
/// nullptr: its legacy default stream), after `after` completed when given;
/// returns the event recorded after the copy.
std::shared_ptr<CopyEvent> copy_async(void* dst, const void* src, std::size_t bytes, int device,
                                      void* stream, CopyEvent* after);

}  // namespace megalith::memory::detail
