#pragma once
// The memory resource concept: allocate / deallocate raw bytes on one tier.
// Concrete resources (host, pinned host, device) get memory from the system;
// adaptors (pool, statistics, limiting) wrap an upstream resource they share
// ownership of. Resources are used through std::shared_ptr.

#include <cstddef>
#include <string>

#include "megalith/export.h"
#include "megalith/memory/bytes.h"
#include "megalith/memory/tier.h"

namespace megalith::memory {

class MEGALITH_API Resource {
 public:
  virtual ~Resource() = default;
  Resource(const Resource&) = delete;
  Resource& operator=(const Resource&) = delete;

  /// `bytes` aligned to `alignment` (a power of two). A request for 0 bytes
  /// returns nullptr without reaching the resource. Throws
  /// megalith::out_of_memory (bytes asked for, resource, bytes free) or
  /// megalith::invalid_argument for a bad alignment. Thread-safe.
  void* allocate(std::size_t bytes, std::size_t alignment = kDefaultAlignment);

  /// Gives back what allocate(bytes, alignment) returned; the same bytes and
  /// alignment must be passed. nullptr is ignored. Never throws.
  void deallocate(void* ptr, std::size_t bytes, std::size_t alignment = kDefaultAlignment) noexcept;

  virtual Tier tier() const = 0;
  /// The CUDA device of device memory; -1 for host tiers.
  virtual int device() const { return -1; }
  /// "host", "pool(device(0))", ...: used in messages.
  virtual std::string name() const = 0;

 protected:
  Resource() = default;
  virtual void* do_allocate(std::size_t bytes, std::size_t alignment) = 0;
  virtual void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept = 0;
};

/// Throws megalith::out_of_memory: "cannot allocate <bytes> from '<name>' (tier
/// <tier>[, cuda:<n>]): <free> free; <detail> [<where>]".
[[noreturn]] MEGALITH_API void throw_out_of_memory(const Resource& r, std::size_t bytes,
                                                   std::size_t free_bytes,
                                                   const std::string& detail, const char* where);

}  // namespace megalith::memory
