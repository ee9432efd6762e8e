// megalith._engine: the one nanobind module over libmegalith_core.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "megalith/error.h"

namespace nb = nanobind;

NB_MODULE(_engine, m) {
  m.doc() = "megalith's C++/CUDA engine (fused optimizers; more engine parts as they land)";
  // megalith::type_error derives from std::invalid_argument (ValueError by
  // default); callers expect TypeError for a wrong dtype.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const megalith::type_error& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
  megalith::bindings::bind_info(m);
  megalith::bindings::bind_optim(m);
}
