#include "megalith/cpu/simd_level.h"

#include <atomic>
#include <cstdlib>

#include "megalith/config.h"
#include "megalith/error.h"

namespace megalith::cpu {
namespace {

constexpr int kAuto = -1;
std::atomic<int> g_forced{kAuto};

bool compiled(SimdLevel level) {
  switch (level) {
    case SimdLevel::scalar:
      return true;
    case SimdLevel::avx2:
      return MEGALITH_SIMD_HAS_AVX2;
    case SimdLevel::avx512:
      return MEGALITH_SIMD_HAS_AVX512;
    case SimdLevel::neon:
      return MEGALITH_SIMD_HAS_NEON;
  }
  return false;
}

std::string runnable_levels() {
  std::string out;
  for (SimdLevel l : compiled_simd_levels()) {
    if (!cpu_supports(l)) continue;
    if (!out.empty()) out += ", ";
    out += simd_level_name(l);
  }
  return out;
}

SimdLevel level_from_env_or_best() {
  const char* env = std::getenv("MEGALITH_SIMD");
  if (env == nullptr || *env == '\0') return best_simd_level();
  SimdLevel wanted = simd_level_from_name(env);
  MEGALITH_EXPECTS(compiled(wanted) && cpu_supports(wanted), invalid_argument,
                   "MEGALITH_SIMD=", env, " cannot run here; this build and CPU can run: ",
                   runnable_levels(), ". Unset MEGALITH_SIMD or pick one of those.");
  return wanted;
}

}  // namespace

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::scalar:
      return "scalar";
    case SimdLevel::avx2:
      return "avx2";
    case SimdLevel::avx512:
      return "avx512";
    case SimdLevel::neon:
      return "neon";
  }
  return "unknown";
}

SimdLevel simd_level_from_name(const std::string& name) {
  for (SimdLevel l : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512, SimdLevel::neon}) {
    if (name == simd_level_name(l)) return l;
  }
  MEGALITH_FAIL(invalid_argument, "unknown SIMD level '", name,
                "': expected scalar, avx2, avx512 or neon");
}

std::vector<SimdLevel> compiled_simd_levels() {
  std::vector<SimdLevel> out;
  for (SimdLevel l : {SimdLevel::scalar, SimdLevel::neon, SimdLevel::avx2, SimdLevel::avx512}) {
    if (compiled(l)) out.push_back(l);
  }
  return out;
}

bool cpu_supports(SimdLevel level) {
  switch (level) {
    case SimdLevel::scalar:
      return true;
#if defined(__x86_64__) || defined(_M_X64)
    case SimdLevel::avx2:
      // __builtin_cpu_supports also checks that the OS saves the wide registers (XGETBV).
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case SimdLevel::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
#if defined(__aarch64__)
    case SimdLevel::neon:
      return true;  // Advanced SIMD is mandatory on AArch64
#endif
    default:
      return false;
  }
}

SimdLevel best_simd_level() {
  SimdLevel best = SimdLevel::scalar;
  for (SimdLevel l : compiled_simd_levels()) {
    if (cpu_supports(l)) best = l;
  }
  return best;
}

SimdLevel active_simd_level() {
  int forced = g_forced.load(std::memory_order_relaxed);
  if (forced != kAuto) return static_cast<SimdLevel>(forced);
  static const SimdLevel chosen = level_from_env_or_best();
  return chosen;
}

void force_simd_level(SimdLevel level) {
  MEGALITH_EXPECTS(compiled(level), invalid_argument, "SIMD level ", simd_level_name(level),
                   " is not compiled into this build (compiled: ", MEGALITH_SIMD_LEVELS, ")");
  MEGALITH_EXPECTS(cpu_supports(level), invalid_argument, "this CPU cannot run SIMD level ",
                   simd_level_name(level), "; it can run: ", runnable_levels());
  g_forced.store(static_cast<int>(level), std::memory_order_relaxed);
}

void reset_simd_level() { g_forced.store(kAuto, std::memory_order_relaxed); }

}  // namespace megalith::cpu
