// megalith._engine.io: asynchronous file I/O and per-run swap directories
// (megalith::io). Buffers are contiguous CPU arrays (any DLPack array: torch,
// numpy); a Request keeps its array alive until the transfer is done, and
// waits for it when dropped early so that no worker writes into freed memory.
// The GIL is released while files are opened, waited on or removed.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "bindings.h"
#include "megalith/error.h"
#include "megalith/io/async_io.h"
#include "megalith/io/error.h"
#include "megalith/io/swap_dir.h"
#include "megalith/memory/bytes.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace megalith::bindings {
namespace {

using namespace megalith::io;
using ReadArray = nb::ndarray<nb::device::cpu>;           // written into: must be writable
using WriteArray = nb::ndarray<nb::ro, nb::device::cpu>;  // only read from
using Target = std::variant<int, std::filesystem::path>;

/// A request and the array it reads or writes.
struct PyRequest {
  Request req;
  nb::ndarray<> keep;
  PyRequest() = default;
  PyRequest(PyRequest&&) =
      default;  // the moved-from one holds no request: its destructor is a no-op
  PyRequest& operator=(PyRequest&&) = default;
  PyRequest(const PyRequest&) = delete;
  ~PyRequest() {
    if (req.done()) return;
    nb::gil_scoped_release release;
    try {
      req.wait();
    } catch (...) {  // dropped without wait(): the error has nobody to go to
    }
  }
  void wait() const {
    nb::gil_scoped_release release;
    req.wait();
  }
};

/// Address and byte count of a contiguous array; `nbytes` (default: all) must fit.
template <typename Array>
std::pair<void*, std::size_t> span_of(const Array& a, std::optional<std::size_t> nbytes,
                                      const char* what) {
  const auto t = a.dtype();
  MEGALITH_EXPECTS(t.bits % 8 == 0, invalid_argument, what,
                   ": expected an array of whole bytes, got ", int(t.bits), "-bit elements");
  std::int64_t expected = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    MEGALITH_EXPECTS(a.shape(d) == 1 || a.stride(d) == expected, invalid_argument, what,
                     ": expected a contiguous array (call .contiguous() first)");
    expected *= static_cast<std::int64_t>(a.shape(d));
  }
  const std::size_t total = a.size() * (t.bits / 8) * t.lanes;
  const std::size_t n = nbytes.value_or(total);
  MEGALITH_EXPECTS(n <= total, invalid_argument, what, ": nbytes ", n,
                   " is more than the array holds (", total, " bytes)");
  return {const_cast<void*>(static_cast<const void*>(a.data())), n};
}

PyRequest submit(AsyncIO& io, bool write, const Target& target, std::uint64_t offset, void* data,
                 std::size_t n, nb::ndarray<> keep) {
  PyRequest r;
  r.keep = std::move(keep);
  const std::string path =
      std::holds_alternative<int>(target) ? "" : std::get<std::filesystem::path>(target).string();
  {
    nb::gil_scoped_release release;
    if (const int* fd = std::get_if<int>(&target)) {
      r.req = write ? io.write(*fd, offset, data, n) : io.read(*fd, offset, data, n);
    } else {
      r.req = write ? io.write(path, offset, data, n) : io.read(path, offset, data, n);
    }
  }
  return r;
}

std::string request_repr(const PyRequest& r) {
  return ::megalith::detail::concat("<megalith io.Request ", memory::format_bytes(r.req.nbytes()),
                                    r.req.direct() ? ", direct" : ", buffered",
                                    r.req.done() ? ", done>" : ", in flight>");
}

