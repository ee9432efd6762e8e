#include "harness.h"
#include "megalith/cpu/simd_level.h"
#include "megalith/error.h"

using namespace megalith::cpu;

TEST(scalar_always_compiled_and_supported) {
  auto levels = compiled_simd_levels();
  CHECK(!levels.empty());
  CHECK(levels.front() == SimdLevel::scalar);
  CHECK(cpu_supports(SimdLevel::scalar));
}

TEST(best_level_is_compiled_and_supported) {
  SimdLevel best = best_simd_level();
  CHECK(cpu_supports(best));
  bool found = false;
  for (auto l : compiled_simd_levels()) found |= l == best;
  CHECK(found);
}

TEST(force_and_reset) {
  for (auto l : compiled_simd_levels()) {
    if (!cpu_supports(l)) {
      CHECK_THROWS(force_simd_level(l), megalith::invalid_argument);
      continue;
    }
    force_simd_level(l);
    CHECK(active_simd_level() == l);
  }
  reset_simd_level();
  CHECK(active_simd_level() == best_simd_level() || std::getenv("MEGALITH_SIMD") != nullptr);
}

TEST(names_round_trip) {
  for (auto l : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512, SimdLevel::neon}) {
    CHECK(simd_level_from_name(simd_level_name(l)) == l);
  }
  CHECK_THROWS(simd_level_from_name("sse9"), megalith::invalid_argument);
}

MEGALITH_TEST_MAIN()
