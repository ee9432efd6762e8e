// Adam over lean state formats on the GPU: bf16 m and v with stochastic
// rounding, 8-bit block-quantised m and v, bf16 masters with a Kahan
// compensation ([Note: lean states] in megalith/optim/slots.h). The same rules
// and the same rounding stream as the host kernels (core/src/optim/), fp32 math
// in the host lean kernel's order.
//
// One pass per element: a q8 block of 256 elements is one thread block's turn,
// its new m and v stay in registers while the block's maxima are reduced, then
// become codes. One launch per slot (the lean formats are for host-resident
// states first; a multi-tensor launch can follow when GPU-resident lean states
// matter).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "../optim/rounding_stream.h"
#include "cuda_check.cuh"
#include "megalith/error.h"
#include "multi_tensor.cuh"
#include "optim_lean.cuh"
#include "step_scalars.cuh"

namespace megalith::optim::cuda::detail {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads == kQ8Block, "one thread per element of a q8 block");
constexpr int kStateF32 = 0, kStateBF16 = 1;
constexpr int kMasterF32 = 0, kMasterKahan = 1;

struct LeanParams {
  float* param;  // fp32, or bf16 bits with kMasterKahan
  const void* grad;
  void* s0;  // m: fp32, bf16, or int8 codes
  void* s1;  // v: fp32, bf16, or uint8 codes
  float* scale0;
  float* scale1;
  __nv_bfloat16* comp;
  void* copy;
  std::int64_t numel;
  std::uint32_t base;  // the slot's rounding stream
  Scalars s;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, inv_bc2_sqrt, eps, decay, l2;
};

// See [Note: stochastic rounding] in core/src/optim/cpu_simd_vec.h.
__device__ __forceinline__ __nv_bfloat16 bf16_sr(float x, std::uint32_t r16) {
  std::uint32_t u = __float_as_uint(x);
  std::uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? static_cast<std::uint16_t>((u >> 16) | 0x40u)
                                                    : static_cast<std::uint16_t>((u + r16) >> 16);
  return __ushort_as_bfloat16(h);
}

// The host lean kernel's operations in its order (AdamVec::update in
// cpu_lean_kernels.cpp), so that a moment which cancels to near zero rounds alike.
__device__ __forceinline__ float update(const LeanParams& P, float p, float g, float& m,
                                        float& v) {
  g = fmaf(p, P.l2, g);
  p *= P.decay;
  m = fmaf(g - m, P.one_minus_beta1, m);
  v = fmaf(g * g, P.one_minus_beta2, v * P.beta2);
  const float denom = fmaf(sqrtf(v), P.inv_bc2_sqrt, P.eps);
  return fmaf(m * (1.0f / denom), -P.step_size, p);
}

template <int M>
__device__ __forceinline__ float load_master(const LeanParams& P, std::int64_t i) {
  if constexpr (M == kMasterF32) {
    return P.param[i];
  } else {
    const __nv_bfloat16* hi = reinterpret_cast<const __nv_bfloat16*>(P.param);
    return __bfloat162float(hi[i]) + __bfloat162float(P.comp[i]);
  }
}

template <int M, typename C>
__device__ __forceinline__ void store_master(const LeanParams& P, std::int64_t i, float p) {
  if constexpr (M == kMasterF32) {
    P.param[i] = p;
  } else {
    const __nv_bfloat16 hi = __float2bfloat16_rn(p);
    reinterpret_cast<__nv_bfloat16*>(P.param)[i] = hi;
    P.comp[i] = __float2bfloat16_rn(p - __bfloat162float(hi));
  }
  if (P.copy != nullptr) static_cast<C*>(P.copy)[i] = from_float<C>(p);
}

/// fp32 or bf16 m and v, element by element (grid-stride).
template <typename G, typename C, int S, int M>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(const __grid_constant__ LeanParams P) {
  float scale;
  if (!effective_scale(P.s, scale)) return;
  const G* grad = static_cast<const G*>(P.grad);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kThreads;
  for (std::int64_t i = blockIdx.x * std::int64_t{kThreads} + threadIdx.x; i < P.numel; i += stride) {
    const float g = to_float(grad[i]) * scale;
    float m, v;
    if constexpr (S == kStateBF16) {
      m = __bfloat162float(static_cast<const __nv_bfloat16*>(P.s0)[i]);
      v = __bfloat162float(static_cast<const __nv_bfloat16*>(P.s1)[i]);
    } else {
      m = static_cast<const float*>(P.s0)[i];
      v = static_cast<const float*>(P.s1)[i];
    }
    const float p = update(P, load_master<M>(P, i), g, m, v);
    if constexpr (S == kStateBF16) {
      const std::uint32_t r = optim::detail::lowbias32(P.base + static_cast<std::uint32_t>(i));
      static_cast<__nv_bfloat16*>(P.s0)[i] = bf16_sr(m, r >> 16);
      static_cast<__nv_bfloat16*>(P.s1)[i] = bf16_sr(v, r & 0xffffu);
    } else {
      static_cast<float*>(P.s0)[i] = m;
      static_cast<float*>(P.s1)[i] = v;
    }
    store_master<M, C>(P, i, p);
  }
}

