#pragma once
// The stochastic-rounding stream of lean bf16 states, shared by the host step
// (cpu_step.cpp) and the CUDA step (cuda/optim_lean.cu) so both draw the same
// bits: element i of slot s at step t rounds with
//     base = lowbias32(rounding_key(seed, t) ^ (s * 0x9e3779b9))
//     r    = lowbias32(base + i)      (high 16 bits for m, low 16 for v)
// (see [Note: stochastic rounding] in cpu_simd_vec.h). Compiled with the
// library's ordinary flags: never include it in a per-SIMD-level source.
// lowbias32 and slot_stream are host+device functions under nvcc.

#include <cstdint>

#ifdef __CUDACC__
#define MEGALITH_ROUNDING_FN __host__ __device__ __forceinline__
#else
#define MEGALITH_ROUNDING_FN inline
#endif

namespace megalith::optim::detail {

/// splitmix64 of seed + step * golden ratio, folded to 32 bits.
inline std::uint32_t rounding_key(std::uint64_t seed, std::int64_t step) {
  std::uint64_t z = seed + static_cast<std::uint64_t>(step) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<std::uint32_t>(z ^ (z >> 32));
}

MEGALITH_ROUNDING_FN std::uint32_t lowbias32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/// The base of slot `slot`'s stream in a step with this key.
MEGALITH_ROUNDING_FN std::uint32_t slot_stream(std::uint32_t key, std::uint32_t slot) {
  return lowbias32(key ^ (slot * 0x9e3779b9u));
}

}  // namespace megalith::optim::detail
