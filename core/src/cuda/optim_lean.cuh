#pragma once
// Adam over lean state formats on GPU memory ([Note: lean states] in
// megalith/optim/slots.h). Called by adam_step (optim_step.cu) after the checks
// every step shares; checks what the lean formats need itself.

#include <cstddef>

#include "megalith/cuda/optim.h"

namespace megalith::optim::cuda::detail {

void adam_lean_step(const ParamSlots* slots, std::size_t count, const AdamHyper& h,
                    const StepArgs& args, const DeviceScalars& dev, void* stream);

}  // namespace megalith::optim::cuda::detail
