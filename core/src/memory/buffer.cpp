#include "megalith/memory/buffer.h"

#include <utility>

#include "megalith/error.h"

namespace megalith::memory {

std::shared_ptr<Buffer> Buffer::allocate(std::shared_ptr<Resource> resource, std::size_t bytes,
                                         std::size_t alignment) {
  MEGALITH_EXPECTS(resource != nullptr, invalid_argument, "Buffer::allocate: resource is null");
  void* p = resource->allocate(bytes, alignment);
  try {
    return std::shared_ptr<Buffer>(new Buffer(resource, p, bytes, alignment));
  } catch (...) {
    resource->deallocate(p, bytes, alignment);
    throw;
  }
}

Buffer::Buffer(std::shared_ptr<Resource> resource, void* data, std::size_t nbytes,
               std::size_t alignment)
    : resource_(std::move(resource)), data_(data), nbytes_(nbytes), alignment_(alignment) {}

Buffer::~Buffer() { resource_->deallocate(data_, nbytes_, alignment_); }

}  // namespace megalith::memory
