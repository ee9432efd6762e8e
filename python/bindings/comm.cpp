// The engine's NCCL communicator on DLPack arrays (torch, cupy, jax...).
// Every array is checked here (CUDA, on the communicator's device, contiguous,
// a supported dtype, sizes consistent across arguments) and the messages name
// the op, the argument and the numbers; the core then checks what is left
// (peers, roots, reductions) before anything reaches NCCL. Streams are
// cudaStream_t handles as int (torch.cuda.current_stream().cuda_stream; 0:
// the legacy default stream). The GIL is released around every NCCL call and wait.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "buffers.h"
#include "megalith/comm/argcheck.h"
#include "megalith/comm/communicator.h"
#include "megalith/comm/nccl.h"
#include "megalith/error.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace megalith::bindings {
namespace {

using comm::Communicator;
using comm::Work;
using WorkPtr = std::shared_ptr<Work>;
using Array = nb::ndarray<>;

void* as_stream(std::uintptr_t s) { return reinterpret_cast<void*>(s); }

/// A CUDA array on the communicator's device, of any collective dtype.
Buffer cuda_buffer(const Communicator& c, const Array& a, const char* op, const char* name) {
  const std::string label = std::string(op) + ": " + name;
  Buffer b = as_buffer(a, label.c_str(),
                       {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::u8,
                        DType::i32, DType::i64});
  b.name = name;
  MEGALITH_EXPECTS(b.device_type == nb::device::cuda::value, invalid_argument, op, ": ", name,
                   " must be a CUDA array (NCCL moves GPU memory); got a ",
                   b.device_type == nb::device::cpu::value ? "CPU" : "non-CUDA",
                   " array: move it with .cuda() or use the CPU (Gloo) path");
  MEGALITH_EXPECTS(b.device_id == c.device(), invalid_argument, op, ": ", name,
                   " is on cuda:", b.device_id, " but communicator '", c.name(),
                   "' works on cuda:", c.device());
  return b;
}

void same_dtype(const char* op, const Buffer& a, const Buffer& b) {
  MEGALITH_EXPECTS(a.dtype == b.dtype, type_error, op, ": ", b.name, " is ", dtype_name(b.dtype),
                   " but ", a.name, " is ", dtype_name(a.dtype), "; they must match");
}

/// send == recv (in place) or disjoint: NCCL's result on partly overlapping buffers is undefined.
void in_place_or_disjoint(const char* op, const Buffer& s, const Buffer& r) {
  if (s.ptr == r.ptr) return;
  auto lo1 = reinterpret_cast<std::uintptr_t>(s.ptr), lo2 = reinterpret_cast<std::uintptr_t>(r.ptr);
  auto hi1 = lo1 + s.numel * dtype_size(s.dtype), hi2 = lo2 + r.numel * dtype_size(r.dtype);
  MEGALITH_EXPECTS(s.numel == 0 || r.numel == 0 || hi1 <= lo2 || hi2 <= lo1, invalid_argument, op,
                   ": send and recv overlap without being the same buffer (pass the same array "
                   "for in place, or separate arrays)");
}

void numel_is(const char* op, const Buffer& b, std::int64_t want, const std::string& why) {
  MEGALITH_EXPECTS(b.numel == want, invalid_argument, op, ": ", b.name, " has ", b.numel,
                   " elements, expected ", want, " (", why, ")");
}

/// Exclusive prefix sums: where each rank's block starts in a packed buffer.
std::vector<std::int64_t> packed_displs(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> displs(counts.size());
  std::int64_t at = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    displs[i] = at;
    at += counts[i];
  }
  return displs;
}

std::int64_t packed_extent(const char* op, const char* counts_name,
                           const std::vector<std::int64_t>& counts, const Buffer& b, int size) {
  std::vector<std::int64_t> displs = packed_displs(counts);
  std::int64_t sum = comm::argcheck::splits(op, counts_name, counts, "displacements", displs, size);
  MEGALITH_EXPECTS(sum == b.numel, invalid_argument, op, ": ", counts_name, " sum to ", sum,
                   " elements but ", b.name, " has ", b.numel);
  return sum;
}

void bind_work(nb::module_& m) {
  nb::class_<Work>(m, "Work", "Handle of one asynchronous communicator operation")
      .def(
          "wait",
          [](Work& w, std::uintptr_t stream) {
            nb::gil_scoped_release release;
            w.wait(as_stream(stream));
          },
          "stream"_a = 0,
          "Make `stream` wait for the operation on the device (the host does not block).")
      .def(
          "synchronize",
          [](Work& w) {
            nb::gil_scoped_release release;
            w.synchronize();
          },
          "Block until the operation finished; raises the communicator's error if it failed.")
      .def(
          "is_completed",
          [](Work& w) {
            nb::gil_scoped_release release;
            return w.is_completed();
          },
          "Whether the operation finished (raises if the communicator failed first).")
      .def("__repr__", [](const Work& w) { return "<megalith Work: " + w.describe() + ">"; });
}

