#pragma once
// An NCCL communicator over one GPU per rank. Every operation is asynchronous
// on the stream it is given (a cudaStream_t as void*; nullptr: the legacy
// default stream) and returns a Work. Counts are elements, not bytes.
//
// Failures: arguments are checked before anything reaches CUDA or NCCL
// (megalith::invalid_argument naming the op and argument). Every NCCL result is
// checked (megalith::error naming op, communicator, rank/size, count, dtype and
// NCCL's own text). A watchdog thread fails the communicator when an operation
// outlives Options::timeout_s or NCCL reports an asynchronous error; it aborts
// NCCL so blocked kernels return, and the next call raises that error.
//
// One thread at a time may issue operations on a communicator; the watchdog
// runs beside it. In a build without CUDA the constructor throws megalith::error.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megalith/comm/types.h"
#include "megalith/comm/work.h"
#include "megalith/dtype.h"
#include "megalith/export.h"

namespace megalith::comm {

class MEGALITH_API Communicator {
 public:
  /// Joins the communicator `unique_id` (from unique_id() on one rank) as
  /// `rank` of `world_size`, on CUDA device `device`. Blocks until every rank
  /// joined, or throws after options.timeout_s.
  Communicator(const std::vector<std::uint8_t>& unique_id, int world_size, int rank, int device,
               Options options = {});
  /// Lets issued operations finish (bounded by timeout_s through the watchdog), joins
  /// the watchdog and frees NCCL; aborts it instead when the communicator failed.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  using WorkPtr = std::shared_ptr<Work>;

  /// recv = op over ranks of send (count elements each); send == recv is in place.
  WorkPtr all_reduce(const void* send, void* recv, std::int64_t count, DType dtype, ReduceOp op,
                     void* stream);
  /// send holds recv_count * size() elements; rank r gets the reduction of block r.
  WorkPtr reduce_scatter(const void* send, void* recv, std::int64_t recv_count, DType dtype,
                         ReduceOp op, void* stream);
  /// recv (send_count * size() elements) gets every rank's send, in rank order.
  WorkPtr all_gather(const void* send, void* recv, std::int64_t send_count, DType dtype,
                     void* stream);
  /// buf of root is copied to buf of every rank.
  WorkPtr broadcast(void* buf, std::int64_t count, DType dtype, int root, void* stream);
  /// recv of root = op over ranks of send; recv is unused elsewhere (may be nullptr there).
  WorkPtr reduce(const void* send, void* recv, std::int64_t count, DType dtype, ReduceOp op,
                 int root, void* stream);
  /// Point to point: each send needs the matching recv on `peer` (same count and dtype).
  WorkPtr send(const void* buf, std::int64_t count, DType dtype, int peer, void* stream);
  WorkPtr recv(void* buf, std::int64_t count, DType dtype, int peer, void* stream);
  /// Block j of send (count_per_rank elements) goes to rank j; block i of recv comes from rank i.
  WorkPtr all_to_all(const void* send, void* recv, std::int64_t count_per_rank, DType dtype,
                     void* stream);
  /// Uneven all_to_all: send_counts[j] elements from send + send_displs[j] go to
  /// rank j; recv_counts[i] elements from rank i land at recv + recv_displs[i].
  /// Each vector has size() entries; send_counts[j] here must equal recv_counts[rank()] on j.
  WorkPtr all_to_allv(const void* send, const std::vector<std::int64_t>& send_counts,
                      const std::vector<std::int64_t>& send_displs, void* recv,
                      const std::vector<std::int64_t>& recv_counts,
                      const std::vector<std::int64_t>& recv_displs, DType dtype, void* stream);
  /// Completes when every rank reached it (a one-element all_reduce on `stream`).
  WorkPtr barrier(void* stream);

  /// Operations issued between group_start() and group_end() go out as one NCCL
  /// launch; their Works complete together after group_end(). Groups nest.
  void group_start();
  void group_end();

  /// Aborts NCCL now (unfinished operations are cancelled); every later call,
  /// and Work::synchronize() of unfinished work, raises naming this communicator.
  void abort();

  /// The error that failed this communicator (timeout, NCCL error, abort), if any.
  std::optional<std::string> error() const;

  int rank() const;
  int size() const;
  int device() const;
  const std::string& name() const;
  double timeout_s() const;

  struct Impl;  // core/src/comm/communicator_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace megalith::comm
