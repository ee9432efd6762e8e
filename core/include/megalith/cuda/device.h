#pragma once
// Whether CUDA kernels are usable here. Safe to call on machines with no GPU,
// no driver, or a build without CUDA: it answers, it never throws.

#include <string>

#include "megalith/export.h"

namespace megalith::cuda {

/// True when this library was built with its CUDA kernels.
MEGALITH_API bool compiled();

/// Number of GPUs the CUDA runtime sees (0 without a driver or a GPU).
MEGALITH_API int device_count();

/// "compiled out", "no driver: ...", "no device", or "N device(s)": for reports.
MEGALITH_API std::string status();

}  // namespace megalith::cuda
