#include "megalith/build_info.h"

#include "megalith/config.h"
#include "megalith/cpu/simd_level.h"
#include "megalith/cpu/thread_pool.h"
#include "megalith/cuda/device.h"

namespace megalith {

const char* version() { return MEGALITH_VERSION; }

std::vector<std::pair<std::string, std::string>> build_info() {
  std::string compiled;
  for (cpu::SimdLevel l : cpu::compiled_simd_levels()) {
    if (!compiled.empty()) compiled += ",";
    compiled += cpu::simd_level_name(l);
  }
  return {
      {"version", MEGALITH_VERSION},
      {"build_type", MEGALITH_BUILD_TYPE},
      {"cxx_compiler", MEGALITH_CXX_COMPILER},
      {"cxx_flags", MEGALITH_CXX_FLAGS},
      {"system_processor", MEGALITH_SYSTEM_PROCESSOR},
      {"simd_levels_compiled", compiled},
      {"simd_level_best", cpu::simd_level_name(cpu::best_simd_level())},
      {"simd_level_active", cpu::simd_level_name(cpu::active_simd_level())},
      {"threads", std::to_string(cpu::num_threads())},
      {"cuda_compiled", MEGALITH_HAS_CUDA ? "yes" : "no"},
      {"cuda_archs", MEGALITH_CUDA_ARCHS},
      {"cuda_compiler_version", MEGALITH_CUDA_COMPILER_VERSION},
      {"cuda_status", cuda::status()},
  };
}

}  // namespace megalith
