#pragma once
// Which CPU instruction-set level the kernels run at. Each level's kernels are
// compiled into the library (cmake/MegalithSimd.cmake); the level is picked once
// from CPUID, can be overridden with MEGALITH_SIMD=scalar|avx2|avx512 in the
// environment, or forced from code (tests and benchmarks).

#include <string>
#include <vector>

#include "megalith/export.h"

namespace megalith::cpu {

enum class SimdLevel { scalar = 0, avx2 = 1, avx512 = 2, neon = 3 };

MEGALITH_API const char* simd_level_name(SimdLevel level);

/// Parses a level name; throws megalith::invalid_argument listing the names.
MEGALITH_API SimdLevel simd_level_from_name(const std::string& name);

/// Levels whose kernels are in this build, in increasing order.
MEGALITH_API std::vector<SimdLevel> compiled_simd_levels();

/// True when this CPU (and OS) can run the level.
MEGALITH_API bool cpu_supports(SimdLevel level);

/// The best level that is both compiled and supported here.
MEGALITH_API SimdLevel best_simd_level();

/// The level kernels use now: MEGALITH_SIMD if set, else best_simd_level(),
/// unless force_simd_level() was called.
MEGALITH_API SimdLevel active_simd_level();

/// Use `level` from now on. Throws megalith::invalid_argument when it is not
/// compiled in or this CPU cannot run it (the message lists what can).
MEGALITH_API void force_simd_level(SimdLevel level);

/// Back to the automatic choice.
MEGALITH_API void reset_simd_level();

}  // namespace megalith::cpu