void bind_communicator(nb::module_& m) {
  nb::class_<Communicator>(m, "NcclCommunicator",
                           "An NCCL communicator over one GPU per rank (see "
                           "core/include/megalith/comm/communicator.h)")
      .def(
          "__init__",
          [](Communicator* self, nb::bytes unique_id, int world_size, int rank, int device,
             double timeout_s, std::string name) {
            auto* p = static_cast<const std::uint8_t*>(unique_id.data());
            std::vector<std::uint8_t> id(p, p + unique_id.size());
            nb::gil_scoped_release release;  // blocks until every rank joined
            new (self) Communicator(id, world_size, rank, device, comm::Options{timeout_s, name});
          },
          "unique_id"_a, "world_size"_a, "rank"_a, "device"_a, "timeout_s"_a = 600.0, "name"_a = "")
      .def(
          "all_reduce",
          [](Communicator& c, const Array& send, const Array& recv, const std::string& op,
             std::uintptr_t stream) -> WorkPtr {
            Buffer s = cuda_buffer(c, send, "all_reduce", "send");
            Buffer r = cuda_buffer(c, recv, "all_reduce", "recv");
            same_dtype("all_reduce", s, r);
            numel_is("all_reduce", r, s.numel, "the size of send");
            in_place_or_disjoint("all_reduce", s, r);
            comm::ReduceOp red = comm::reduce_op_from_name(op);
            nb::gil_scoped_release release;
            return c.all_reduce(s.ptr, r.ptr, s.numel, s.dtype, red, as_stream(stream));
          },
          "send"_a, "recv"_a, "op"_a = "sum", "stream"_a = 0,
          "recv = op over ranks of send; pass the same array twice for in place.")
      .def(
          "reduce_scatter",
          [](Communicator& c, const Array& send, const Array& recv, const std::string& op,
             std::uintptr_t stream) -> WorkPtr {
            Buffer s = cuda_buffer(c, send, "reduce_scatter", "send");
            Buffer r = cuda_buffer(c, recv, "reduce_scatter", "recv");
            same_dtype("reduce_scatter", s, r);
            numel_is("reduce_scatter", s, r.numel * c.size(),
                     "recv.size * world_size = " + std::to_string(r.numel) + " * " +
                         std::to_string(c.size()));
            comm::ReduceOp red = comm::reduce_op_from_name(op);
            nb::gil_scoped_release release;
            return c.reduce_scatter(s.ptr, r.ptr, r.numel, s.dtype, red, as_stream(stream));
          },
          "send"_a, "recv"_a, "op"_a = "sum", "stream"_a = 0,
          "recv = op over ranks of block rank() of send (send.size == recv.size * world_size).")
      .def(
          "all_gather",
          [](Communicator& c, const Array& send, const Array& recv,
             std::uintptr_t stream) -> WorkPtr {
            Buffer s = cuda_buffer(c, send, "all_gather", "send");
            Buffer r = cuda_buffer(c, recv, "all_gather", "recv");
            same_dtype("all_gather", s, r);
            numel_is("all_gather", r, s.numel * c.size(),
                     "send.size * world_size = " + std::to_string(s.numel) + " * " +
                         std::to_string(c.size()));
            nb::gil_scoped_release release;
            return c.all_gather(s.ptr, r.ptr, s.numel, s.dtype, as_stream(stream));
          },
          "send"_a, "recv"_a, "stream"_a = 0,
          "recv = every rank's send in rank order (recv.size == send.size * world_size).")
      .def(
          "broadcast",
          [](Communicator& c, const Array& buf, int root, std::uintptr_t stream) -> WorkPtr {
            Buffer b = cuda_buffer(c, buf, "broadcast", "buf");
            nb::gil_scoped_release release;
            return c.broadcast(b.ptr, b.numel, b.dtype, root, as_stream(stream));
          },
          "buf"_a, "root"_a, "stream"_a = 0, "buf of root is copied into buf of every rank.")
      .def(
          "reduce",
          [](Communicator& c, const Array& send, const Array& recv, int root, const std::string& op,
             std::uintptr_t stream) -> WorkPtr {
            Buffer s = cuda_buffer(c, send, "reduce", "send");
            Buffer r = cuda_buffer(c, recv, "reduce", "recv");
            same_dtype("reduce", s, r);
            numel_is("reduce", r, s.numel, "the size of send");
            in_place_or_disjoint("reduce", s, r);
            comm::ReduceOp red = comm::reduce_op_from_name(op);
            nb::gil_scoped_release release;
            return c.reduce(s.ptr, r.ptr, s.numel, s.dtype, red, root, as_stream(stream));
          },
          "send"_a, "recv"_a, "root"_a, "op"_a = "sum", "stream"_a = 0,
          "recv of root = op over ranks of send (recv is left alone on other ranks).")
      .def(
          "send",
          [](Communicator& c, const Array& buf, int peer, std::uintptr_t stream) -> WorkPtr {
            Buffer b = cuda_buffer(c, buf, "send", "buf");
            nb::gil_scoped_release release;
            return c.send(b.ptr, b.numel, b.dtype, peer, as_stream(stream));
          },
          "buf"_a, "peer"_a, "stream"_a = 0, "Send buf to peer (which must recv the same size).")
      .def(
          "recv",
          [](Communicator& c, const Array& buf, int peer, std::uintptr_t stream) -> WorkPtr {
            Buffer b = cuda_buffer(c, buf, "recv", "buf");
            nb::gil_scoped_release release;
            return c.recv(b.ptr, b.numel, b.dtype, peer, as_stream(stream));
          },
          "buf"_a, "peer"_a, "stream"_a = 0, "Receive into buf from peer.")
      .def(
          "all_to_all",
          [](Communicator& c, const Array& send, const Array& recv,
             std::uintptr_t stream) -> WorkPtr {
            Buffer s = cuda_buffer(c, send, "all_to_all", "send");
            Buffer r = cuda_buffer(c, recv, "all_to_all", "recv");
            same_dtype("all_to_all", s, r);
            numel_is("all_to_all", r, s.numel, "the size of send");
            MEGALITH_EXPECTS(s.numel % c.size() == 0, invalid_argument, "all_to_all: send has ",
                             s.numel, " elements, not a multiple of the world size ", c.size(),
                             " (use all_to_allv for uneven splits)");
            nb::gil_scoped_release release;
            return c.all_to_all(s.ptr, r.ptr, s.numel / c.size(), s.dtype, as_stream(stream));
          },
          "send"_a, "recv"_a, "stream"_a = 0,
          "Block j of send goes to rank j; block i of recv comes from rank i (equal blocks).")
      .def(
          "all_to_allv",
          [](Communicator& c, const Array& send, const std::vector<std::int64_t>& send_counts,
             const Array& recv, const std::vector<std::int64_t>& recv_counts,
             std::uintptr_t stream) -> WorkPtr {
            Buffer s = cuda_buffer(c, send, "all_to_allv", "send");
            Buffer r = cuda_buffer(c, recv, "all_to_allv", "recv");
            same_dtype("all_to_allv", s, r);
            packed_extent("all_to_allv", "send_counts", send_counts, s, c.size());
            packed_extent("all_to_allv", "recv_counts", recv_counts, r, c.size());
            auto send_displs = packed_displs(send_counts), recv_displs = packed_displs(recv_counts);
            nb::gil_scoped_release release;
            return c.all_to_allv(s.ptr, send_counts, send_displs, r.ptr, recv_counts, recv_displs,
                                 s.dtype, as_stream(stream));
          },
          "send"_a, "send_counts"_a, "recv"_a, "recv_counts"_a, "stream"_a = 0,
          "Uneven all_to_all on packed buffers: send_counts[j] elements go to rank j, "
          "recv_counts[i] come from rank i, blocks back to back in rank order.")
      .def(
          "barrier",
          [](Communicator& c, std::uintptr_t stream) -> WorkPtr {
            nb::gil_scoped_release release;
            return c.barrier(as_stream(stream));
          },
          "stream"_a = 0, "Completes when every rank reached it.")
      .def("group_start", &Communicator::group_start,
           "Operations until group_end() go out as one NCCL launch.")
      .def(
          "group_end",
          [](Communicator& c) {
            nb::gil_scoped_release release;
            c.group_end();
          },
          "Launch the group; its Works complete together.")
      .def(
          "abort",
          [](Communicator& c) {
            nb::gil_scoped_release release;
            c.abort();
          },
          "Abort NCCL now; later calls raise naming this communicator.")
      .def("error", &Communicator::error,
           "The error that failed this communicator (timeout, NCCL error, abort), or None.")
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("size", &Communicator::size)
      .def_prop_ro("device", &Communicator::device)
      .def_prop_ro("name", &Communicator::name)
      .def_prop_ro("timeout_s", &Communicator::timeout_s)
      .def("__repr__", [](const Communicator& c) {
        return "<NcclCommunicator '" + c.name() + "' rank " + std::to_string(c.rank()) + " of " +
               std::to_string(c.size()) + " on cuda:" + std::to_string(c.device()) + ">";
      });
}

}  // namespace

void bind_comm(nb::module_& m) {
  m.def("nccl_available", &comm::nccl_available,
        "True when NCCL loads here and this build has CUDA (never raises).");
  m.def("nccl_version", &comm::nccl_version,
        "The loaded NCCL's version, e.g. '2.21.5'; raises saying where it looked when it is "
        "missing.");
  m.def("set_nccl_search_path", &comm::set_nccl_search_path, "path"_a,
        "Directory to try first for libnccl.so.2 (no effect once NCCL is loaded).");
  m.def("nccl_search_candidates", &comm::nccl_search_candidates,
        "The paths tried for libnccl.so.2, in order.");
  m.def(
      "nccl_unique_id",
      [] {
        std::vector<std::uint8_t> id = comm::unique_id();
        return nb::bytes(id.data(), id.size());
      },
      "A new 128-byte NCCL unique id: make it on one rank, send it to the others.");
  bind_work(m);
  bind_communicator(m);
}

}  // namespace megalith::bindings
