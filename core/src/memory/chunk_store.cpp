#include "megalith/memory/chunk_store.h"

#include "megalith/error.h"
#include "store_state.h"

namespace megalith::memory {

ChunkStore::ChunkStore(std::size_t capacity, const TierResources& resources, std::size_t alignment)
    : state_(std::make_shared<detail::StoreState>()) {
  MEGALITH_EXPECTS(capacity > 0, invalid_argument, "ChunkStore: capacity must be > 0");
  MEGALITH_EXPECTS(is_power_of_two(alignment) && alignment <= (std::size_t{1} << 30),
                   invalid_argument,
                   "ChunkStore: alignment must be a power of two up to 2^30, got ", alignment);
  state_->capacity = capacity;
  state_->alignment = alignment;
  state_->base_alignment = alignment > kDefaultAlignment ? alignment : kDefaultAlignment;
  const std::pair<Tier, const std::shared_ptr<Resource>*> given[] = {
      {Tier::host, &resources.host},
      {Tier::pinned_host, &resources.pinned_host},
      {Tier::device, &resources.device}};
  for (const auto& [tier, r] : given) {
    if (*r == nullptr) continue;
    MEGALITH_EXPECTS((*r)->tier() == tier, invalid_argument, "ChunkStore: the resource given as ",
                     tier_name(tier), " ('", (*r)->name(), "') serves tier ",
                     tier_name((*r)->tier()));
    state_->tiers[static_cast<int>(tier)] = std::make_shared<StatisticsAdaptor>(*r);
  }
}

std::size_t ChunkStore::capacity() const { return state_->capacity; }
std::size_t ChunkStore::alignment() const { return state_->alignment; }
bool ChunkStore::has_tier(Tier tier) const { return state_->resource(tier) != nullptr; }

std::shared_ptr<StatisticsAdaptor> ChunkStore::resource(Tier tier) const {
  return state_->resource(tier);
}

std::shared_ptr<Chunk> ChunkStore::new_chunk(Tier tier) {
  state_->require(tier);
  std::shared_ptr<Chunk> c(new Chunk(state_, state_->next_id++, tier));
  c->storage_ = c->new_storage(tier);
  return c;
}

MemoryStats ChunkStore::stats(Tier tier) const {
  const auto& r = state_->resource(tier);
  return r ? r->stats() : MemoryStats{};
}

void ChunkStore::reset_peak() {
  for (const auto& r : state_->tiers) {
    if (r) r->reset_peak();
  }
}

}  // namespace megalith::memory
