// Fused Adam/AdamW, SGD and Lion steps on GPU memory, with torch.optim's
// semantics: one launch per group of tensors (see [Note: multi-tensor
// launches] in multi_tensor.cuh), fp32 math, optional bf16/f16/f32 copy of the
// updated parameter written in the same pass.
//
// The effective gradient is g * grad_scale * (*inv_scale) * clip, with the
// sign flipped for maximize (torch negates the gradient before anything else,
// so the flip folds into the scale). Hyper-parameter algebra that depends on
// the step number (bias corrections, decay factors) is done once on the host
// in double and passed as fp32 constants.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "cuda_check.cuh"
#include "megalith/cuda/optim.h"
#include "megalith/error.h"
#include "multi_tensor.cuh"
#include "optim_lean.cuh"
#include "step_scalars.cuh"

namespace megalith::optim::cuda {

namespace {

using detail::effective_scale;
using detail::find_tensor;
using detail::Scalars;
using detail::kMaxTensors;
using detail::load4;
using detail::store4;
using detail::to_float;

// Launch shape. 256 threads, at least 4 blocks per SM (<= 64 registers), each
// thread keeping kUnroll 16-byte loads of every buffer in flight: about 128 KB
// of reads outstanding per SM, several times what HBM3e latency needs.
constexpr int kThreads = 256;
constexpr int kMinBlocksPerSm = 4;
constexpr int kUnroll = 2;
constexpr int kScalarUnroll = 4;
// Elements per block: 8 passes of the vector loop. Small enough that the
// last wave is short (1e9 params are ~61k blocks, ~115 waves on an H200),
// large enough that a block amortises its setup (scalar loads, tensor search).
constexpr std::int64_t kChunk = 16384;
static_assert(kChunk % (4 * kThreads * kUnroll) == 0, "a chunk is whole vector passes");

/// The group of tensors of one launch. Unused state arrays hold nullptr.
struct Tensors {
  float* param[kMaxTensors];
  const void* grad[kMaxTensors];
  float* state[3][kMaxTensors];
  void* copy[kMaxTensors];
  std::int64_t numel[kMaxTensors];
  std::uint32_t block_end[kMaxTensors];  // inclusive prefix sum of chunk counts
  std::uint8_t vec[kMaxTensors];         // 1: all buffers aligned for 4-wide access
  int count;
};

// ------------------------------------------------------------- the updates
// Each op updates one element: p in place, g the effective gradient, s the
// element's optimizer state (Op::kStates values; one dummy when none).

template <bool kAmsgrad>
struct AdamOp {
  static constexpr int kStates = kAmsgrad ? 3 : 2;
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;  // lr / bias_correction1
  float bc2_sqrt;   // sqrt(bias_correction2)
  float eps;
  float decay;  // 1 - lr*wd for AdamW, else 1
  float l2;     // wd for Adam's L2 form, else 0

  __device__ __forceinline__ void operator()(float& p, float g, float (&s)[kStates]) const {
    g = fmaf(l2, p, g);
    p *= decay;
    const float m = fmaf(beta1, s[0], one_minus_beta1 * g);
    const float v = fmaf(beta2, s[1], one_minus_beta2 * g * g);
    s[0] = m;
    s[1] = v;
    float vhat = v;
    if constexpr (kAmsgrad) {
      vhat = s[2] > v ? s[2] : v;  // torch.maximum: a nan in v propagates
      s[2] = vhat;
    }
    const float denom = sqrtf(vhat) / bc2_sqrt + eps;
    p = fmaf(-step_size, m / denom, p);
  }
};

template <bool kMomentum>
struct SgdOp {
  static constexpr int kStates = kMomentum ? 1 : 0;
  float lr, weight_decay, momentum, one_minus_dampening;
  bool nesterov;
  bool first_step;  // the momentum buffer starts as the (decayed) gradient

