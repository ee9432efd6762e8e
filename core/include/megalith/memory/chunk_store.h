#pragma once
// Makes chunks of one capacity on up to three tiers, each tier with its own
// resource. Each resource is wrapped in a StatisticsAdaptor so the store can
// report bytes in use and their peak per tier.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "megalith/export.h"
#include "megalith/memory/chunk.h"
#include "megalith/memory/resource.h"
#include "megalith/memory/statistics_adaptor.h"

namespace megalith::memory {

/// The resources of a store; a tier left null cannot be used (using it throws
/// megalith::invalid_argument naming the missing one).
struct TierResources {
  std::shared_ptr<Resource> host, pinned_host, device;
};

class MEGALITH_API ChunkStore {
 public:
  /// `alignment` is the default placement alignment (a power of two); chunk
  /// storage is aligned to max(alignment, 256). Throws invalid_argument when a
  /// resource serves another tier than the one it is given for.
  ChunkStore(std::size_t capacity, const TierResources& resources,
             std::size_t alignment = kDefaultAlignment);

  std::size_t capacity() const;
  std::size_t alignment() const;
  bool has_tier(Tier tier) const;
  /// The statistics-wrapped resource of `tier` (nullptr when none was given).
  std::shared_ptr<StatisticsAdaptor> resource(Tier tier) const;

  /// A new chunk with storage on `tier` (throws out_of_memory naming the chunk).
  std::shared_ptr<Chunk> new_chunk(Tier tier);
  /// Bytes in use on `tier`, peak and allocations (zeros for a tier without a resource).
  MemoryStats stats(Tier tier) const;
  void reset_peak();

 private:
  std::shared_ptr<detail::StoreState> state_;
};

}  // namespace megalith::memory
