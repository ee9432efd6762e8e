#pragma once
// Byte arithmetic shared by the resources: alignment and human-readable sizes.

#include <cstddef>
#include <string>

#include "megalith/export.h"

namespace megalith::memory {

/// The alignment every resource gives when none is asked for (CUDA's cudaMalloc guarantee).
constexpr std::size_t kDefaultAlignment = 256;

constexpr bool is_power_of_two(std::size_t v) { return v != 0 && (v & (v - 1)) == 0; }

/// Rounds `v` up to a multiple of `alignment` (a power of two).
constexpr std::size_t align_up(std::size_t v, std::size_t alignment) {
  return (v + alignment - 1) & ~(alignment - 1);
}

/// "64.0 MiB (67108864 bytes)"; below 1 KiB just "512 bytes".
MEGALITH_API std::string format_bytes(std::size_t bytes);

}  // namespace megalith::memory
