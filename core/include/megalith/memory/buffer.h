#pragma once
// One allocation from a resource, freed to it when the last reference dies.
// Buffers are shared (std::shared_ptr<Buffer>) and hold their resource alive.

#include <cstddef>
#include <memory>

#include "megalith/export.h"
#include "megalith/memory/resource.h"

namespace megalith::memory {

class MEGALITH_API Buffer {
 public:
  /// Allocates `bytes` from `resource` (throws like Resource::allocate).
  static std::shared_ptr<Buffer> allocate(std::shared_ptr<Resource> resource, std::size_t bytes,
                                          std::size_t alignment = kDefaultAlignment);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  std::size_t alignment() const { return alignment_; }
  Tier tier() const { return resource_->tier(); }
  int device() const { return resource_->device(); }
  const std::shared_ptr<Resource>& resource() const { return resource_; }

 private:
  Buffer(std::shared_ptr<Resource> resource, void* data, std::size_t nbytes, std::size_t alignment);
  std::shared_ptr<Resource> resource_;
  void* data_;
  std::size_t nbytes_, alignment_;
};

}  // namespace megalith::memory
