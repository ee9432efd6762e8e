#pragma once
// A chunk: a fixed-capacity byte range that tensors are placed into, whose
// storage (a Buffer) lives on one tier at a time and moves between tiers as a
// whole. Chunks are made by a ChunkStore and shared (std::shared_ptr<Chunk>).
//
// [Note: chunk copies and lifetimes] move_to() involving the device tier is
// asynchronous: it orders a cudaMemcpyAsync on the caller's stream and records
// an event. Until that event completed, the chunk keeps the old storage alive
// (its memory may not go back to a pool and be reused while the copy reads
// it); the first call on the chunk that finds the event complete, or
// synchronize(), drops it. A later copy on another stream waits for the
// previous one on the device. Reading the new storage on the host needs
// synchronize() first; work on the same stream is ordered already.
// Copies between the host tiers are plain memcpy: done when move_to returns.
// release() waits for a copy in flight before freeing, so memory accounting
// is exact once it returns. Methods lock the chunk: safe from several threads.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "megalith/export.h"
#include "megalith/memory/buffer.h"
#include "megalith/memory/tier.h"

namespace megalith::memory {

namespace detail {
struct StoreState;
class CopyEvent;
}  // namespace detail

class MEGALITH_API Chunk {
 public:
  ~Chunk();
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  std::uint64_t id() const { return id_; }
  std::size_t capacity() const;
  /// End of the last placed tensor (placement survives release()).
  std::size_t used_bytes() const;
  /// The tier of the storage; after release(), the tier it last had.
  Tier tier() const;
  bool resident() const;
  /// nullptr when not resident.
  void* data() const;
  /// The current storage (nullptr when not resident): views hold it alive.
  std::shared_ptr<Buffer> storage() const;

  /// Whether `nbytes` at the next offset aligned to `alignment` (0: the
  /// store's alignment) ends within the capacity.
  bool fits(std::size_t nbytes, std::size_t alignment = 0) const;
  /// Reserves `nbytes` at that offset and returns it; throws
  /// megalith::invalid_argument naming chunk id, capacity and used bytes when
  /// it does not fit.
  std::size_t place(std::size_t nbytes, std::size_t alignment = 0);

  /// Copies the whole chunk to fresh storage on `tier` (see the note above);
  /// `stream` is a cudaStream_t (nullptr: the legacy default stream).
  void move_to(Tier tier, void* stream = nullptr);
  /// Waits for the last copy and drops storage it kept alive.
  void synchronize();
  /// Drops the storage: the chunk is not resident and its contents are lost.
  void release();
  /// Gives a non-resident chunk fresh (uninitialised) storage on `tier`.
  void allocate(Tier tier);

 private:
  friend class ChunkStore;
  Chunk(std::shared_ptr<detail::StoreState> store, std::uint64_t id, Tier tier);

  std::size_t aligned_offset(std::size_t alignment) const;
  std::shared_ptr<Buffer> new_storage(Tier tier) const;
  void poll_locked();
  void wait_locked();

  std::shared_ptr<detail::StoreState> store_;
  std::uint64_t id_;
  mutable std::mutex mutex_;
  std::size_t used_ = 0;
  Tier tier_;
  std::shared_ptr<Buffer> storage_;
  std::shared_ptr<detail::CopyEvent> event_;        // the last asynchronous copy
  std::vector<std::shared_ptr<Buffer>> in_flight_;  // storage it may still read or write
};

}  // namespace megalith::memory
