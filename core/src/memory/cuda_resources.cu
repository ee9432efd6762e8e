// Pinned host and device memory through the CUDA runtime.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cuda_support.cuh"
#include "megalith/cuda/device.h"
#include "megalith/error.h"
#include "megalith/memory/device_resource.h"
#include "megalith/memory/host_resource.h"
#include "megalith/memory/pinned_host_resource.h"

namespace megalith::memory {

namespace {

detail::OverAligned& pinned_over_aligned() {
  static detail::OverAligned table;
  return table;
}

detail::OverAligned& device_over_aligned() {
  static detail::OverAligned table;
  return table;
}

// [Note: pinned huge pages]
// The host optimizer streams its masters and states (12-16 B/param) every step; over
// 4 KiB pages the TLB misses cost it about a fifth of its speed on a 16-core host
// (benchmarks/results/optim_host/2026-11-30_h200x2_16threads_thp.md). cudaHostAlloc
// gives no say in the page size, so large blocks are allocated 2 MiB aligned, advised
// for transparent huge pages and then page-locked with cudaHostRegister. Anything that
// fails there falls back to cudaHostAlloc; MEGALITH_PINNED_HUGE_PAGES=0 turns it off.
class RegisteredBlocks {
 public:
  void* try_allocate(std::size_t n) {
    if (n < HostResource::kHugePageBytes || !enabled()) return nullptr;
    void* p = nullptr;
    if (posix_memalign(&p, HostResource::kHugePageBytes, n) != 0 || p == nullptr) return nullptr;
#if defined(MADV_HUGEPAGE)
    (void)madvise(p, n - n % HostResource::kHugePageBytes, MADV_HUGEPAGE);
#endif
    if (cudaHostRegister(p, n, cudaHostRegisterPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      std::free(p);
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.insert(p);
    return p;
  }

  /// Frees `p` if it is one of ours; false otherwise (then it came from cudaHostAlloc).
  bool free(void* p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (blocks_.erase(p) == 0) return false;
    }
    (void)cudaHostUnregister(p);
    std::free(p);
    return true;
  }

 private:
  static bool enabled() {
    static const bool on = [] {
      const char* v = std::getenv("MEGALITH_PINNED_HUGE_PAGES");
      return v == nullptr || std::string(v) != "0";
    }();
    return on;
  }

  std::mutex mu_;
  std::unordered_set<void*> blocks_;
};

RegisteredBlocks& registered_blocks() {
  static auto* blocks = new RegisteredBlocks();  // leaked: frees may come during exit
  return *blocks;
}

}  // namespace

// ------------------------------------------------------------ pinned host

PinnedHostResource::PinnedHostResource() {
  MEGALITH_EXPECTS(
      cuda::device_count() > 0, error,
      "PinnedHostResource: page-locked memory needs a CUDA driver and GPU; CUDA: ", cuda::status());
}

void* PinnedHostResource::do_allocate(std::size_t bytes, std::size_t alignment) {
  return pinned_over_aligned().allocate(bytes, alignment, [&](std::size_t n) {
    void* p = registered_blocks().try_allocate(n);
    if (p != nullptr) return p;
    cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw_out_of_memory(*this, bytes, host_available_bytes(), "cudaHostAlloc failed",
                          MEGALITH_WHERE);
    }
    MEGALITH_CUDA_TRY(e);
    return p;
  });
}

void PinnedHostResource::do_deallocate(void* ptr, std::size_t, std::size_t alignment) noexcept {
  pinned_over_aligned().deallocate(ptr, alignment, [](void* p) {
    if (!registered_blocks().free(p)) (void)cudaFreeHost(p);
  });
}

// ----------------------------------------------------------------- device

void device_memory_info(int device, std::size_t* free_bytes, std::size_t* total_bytes) {
  detail::DeviceGuard guard(device);
  MEGALITH_CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
}

DeviceResource::DeviceResource(int device) : device_(device) {
  const int n = cuda::device_count();
  MEGALITH_EXPECTS(device >= 0 && device < n, invalid_argument, "DeviceResource: device ", device,
                   " does not exist; CUDA: ", cuda::status());
}

std::string DeviceResource::name() const { return "device(" + std::to_string(device_) + ")"; }

void* DeviceResource::do_allocate(std::size_t bytes, std::size_t alignment) {
  detail::DeviceGuard guard(device_);
  return device_over_aligned().allocate(bytes, alignment, [&](std::size_t n) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      std::size_t free_bytes = 0, total = 0;
      (void)cudaMemGetInfo(&free_bytes, &total);
      throw_out_of_memory(*this, bytes, free_bytes,
                          ::megalith::detail::concat("cudaMalloc failed; the device has ",
                                                     format_bytes(total), " in all"),
                          MEGALITH_WHERE);
    }
    MEGALITH_CUDA_TRY(e);
    return p;
  });
}

void DeviceResource::do_deallocate(void* ptr, std::size_t, std::size_t alignment) noexcept {
  try {
    detail::DeviceGuard guard(device_);
    device_over_aligned().deallocate(ptr, alignment, [](void* p) { (void)cudaFree(p); });
  } catch (...) {  // no way to report from a deallocation; the device is gone anyway
  }
}

}  // namespace megalith::memory