  __device__ __forceinline__ void operator()(float& p, float g, float (&s)[1]) const {
    g = fmaf(weight_decay, p, g);
    if constexpr (kMomentum) {
      const float buf = first_step ? g : fmaf(momentum, s[0], one_minus_dampening * g);
      s[0] = buf;
      g = nesterov ? fmaf(momentum, buf, g) : buf;
    }
    p = fmaf(-lr, g, p);
  }
};

struct LionOp {
  static constexpr int kStates = 1;
  float lr, beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay;  // 1 - lr*wd

  __device__ __forceinline__ void operator()(float& p, float g, float (&s)[1]) const {
    p *= decay;
    const float c = fmaf(beta1, s[0], one_minus_beta1 * g);
    // sign(c), with sign(+-0) = 0 and nan propagating like torch.sign.
    const float sign_c = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : c * 0.0f);
    p = fmaf(-lr, sign_c, p);
    s[0] = fmaf(beta2, s[0], one_minus_beta2 * g);
  }
};

template <class Op>
struct StepParams {
  Tensors t;
  Scalars s;
  Op op;
};
static_assert(sizeof(StepParams<AdamOp<true>>) <= detail::kMaxKernelParamBytes,
              "the launch parameter block must fit CUDA's 32,764-byte limit");
static_assert(sizeof(StepParams<SgdOp<true>>) <= detail::kMaxKernelParamBytes, "");
static_assert(sizeof(StepParams<LionOp>) <= detail::kMaxKernelParamBytes, "");

// -------------------------------------------------------------- the kernel

template <class Op, typename C>
__device__ __forceinline__ void update_one(const Op& op, float* p, float g, float* const* st,
                                           C* copy, int i) {
  constexpr int kS = Op::kStates;
  float s[kS > 0 ? kS : 1];
#pragma unroll
  for (int k = 0; k < kS; ++k) s[k] = st[k][i];
  float x = p[i];
  op(x, g, s);
  p[i] = x;
#pragma unroll
  for (int k = 0; k < kS; ++k) st[k][i] = s[k];
  if (copy != nullptr) copy[i] = detail::from_float<C>(x);
}

template <class Op, typename G, typename C>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    step_kernel(const __grid_constant__ StepParams<Op> P) {
  constexpr int kS = Op::kStates;
  constexpr int kSA = kS > 0 ? kS : 1;
  float scale;
  if (!effective_scale(P.s, scale)) return;

  const int t = find_tensor(P.t.block_end, P.t.count, blockIdx.x);
  const std::uint32_t first = t > 0 ? P.t.block_end[t - 1] : 0u;
  const std::int64_t start = static_cast<std::int64_t>(blockIdx.x - first) * kChunk;
  const std::int64_t left = P.t.numel[t] - start;
  const int n = static_cast<int>(left < kChunk ? left : kChunk);

  float* p = P.t.param[t] + start;
  const G* g = static_cast<const G*>(P.t.grad[t]) + start;
  float* st[kSA];
#pragma unroll
  for (int k = 0; k < kSA; ++k) st[k] = k < kS ? P.t.state[k][t] + start : nullptr;
  C* copy = P.t.copy[t] != nullptr ? static_cast<C*>(P.t.copy[t]) + start : nullptr;
  const Op& op = P.op;

  if (P.t.vec[t]) {
    const int nv = n >> 2;  // whole 4-element groups
    for (int base = threadIdx.x; base < nv; base += kThreads * kUnroll) {
      float pr[kUnroll][4], gr[kUnroll][4], sr[kSA][kUnroll][4];
      // All loads of the pass first, so they are in flight together.
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < nv) {
          load4(p, i, pr[u]);
          load4(g, i, gr[u]);
#pragma unroll
          for (int k = 0; k < kS; ++k) load4(st[k], i, sr[k][u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < nv) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float s[kSA];
#pragma unroll
            for (int k = 0; k < kS; ++k) s[k] = sr[k][u][e];
            op(pr[u][e], gr[u][e] * scale, s);
#pragma unroll
            for (int k = 0; k < kS; ++k) sr[k][u][e] = s[k];
          }
          store4(p, i, pr[u]);
#pragma unroll
          for (int k = 0; k < kS; ++k) store4(st[k], i, sr[k][u]);
          if (copy != nullptr) store4(copy, i, pr[u]);
        }
      }
    }
    const int i = (nv << 2) + static_cast<int>(threadIdx.x);  // the last n % 4 elements
    if (i < n) update_one(op, p, to_float(g[i]) * scale, st, copy, i);
  } else {
    // Misaligned buffers: scalar accesses, kScalarUnroll elements in flight per thread.
    for (int base = threadIdx.x; base < n; base += kThreads * kScalarUnroll) {
      float pr[kScalarUnroll], gr[kScalarUnroll], sr[kSA][kScalarUnroll];
#pragma unroll
      for (int u = 0; u < kScalarUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < n) {
          pr[u] = p[i];
          gr[u] = to_float(g[i]);
#pragma unroll
          for (int k = 0; k < kS; ++k) sr[k][u] = st[k][i];
        }
      }
#pragma unroll
      for (int u = 0; u < kScalarUnroll; ++u) {
        const int i = base + u * kThreads;
        if (i < n) {
          float s[kSA];
#pragma unroll
          for (int k = 0; k < kS; ++k) s[k] = sr[k][u];
          op(pr[u], gr[u] * scale, s);
          p[i] = pr[u];
#pragma unroll
          for (int k = 0; k < kS; ++k) st[k][i] = s[k];
          if (copy != nullptr) copy[i] = detail::from_float<C>(pr[u]);
        }
      }
    }
  }
}

