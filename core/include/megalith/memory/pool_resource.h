#pragma once
// A pool over an upstream resource: takes memory from upstream in blocks of
// at least `block_bytes`, and keeps what is freed for reuse instead of giving
// it back.
//
// Strategy: best fit with coalescing. Every piece handed out is a multiple of
// 256 bytes carved from an upstream block. Free ranges are indexed twice: by
// (size, address) to find the smallest range that holds a request (best fit
// keeps large ranges whole for large requests), and by address to merge a
// freed range with its free neighbours. Ranges merge only within the upstream
// block they came from, so a block that is entirely free again can be
// returned upstream whole (release_unused(), and automatically once when
// upstream runs out of memory). Requests larger than `block_bytes` get an
// upstream block of their own size.
//
// All blocks go back upstream when the pool is destroyed; Buffers hold the
// pool alive, so that happens only after the last one is gone.

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megalith/memory/resource.h"

namespace megalith::memory {

class MEGALITH_API PoolResource final : public Resource {
 public:
  /// `max_bytes` caps the bytes held from upstream (0: no cap); a request that
  /// would need more raises out_of_memory naming the pool.
  explicit PoolResource(std::shared_ptr<Resource> upstream,
                        std::size_t block_bytes = std::size_t{64} << 20, std::size_t max_bytes = 0);
  ~PoolResource() override;

  Tier tier() const override { return upstream_->tier(); }
  int device() const override { return upstream_->device(); }
  std::string name() const override { return "pool(" + upstream_->name() + ")"; }
  const std::shared_ptr<Resource>& upstream() const { return upstream_; }

  std::size_t block_bytes() const { return block_bytes_; }
  std::size_t max_bytes() const { return max_bytes_; }
  /// Bytes taken from upstream and not yet returned.
  std::size_t held_bytes() const;
  /// Bytes handed out (rounded up to the pool's 256-byte granule).
  std::size_t used_bytes() const;
  /// Returns every block that is entirely free to upstream; gives the bytes returned.
  std::size_t release_unused();

 private:
  static constexpr std::size_t kGranule = 256;
  struct Range {
    std::size_t size;
    std::size_t block;
  };
  struct Live {
    char* start;
    std::size_t size;
    std::size_t block;
  };
  struct Block {
    char* ptr;
    std::size_t size;
  };

  void* do_allocate(std::size_t bytes, std::size_t alignment) override;
  void do_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept override;

  char* take_free(std::size_t need, std::size_t alignment);  // best fit, or nullptr
  void grow(std::size_t need, std::size_t alignment, std::size_t bytes);
  void add_free(char* start, std::size_t size, std::size_t block);
  void remove_free(std::map<char*, Range>::iterator it);
  std::size_t release_unused_locked();
  std::size_t largest_free_locked() const;

  std::shared_ptr<Resource> upstream_;
  std::size_t block_bytes_, max_bytes_;
  mutable std::mutex mutex_;
  std::vector<Block> blocks_;  // index = block id; ptr == nullptr once returned
  std::size_t held_ = 0, used_ = 0;
  std::map<char*, Range> free_by_addr_;
  std::set<std::pair<std::size_t, char*>> free_by_size_;
  std::unordered_map<void*, Live> live_;
};

}  // namespace megalith::memory
