#pragma once
// The buffers one optimizer step touches, as raw pointers. One ParamSlots per
// parameter tensor; a step takes an array of them and treats it as one range.

#include <cstdint>

#include "megalith/dtype.h"

namespace megalith::optim {

/// How Adam's exp_avg (m) and exp_avg_sq (v) are stored; see [Note: lean states].
enum class StateFormat : std::uint8_t {
  f32 = 0,   // fp32 m and v: exact, 8 bytes per parameter (the default)
  bf16 = 1,  // bf16 m and v, stochastically rounded: 4 bytes per parameter
  q8 = 2,    // 8-bit codes with one fp32 scale per kQ8Block elements: ~2.03 bytes per parameter
};

/// How the master parameter is stored.
enum class MasterFormat : std::uint8_t {
  f32 = 0,         // fp32 master in ParamSlots::param
  bf16_kahan = 1,  // bf16 master in param plus a bf16 compensation in param_comp (4 bytes)
};

/// Elements per quantisation block of StateFormat::q8 (blocks start at element 0 of each slot).
constexpr std::int64_t kQ8Block = 256;

/// fp32 scales a q8 state of `numel` elements needs: ceil(numel / kQ8Block).
constexpr std::int64_t q8_scale_count(std::int64_t numel) {
  return (numel + kQ8Block - 1) / kQ8Block;
}

// [Note: lean states] Adam's m and v in fewer bytes, read and written by the
// step kernels in their one pass (no fp32 copy of the state exists):
//  - bf16: m and v as bf16, stochastically rounded on every store (unbiased;
//    the random bits are a hash of (StepArgs::seed, step, slot index, element
//    index), so a step is reproducible whatever the thread split or SIMD level).
//  - q8: per block of kQ8Block elements, m is stored as int8 codes c in
//    [-127, 127] with scale A = max|m| over the block, and v as uint8 codes q in
//    [0, 255] with scale U = sqrt(max v) (v is quantised in the sqrt domain):
//        encode  c = sign(m) * rint(127 * sqrt(|m| / A))
//                q = rint(255 * sqrt(sqrt(v) / U))
//        decode  m = c * |c| * (A / 127^2)
//                v = (q * q * (U / 255^2))^2
//    rint rounds to nearest even; an all-zero block has scale 0 and codes 0.
//    The square-root companding gives small values finer steps (the smallest
//    non-zero |m| is A / 16129, the smallest non-zero v is U^2 / 255^4), which
//    matters because Adam divides by sqrt(v). The update of the parameter uses
//    the fp32 m and v of this step; only their storage is quantised.
//  - bf16_kahan masters: the parameter is hi + lo, two bf16 values; the update
//    is computed in fp32 on hi + lo, then hi = bf16(p) and lo = bf16(p - hi),
//    both rounded to nearest even (about 16 bits of mantissa in 4 bytes).
// Lean formats do not support amsgrad.

/// One parameter and its optimizer state, all `numel` elements long.
/// State slots per optimizer (unused ones are nullptr):
///   Adam:  state[0] = exp_avg, state[1] = exp_avg_sq, state[2] = max_exp_avg_sq (amsgrad)
///   SGD:   state[0] = momentum buffer (nullptr when momentum == 0)
///   Lion:  state[0] = exp_avg
///
/// With lean formats (StepArgs::state_format, master_format; see
/// [Note: lean states]) the same pointers hold other element types:
///   state_format bf16: state[0], state[1] point to bf16 (uint16) m and v
///   state_format q8:   state[0] to int8 codes of m, state[1] to uint8 codes of v,
///                      state_scale[0], state_scale[1] to q8_scale_count(numel) fp32 scales
///   master_format bf16_kahan: param points to the bf16 master, param_comp to its
///                      bf16 compensation
struct ParamSlots {
  float* param = nullptr;         // fp32 master, updated in place
  const void* grad = nullptr;     // StepArgs::grad_dtype
  float* state[3] = {nullptr, nullptr, nullptr};
  void* param_copy = nullptr;     // optional StepArgs::copy_dtype copy of the updated param
  std::int64_t numel = 0;
  float* state_scale[2] = {nullptr, nullptr};  // q8 only
  void* param_comp = nullptr;                  // bf16_kahan only
};

/// What to do about inf/nan gradients.
enum class NonFinite : std::uint8_t {
  ignore = 0,  // no check
  detect = 1,  // one fused pass; StepResult::found_nonfinite reports it, the step still runs
  skip = 2,    // no parameter or state changes when any gradient is inf/nan
};

struct StepArgs {
  DType grad_dtype = DType::f32;
  DType copy_dtype = DType::bf16;  // used only for slots with param_copy
  /// Every gradient is multiplied by this before use: 1/loss_scale, times a
  /// clipping coefficient when clipping.
  float grad_scale = 1.0f;
  /// The step number after this update, 1-based (Adam bias correction; SGD's
  /// momentum buffer is initialised from the gradient when step == 1).
  std::int64_t step = 1;
  NonFinite nonfinite = NonFinite::ignore;
  /// Adam only (other optimizers require the defaults); see [Note: lean states].
  StateFormat state_format = StateFormat::f32;
  MasterFormat master_format = MasterFormat::f32;
  /// Stream of the stochastic rounding of bf16 states (with the step number).
  std::uint64_t seed = 0;
};

struct StepResult {
  bool found_nonfinite = false;
};

/// Sum of squares of the scaled gradients, and whether any was inf/nan.
struct GradStats {
  double sum_sq = 0.0;
  bool found_nonfinite = false;
};

}  // namespace megalith::optim