// ------------------------------------------------------------------ host side

template <class Op>
using KernelFn = void (*)(StepParams<Op>);

template <class Op, typename G>
KernelFn<Op> pick_copy(DType copy) {
  switch (copy) {
    case DType::f32:
      return &step_kernel<Op, G, float>;
    case DType::bf16:
      return &step_kernel<Op, G, __nv_bfloat16>;
    case DType::f16:
      return &step_kernel<Op, G, __half>;
    default:
      break;
  }
  MEGALITH_FAIL(type_error, "param copy dtype ", dtype_name(copy),
                " is not supported: expected float32, bfloat16 or float16");
}

template <class Op>
KernelFn<Op> pick_kernel(DType grad, DType copy) {
  switch (grad) {
    case DType::f32:
      return pick_copy<Op, float>(copy);
    case DType::bf16:
      return pick_copy<Op, __nv_bfloat16>(copy);
    case DType::f16:
      return pick_copy<Op, __half>(copy);
    default:
      break;
  }
  MEGALITH_FAIL(type_error, "grad dtype ", dtype_name(grad),
                " is not supported: expected float32, bfloat16 or float16");
}

void check_common(const char* optimizer, const ParamSlots* slots, std::size_t count,
                  const StepArgs& args, const DeviceScalars& dev) {
  MEGALITH_EXPECTS(count == 0 || slots != nullptr, invalid_argument, optimizer,
                   ": slots is null but count is ", count);
  MEGALITH_EXPECTS(is_optimizer_float(args.grad_dtype), type_error, optimizer, ": grad dtype ",
                   dtype_name(args.grad_dtype),
                   " is not supported: expected float32, bfloat16 or float16");
  MEGALITH_EXPECTS(is_optimizer_float(args.copy_dtype), type_error, optimizer,
                   ": param copy dtype ", dtype_name(args.copy_dtype),
                   " is not supported: expected float32, bfloat16 or float16");
  MEGALITH_EXPECTS(args.nonfinite == NonFinite::ignore, invalid_argument, optimizer,
                   ": StepArgs::nonfinite must be ignore for the CUDA step (a host-side check "
                   "would need a device sync); run grad_check() first and pass its flag as "
                   "DeviceScalars::found_inf to skip the step on inf/nan gradients");
  MEGALITH_EXPECTS(args.step >= 1, invalid_argument, optimizer, ": step is ", args.step,
                   "; expected the 1-based number of this update");
  MEGALITH_EXPECTS(args.state_format == StateFormat::f32 && args.master_format == MasterFormat::f32,
                   invalid_argument, optimizer,
                   ": lean state or master formats are for Adam only; pass StateFormat::f32 and "
                   "MasterFormat::f32");
  MEGALITH_EXPECTS(!(dev.max_grad_norm > 0.0f) || dev.grad_sum_sq != nullptr, invalid_argument,
                   optimizer, ": DeviceScalars::max_grad_norm is ", dev.max_grad_norm,
                   " but grad_sum_sq is null; pass the sum of squares from grad_check() or "
                   "set max_grad_norm to 0 to turn clipping off");
}

