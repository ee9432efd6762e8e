#pragma once
// Fused optimizer steps on GPU memory. A step over any number of tensors is one
// kernel launch per group of up to kMaxTensorsPerLaunch tensors (multi-tensor);
// a flat buffer is a list of one. All calls are asynchronous on `stream` (a
// cudaStream_t passed as void*; nullptr is the legacy default stream) and
// return before the GPU finishes. In a build without CUDA they throw
// megalith::error saying how to rebuild.

#include <cstddef>
#include <cstdint>

#include "megalith/export.h"
#include "megalith/optim/hyper.h"
#include "megalith/optim/slots.h"

namespace megalith::optim::cuda {

/// Tensors carried by one launch's parameter block.
constexpr std::size_t kMaxTensorsPerLaunch = 320;

/// Scalars that live on the GPU so a step needs no host synchronisation.
/// Every pointer is optional (nullptr: not used).
struct DeviceScalars {
  /// Gradients are multiplied by *inv_scale (1/loss_scale), on top of StepArgs::grad_scale.
  const float* inv_scale = nullptr;
  /// When *found_inf != 0 the kernel changes nothing (a skipped fp16 step).
  const float* found_inf = nullptr;
  /// With max_grad_norm > 0: gradients are also multiplied by
  /// min(1, max_grad_norm / (sqrt(*grad_sum_sq) + 1e-6)), where *grad_sum_sq is
  /// the sum of squares of the unscaled gradients (from grad_check()).
  const float* grad_sum_sq = nullptr;
  float max_grad_norm = 0.0f;
};

/// `slots` is a host array; the buffers it points to are device memory.
/// StepArgs::nonfinite must be ignore here: use grad_check() and
/// DeviceScalars::found_inf for skip semantics without a host sync.
MEGALITH_API void adam_step(const ParamSlots* slots, std::size_t count, const AdamHyper& h,
                            const StepArgs& args, const DeviceScalars& dev, void* stream);
MEGALITH_API void sgd_step(const ParamSlots* slots, std::size_t count, const SgdHyper& h,
                           const StepArgs& args, const DeviceScalars& dev, void* stream);
MEGALITH_API void lion_step(const ParamSlots* slots, std::size_t count, const LionHyper& h,
                            const StepArgs& args, const DeviceScalars& dev, void* stream);

/// One fused pass over gradient buffers (device memory): multiplies each by
/// *inv_scale in place when unscale_in_place (inv_scale may be nullptr: 1),
/// sets *found_inf = 1 when any value is inf/nan, and adds the sum of squares
/// of the (unscaled) values to *sum_sq. found_inf and sum_sq accumulate across
/// calls: zero them before the first. sum_sq may be nullptr.
MEGALITH_API void grad_check(void* const* grads, const std::int64_t* numels, std::size_t count,
                             DType grad_dtype, const float* inv_scale, bool unscale_in_place,
                             float* found_inf, float* sum_sq, void* stream);

}  // namespace megalith::optim::cuda
