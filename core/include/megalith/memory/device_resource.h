#pragma once
// GPU memory of one device through cudaMalloc.
//
// cudaMalloc rather than cudaMallocAsync: a Resource has no stream, and
// cudaFree waits for the device, so a buffer freed while a copy still reads
// it is safe. Put a PoolResource on top to avoid the cost of cudaMalloc/cudaFree
// per allocation.

#include <string>

#include "megalith/memory/resource.h"

namespace megalith::memory {

class MEGALITH_API DeviceResource final : public Resource {
 public:
  /// Throws megalith::error in a build without CUDA, megalith::invalid_argument
  /// when `device` is not a device index of this machine.
  explicit DeviceResource(int device);
  Tier tier() const override { return Tier::device; }
  int device() const override { return device_; }
  std::string name() const override;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept override;
  int device_;
};

/// Free and total bytes of `device` (cudaMemGetInfo); throws like DeviceResource.
MEGALITH_API void device_memory_info(int device, std::size_t* free_bytes, std::size_t* total_bytes);

}  // namespace megalith::memory
