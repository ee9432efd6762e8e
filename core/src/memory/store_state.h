#pragma once
// What a ChunkStore and its chunks share: capacity, alignment and the
// statistics-wrapped resource of each tier. Chunks hold it alive, so a chunk
// outliving its store still frees to the right resources.
#include <atomic>
#include <cstdint>
#include <memory>

#include "megalith/error.h"
#include "megalith/memory/statistics_adaptor.h"
#include "megalith/memory/tier.h"

namespace megalith::memory::detail {

struct StoreState {
  std::size_t capacity = 0;
  std::size_t alignment = 0;       // default placement alignment
  std::size_t base_alignment = 0;  // of chunk storage: the largest placement alignment allowed
  std::shared_ptr<StatisticsAdaptor> tiers[kTierCount];
  std::atomic<std::uint64_t> next_id{0};

  const std::shared_ptr<StatisticsAdaptor>& resource(Tier t) const {
    return tiers[static_cast<int>(t)];
  }

  /// The resource of `t`, or invalid_argument naming the constructor keyword that was left out.
  const std::shared_ptr<StatisticsAdaptor>& require(Tier t) const {
    const auto& r = resource(t);
    MEGALITH_EXPECTS(r != nullptr, invalid_argument, "ChunkStore has no resource for tier ",
                     tier_name(t), ": pass ", tier_name(t), "=<resource> when creating the store");
    return r;
  }
};

}  // namespace megalith::memory::detail
