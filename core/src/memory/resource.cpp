// The checks every resource shares (zero bytes, alignment, absurd sizes), the
// out-of-memory message, and the names of tiers and byte counts.
#include "megalith/memory/resource.h"

#include <cstdint>
#include <cstdio>
#include <limits>

#include "megalith/error.h"
#include "megalith/memory/bytes.h"
#include "megalith/memory/tier.h"

namespace megalith::memory {

namespace {
// Larger alignments would only waste memory; 1 GiB keeps align_up from overflowing.
constexpr std::size_t kMaxAlignment = std::size_t{1} << 30;
}  // namespace

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::device:
      return "device";
    case Tier::pinned_host:
      return "pinned_host";
    case Tier::host:
      return "host";
  }
  return "unknown tier";
}

std::string format_bytes(std::size_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.1f %s (%llu bytes)", v, units[u],
                static_cast<unsigned long long>(bytes));
  return buf;
}

void* Resource::allocate(std::size_t bytes, std::size_t alignment) {
  MEGALITH_EXPECTS(is_power_of_two(alignment) && alignment <= kMaxAlignment, invalid_argument,
                   name(), ": alignment must be a power of two up to ", kMaxAlignment, ", got ",
                   alignment);
  if (bytes == 0) return nullptr;
  if (bytes > std::numeric_limits<std::size_t>::max() / 2) {
    throw out_of_memory(::megalith::detail::concat(
        "cannot allocate ", format_bytes(bytes), " from '", name(),
        "': more than the address space can hold [", MEGALITH_WHERE, "]"));
  }
  return do_allocate(bytes, alignment);
}

void Resource::deallocate(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
  if (ptr == nullptr || bytes == 0) return;
  do_deallocate(ptr, bytes, alignment);
}

void throw_out_of_memory(const Resource& r, std::size_t bytes, std::size_t free_bytes,
                         const std::string& detail, const char* where) {
  std::string place = tier_name(r.tier());
  if (r.device() >= 0) place += " cuda:" + std::to_string(r.device());
  throw out_of_memory(::megalith::detail::concat(
      "cannot allocate ", format_bytes(bytes), " from '", r.name(), "' (", place, "): ",
      format_bytes(free_bytes), " free", detail.empty() ? "" : "; ", detail, " [", where, "]"));
}

}  // namespace megalith::memory
