#pragma once
// Plumbing of the CUDA memory resources: a device guard, and alignment above
// the 256 bytes that cudaMalloc and cudaHostAlloc guarantee.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "../cuda/cuda_check.cuh"
#include "megalith/memory/bytes.h"

namespace megalith::memory::detail {

/// Makes `device` current for its scope (device < 0: leaves the current one).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (device < 0) return;
    MEGALITH_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ == device) {
      previous_ = -1;
    } else {
      MEGALITH_CUDA_TRY(cudaSetDevice(device));
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// Over-allocates by alignment - 256 for larger alignments and remembers
/// where each raw allocation began.
class OverAligned {
 public:
  static constexpr std::size_t kNative = 256;

  template <class RawAlloc>
  void* allocate(std::size_t bytes, std::size_t alignment, RawAlloc&& raw_alloc) {
    if (alignment <= kNative) return raw_alloc(bytes);
    char* raw = static_cast<char*>(raw_alloc(bytes + alignment - kNative));
    auto v = reinterpret_cast<std::uintptr_t>(raw);
    char* aligned = raw + (align_up(v, alignment) - v);
    std::lock_guard<std::mutex> lock(mutex_);
    raw_of_[aligned] = raw;
    return aligned;
  }

  template <class RawFree>
  void deallocate(void* ptr, std::size_t alignment, RawFree&& raw_free) noexcept {
    if (alignment <= kNative) {
      raw_free(ptr);
      return;
    }
    void* raw = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = raw_of_.find(ptr);
      if (it == raw_of_.end()) return;
      raw = it->second;
      raw_of_.erase(it);
    }
    raw_free(raw);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, void*> raw_of_;
};

}  // namespace megalith::memory::detail