void check_slot(const char* optimizer, const ParamSlots& s, std::size_t i, int states_needed,
                const char* const* state_names) {
  MEGALITH_EXPECTS(s.numel >= 0, invalid_argument, optimizer, " slot ", i, ": numel is ", s.numel,
                   "; expected >= 0");
  if (s.numel == 0) return;  // nothing is read or written
  MEGALITH_EXPECTS(s.param != nullptr, invalid_argument, optimizer, " slot ", i, ": param is null");
  MEGALITH_EXPECTS(s.grad != nullptr, invalid_argument, optimizer, " slot ", i, ": grad is null");
  for (int k = 0; k < states_needed; ++k) {
    MEGALITH_EXPECTS(s.state[k] != nullptr, invalid_argument, optimizer, " slot ", i, ": ",
                     state_names[k], " (state[", k, "]) is null; ", optimizer, " needs it");
  }
}

template <class Op>
void launch_step(const char* name, const ParamSlots* slots, std::size_t count, const StepArgs& args,
                 const DeviceScalars& dev, bool maximize, const Op& op, void* stream) {
  const KernelFn<Op> kernel = pick_kernel<Op>(args.grad_dtype, args.copy_dtype);
  const std::size_t gsize = dtype_size(args.grad_dtype);
  const std::size_t csize = dtype_size(args.copy_dtype);
  const bool clip = dev.max_grad_norm > 0.0f;

  // ~20 KB: the whole parameter block is copied at each launch.
  StepParams<Op> P{};
  P.s.inv_scale = dev.inv_scale;
  P.s.found_inf = dev.found_inf;
  P.s.grad_sum_sq = clip ? dev.grad_sum_sq : nullptr;
  P.s.max_grad_norm = clip ? dev.max_grad_norm : 0.0f;
  P.s.grad_scale = maximize ? -args.grad_scale : args.grad_scale;
  P.op = op;

  detail::plan_groups(
      count, kChunk, [&](std::size_t i) { return slots[i].numel; },
      [&](int k, std::size_t i, std::uint32_t block_end) {
        const ParamSlots& s = slots[i];
        bool vec = detail::aligned(s.param, 16) && detail::aligned(s.grad, 4 * gsize);
        P.t.param[k] = s.param;
        P.t.grad[k] = s.grad;
        for (int j = 0; j < 3; ++j) {
          P.t.state[j][k] = j < Op::kStates ? s.state[j] : nullptr;
          if (j < Op::kStates) vec = vec && detail::aligned(s.state[j], 16);
        }
        P.t.copy[k] = s.param_copy;
        if (s.param_copy != nullptr) vec = vec && detail::aligned(s.param_copy, 4 * csize);
        P.t.numel[k] = s.numel;
        P.t.block_end[k] = block_end;
        P.t.vec[k] = vec ? 1 : 0;
      },
      [&](int tensors, std::uint64_t blocks) {
        P.t.count = tensors;
        kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            P);
        MEGALITH_CUDA_CHECK_LAUNCH(::megalith::detail::concat(
            name, " step kernel (grad ", dtype_name(args.grad_dtype), ", copy ",
            dtype_name(args.copy_dtype), ", ", tensors, " tensors, ", blocks, " blocks)"));
      });
}

}  // namespace

