// Chunk placement and moves between tiers; see [Note: chunk copies and
// lifetimes] in chunk.h.
#include "megalith/memory/chunk.h"

#include <cstring>
#include <utility>

#include "copy_engine.h"
#include "megalith/error.h"
#include "store_state.h"

namespace megalith::memory {

using Lock = std::lock_guard<std::mutex>;

Chunk::Chunk(std::shared_ptr<detail::StoreState> store, std::uint64_t id, Tier tier)
    : store_(std::move(store)), id_(id), tier_(tier) {}

Chunk::~Chunk() {
  // Storage a copy may still use must not go back to its resource before the copy ends.
  try {
    if (event_) event_->wait();
  } catch (...) {
  }
}

std::size_t Chunk::capacity() const { return store_->capacity; }

std::size_t Chunk::used_bytes() const {
  Lock lock(mutex_);
  return used_;
}

Tier Chunk::tier() const {
  Lock lock(mutex_);
  return tier_;
}

bool Chunk::resident() const {
  Lock lock(mutex_);
  return storage_ != nullptr;
}

void* Chunk::data() const {
  Lock lock(mutex_);
  return storage_ ? storage_->data() : nullptr;
}

std::shared_ptr<Buffer> Chunk::storage() const {
  Lock lock(mutex_);
  return storage_;
}

std::size_t Chunk::aligned_offset(std::size_t alignment) const {
  const std::size_t a = alignment ? alignment : store_->alignment;
  MEGALITH_EXPECTS(is_power_of_two(a) && a <= store_->base_alignment, invalid_argument, "chunk ",
                   id_, ": placement alignment must be a power of two up to the store's ",
                   store_->base_alignment, " (its storage alignment), got ", a);
  return align_up(used_, a);
}

bool Chunk::fits(std::size_t nbytes, std::size_t alignment) const {
  Lock lock(mutex_);
  const std::size_t off = aligned_offset(alignment);
  return off <= store_->capacity && nbytes <= store_->capacity - off;
}

std::size_t Chunk::place(std::size_t nbytes, std::size_t alignment) {
  Lock lock(mutex_);
  const std::size_t off = aligned_offset(alignment), cap = store_->capacity;
  MEGALITH_EXPECTS(off <= cap && nbytes <= cap - off, invalid_argument, "chunk ", id_,
                   ": cannot place ", format_bytes(nbytes), " at offset ", off, ": capacity ",
                   format_bytes(cap), ", ", format_bytes(used_), " used, ",
                   format_bytes(off < cap ? cap - off : 0), " left after alignment");
  used_ = off + nbytes;
  return off;
}

std::shared_ptr<Buffer> Chunk::new_storage(Tier tier) const {
  const auto& r = store_->require(tier);
  try {
    return Buffer::allocate(r, store_->capacity, store_->base_alignment);
  } catch (const out_of_memory& e) {
    throw out_of_memory(::megalith::detail::concat("chunk ", id_, " (capacity ",
                                                   format_bytes(store_->capacity), ") on tier ",
                                                   tier_name(tier), ": ", e.what()));
  }
}

void Chunk::poll_locked() {
  if (event_ && event_->done()) {
    event_.reset();
    in_flight_.clear();
  }
}

void Chunk::wait_locked() {
  if (event_) {
    event_->wait();
    event_.reset();
    in_flight_.clear();
  }
}

void Chunk::move_to(Tier tier, void* stream) {
  Lock lock(mutex_);
  poll_locked();
  MEGALITH_EXPECTS(storage_ != nullptr, invalid_argument, "chunk ", id_, ": move_to(",
                   tier_name(tier),
                   ") on a chunk that is not resident (it was released); allocate(tier) gives "
                   "it fresh storage");
  if (tier == tier_) return;
  std::shared_ptr<Buffer> dst = new_storage(tier);
  if (is_host_tier(tier) && is_host_tier(tier_)) {
    wait_locked();  // a copy in flight may still be writing the source
    std::memcpy(dst->data(), storage_->data(), store_->capacity);
  } else {
    const int device = tier == Tier::device ? dst->device() : storage_->device();
    event_ = detail::copy_async(dst->data(), storage_->data(), store_->capacity, device, stream,
                                event_.get());
    in_flight_.push_back(std::move(storage_));
  }
  storage_ = std::move(dst);
  tier_ = tier;
}

void Chunk::synchronize() {
  Lock lock(mutex_);
  wait_locked();
}

void Chunk::release() {
  Lock lock(mutex_);
  wait_locked();
  storage_.reset();
}

void Chunk::allocate(Tier tier) {
  Lock lock(mutex_);
  poll_locked();
  MEGALITH_EXPECTS(storage_ == nullptr, invalid_argument, "chunk ", id_, ": allocate(",
                   tier_name(tier), ") on a chunk already resident on ", tier_name(tier_),
                   "; release() it first, or move_to() to keep its contents");
  storage_ = new_storage(tier);
  tier_ = tier;
}

}  // namespace megalith::memory
