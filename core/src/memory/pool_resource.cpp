// Best fit with coalescing over blocks from upstream (see pool_resource.h).
#include "megalith/memory/pool_resource.h"

#include <cstdint>
#include <cstdio>
#include <iterator>

#include "megalith/error.h"

namespace megalith::memory {

namespace {
char* align_ptr(char* p, std::size_t alignment) {
  auto v = reinterpret_cast<std::uintptr_t>(p);
  return p + (align_up(v, alignment) - v);
}
}  // namespace

PoolResource::PoolResource(std::shared_ptr<Resource> upstream, std::size_t block_bytes,
                           std::size_t max_bytes)
    : upstream_(std::move(upstream)), block_bytes_(block_bytes), max_bytes_(max_bytes) {
  MEGALITH_EXPECTS(upstream_ != nullptr, invalid_argument,
                   "PoolResource: upstream resource is null");
  MEGALITH_EXPECTS(block_bytes_ > 0, invalid_argument, "PoolResource: block_bytes must be > 0");
  block_bytes_ = align_up(block_bytes_, kGranule);
}

PoolResource::~PoolResource() {
  for (const Block& b : blocks_) {
    if (b.ptr) upstream_->deallocate(b.ptr, b.size, kGranule);
  }
}

std::size_t PoolResource::held_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_;
}

std::size_t PoolResource::used_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

std::size_t PoolResource::release_unused() {
  std::lock_guard<std::mutex> lock(mutex_);
  return release_unused_locked();
}

void* PoolResource::do_allocate(std::size_t bytes, std::size_t alignment) {
  const std::size_t need = align_up(bytes, kGranule);
  const std::size_t align = alignment > kGranule ? alignment : kGranule;
  std::lock_guard<std::mutex> lock(mutex_);
  char* p = take_free(need, align);
  if (p == nullptr) {
    grow(need, align, bytes);
    p = take_free(need, align);
  }
  return p;
}

char* PoolResource::take_free(std::size_t need, std::size_t align) {
  // Smallest range first; with an alignment above the granule a range may
  // need to be larger than `need` to hold an aligned start.
  for (auto it = free_by_size_.lower_bound({need, nullptr}); it != free_by_size_.end(); ++it) {
    char* start = it->second;
    const std::size_t size = it->first;
    char* aligned = align_ptr(start, align);
    if (aligned + need > start + size) continue;
    auto at = free_by_addr_.find(start);
    const std::size_t block = at->second.block;
    remove_free(at);
    if (aligned > start) add_free(start, static_cast<std::size_t>(aligned - start), block);
    char* end = aligned + need;
    if (end < start + size) add_free(end, static_cast<std::size_t>(start + size - end), block);
    live_[aligned] = Live{aligned, need, block};
    used_ += need;
    return aligned;
  }
  return nullptr;
}

void PoolResource::grow(std::size_t need, std::size_t align, std::size_t bytes) {
  // Enough for `need` at any granule-aligned start of a fresh block.
  const std::size_t minimal = need + (align - kGranule);
  auto describe = [&] {
    return ::megalith::detail::concat("pool holds ", format_bytes(held_), " from upstream, ",
                                      format_bytes(used_), " in use, largest free range ",
                                      format_bytes(largest_free_locked()));
  };
  std::size_t want = block_bytes_ > minimal ? block_bytes_ : minimal;
  if (max_bytes_ != 0) {
    if (held_ + minimal > max_bytes_) release_unused_locked();
    if (held_ + minimal > max_bytes_) {
      throw_out_of_memory(
          *this, bytes, max_bytes_ - used_,
          ::megalith::detail::concat("max_bytes ", format_bytes(max_bytes_), "; ", describe()),
          MEGALITH_WHERE);
    }
    if (want > max_bytes_ - held_) want = max_bytes_ - held_;
  }
  void* raw = nullptr;
  try {
    raw = upstream_->allocate(want, kGranule);
  } catch (const out_of_memory&) {
    // Give back blocks that are entirely free, then ask only for what this request needs.
    release_unused_locked();
    want = minimal;
    try {
      raw = upstream_->allocate(want, kGranule);
    } catch (const out_of_memory& e) {
      throw_out_of_memory(*this, bytes, held_ - used_,
                          ::megalith::detail::concat(describe(), "; upstream: ", e.what()),
                          MEGALITH_WHERE);
    }
  }
  std::size_t id = 0;
  while (id < blocks_.size() && blocks_[id].ptr != nullptr) ++id;
  if (id == blocks_.size()) blocks_.push_back({});
  blocks_[id] = Block{static_cast<char*>(raw), want};
  held_ += want;
  add_free(static_cast<char*>(raw), want, id);
}

void PoolResource::add_free(char* start, std::size_t size, std::size_t block) {
  auto next = free_by_addr_.find(start + size);
  if (next != free_by_addr_.end() && next->second.block == block) {
    size += next->second.size;
    remove_free(next);
  }
  auto after = free_by_addr_.lower_bound(start);
  if (after != free_by_addr_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second.size == start && prev->second.block == block) {
      start = prev->first;
      size += prev->second.size;
      remove_free(prev);
    }
  }
  free_by_addr_.emplace(start, Range{size, block});
  free_by_size_.emplace(size, start);
}

void PoolResource::remove_free(std::map<char*, Range>::iterator it) {
  free_by_size_.erase({it->second.size, it->first});
  free_by_addr_.erase(it);
}

void PoolResource::do_deallocate(void* ptr, std::size_t, std::size_t) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    std::fprintf(stderr, "megalith: %s: deallocate(%p) of memory it did not allocate; ignored\n",
                 name().c_str(), ptr);
    return;
  }
  const Live live = it->second;
  live_.erase(it);
  used_ -= live.size;
  add_free(live.start, live.size, live.block);
}

std::size_t PoolResource::release_unused_locked() {
  std::size_t released = 0;
  for (Block& b : blocks_) {
    if (b.ptr == nullptr) continue;
    auto it = free_by_addr_.find(b.ptr);
    if (it == free_by_addr_.end() || it->second.size != b.size) continue;
    remove_free(it);
    upstream_->deallocate(b.ptr, b.size, kGranule);
    held_ -= b.size;
    released += b.size;
    b.ptr = nullptr;
  }
  return released;
}

std::size_t PoolResource::largest_free_locked() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

}  // namespace megalith::memory
