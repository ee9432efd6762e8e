#pragma once
// Shared pieces of the multi-tensor kernels (optim_step.cu, grad_check.cu).
//
// [Note: multi-tensor launches]
// A step over a list of tensors is one kernel launch per group of up to
// kMaxTensorsPerLaunch tensors. The group's pointers and sizes travel in the
// kernel's parameter block (a __grid_constant__ struct of ~20 KB: CUDA 12.1+
// allows 32,764 bytes of parameters on Volta and newer), so no host-to-device
// copy and no device-side table are needed. Every tensor is cut into chunks of
// a fixed number of elements; block b works on one chunk, and finds its tensor
// by binary search in the group's inclusive prefix sum of chunk counts
// (block_end). The grid is therefore proportional to the total size, whatever
// the mix of tensor sizes, and consecutive blocks walk consecutive memory.
//
// A tensor takes the 16-byte vector path when every buffer it touches is
// aligned for 4-element vectors; chunks start at multiples of 4 elements, so
// that holds for each chunk. Otherwise (a sub-buffer at an odd offset) its
// chunks use scalar, still coalesced, accesses. Arithmetic is fp32 throughout.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "megalith/cuda/optim.h"
#include "megalith/dtype.h"
#include "megalith/error.h"

namespace megalith::optim::cuda::detail {

constexpr int kMaxTensors = static_cast<int>(kMaxTensorsPerLaunch);
/// gridDim.x limit; block_end is 32-bit.
constexpr std::uint64_t kMaxBlocksPerLaunch = 0x7fffffffu;
/// Kernel parameter limit from CUDA 12.1 on (Volta and newer).
constexpr std::size_t kMaxKernelParamBytes = 32764;

// ---------------------------------------------------------------- device side

/// Index of the tensor that block `block` works on: the first t with
/// block_end[t] > block. The search is uniform across the block, so each
/// probe is one broadcast read of the parameter bank.
__device__ __forceinline__ int find_tensor(const std::uint32_t* block_end, int count,
                                           std::uint32_t block) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (block_end[mid] > block) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

/// Loads the i-th group of 4 elements (16 bytes of fp32, 8 of 16-bit types).
__device__ __forceinline__ void load4(const float* base, int i, float (&out)[4]) {
  const float4 v = reinterpret_cast<const float4*>(base)[i];
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

template <typename Half2, typename Convert>
__device__ __forceinline__ void load4_16bit(const void* base, int i, float (&out)[4],
                                            Convert convert) {
  const uint2 raw = reinterpret_cast<const uint2*>(base)[i];
  Half2 lo, hi;
  std::memcpy(&lo, &raw.x, 4);
  std::memcpy(&hi, &raw.y, 4);
  const float2 a = convert(lo), b = convert(hi);
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

__device__ __forceinline__ void load4(const __nv_bfloat16* base, int i, float (&out)[4]) {
  load4_16bit<__nv_bfloat162>(base, i, out, [](__nv_bfloat162 v) { return __bfloat1622float2(v); });
}
__device__ __forceinline__ void load4(const __half* base, int i, float (&out)[4]) {
  load4_16bit<__half2>(base, i, out, [](__half2 v) { return __half22float2(v); });
}

/// Stores 4 values at the i-th group of 4 elements, rounding to nearest even.
__device__ __forceinline__ void store4(float* base, int i, const float (&in)[4]) {
  reinterpret_cast<float4*>(base)[i] = make_float4(in[0], in[1], in[2], in[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* base, int i, const float (&in)[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(in[0], in[1]);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(in[2], in[3]);
  uint2 raw;
  std::memcpy(&raw.x, &lo, 4);
  std::memcpy(&raw.y, &hi, 4);
  reinterpret_cast<uint2*>(base)[i] = raw;
}
__device__ __forceinline__ void store4(__half* base, int i, const float (&in)[4]) {
  const __half2 lo = __floats2half2_rn(in[0], in[1]);
  const __half2 hi = __floats2half2_rn(in[2], in[3]);
  uint2 raw;
  std::memcpy(&raw.x, &lo, 4);
  std::memcpy(&raw.y, &hi, 4);
  reinterpret_cast<uint2*>(base)[i] = raw;
}

// ------------------------------------------------------------------ host side

inline bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

/// Cuts `count` buffers into launch groups of at most kMaxTensors non-empty
/// buffers and kMaxBlocksPerLaunch blocks of `chunk` elements. For each
/// non-empty buffer i, calls add(k, i, block_end) with its index k in the
/// group and the group's inclusive block count so far; after each group,
/// launch(tensors, blocks). Empty buffers are skipped.
template <class NumelOf, class Add, class Launch>
void plan_groups(std::size_t count, std::int64_t chunk, NumelOf numel_of, Add add, Launch launch) {
  int tensors = 0;
  std::uint64_t blocks = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t numel = numel_of(i);
    if (numel <= 0) continue;
    const std::uint64_t b = (static_cast<std::uint64_t>(numel) + chunk - 1) / chunk;
    MEGALITH_EXPECTS(b <= kMaxBlocksPerLaunch, ::megalith::invalid_argument, "buffer ", i, " has ",
                     numel, " elements; one launch handles at most ",
                     kMaxBlocksPerLaunch * static_cast<std::uint64_t>(chunk));
    if (tensors == kMaxTensors || blocks + b > kMaxBlocksPerLaunch) {
      launch(tensors, blocks);
      tensors = 0;
      blocks = 0;
    }
    blocks += b;
    add(tensors, i, static_cast<std::uint32_t>(blocks));
    ++tensors;
  }
  if (tensors > 0) launch(tensors, blocks);
}

}  // namespace megalith::optim::cuda::detail
