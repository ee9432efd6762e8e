#pragma once
// What this build of the engine contains (compiler, flags, SIMD levels, CUDA).

#include <string>
#include <utility>
#include <vector>

#include "megalith/export.h"

namespace megalith {

/// Ordered (key, value) pairs from the generated config.h plus what the
/// running machine offers (detected SIMD level, CUDA devices seen).
MEGALITH_API std::vector<std::pair<std::string, std::string>> build_info();

MEGALITH_API const char* version();

}  // namespace megalith
