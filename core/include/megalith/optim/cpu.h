#pragma once
// Fused optimizer steps on host memory: one pass over each buffer, SIMD at the
// active level (cpu/simd_level.h), split over the engine's threads.

#include <cstddef>
#include <string>

#include "megalith/export.h"
#include "megalith/optim/hyper.h"
#include "megalith/optim/slots.h"

namespace megalith::optim::cpu {

/// Steps every slot. All pointers are host memory; grads may be f32, bf16 or
/// f16; copies (when given) bf16, f16 or f32. Throws megalith::invalid_argument
/// on a missing buffer, naming the slot and the buffer.
MEGALITH_API StepResult adam_step(const ParamSlots* slots, std::size_t count, const AdamHyper& h,
                                  const StepArgs& args);
MEGALITH_API StepResult sgd_step(const ParamSlots* slots, std::size_t count, const SgdHyper& h,
                                 const StepArgs& args);
MEGALITH_API StepResult lion_step(const ParamSlots* slots, std::size_t count, const LionHyper& h,
                                  const StepArgs& args);

/// Sum of squares of grad * scale over all buffers and an inf/nan flag, in one
/// pass (the input to global-norm clipping and dynamic loss scaling).
MEGALITH_API GradStats grad_stats(const void* const* grads, const std::int64_t* numels,
                                  std::size_t count, DType grad_dtype, float scale);

/// How the step kernels split their elements over the threads: "blocked" or
/// "interleaved" (measured at the first large steps, or forced by
/// MEGALITH_CPU_SCHEDULE), "measuring" until then.
MEGALITH_API std::string step_schedule();

}  // namespace megalith::optim::cpu
