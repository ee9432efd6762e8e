#pragma once
// Choosing a chunk capacity for a list of tensors.
//
// The placement rule (the one Chunk::place follows): tensors go into chunks
// in the given order; each starts at the next offset in the current chunk that
// is a multiple of `alignment`, or at offset 0 of a new chunk when it would not
// end within the capacity. A tensor never spans chunks.

#include <cstddef>
#include <vector>

#include "megalith/export.h"

namespace megalith::memory {

struct CapacityChoice {
  std::size_t capacity = 0;
  /// chunks * capacity - sum(tensor bytes): alignment padding and unused tails.
  std::size_t wasted_bytes = 0;
  std::size_t chunks = 0;
};

/// The capacity in [max(min_capacity, largest tensor), max_capacity] that
/// minimises the wasted bytes; among equal waste, the one with fewer chunks.
/// Throws megalith::invalid_argument when max_capacity is below the largest
/// tensor (naming its index and size) or below min_capacity, or for an
/// alignment that is not a power of two. Exact, and fast for 10k tensors
/// (see the note in capacity_search.cpp).
MEGALITH_API CapacityChoice search_chunk_capacity(const std::vector<std::size_t>& tensor_bytes,
                                                  std::size_t min_capacity,
                                                  std::size_t max_capacity,
                                                  std::size_t alignment = 256);

/// Chunks the placement rule needs at `capacity` (every tensor must fit one chunk).
MEGALITH_API std::size_t count_chunks(const std::vector<std::size_t>& tensor_bytes,
                                      std::size_t capacity, std::size_t alignment = 256);

}  // namespace megalith::memory