void bind_engine(nb::module_& m) {
  nb::class_<PyRequest>(m, "Request", "A read or write in flight; wait() raises its error")
      .def("wait", &PyRequest::wait,
           "Blocks (without the GIL) until the transfer finished; raises OSError naming the "
           "file, offset and bytes when it failed (errno ENOSPC/EFBIG: disk full).")
      .def("done", [](const PyRequest& r) { return r.req.done(); })
      .def_prop_ro("nbytes", [](const PyRequest& r) { return r.req.nbytes(); })
      .def_prop_ro(
          "direct", [](const PyRequest& r) { return r.req.direct(); },
          "Whether the file is accessed with O_DIRECT")
      .def("__repr__", &request_repr);

  nb::class_<AsyncIO>(m, "AsyncIO",
                      "Reads and writes files on a pool of I/O threads or an io_uring, large "
                      "requests split into blocks run in parallel; O_DIRECT where the filesystem "
                      "allows it")
      .def(
          "__init__",
          [](AsyncIO* self, int threads, std::size_t block_bytes, bool direct,
             const std::string& backend, int queue_depth) {
            new (self) AsyncIO(
                IOOptions{threads, block_bytes, direct, parse_backend(backend), queue_depth});
          },
          "threads"_a = 4, "block_bytes"_a = std::size_t{8} << 20, "direct"_a = true,
          "backend"_a = "auto", "queue_depth"_a = 64,
          "`backend`: \"threads\", \"uring\" (OSError naming the reason where the kernel "
          "refuses io_uring) or \"auto\" (io_uring where it can be had; the environment "
          "variable MEGALITH_IO_BACKEND overrides auto). `queue_depth`: blocks in flight in the "
          "ring.")
      .def_prop_ro("threads", [](const AsyncIO& a) { return a.options().threads; })
      .def_prop_ro("block_bytes", [](const AsyncIO& a) { return a.options().block_bytes; })
      .def_prop_ro("direct", [](const AsyncIO& a) { return a.options().direct; })
      .def_prop_ro(
          "backend", [](const AsyncIO& a) { return std::string(backend_name(a.backend())); },
          "The backend in use: \"threads\" or \"uring\" (never \"auto\")")
      .def_prop_ro("queue_depth", [](const AsyncIO& a) { return a.options().queue_depth; })
      .def(
          "read",
          [](AsyncIO& io, const Target& file, std::uint64_t offset, ReadArray buffer,
             std::optional<std::size_t> nbytes) {
            auto [p, n] = span_of(buffer, nbytes, "AsyncIO.read: buffer");
            return submit(io, false, file, offset, p, n, nb::ndarray<>(buffer));
          },
          "file"_a, "offset"_a, "buffer"_a, "nbytes"_a = nb::none(),
          "Reads `nbytes` (default: all of `buffer`) at `offset` of `file` (a path or an open "
          "descriptor) into the contiguous CPU array `buffer`. Past the end of the file: OSError "
          "at wait().")
      .def(
          "write",
          [](AsyncIO& io, const Target& file, std::uint64_t offset, WriteArray buffer,
             std::optional<std::size_t> nbytes) {
            auto [p, n] = span_of(buffer, nbytes, "AsyncIO.write: buffer");
            return submit(io, true, file, offset, p, n, nb::ndarray<>(buffer));
          },
          "file"_a, "offset"_a, "buffer"_a, "nbytes"_a = nb::none(),
          "Writes `nbytes` (default: all) of `buffer` at `offset` of `file`, creating it.")
      .def(
          "direct_io_active",
          [](const AsyncIO& io, const std::filesystem::path& path) {
            nb::gil_scoped_release release;
            return io.direct_io_active(path.string());
          },
          "path"_a,
          "Whether requests on `path` (a file, or a directory for new files) use "
          "O_DIRECT: asked for, and the filesystem allows it (tmpfs may not)");

  m.def("uring_unavailable_reason", &uring_unavailable_reason,
        "\"\" when AsyncIO can use io_uring in this process, else why not and what to do");
  m.def(
      "free_bytes", [](const std::filesystem::path& p) { return free_bytes(p.string()); }, "path"_a,
      "Bytes an unprivileged process may still write on the filesystem of `path`");
}

