#pragma once
// Where a piece of engine memory lives. Chunks move between the tiers; every
// resource says which tier it serves.

#include <cstdint>

#include "megalith/export.h"

namespace megalith::memory {

/// device: GPU memory; pinned_host: page-locked host memory (fast, truly
/// asynchronous copies to and from a GPU); host: ordinary pageable host memory.
enum class Tier : std::uint8_t { device = 0, pinned_host = 1, host = 2 };

constexpr int kTierCount = 3;

/// "device", "pinned_host" or "host".
MEGALITH_API const char* tier_name(Tier t);

/// True for the tiers the CPU can read and write directly (pinned_host, host).
constexpr bool is_host_tier(Tier t) { return t != Tier::device; }

}  // namespace megalith::memory
