#pragma once
// The per-step scalars every CUDA optimizer kernel reads (optim_step.cu,
// optim_lean.cu), and the gradient multiplier they give.

#include <cuda_runtime_api.h>

namespace megalith::optim::cuda::detail {

/// Per-step scalars; the pointers are device memory (see DeviceScalars).
struct Scalars {
  const float* inv_scale;
  const float* found_inf;
  const float* grad_sum_sq;  // nullptr unless clipping
  float max_grad_norm;
  float grad_scale;  // StepArgs::grad_scale, negated for maximize
};

/// The gradient multiplier of this step, or false when the step is skipped.
/// The three scalar loads are independent, so they are in flight together.
__device__ __forceinline__ bool effective_scale(const Scalars& s, float& scale) {
  const float found = s.found_inf != nullptr ? *s.found_inf : 0.0f;
  const float inv = s.inv_scale != nullptr ? *s.inv_scale : 1.0f;
  const float sum_sq = s.grad_sum_sq != nullptr ? *s.grad_sum_sq : 0.0f;
  if (found != 0.0f) return false;  // a nan flag skips too
  float k = s.grad_scale * inv;
  if (s.grad_sum_sq != nullptr) {
    const float clip = s.max_grad_norm / (sqrtf(sum_sq) + 1e-6f);
    k *= fminf(clip, 1.0f);  // a nan norm leaves the gradient unclipped
  }
  scale = k;
  return true;
}

}  // namespace megalith::optim::cuda::detail