__device__ __forceinline__ float block_max(float x, float* shared) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  // Every lane, not only the first kThreads / 32 of each warp, needs the block's maximum
  // (each encodes its own element): lane l reads warp l % 8's maximum, and the xor steps
  // stay within groups of 8 lanes that each hold all 8.
  x = shared[lane % (kThreads / 32)];
  for (int o = kThreads / 64; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();  // shared is reused by the next reduction
  return x;
}

/// q8 m and v: thread t of a block handles element t of one q8 block at a time.
template <typename G, typename C, int M>
__global__ void __launch_bounds__(kThreads) q8_kernel(const __grid_constant__ LeanParams P) {
  __shared__ float shared[kThreads / 32];
  float scale;
  if (!effective_scale(P.s, scale)) return;
  const G* grad = static_cast<const G*>(P.grad);
  std::int8_t* mc = static_cast<std::int8_t*>(P.s0);
  std::uint8_t* vc = static_cast<std::uint8_t*>(P.s1);
  const std::int64_t blocks = q8_scale_count(P.numel);
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::int64_t i = b * kQ8Block + threadIdx.x;
    const bool in = i < P.numel;
    float m = 0.0f, v = 0.0f;
    if (in) {
      const float c = mc[i], q = vc[i];
      m = c * fabsf(c) * (P.scale0[b] * (1.0f / 16129.0f));
      const float u = q * q * (P.scale1[b] * (1.0f / 65025.0f));
      v = u * u;
      const float p = update(P, load_master<M>(P, i), to_float(grad[i]) * scale, m, v);
      store_master<M, C>(P, i, p);
    }
    const float a = block_max(fabsf(m), shared);
    const float u = sqrtf(block_max(v, shared));
    if (threadIdx.x == 0) {
      P.scale0[b] = a;
      P.scale1[b] = u;
    }
    if (in) {
      const float inv_a = a > 0.0f ? 1.0f / a : 0.0f;
      const float inv_u = u > 0.0f ? 1.0f / u : 0.0f;
      const float cm = fminf(rintf(sqrtf(fabsf(m) * inv_a) * 127.0f), 127.0f);
      const float cv = fminf(rintf(sqrtf(sqrtf(v) * inv_u) * 255.0f), 255.0f);
      mc[i] = static_cast<std::int8_t>(m < 0.0f ? -cm : cm);
      vc[i] = static_cast<std::uint8_t>(cv);
    }
  }
}

using KernelFn = void (*)(LeanParams);

template <typename G, typename C>
KernelFn pick_format(StateFormat sf, MasterFormat mf) {
  const bool kahan = mf == MasterFormat::bf16_kahan;
  switch (sf) {
    case StateFormat::q8:
      return kahan ? &q8_kernel<G, C, kMasterKahan> : &q8_kernel<G, C, kMasterF32>;
    case StateFormat::bf16:
      return kahan ? &elementwise_kernel<G, C, kStateBF16, kMasterKahan>
                   : &elementwise_kernel<G, C, kStateBF16, kMasterF32>;
    default:
      return &elementwise_kernel<G, C, kStateF32, kMasterKahan>;
  }
}

template <typename G>
KernelFn pick_copy(DType copy, StateFormat sf, MasterFormat mf) {
  switch (copy) {
    case DType::f32:
      return pick_format<G, float>(sf, mf);
    case DType::f16:
      return pick_format<G, __half>(sf, mf);
    default:
      return pick_format<G, __nv_bfloat16>(sf, mf);
  }
}

KernelFn pick(DType grad, DType copy, StateFormat sf, MasterFormat mf) {
  switch (grad) {
    case DType::bf16:
      return pick_copy<__nv_bfloat16>(copy, sf, mf);
    case DType::f16:
      return pick_copy<__half>(copy, sf, mf);
    default:
      return pick_copy<float>(copy, sf, mf);
  }
}

