// Host optimizer steps: validate the slots, derive the per-step constants,
// split the concatenated element range evenly over the engine's threads, and
// run the active SIMD level's kernel on each piece.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu_kernel_table.h"
#include "cpu_schedule.h"
#include "rounding_stream.h"
#include "megalith/config.h"
#include "megalith/cpu/simd_level.h"
#include "megalith/cpu/thread_pool.h"
#include "megalith/error.h"
#include "megalith/optim/cpu.h"

namespace megalith::optim::cpu {
namespace {

using detail::KernelTable;
using detail::LeanKernelTable;
using detail::Range;
using detail::Schedule;

// Below this many elements per thread, waking another thread costs more than it saves.
constexpr std::int64_t kMinPerThread = 1 << 15;
// Thread boundaries fall on multiples of this (a cache line of fp32 and of bf16).
constexpr std::int64_t kAlign = 64;

const KernelTable& kernels() {
  switch (megalith::cpu::active_simd_level()) {
#if MEGALITH_SIMD_HAS_AVX512
    case megalith::cpu::SimdLevel::avx512:
      return detail::avx512::kKernels;
#endif
#if MEGALITH_SIMD_HAS_AVX2
    case megalith::cpu::SimdLevel::avx2:
      return detail::avx2::kKernels;
#endif
    default:
      return detail::scalar::kKernels;
  }
}

const LeanKernelTable& lean_kernels() {
  switch (megalith::cpu::active_simd_level()) {
#if MEGALITH_SIMD_HAS_AVX512
    case megalith::cpu::SimdLevel::avx512:
      return detail::avx512::kLeanKernels;
#endif
#if MEGALITH_SIMD_HAS_AVX2
    case megalith::cpu::SimdLevel::avx2:
      return detail::avx2::kLeanKernels;
#endif
    default:
      return detail::scalar::kLeanKernels;
  }
}

void check_slot(const ParamSlots& s, std::size_t i, const char* optimizer, int states_needed,
                const char* const* state_names) {
  MEGALITH_EXPECTS(s.numel >= 0, invalid_argument, optimizer, " slot ", i, ": numel is ", s.numel,
                   "; expected >= 0");
  if (s.numel == 0) return;
  MEGALITH_EXPECTS(s.param != nullptr, invalid_argument, optimizer, " slot ", i, ": param is null");
  MEGALITH_EXPECTS(s.grad != nullptr, invalid_argument, optimizer, " slot ", i, ": grad is null");
  for (int k = 0; k < states_needed; ++k) {
    MEGALITH_EXPECTS(s.state[k] != nullptr, invalid_argument, optimizer, " slot ", i, ": ",
                     state_names[k], " (state[", k, "]) is null; ", optimizer, " needs it");
  }
}

// Schedule::interleaved walks chunks t, t + T, t + 2T, ... of kChunk elements per
// task instead of one contiguous 1/T of the range; which is faster is measured at
// first use (see [Note: schedule by measurement] in cpu_schedule.cpp).
constexpr std::int64_t kChunk = 1 << 16;

// Calls kernel(range, task) on the part of every slot inside [lo, hi).
template <class Kernel>
bool visit(const ParamSlots* slots, std::size_t count, const std::vector<std::int64_t>& offsets,
           std::int64_t lo, std::int64_t hi, int task, Kernel& kernel) {
  // first slot whose range ends after lo
  std::size_t s = std::upper_bound(offsets.begin(), offsets.end(), lo) - offsets.begin() - 1;
  bool bad = false;
  for (; s < count && offsets[s] < hi; ++s) {
    const ParamSlots& slot = slots[s];
    std::int64_t b = std::max(lo, offsets[s]) - offsets[s];
    std::int64_t e = std::min({hi - offsets[s], offsets[s + 1] - offsets[s], slot.numel});
    if (b >= e) continue;  // empty, or only the slot's padding (see for_each_range)
    Range r{slot.param, slot.grad, slot.state[0], slot.state[1], slot.state[2], slot.param_copy, b, e};
    r.scale0 = slot.state_scale[0];
    r.scale1 = slot.state_scale[1];
    r.comp = slot.param_comp;
    r.slot = static_cast<std::uint32_t>(s);
    bad |= kernel(r, task);
  }
  return bad;
}

// Runs `kernel(range, task) -> bool` over all slots, spread over the threads as
// `schedule` splits them (nullptr: measured or chosen by step_schedule, for the
// elementwise step kernels). Returns true when any call returned true.
// With block > 1 every range starts on a multiple of `block` within its slot
// (q8 states): each slot is padded to whole blocks in the split and the piece
// boundaries are multiples of the block.
template <class Kernel>
bool for_each_range(const ParamSlots* slots, std::size_t count, Kernel&& kernel,
                    std::int64_t block = 1, const Schedule* schedule = nullptr) {
  std::vector<std::int64_t> offsets(count + 1, 0);
  for (std::size_t i = 0; i < count; ++i) {
    offsets[i + 1] = offsets[i] + (slots[i].numel + block - 1) / block * block;
  }
  const std::int64_t total = offsets[count];
  if (total == 0) return false;

  std::int64_t by_size = std::max<std::int64_t>(1, total / kMinPerThread);
  int tasks = static_cast<int>(std::min<std::int64_t>(megalith::cpu::num_threads(), by_size));
  bool timed = false;
  const Schedule chosen = schedule ? *schedule : detail::step_schedule(total, tasks, &timed);
  const bool interleaved = chosen == Schedule::interleaved;
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t align = std::max(kAlign, block);
  static_assert(kChunk % optim::kQ8Block == 0, "interleaved chunks are whole q8 blocks");
  std::int64_t per_task = (total + tasks - 1) / tasks;
  per_task = (per_task + align - 1) / align * align;

  std::atomic<bool> found{false};
  megalith::cpu::parallel_for(tasks, [&](int t) {
    bool bad = false;
    if (interleaved) {
      for (std::int64_t lo = t * kChunk; lo < total; lo += tasks * kChunk) {
        bad |= visit(slots, count, offsets, lo, std::min(total, lo + kChunk), t, kernel);
      }
    } else {
      std::int64_t lo = t * per_task, hi = std::min(total, lo + per_task);
      if (lo < hi) bad = visit(slots, count, offsets, lo, hi, t, kernel);
    }
    if (bad) found.store(true, std::memory_order_relaxed);
  });
  if (timed) {
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    detail::report_step_time(chosen, total, took.count());
  }
  return found.load();
}

// Reductions keep one split, so their partial sums (and bits) do not follow the timing.
constexpr Schedule kReductionSplit = Schedule::blocked;

bool any_nonfinite(const ParamSlots* slots, std::size_t count, const StepArgs& args) {
  const KernelTable& k = kernels();
  return for_each_range(
      slots, count,
      [&](const Range& r, int) {
        double ignored = 0.0;
        return k.grad_stats(r.grad, r.begin, r.end, args.grad_dtype, args.grad_scale, &ignored);
      },
      1, &kReductionSplit);
}

// Shared shape of every step: optional pre-scan for skip, then one fused pass.
template <class Kernel>
StepResult run_step(const ParamSlots* slots, std::size_t count, const StepArgs& args,
                    Kernel&& kernel, std::int64_t block = 1) {
  MEGALITH_EXPECTS(count == 0 || slots != nullptr, invalid_argument, "slots is null but count is ",
                   count);
  MEGALITH_EXPECTS(is_optimizer_float(args.grad_dtype), type_error, "grad dtype ",
                   dtype_name(args.grad_dtype), " is not supported: expected float32, bfloat16 or float16");
  MEGALITH_EXPECTS(is_optimizer_float(args.copy_dtype), type_error, "param copy dtype ",
                   dtype_name(args.copy_dtype), " is not supported: expected float32, bfloat16 or float16");
  StepResult result;
  if (args.nonfinite == NonFinite::skip && any_nonfinite(slots, count, args)) {
    result.found_nonfinite = true;  // nothing written: the step is skipped
    return result;
  }
  const bool check = args.nonfinite == NonFinite::detect;
  // The copy dtype is per call; whether a slot has a copy is per slot.
  result.found_nonfinite = for_each_range(
      slots, count,
      [&](const Range& r, int) {
        return kernel(r, r.copy ? static_cast<int>(args.copy_dtype) : -1, check);
      },
      block);
  return result;
}

void check_step_number(std::int64_t step, const char* optimizer) {
  MEGALITH_EXPECTS(step >= 1, invalid_argument, optimizer, ": step is ", step,
                   "; expected the 1-based number of this update");
}

bool is_lean(const StepArgs& args) {
  return args.state_format != StateFormat::f32 || args.master_format != MasterFormat::f32;
}

const char* state_format_name(StateFormat f) {
  switch (f) {
    case StateFormat::f32:
      return "f32";
    case StateFormat::bf16:
      return "bf16";
    case StateFormat::q8:
      return "q8";
  }
  return "unknown";
}

// Only Adam reads the lean formats; the others must not silently ignore them.
void check_plain_formats(const StepArgs& args, const char* optimizer) {
  MEGALITH_EXPECTS(!is_lean(args), invalid_argument, optimizer, ": state_format ",
                   state_format_name(args.state_format), " / master_format ",
                   static_cast<int>(args.master_format),
                   " are for Adam only; pass StateFormat::f32 and MasterFormat::f32");
}

void check_lean_args(const AdamHyper& h, const StepArgs& args) {
  MEGALITH_EXPECTS(static_cast<int>(args.state_format) <= static_cast<int>(StateFormat::q8),
                   invalid_argument, "Adam: state_format ", static_cast<int>(args.state_format),
                   " is not a StateFormat (f32 = 0, bf16 = 1, q8 = 2)");
  MEGALITH_EXPECTS(static_cast<int>(args.master_format) <= static_cast<int>(MasterFormat::bf16_kahan),
                   invalid_argument, "Adam: master_format ", static_cast<int>(args.master_format),
                   " is not a MasterFormat (f32 = 0, bf16_kahan = 1)");
  MEGALITH_EXPECTS(!h.amsgrad, invalid_argument, "Adam: amsgrad needs fp32 states and masters (got state_format ",
                   state_format_name(args.state_format),
                   "); turn amsgrad off or use StateFormat::f32 and MasterFormat::f32");
}

void check_lean_slot(const ParamSlots& s, std::size_t i, const StepArgs& args) {
  if (s.numel == 0) return;
  if (args.state_format == StateFormat::q8) {
    MEGALITH_EXPECTS(s.state_scale[0] != nullptr, invalid_argument, "Adam slot ", i,
                     ": exp_avg scales (state_scale[0]) is null; state_format q8 needs ",
                     q8_scale_count(s.numel), " fp32 scales for ", s.numel, " elements");
    MEGALITH_EXPECTS(s.state_scale[1] != nullptr, invalid_argument, "Adam slot ", i,
                     ": exp_avg_sq scales (state_scale[1]) is null; state_format q8 needs ",
                     q8_scale_count(s.numel), " fp32 scales for ", s.numel, " elements");
  }
  if (args.master_format == MasterFormat::bf16_kahan) {
    MEGALITH_EXPECTS(s.param_comp != nullptr, invalid_argument, "Adam slot ", i,
                     ": param_comp is null; master_format bf16_kahan needs the bf16 compensation "
                     "buffer beside the bf16 param");
  }
}

}  // namespace

StepResult adam_step(const ParamSlots* slots, std::size_t count, const AdamHyper& h,
                     const StepArgs& args) {
  static const char* const names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  check_step_number(args.step, "Adam");
  const bool lean = is_lean(args);
  if (lean) check_lean_args(h, args);
  for (std::size_t i = 0; i < count; ++i) {
    check_slot(slots[i], i, "Adam", h.amsgrad ? 3 : 2, names);
    if (lean) check_lean_slot(slots[i], i, args);
  }

  detail::AdamConsts k{};
  double t = static_cast<double>(args.step);
  double bc1 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta1), t) : 1.0;
  double bc2 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta2), t) : 1.0;
  k.beta1 = h.beta1;
  k.beta2 = h.beta2;
  k.one_minus_beta1 = 1.0f - h.beta1;
  k.one_minus_beta2 = 1.0f - h.beta2;
  k.step_size = static_cast<float>(h.lr / bc1);
  k.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  k.eps = h.eps;
  k.decay = h.decoupled_weight_decay ? 1.0f - h.lr * h.weight_decay : 1.0f;
  k.l2 = h.decoupled_weight_decay ? 0.0f : h.weight_decay;
  k.grad_scale = h.maximize ? -args.grad_scale : args.grad_scale;
  k.amsgrad = h.amsgrad;

  if (lean) {
    const LeanKernelTable& lt = lean_kernels();
    const int sf = static_cast<int>(args.state_format), mf = static_cast<int>(args.master_format);
    const std::uint32_t key = optim::detail::rounding_key(args.seed, args.step);
    const std::int64_t block = args.state_format == StateFormat::q8 ? kQ8Block : 1;
    return run_step(
        slots, count, args,
        [&](const Range& r, int copy, bool check) {
          return lt.adam(r, k, args.grad_dtype, copy, sf, mf, key, check);
        },
        block);
  }
  const KernelTable& kt = kernels();
  return run_step(slots, count, args, [&](const Range& r, int copy, bool check) {
    return kt.adam(r, k, args.grad_dtype, copy, check);
  });
}

