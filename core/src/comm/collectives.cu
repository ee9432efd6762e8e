// The communicator's operations: argument checks, then one checked NCCL launch
// each (all_to_all/v: a group of sends and receives). Empty operations issue
// nothing to NCCL but still return a Work ordered on the stream.

#include <string>
#include <type_traits>
#include <vector>

#include "../cuda/cuda_check.cuh"
#include "communicator_impl.h"
#include "megalith/comm/argcheck.h"
#include "megalith/error.h"

namespace megalith::comm {
namespace {

using WorkPtr = Communicator::WorkPtr;

nccl::DataType to_nccl(DType t) {
  switch (t) {
    case DType::f32:
      return nccl::float32;
    case DType::f16:
      return nccl::float16;
    case DType::bf16:
      return nccl::bfloat16;
    case DType::f64:
      return nccl::float64;
    case DType::i8:
      return nccl::int8;
    case DType::u8:
      return nccl::uint8;
    case DType::i32:
      return nccl::int32;
    case DType::i64:
      return nccl::int64;
  }
  MEGALITH_FAIL(invalid_argument, "dtype ", static_cast<int>(t), " has no NCCL type");
}

// [Note: avg on one rank] NCCL 2.28.9's ncclAvg on a one-rank communicator
// left the last element(s) of the output unwritten for some counts (4097 fp32,
// 8193 fp16/bf16/fp64; seen on an H200, tests/test_comm_engine_gpu.py). The
// average of one value is the value: sum gives it exactly, so one rank uses sum.
nccl::RedOp to_nccl(ReduceOp op, int world_size) {
  switch (op) {
    case ReduceOp::sum:
      return nccl::sum;
    case ReduceOp::avg:
      return world_size == 1 ? nccl::sum : nccl::avg;
    case ReduceOp::min:
      return nccl::min;
    case ReduceOp::max:
      return nccl::max;
    case ReduceOp::prod:
      return nccl::prod;
  }
  MEGALITH_FAIL(invalid_argument, "op ", static_cast<int>(op), " is not an NCCL reduction");
}

template <class T>
T* at(T* base, std::int64_t elements, DType t) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<Byte*>(base) + elements * static_cast<std::int64_t>(dtype_size(t));
}

/// The sends and receives of an all_to_all(v), as one NCCL group. Stops at the
/// first error (ncclInProgress is not one), and always closes the group it opened.
nccl::Result exchange(const nccl::Api& api, nccl::Comm c, nccl::Stream st, int size,
                      const void* send, const std::vector<std::int64_t>& send_counts,
                      const std::vector<std::int64_t>& send_displs, void* recv,
                      const std::vector<std::int64_t>& recv_counts,
                      const std::vector<std::int64_t>& recv_displs, DType dtype) {
  auto failed = [](nccl::Result r) { return r != nccl::success && r != nccl::in_progress; };
  nccl::Result first = api.GroupStart();
  if (failed(first)) return first;
  const nccl::DataType t = to_nccl(dtype);
  for (int peer = 0; peer < size && !failed(first); ++peer) {
    if (send_counts[peer] > 0) {
      first = api.Send(at(send, send_displs[peer], dtype), send_counts[peer], t, peer, c, st);
    }
    if (!failed(first) && recv_counts[peer] > 0) {
      first = api.Recv(at(recv, recv_displs[peer], dtype), recv_counts[peer], t, peer, c, st);
    }
  }
  nccl::Result end = api.GroupEnd();
  return failed(first) ? first : end;
}

}  // namespace

WorkPtr Communicator::all_reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                                 ReduceOp op, void* stream) {
  argcheck::buffer("all_reduce", "send", send, count);
  argcheck::buffer("all_reduce", "recv", recv, count);
  argcheck::reduction("all_reduce", op, dtype);
  const nccl::Api& api = *impl_->state->api;
  return impl_->issue({"all_reduce", count, dtype}, stream, [&](nccl::Comm c, nccl::Stream st) {
    if (count == 0) return nccl::success;
    return api.AllReduce(send, recv, count, to_nccl(dtype), to_nccl(op, size()), c, st);
  });
}

WorkPtr Communicator::reduce_scatter(const void* send, void* recv, std::int64_t recv_count,
                                     DType dtype, ReduceOp op, void* stream) {
  argcheck::buffer("reduce_scatter", "recv", recv, recv_count);
  argcheck::buffer("reduce_scatter", "send", send, recv_count * size());
  argcheck::reduction("reduce_scatter", op, dtype);
  const nccl::Api& api = *impl_->state->api;
  return impl_->issue(
      {"reduce_scatter", recv_count, dtype}, stream, [&](nccl::Comm c, nccl::Stream st) {
        if (recv_count == 0) return nccl::success;
        return api.ReduceScatter(send, recv, recv_count, to_nccl(dtype), to_nccl(op, size()), c, st);
      });
}

WorkPtr Communicator::all_gather(const void* send, void* recv, std::int64_t send_count, DType dtype,
                                 void* stream) {
  argcheck::buffer("all_gather", "send", send, send_count);
  argcheck::buffer("all_gather", "recv", recv, send_count * size());
  const nccl::Api& api = *impl_->state->api;
  return impl_->issue({"all_gather", send_count, dtype}, stream,
                      [&](nccl::Comm c, nccl::Stream st) {
                        if (send_count == 0) return nccl::success;
                        return api.AllGather(send, recv, send_count, to_nccl(dtype), c, st);
                      });
}

