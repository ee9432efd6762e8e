#pragma once
// Caps the bytes in use through an upstream resource: a request that would
// take the total over `limit_bytes` raises out_of_memory (bytes asked for,
// limit, in use, free) without reaching upstream. Counts the bytes asked for.
// Thread-safe.

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "megalith/memory/resource.h"

namespace megalith::memory {

class MEGALITH_API LimitingAdaptor final : public Resource {
 public:
  LimitingAdaptor(std::shared_ptr<Resource> upstream, std::size_t limit_bytes);

  Tier tier() const override { return upstream_->tier(); }
  int device() const override { return upstream_->device(); }
  std::string name() const override { return "limit(" + upstream_->name() + ")"; }
  const std::shared_ptr<Resource>& upstream() const { return upstream_; }

  std::size_t limit_bytes() const { return limit_; }
  std::size_t used_bytes() const;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept override;

  std::shared_ptr<Resource> upstream_;
  std::size_t limit_;
  mutable std::mutex mutex_;
  std::size_t used_ = 0;
};

}  // namespace megalith::memory
