// The CUDA entry points of a build without the CUDA toolkit: they answer
// "compiled out" and the kernels throw, saying how to get them.

#include <cstdint>
#include <string>

#include "megalith/cuda/device.h"
#include "megalith/cuda/optim.h"
#include "megalith/error.h"

namespace megalith::cuda {

namespace {
constexpr const char* kCompiledOut =
    "compiled out (megalith was built without CUDA; reinstall with nvcc on PATH, or "
    "MEGALITH_CUDA=ON, to get the GPU kernels)";
}

bool compiled() { return false; }
int device_count() { return 0; }
std::string status() { return kCompiledOut; }

}  // namespace megalith::cuda

namespace megalith::optim::cuda {

namespace {
[[noreturn]] void compiled_out(const char* what) {
  MEGALITH_FAIL(::megalith::error, what, ": CUDA kernels are ", ::megalith::cuda::status());
}
}  // namespace

void adam_step(const ParamSlots*, std::size_t, const AdamHyper&, const StepArgs&,
               const DeviceScalars&, void*) {
  compiled_out("cuda::adam_step");
}
void sgd_step(const ParamSlots*, std::size_t, const SgdHyper&, const StepArgs&,
              const DeviceScalars&, void*) {
  compiled_out("cuda::sgd_step");
}
void lion_step(const ParamSlots*, std::size_t, const LionHyper&, const StepArgs&,
               const DeviceScalars&, void*) {
  compiled_out("cuda::lion_step");
}
void grad_check(void* const*, const std::int64_t*, std::size_t, DType, const float*, bool, float*,
                float*, void*) {
  compiled_out("cuda::grad_check");
}

}  // namespace megalith::optim::cuda