StepResult sgd_step(const ParamSlots* slots, std::size_t count, const SgdHyper& h,
                    const StepArgs& args) {
  static const char* const names[] = {"momentum_buffer"};
  check_step_number(args.step, "SGD");
  check_plain_formats(args, "SGD");
  MEGALITH_EXPECTS(!h.nesterov || (h.momentum > 0 && h.dampening == 0), invalid_argument,
                   "SGD: nesterov momentum requires momentum > 0 and dampening == 0 (got momentum ",
                   h.momentum, ", dampening ", h.dampening, ")");
  bool has_momentum = h.momentum != 0.0f;
  for (std::size_t i = 0; i < count; ++i) check_slot(slots[i], i, "SGD", has_momentum ? 1 : 0, names);

  detail::SgdConsts k{};
  k.lr = h.lr;
  k.momentum = h.momentum;
  k.one_minus_dampening = 1.0f - h.dampening;
  k.weight_decay = h.weight_decay;
  k.grad_scale = h.maximize ? -args.grad_scale : args.grad_scale;
  k.has_momentum = has_momentum;
  k.first_step = args.step == 1;
  k.nesterov = h.nesterov;

  const KernelTable& kt = kernels();
  return run_step(slots, count, args, [&](const Range& r, int copy, bool check) {
    return kt.sgd(r, k, args.grad_dtype, copy, check);
  });
}