WorkPtr Communicator::broadcast(void* buf, std::int64_t count, DType dtype, int root,
                                void* stream) {
  argcheck::buffer("broadcast", "buf", buf, count);
  argcheck::rank("broadcast", "root", root, size());
  const nccl::Api& api = *impl_->state->api;
  return impl_->issue({"broadcast", count, dtype, root}, stream,
                      [&](nccl::Comm c, nccl::Stream st) {
                        if (count == 0) return nccl::success;
                        return api.Broadcast(buf, buf, count, to_nccl(dtype), root, c, st);
                      });
}

WorkPtr Communicator::reduce(const void* send, void* recv, std::int64_t count, DType dtype,
                             ReduceOp op, int root, void* stream) {
  argcheck::rank("reduce", "root", root, size());
  argcheck::buffer("reduce", "send", send, count);
  if (rank() == root) argcheck::buffer("reduce", "recv", recv, count);  // unused elsewhere
  argcheck::reduction("reduce", op, dtype);
  const nccl::Api& api = *impl_->state->api;
  return impl_->issue({"reduce", count, dtype, root}, stream, [&](nccl::Comm c, nccl::Stream st) {
    if (count == 0) return nccl::success;
    return api.Reduce(send, recv, count, to_nccl(dtype), to_nccl(op, size()), root, c, st);
  });
}

namespace {
void check_peer(const char* op, int peer, int rank, int size, int group_depth) {
  argcheck::rank(op, "peer", peer, size);
  // NCCL matches a send to oneself with a recv of the same group; alone it never finishes.
  MEGALITH_EXPECTS(peer != rank || group_depth > 0, invalid_argument, op, ": peer ", peer,
                   " is this rank: a self ", op,
                   " needs its matching send/recv in the same group (group_start()/group_end())");
}
}  // namespace

WorkPtr Communicator::send(const void* buf, std::int64_t count, DType dtype, int peer,
                           void* stream) {
  argcheck::buffer("send", "buf", buf, count);
  check_peer("send", peer, rank(), size(), impl_->group_depth);
  const nccl::Api& api = *impl_->state->api;
  return impl_->issue({"send", count, dtype, peer}, stream, [&](nccl::Comm c, nccl::Stream st) {
    if (count == 0) return nccl::success;
    return api.Send(buf, count, to_nccl(dtype), peer, c, st);
  });
}

WorkPtr Communicator::recv(void* buf, std::int64_t count, DType dtype, int peer, void* stream) {
  argcheck::buffer("recv", "buf", buf, count);
  check_peer("recv", peer, rank(), size(), impl_->group_depth);
  const nccl::Api& api = *impl_->state->api;
  return impl_->issue({"recv", count, dtype, peer}, stream, [&](nccl::Comm c, nccl::Stream st) {
    if (count == 0) return nccl::success;
    return api.Recv(buf, count, to_nccl(dtype), peer, c, st);
  });
}

WorkPtr Communicator::all_to_all(const void* send, void* recv, std::int64_t count_per_rank,
                                 DType dtype, void* stream) {
  argcheck::buffer("all_to_all", "send", send, count_per_rank * size());
  argcheck::buffer("all_to_all", "recv", recv, count_per_rank * size());
  std::vector<std::int64_t> counts(size(), count_per_rank), displs(size());
  for (int r = 0; r < size(); ++r) displs[r] = count_per_rank * r;
  const nccl::Api& api = *impl_->state->api;
  const int n = size();
  return impl_->issue(
      {"all_to_all", count_per_rank * n, dtype}, stream, [&](nccl::Comm c, nccl::Stream st) {
        if (count_per_rank == 0) return nccl::success;
        return exchange(api, c, st, n, send, counts, displs, recv, counts, displs, dtype);
      });
}

WorkPtr Communicator::all_to_allv(const void* send, const std::vector<std::int64_t>& send_counts,
                                  const std::vector<std::int64_t>& send_displs, void* recv,
                                  const std::vector<std::int64_t>& recv_counts,
                                  const std::vector<std::int64_t>& recv_displs, DType dtype,
                                  void* stream) {
  const int n = size();
  std::int64_t send_extent =
      argcheck::splits("all_to_allv", "send_counts", send_counts, "send_displs", send_displs, n);
  std::int64_t recv_extent =
      argcheck::splits("all_to_allv", "recv_counts", recv_counts, "recv_displs", recv_displs, n);
  argcheck::buffer("all_to_allv", "send", send, send_extent);
  argcheck::buffer("all_to_allv", "recv", recv, recv_extent);
  const nccl::Api& api = *impl_->state->api;
  return impl_->issue({"all_to_allv", recv_extent, dtype}, stream,
                      [&](nccl::Comm c, nccl::Stream st) {
                        return exchange(api, c, st, n, send, send_counts, send_displs, recv,
                                        recv_counts, recv_displs, dtype);
                      });
}

WorkPtr Communicator::barrier(void* stream) {
  impl_->state->raise_if_failed();
  if (!impl_->barrier_buffer) {
    detail::DeviceGuard guard(device());
    MEGALITH_CUDA_TRY(cudaMalloc(&impl_->barrier_buffer, sizeof(float)));
    MEGALITH_CUDA_TRY(cudaMemset(impl_->barrier_buffer, 0, sizeof(float)));
  }
  void* b = impl_->barrier_buffer;
  const nccl::Api& api = *impl_->state->api;
  return impl_->issue({"barrier", 1, DType::f32}, stream, [&](nccl::Comm c, nccl::Stream st) {
    return api.AllReduce(b, b, 1, nccl::float32, nccl::sum, c, st);
  });
}

}  // namespace megalith::comm
