// Exact capacity search under the placement rule of capacity_search.h.
//
// [Note: capacity search]
// Prefix form of the rule: let r_i be tensor i's size rounded up to the
// alignment and R[i] = r_0 + ... + r_{i-1}. In a chunk whose first tensor is
// i, tensor j (j >= i) starts at R[j] - R[i] (every start is aligned, so each
// tensor advances the next start by exactly r_j) and ends at E[j] - R[i] with
// E[j] = R[j] + s_j. E is non-decreasing, so the greedy rule fills a chunk
// starting at i up to the last j with E[j] <= R[i] + C: one binary search per
// chunk, and the chunk count n(C) costs O(chunks * log n).
//
// Waste is n(C) * C - sum(s), so we minimise f(C) = n(C) * C. n is a
// non-increasing step function of C, and for a given greedy partition f is
// smallest at the widest chunk's extent W(C) <= C (greedy at W(C) gives the
// same partition). The search walks C downward from max_capacity:
//  - if n(C) * C < best, then W(C) is a new best; continue at W(C) - 1;
//  - otherwise every C' in ((best - 1) / n(C), C] has n(C') >= n(C) and so
//    f(C') >= best: jump to (best - 1) / n(C).
// C strictly decreases each step and only values that cannot win are
// skipped, so the result is exact; walking downward meets ties with the
// fewest chunks first, and only strict improvements are taken. In practice a
// few hundred steps for 10k tensors (the jumps skip whole ranges of C).
#include "megalith/memory/capacity_search.h"

#include <algorithm>
#include <limits>

#include "megalith/error.h"
#include "megalith/memory/bytes.h"

namespace megalith::memory {

namespace {

constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();

struct Layout {
  std::vector<std::size_t> R, E;
};

struct Greedy {
  std::size_t chunks = 0, widest = 0;
};

void check_alignment(std::size_t alignment, const char* who) {
  MEGALITH_EXPECTS(is_power_of_two(alignment) && alignment <= (std::size_t{1} << 30),
                   invalid_argument, who, ": alignment must be a power of two up to 2^30, got ",
                   alignment);
}

Layout layout(const std::vector<std::size_t>& s, std::size_t alignment) {
  Layout L;
  L.R.resize(s.size() + 1);
  L.E.resize(s.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    MEGALITH_EXPECTS(s[i] <= kMax / 4 && at <= kMax / 4, invalid_argument,
                     "chunk capacity search: tensor sizes sum past the address space at tensor ",
                     i);
    L.R[i] = at;
    L.E[i] = at + s[i];
    at += align_up(s[i], alignment);
  }
  L.R[s.size()] = at;
  return L;
}

Greedy greedy(const Layout& L, std::size_t capacity) {
  Greedy g;
  const std::size_t n = L.E.size();
  std::size_t i = 0;
  while (i < n) {
    const std::size_t limit = L.R[i] > kMax - capacity ? kMax : L.R[i] + capacity;
    auto it = std::upper_bound(L.E.begin() + static_cast<std::ptrdiff_t>(i), L.E.end(), limit);
    const std::size_t j = static_cast<std::size_t>(it - L.E.begin()) - 1;  // >= i: s_i <= capacity
    g.widest = std::max(g.widest, L.E[j] - L.R[i]);
    ++g.chunks;
    i = j + 1;
  }
  return g;
}

std::size_t largest_index(const std::vector<std::size_t>& s) {
  return static_cast<std::size_t>(std::max_element(s.begin(), s.end()) - s.begin());
}

std::size_t times(std::size_t k, std::size_t c) { return c != 0 && k > kMax / c ? kMax : k * c; }

}  // namespace

std::size_t count_chunks(const std::vector<std::size_t>& tensor_bytes, std::size_t capacity,
                         std::size_t alignment) {
  check_alignment(alignment, "count_chunks");
  if (tensor_bytes.empty()) return 0;
  const std::size_t big = largest_index(tensor_bytes);
  MEGALITH_EXPECTS(tensor_bytes[big] <= capacity, invalid_argument, "count_chunks: tensor ", big,
                   " has ", format_bytes(tensor_bytes[big]), ", more than the capacity ",
                   format_bytes(capacity));
  return greedy(layout(tensor_bytes, alignment), capacity).chunks;
}

CapacityChoice search_chunk_capacity(const std::vector<std::size_t>& tensor_bytes,
                                     std::size_t min_capacity, std::size_t max_capacity,
                                     std::size_t alignment) {
  check_alignment(alignment, "search_chunk_capacity");
  MEGALITH_EXPECTS(min_capacity <= max_capacity, invalid_argument,
                   "search_chunk_capacity: min_capacity ", format_bytes(min_capacity),
                   " is above max_capacity ", format_bytes(max_capacity));
  std::size_t lo = std::max<std::size_t>(min_capacity, 1);
  if (tensor_bytes.empty()) return {lo, 0, 0};
  const std::size_t big = largest_index(tensor_bytes);
  MEGALITH_EXPECTS(tensor_bytes[big] <= max_capacity, invalid_argument,
                   "search_chunk_capacity: tensor ", big, " has ", format_bytes(tensor_bytes[big]),
                   " but max_capacity is ", format_bytes(max_capacity),
                   "; a tensor never spans chunks, so raise max_capacity to at least that");
  lo = std::max(lo, tensor_bytes[big]);
  const Layout L = layout(tensor_bytes, alignment);

  std::size_t best = kMax, best_c = 0, best_k = 0;
  std::size_t c = max_capacity;
  while (c >= lo) {
    const Greedy g = greedy(L, c);
    if (times(g.chunks, c) >= best) {
      c = (best - 1) / g.chunks;
      continue;
    }
    best_c = std::max(g.widest, lo);  // same partition at every capacity in [widest, c]
    best_k = g.chunks;
    best = times(best_k, best_c);
    c = best_c - 1;
  }
  std::size_t total = 0;
  for (std::size_t s : tensor_bytes) total += s;
  return {best_c, best - total, best_k};
}

}  // namespace megalith::memory
