#pragma once
// Registration functions of the engine module, one per binding file.
#include <nanobind/nanobind.h>

namespace megalith::bindings {
void bind_info(nanobind::module_& m);
void bind_optim(nanobind::module_& m);
void bind_comm(nanobind::module_& m);
void bind_memory(nanobind::module_& m);  // the `memory` submodule
void bind_io(nanobind::module_& m);      // the `io` submodule
}  // namespace megalith::bindings
