// Build and machine information, SIMD level and thread controls.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "megalith/build_info.h"
#include "megalith/cpu/simd_level.h"
#include "megalith/cpu/thread_pool.h"
#include "megalith/cuda/device.h"
#include "megalith/optim/cpu.h"

namespace nb = nanobind;

namespace megalith::bindings {

void bind_info(nb::module_& m) {
  m.attr("__version__") = megalith::version();

  m.def(
      "build_info",
      [] {
        nb::dict d;
        for (auto& [k, v] : megalith::build_info()) d[k.c_str()] = v;
        return d;
      },
      "What this build contains and what it sees here, as a dict of strings.");

  m.def(
      "simd_levels_compiled",
      [] {
        std::vector<std::string> out;
        for (auto l : cpu::compiled_simd_levels()) out.emplace_back(cpu::simd_level_name(l));
        return out;
      },
      "SIMD levels compiled into this build, lowest first.");
  m.def(
      "simd_level", [] { return std::string(cpu::simd_level_name(cpu::active_simd_level())); },
      "The SIMD level the CPU kernels use now.");
  m.def(
      "best_simd_level", [] { return std::string(cpu::simd_level_name(cpu::best_simd_level())); },
      "The best SIMD level compiled in and supported by this CPU.");
  m.def(
      "cpu_supports",
      [](const std::string& name) { return cpu::cpu_supports(cpu::simd_level_from_name(name)); },
      nb::arg("level"), "Whether this CPU can run the named SIMD level.");
  m.def(
      "force_simd_level",
      [](std::optional<std::string> name) {
        if (name) cpu::force_simd_level(cpu::simd_level_from_name(*name));
        else cpu::reset_simd_level();
      },
      nb::arg("level").none(),
      "Use the named SIMD level from now on (None: back to the automatic choice).");

  m.def("cpu_step_schedule", &optim::cpu::step_schedule,
        "How the host step kernels split their elements over the threads: 'blocked' or "
        "'interleaved' (measured at the first large steps; MEGALITH_CPU_SCHEDULE forces one), "
        "'measuring' until then.");
  m.def("num_threads", &cpu::num_threads, "Host threads the engine's CPU kernels use.");
  m.def("set_num_threads", &cpu::set_num_threads, nb::arg("n"),
        "Set the engine's host thread count (>= 1).");

  m.def("cuda_compiled", &cuda::compiled, "True when the CUDA kernels are in this build.");
  m.def("cuda_device_count", &cuda::device_count, "GPUs the CUDA runtime sees (0 if none).");
  m.def("cuda_status", &cuda::status, "One line on CUDA here, for reports.");
}

}  // namespace megalith::bindings