void check_lean_slot(const ParamSlots& s, std::size_t i, const StepArgs& args) {
  if (s.numel == 0) return;
  if (args.state_format == StateFormat::q8) {
    for (int k = 0; k < 2; ++k) {
      MEGALITH_EXPECTS(s.state_scale[k] != nullptr, invalid_argument, "Adam slot ", i, ": ",
                       k == 0 ? "exp_avg" : "exp_avg_sq", " scales (state_scale[", k,
                       "]) is null; state_format q8 needs ", q8_scale_count(s.numel),
                       " fp32 scales for ", s.numel, " elements");
    }
  }
  if (args.master_format == MasterFormat::bf16_kahan) {
    MEGALITH_EXPECTS(s.param_comp != nullptr, invalid_argument, "Adam slot ", i,
                     ": param_comp is null; master_format bf16_kahan needs the bf16 compensation "
                     "buffer beside the bf16 param");
  }
}

}  // namespace

void adam_lean_step(const ParamSlots* slots, std::size_t count, const AdamHyper& h,
                    const StepArgs& args, const DeviceScalars& dev, void* stream) {
  MEGALITH_EXPECTS(static_cast<int>(args.state_format) <= static_cast<int>(StateFormat::q8) &&
                       static_cast<int>(args.master_format) <=
                           static_cast<int>(MasterFormat::bf16_kahan),
                   invalid_argument, "Adam: state_format ", static_cast<int>(args.state_format),
                   " / master_format ", static_cast<int>(args.master_format),
                   " is not a StateFormat (0-2) / MasterFormat (0-1)");
  MEGALITH_EXPECTS(!h.amsgrad, invalid_argument,
                   "Adam: amsgrad needs fp32 states and masters; turn amsgrad off or use "
                   "StateFormat::f32 and MasterFormat::f32");
  for (std::size_t i = 0; i < count; ++i) check_lean_slot(slots[i], i, args);

  const double t = static_cast<double>(args.step);
  const double b1 = h.beta1, b2 = h.beta2, lr = h.lr;
  const double bc1 = h.bias_correction ? 1.0 - std::pow(b1, t) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(b2, t) : 1.0;
  const bool clip = dev.max_grad_norm > 0.0f;
  LeanParams P{};
  P.s.inv_scale = dev.inv_scale;
  P.s.found_inf = dev.found_inf;
  P.s.grad_sum_sq = clip ? dev.grad_sum_sq : nullptr;
  P.s.max_grad_norm = clip ? dev.max_grad_norm : 0.0f;
  P.s.grad_scale = h.maximize ? -args.grad_scale : args.grad_scale;
  P.beta1 = h.beta1;
  P.one_minus_beta1 = 1.0f - h.beta1;  // the host's constants, rounded as it rounds them
  P.beta2 = h.beta2;
  P.one_minus_beta2 = 1.0f - h.beta2;
  P.step_size = static_cast<float>(lr / bc1);
  P.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  P.eps = h.eps;
  P.decay = h.decoupled_weight_decay ? 1.0f - h.lr * h.weight_decay : 1.0f;
  P.l2 = h.decoupled_weight_decay ? 0.0f : h.weight_decay;

  const KernelFn kernel = pick(args.grad_dtype, args.copy_dtype, args.state_format, args.master_format);
  const std::uint32_t key = optim::detail::rounding_key(args.seed, args.step);
  for (std::size_t i = 0; i < count; ++i) {
    const ParamSlots& s = slots[i];
    if (s.numel == 0) continue;
    P.param = s.param;
    P.grad = s.grad;
    P.s0 = s.state[0];
    P.s1 = s.state[1];
    P.scale0 = s.state_scale[0];
    P.scale1 = s.state_scale[1];
    P.comp = static_cast<__nv_bfloat16*>(s.param_comp);
    P.copy = s.param_copy;
    P.numel = s.numel;
    P.base = optim::detail::slot_stream(key, static_cast<std::uint32_t>(i));
    const std::int64_t blocks = q8_scale_count(s.numel);
    const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
    kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(P);
    MEGALITH_CUDA_CHECK_LAUNCH(::megalith::detail::concat(
        "Adam lean step kernel (state_format ", static_cast<int>(args.state_format),
        ", master_format ", static_cast<int>(args.master_format), ", slot ", i, ", ", s.numel,
        " elements)"));
  }
}

}  // namespace megalith::optim::cuda::detail
