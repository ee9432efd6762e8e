#pragma once
// The buffers one optimizer step touches, as raw pointers. One ParamSlots per
// parameter tensor; a step takes an array of them and treats it as one range.

#include <cstdint>

#include "megalith/dtype.h"

namespace megalith::optim {

/// One parameter and its optimizer state, all `numel` elements long.
/// State slots per optimizer (unused ones are nullptr):
///   Adam:  state[0] = exp_avg, state[1] = exp_avg_sq, state[2] = max_exp_avg_sq (amsgrad)
///   SGD:   state[0] = momentum buffer (nullptr when momentum == 0)
///   Lion:  state[0] = exp_avg
struct ParamSlots {
  float* param = nullptr;         // fp32 master, updated in place
  const void* grad = nullptr;     // StepArgs::grad_dtype
  float* state[3] = {nullptr, nullptr, nullptr};
  void* param_copy = nullptr;     // optional StepArgs::copy_dtype copy of the updated param
  std::int64_t numel = 0;
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
