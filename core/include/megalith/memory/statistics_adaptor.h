#pragma once
// Counts what passes through to an upstream resource: bytes in use now, their
// peak since construction or reset_peak(), and allocations made. Bytes are
// the bytes asked for (not what upstream rounds them to). Thread-safe.

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "megalith/memory/resource.h"

namespace megalith::memory {

struct MemoryStats {
  std::size_t current_bytes = 0;
  std::size_t peak_bytes = 0;
  std::size_t allocations = 0;       // allocations made since construction
  std::size_t live_allocations = 0;  // allocations not yet deallocated
};

class MEGALITH_API StatisticsAdaptor final : public Resource {
 public:
  explicit StatisticsAdaptor(std::shared_ptr<Resource> upstream);

  Tier tier() const override { return upstream_->tier(); }
  int device() const override { return upstream_->device(); }
  std::string name() const override { return "stats(" + upstream_->name() + ")"; }
  const std::shared_ptr<Resource>& upstream() const { return upstream_; }

  MemoryStats stats() const;
  std::size_t current_bytes() const { return stats().current_bytes; }
  std::size_t peak_bytes() const { return stats().peak_bytes; }
  std::size_t allocations() const { return stats().allocations; }
  /// Sets the peak to the bytes in use now.
  void reset_peak();

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept override;

  std::shared_ptr<Resource> upstream_;
  mutable std::mutex mutex_;
  MemoryStats stats_;
};

}  // namespace megalith::memory