void adam_step(const ParamSlots* slots, std::size_t count, const AdamHyper& h, const StepArgs& args,
               const DeviceScalars& dev, void* stream) {
  static const char* const names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  if (args.state_format != StateFormat::f32 || args.master_format != MasterFormat::f32) {
    StepArgs plain = args;  // the checks every step shares; the lean ones follow
    plain.state_format = StateFormat::f32;
    plain.master_format = MasterFormat::f32;
    check_common("Adam", slots, count, plain, dev);
    for (std::size_t i = 0; i < count; ++i) check_slot("Adam", slots[i], i, 2, names);
    detail::adam_lean_step(slots, count, h, args, dev, stream);
    return;
  }
  check_common("Adam", slots, count, args, dev);
  for (std::size_t i = 0; i < count; ++i) check_slot("Adam", slots[i], i, h.amsgrad ? 3 : 2, names);

  const double t = static_cast<double>(args.step);
  const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, wd = h.weight_decay;
  const double bc1 = h.bias_correction ? 1.0 - std::pow(b1, t) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(b2, t) : 1.0;
  auto fill = [&](auto& op) {
    op.beta1 = h.beta1;
    op.one_minus_beta1 = static_cast<float>(1.0 - b1);
    op.beta2 = h.beta2;
    op.one_minus_beta2 = static_cast<float>(1.0 - b2);
    op.step_size = static_cast<float>(lr / bc1);
    op.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    op.eps = h.eps;
    op.decay = h.decoupled_weight_decay ? static_cast<float>(1.0 - lr * wd) : 1.0f;
    op.l2 = h.decoupled_weight_decay ? 0.0f : h.weight_decay;
  };
  if (h.amsgrad) {
    AdamOp<true> op{};
    fill(op);
    launch_step("Adam", slots, count, args, dev, h.maximize, op, stream);
  } else {
    AdamOp<false> op{};
    fill(op);
    launch_step("Adam", slots, count, args, dev, h.maximize, op, stream);
  }
}

void sgd_step(const ParamSlots* slots, std::size_t count, const SgdHyper& h, const StepArgs& args,
              const DeviceScalars& dev, void* stream) {
  static const char* const names[] = {"momentum_buffer"};
  check_common("SGD", slots, count, args, dev);
  MEGALITH_EXPECTS(!h.nesterov || (h.momentum > 0 && h.dampening == 0), invalid_argument,
                   "SGD: nesterov momentum requires momentum > 0 and dampening == 0 (got momentum ",
                   h.momentum, ", dampening ", h.dampening, ")");
  const bool has_momentum = h.momentum != 0.0f;
  for (std::size_t i = 0; i < count; ++i) {
    check_slot("SGD", slots[i], i, has_momentum ? 1 : 0, names);
  }
  auto fill = [&](auto& op) {
    op.lr = h.lr;
    op.weight_decay = h.weight_decay;
    op.momentum = h.momentum;
    op.one_minus_dampening = static_cast<float>(1.0 - static_cast<double>(h.dampening));
    op.nesterov = h.nesterov;
    op.first_step = args.step == 1;
  };
  if (has_momentum) {
    SgdOp<true> op{};
    fill(op);
    launch_step("SGD", slots, count, args, dev, h.maximize, op, stream);
  } else {
    SgdOp<false> op{};
    fill(op);
    launch_step("SGD", slots, count, args, dev, h.maximize, op, stream);
  }
}

void lion_step(const ParamSlots* slots, std::size_t count, const LionHyper& h, const StepArgs& args,
               const DeviceScalars& dev, void* stream) {
  static const char* const names[] = {"exp_avg"};
  check_common("Lion", slots, count, args, dev);
  for (std::size_t i = 0; i < count; ++i) check_slot("Lion", slots[i], i, 1, names);
  const double b1 = h.beta1, b2 = h.beta2;
  LionOp op{};
  op.lr = h.lr;
  op.beta1 = h.beta1;
  op.one_minus_beta1 = static_cast<float>(1.0 - b1);
  op.beta2 = h.beta2;
  op.one_minus_beta2 = static_cast<float>(1.0 - b2);
  op.decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  launch_step("Lion", slots, count, args, dev, h.maximize, op, stream);
}

}  // namespace megalith::optim::cuda
