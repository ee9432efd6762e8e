// megalith._engine: the one nanobind module over libmegalith_core.
#include <nanobind/nanobind.h>

#include <exception>
#include <new>
#include <stdexcept>

#include "bindings.h"
#include "megalith/error.h"
#include "megalith/io/error.h"

namespace nb = nanobind;

NB_MODULE(_engine, m) {
  m.doc() = "megalith's C++/CUDA engine: fused optimizers, NCCL collectives, chunk memory, file I/O";
  // Engine objects that torch tensors still reference (buffers behind DLPack views)
  // are legitimately alive when the interpreter exits; nanobind's leak report about
  // them would only alarm users.
  nb::set_leak_warnings(false);
  // Every engine exception becomes its Python counterpart here, in one
  // translator, so none has to travel on through nanobind's chain (a path seen
  // to crash with one toolchain). megalith::type_error derives from
  // std::invalid_argument, but callers expect TypeError for a wrong dtype.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const megalith::io::io_error& e) {
      // OSError(errno, text) becomes FileNotFoundError for ENOENT and so on.
      if (e.code() == 0) {
        PyErr_SetString(PyExc_OSError, e.what());
      } else {
        PyObject* args = Py_BuildValue("(is)", e.code(), e.what());
        PyErr_SetObject(PyExc_OSError, args);
        Py_XDECREF(args);
      }
    } catch (const megalith::type_error& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::bad_alloc& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const std::runtime_error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  megalith::bindings::bind_info(m);
  megalith::bindings::bind_optim(m);
  megalith::bindings::bind_comm(m);
  megalith::bindings::bind_memory(m);
  megalith::bindings::bind_io(m);
}