StepResult lion_step(const ParamSlots* slots, std::size_t count, const LionHyper& h,
                     const StepArgs& args) {
  static const char* const names[] = {"exp_avg"};
  check_step_number(args.step, "Lion");
  check_plain_formats(args, "Lion");
  for (std::size_t i = 0; i < count; ++i) check_slot(slots[i], i, "Lion", 1, names);

  detail::LionConsts k{};
  k.lr = h.lr;
  k.beta1 = h.beta1;
  k.one_minus_beta1 = 1.0f - h.beta1;
  k.beta2 = h.beta2;
  k.one_minus_beta2 = 1.0f - h.beta2;
  k.decay = 1.0f - h.lr * h.weight_decay;
  k.grad_scale = h.maximize ? -args.grad_scale : args.grad_scale;

  const KernelTable& kt = kernels();
  return run_step(slots, count, args, [&](const Range& r, int copy, bool check) {
    return kt.lion(r, k, args.grad_dtype, copy, check);
  });
}

GradStats grad_stats(const void* const* grads, const std::int64_t* numels, std::size_t count,
                     DType grad_dtype, float scale) {
  MEGALITH_EXPECTS(is_optimizer_float(grad_dtype), type_error, "grad_stats: dtype ",
                   dtype_name(grad_dtype), " is not supported: expected float32, bfloat16 or float16");
  MEGALITH_EXPECTS(count == 0 || (grads != nullptr && numels != nullptr), invalid_argument,
                   "grad_stats: grads or numels is null but count is ", count);
  std::vector<ParamSlots> slots(count);
  for (std::size_t i = 0; i < count; ++i) {
    MEGALITH_EXPECTS(numels[i] >= 0, invalid_argument, "grad_stats: numel of buffer ", i, " is ",
                     numels[i], "; expected >= 0");
    MEGALITH_EXPECTS(numels[i] == 0 || grads[i] != nullptr, invalid_argument,
                     "grad_stats: buffer ", i, " is null");
    slots[i].grad = grads[i];
    slots[i].numel = numels[i];
  }
  // One partial sum per task, added in task order: the same split gives the same bits.
  std::vector<double> partial(static_cast<std::size_t>(megalith::cpu::num_threads()), 0.0);
  const KernelTable& k = kernels();
  GradStats out;
  out.found_nonfinite = for_each_range(
      slots.data(), count,
      [&](const Range& r, int task) {
        return k.grad_stats(r.grad, r.begin, r.end, grad_dtype, scale, &partial[task]);
      },
      1, &kReductionSplit);
  for (double p : partial) out.sum_sq += p;
  return out;
}

}  // namespace megalith::optim::cpu