void bind_swap(nb::module_& m) {
  using SwapFilePtr = std::shared_ptr<SwapFile>;
  nb::class_<SwapFile>(m, "SwapFile", "A file of fixed size reserved in a SwapDir")
      .def_prop_ro("path", &SwapFile::path)
      .def_prop_ro("nbytes", &SwapFile::nbytes)
      .def_prop_ro("direct", &SwapFile::direct)
      .def(
          "write",
          [](const SwapFilePtr& f, WriteArray tensor, std::uint64_t offset) {
            auto [p, n] = span_of(tensor, std::nullopt, "SwapFile.write: tensor");
            PyRequest r;
            r.keep = nb::ndarray<>(tensor);
            {
              nb::gil_scoped_release release;
              r.req = f->write(p, n, offset);
            }
            return r;
          },
          "tensor"_a, "offset"_a = 0, "Writes all of `tensor` at byte `offset` (async)")
      .def(
          "read",
          [](const SwapFilePtr& f, ReadArray tensor, std::uint64_t offset) {
            auto [p, n] = span_of(tensor, std::nullopt, "SwapFile.read: tensor");
            PyRequest r;
            r.keep = nb::ndarray<>(tensor);
            {
              nb::gil_scoped_release release;
              r.req = f->read(p, n, offset);
            }
            return r;
          },
          "tensor"_a, "offset"_a = 0, "Fills `tensor` from byte `offset` (async)")
      .def("__repr__", [](const SwapFile& f) {
        return "<megalith io.SwapFile '" + f.path() + "' " + memory::format_bytes(f.nbytes()) + ">";
      });

  nb::class_<SwapDir>(
      m, "SwapDir",
      "A per-run swap directory <root>/megalith-swap-<run>-<id>, removed by "
      "remove(), when it and its files are collected, or at exit; a crashed run's is stale "
      "(find_stale / clean_stale) and never reused")
      .def(
          "__init__",
          [](SwapDir* self, const std::filesystem::path& root, const std::string& run_name,
             std::shared_ptr<AsyncIO> io, bool clean_stale) {
            nb::gil_scoped_release release;
            new (self) SwapDir(root.string(), run_name, std::move(io), clean_stale);
          },
          "root"_a, "run_name"_a = "", "io"_a.none() = nb::none(), "clean_stale"_a = true)
      .def_prop_ro("path", &SwapDir::path)
      .def_prop_ro("id", &SwapDir::id)
      .def_prop_ro("io", &SwapDir::io)
      .def_prop_ro("removed", &SwapDir::removed)
      .def(
          "allocate",
          [](SwapDir& d, const std::string& name, std::uint64_t nbytes) {
            nb::gil_scoped_release release;
            return d.allocate(name, nbytes);
          },
          "name"_a, "nbytes"_a,
          "A new SwapFile of `nbytes`, reserved on disk now: a full disk raises OSError "
          "(ENOSPC/EFBIG) naming the path, the bytes asked and the bytes free")
      .def(
          "remove",
          [](SwapDir& d) {
            nb::gil_scoped_release release;
            d.remove();
          },
          "Deletes the directory and its files (idempotent)")
      .def(
          "__enter__", [](nb::handle self) { return nb::borrow(self); },
          nb::sig("def __enter__(self) -> SwapDir"))
      .def(
          "__exit__",
          [](SwapDir& d, nb::handle, nb::handle, nb::handle) {
            nb::gil_scoped_release release;
            d.remove();
          },
          "exc_type"_a.none(), "exc_value"_a.none(), "traceback"_a.none())
      .def_static(
          "find_stale",
          [](const std::filesystem::path& root) { return SwapDir::find_stale(root.string()); },
          "root"_a, "Swap directories under `root` whose run is gone")
      .def_static(
          "clean_stale",
          [](const std::filesystem::path& root) { return SwapDir::clean_stale(root.string()); },
          "root"_a, "Removes those and returns their paths")
      .def("__repr__", [](const SwapDir& d) { return "<megalith io.SwapDir '" + d.path() + "'>"; });
}

}  // namespace

void bind_io(nb::module_& m) {
  nb::module_ io = m.def_submodule(
      "io", "Asynchronous file I/O and per-run swap directories of the engine (megalith::io)");
  bind_engine(io);
  bind_swap(io);
}

}  // namespace megalith::bindings
