// One fused pass over gradient buffers: optional in-place unscale, an inf/nan
// flag, and the sum of squares of the unscaled values (the input to global
// norm clipping), with no host synchronisation. Multi-tensor like the steps
// (see [Note: multi-tensor launches] in multi_tensor.cuh).
//
// "Unscaled" means g * *inv_scale whenever inv_scale is given, whether or not
// the result is written back: the sum of squares is always that of the
// gradients the optimizer will see (DeviceScalars::grad_sum_sq).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_check.cuh"
#include "megalith/cuda/optim.h"
#include "megalith/error.h"
#include "multi_tensor.cuh"

namespace megalith::optim::cuda {

namespace {

using detail::find_tensor;
using detail::kMaxTensors;
using detail::load4;
using detail::store4;
using detail::to_float;

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte (f32) or 8-byte (16-bit) loads in flight per thread
constexpr int kScalarUnroll = 8;
// Elements per block: 8 passes of the vector loop. Larger than the step's
// chunk to keep the number of atomicAdds on *sum_sq (one per block) low.
constexpr std::int64_t kChunk = 32768;
static_assert(kChunk % (4 * kThreads * kUnroll) == 0, "a chunk is whole vector passes");

struct CheckParams {
  void* grad[kMaxTensors];
  std::int64_t numel[kMaxTensors];
  std::uint32_t block_end[kMaxTensors];
  std::uint8_t vec[kMaxTensors];
  int count;
  const float* inv_scale;  // nullptr: 1
  float* found_inf;
  float* sum_sq;    // nullptr: not wanted
  bool write_back;  // unscale in place (only when inv_scale is given)
};
static_assert(sizeof(CheckParams) <= detail::kMaxKernelParamBytes,
              "the launch parameter block must fit CUDA's 32,764-byte limit");

__device__ __forceinline__ bool finite(float x) { return fabsf(x) <= 3.402823466e38f; }

template <typename G>
__global__ void __launch_bounds__(kThreads)
    grad_check_kernel(const __grid_constant__ CheckParams P) {
  const float inv = P.inv_scale != nullptr ? *P.inv_scale : 1.0f;
  const int t = find_tensor(P.block_end, P.count, blockIdx.x);
  const std::uint32_t first = t > 0 ? P.block_end[t - 1] : 0u;
  const std::int64_t start = static_cast<std::int64_t>(blockIdx.x - first) * kChunk;
  const std::int64_t left = P.numel[t] - start;
  const int n = static_cast<int>(left < kChunk ? left : kChunk);
  G* g = static_cast<G*>(P.grad[t]) + start;
  const bool write = P.write_back;

  float acc = 0.0f;
  bool bad = false;
  if (P.vec[t]) {
    const int nv = n >> 2;
    for (int base = threadIdx.x; base < nv; base += kThreads * kUnroll) {
      float x[kUnroll][4];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < nv) load4(g, i, x[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < nv) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            x[u][e] *= inv;
            bad |= !finite(x[u][e]);
            acc = fmaf(x[u][e], x[u][e], acc);
          }
          if (write) store4(g, i, x[u]);
        }
      }
    }
    const int i = (nv << 2) + static_cast<int>(threadIdx.x);
    if (i < n) {
      const float x = to_float(g[i]) * inv;
      bad |= !finite(x);
      acc = fmaf(x, x, acc);
      if (write) g[i] = detail::from_float<G>(x);
    }
  } else {
    for (int base = threadIdx.x; base < n; base += kThreads * kScalarUnroll) {
      float x[kScalarUnroll];
#pragma unroll
      for (int u = 0; u < kScalarUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < n) x[u] = to_float(g[i]);
      }
#pragma unroll
      for (int u = 0; u < kScalarUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < n) {
          x[u] *= inv;
          bad |= !finite(x[u]);
          acc = fmaf(x[u], x[u], acc);
          if (write) g[i] = detail::from_float<G>(x[u]);
        }
      }
    }
  }

  // Block reduction: warp shuffles, then one value per warp through shared memory.
  __shared__ float warp_sums[kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = acc;
  const int any_bad = __syncthreads_or(bad ? 1 : 0);  // also orders the warp_sums writes
  if (threadIdx.x == 0) {
    if (P.sum_sq != nullptr) {
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
      atomicAdd(P.sum_sq, total);
    }
    if (any_bad) *P.found_inf = 1.0f;
  }
}

using CheckFn = void (*)(CheckParams);

CheckFn pick_kernel(DType grad) {
  switch (grad) {
    case DType::f32:
      return &grad_check_kernel<float>;
    case DType::bf16:
      return &grad_check_kernel<__nv_bfloat16>;
    case DType::f16:
      return &grad_check_kernel<__half>;
    default:
      break;
  }
  MEGALITH_FAIL(type_error, "grad_check: dtype ", dtype_name(grad),
                " is not supported: expected float32, bfloat16 or float16");
}

}  // namespace

void grad_check(void* const* grads, const std::int64_t* numels, std::size_t count, DType grad_dtype,
                const float* inv_scale, bool unscale_in_place, float* found_inf, float* sum_sq,
                void* stream) {
  MEGALITH_EXPECTS(count == 0 || (grads != nullptr && numels != nullptr), invalid_argument,
                   "grad_check: grads or numels is null but count is ", count);
  MEGALITH_EXPECTS(found_inf != nullptr, invalid_argument,
                   "grad_check: found_inf is null; pass a zeroed device float to receive the "
                   "inf/nan flag");
  for (std::size_t i = 0; i < count; ++i) {
    MEGALITH_EXPECTS(numels[i] >= 0, invalid_argument, "grad_check: numel of buffer ", i, " is ",
                     numels[i], "; expected >= 0");
    MEGALITH_EXPECTS(numels[i] == 0 || grads[i] != nullptr, invalid_argument, "grad_check: buffer ",
                     i, " is null");
  }
  const CheckFn kernel = pick_kernel(grad_dtype);
  const std::size_t gsize = dtype_size(grad_dtype);

  CheckParams P{};
  P.inv_scale = inv_scale;
  P.found_inf = found_inf;
  P.sum_sq = sum_sq;
  P.write_back = unscale_in_place && inv_scale != nullptr;
  detail::plan_groups(
      count, kChunk, [&](std::size_t i) { return numels[i]; },
      [&](int k, std::size_t i, std::uint32_t block_end) {
        P.grad[k] = grads[i];
        P.numel[k] = numels[i];
        P.block_end[k] = block_end;
        P.vec[k] = detail::aligned(grads[i], 4 * gsize) ? 1 : 0;
      },
      [&](int tensors, std::uint64_t blocks) {
        P.count = tensors;
        kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            P);
        MEGALITH_CUDA_CHECK_LAUNCH(::megalith::detail::concat("grad_check kernel (",
                                                              dtype_name(grad_dtype), ", ", tensors,
                                                              " tensors, ", blocks, " blocks)"));
      });
}

}  // namespace megalith::optim::cuda
