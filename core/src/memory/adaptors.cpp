// The statistics and limiting adaptors: bookkeeping under a mutex around the
// upstream call.
#include <utility>

#include "megalith/error.h"
#include "megalith/memory/limiting_adaptor.h"
#include "megalith/memory/statistics_adaptor.h"

namespace megalith::memory {

namespace {
std::shared_ptr<Resource> checked(std::shared_ptr<Resource> upstream, const char* who) {
  MEGALITH_EXPECTS(upstream != nullptr, invalid_argument, who, ": upstream resource is null");
  return upstream;
}
}  // namespace

StatisticsAdaptor::StatisticsAdaptor(std::shared_ptr<Resource> upstream)
    : upstream_(checked(std::move(upstream), "StatisticsAdaptor")) {}

MemoryStats StatisticsAdaptor::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void StatisticsAdaptor::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
}

void* StatisticsAdaptor::do_allocate(std::size_t bytes, std::size_t alignment) {
  void* p = upstream_->allocate(bytes, alignment);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.current_bytes += bytes;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  ++stats_.allocations;
  ++stats_.live_allocations;
  return p;
}

void StatisticsAdaptor::do_deallocate(void* ptr, std::size_t bytes,
                                      std::size_t alignment) noexcept {
  upstream_->deallocate(ptr, bytes, alignment);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.current_bytes -= bytes;
  --stats_.live_allocations;
}

LimitingAdaptor::LimitingAdaptor(std::shared_ptr<Resource> upstream, std::size_t limit_bytes)
    : upstream_(checked(std::move(upstream), "LimitingAdaptor")), limit_(limit_bytes) {}

std::size_t LimitingAdaptor::used_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

void* LimitingAdaptor::do_allocate(std::size_t bytes, std::size_t alignment) {
  {
    // Reserve first so that concurrent requests cannot both pass the check.
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes > limit_ - used_) {
      throw_out_of_memory(*this, bytes, limit_ - used_,
                          ::megalith::detail::concat("limit ", format_bytes(limit_), ", ",
                                                     format_bytes(used_), " in use"),
                          MEGALITH_WHERE);
    }
    used_ += bytes;
  }
  try {
    return upstream_->allocate(bytes, alignment);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    used_ -= bytes;
    throw;
  }
}

void LimitingAdaptor::do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
  upstream_->deallocate(ptr, bytes, alignment);
  std::lock_guard<std::mutex> lock(mutex_);
  used_ -= bytes;
}

}  // namespace megalith::memory
