#pragma once
// Pageable host memory from the C library (posix_memalign / _aligned_malloc).
// Blocks of kHugePageBytes or more are aligned to it and advised for transparent huge
// pages (Linux), so that long streams over them take few TLB misses.

#include <cstddef>
#include <string>

#include "megalith/memory/resource.h"

namespace megalith::memory {

class MEGALITH_API HostResource final : public Resource {
 public:
  static constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
  HostResource() = default;
  Tier tier() const override { return Tier::host; }
  std::string name() const override { return "host"; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept override;
};

/// Bytes of physical host memory available now (for out-of-memory messages).
MEGALITH_API std::size_t host_available_bytes();

}  // namespace megalith::memory
