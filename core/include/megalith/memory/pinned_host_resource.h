#pragma once
// Page-locked host memory, portable to every device: what copies to and from a GPU
// need to be truly asynchronous and run at full bandwidth. Blocks of 2 MiB and more are
// 2 MiB aligned, on transparent huge pages where the kernel gives them, and registered
// with cudaHostRegister; smaller ones (or where that fails) come from cudaHostAlloc.
// Exact size either way. Needs a CUDA build and a driver; the constructor says which
// is missing.

#include <string>

#include "megalith/memory/resource.h"

namespace megalith::memory {

class MEGALITH_API PinnedHostResource final : public Resource {
 public:
  /// Throws megalith::error in a build without CUDA or on a machine without a GPU.
  PinnedHostResource();
  Tier tier() const override { return Tier::pinned_host; }
  std::string name() const override { return "pinned_host"; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept override;
};

}  // namespace megalith::memory
