// Argument checks and names of the communicator's value types. Pure C++: they
// run before any CUDA or NCCL call and are tested without a GPU.

#include "megalith/comm/argcheck.h"

#include <string>

#include "megalith/comm/nccl.h"
#include "megalith/comm/types.h"
#include "megalith/error.h"

namespace megalith::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::prod:
      return "prod";
  }
  return "unknown";
}

ReduceOp reduce_op_from_name(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "avg" || name == "mean") return ReduceOp::avg;
  if (name == "min") return ReduceOp::min;
  if (name == "max") return ReduceOp::max;
  if (name == "prod" || name == "product") return ReduceOp::prod;
  MEGALITH_FAIL(invalid_argument, "op: unknown reduction '", name,
                "': expected one of sum, avg (mean), min, max, prod (product)");
}

namespace argcheck {

void buffer(const char* op, const char* arg, const void* ptr, std::int64_t count) {
  MEGALITH_EXPECTS(count >= 0, invalid_argument, op, ": ", arg,
                   ": element count must be >= 0, got ", count);
  MEGALITH_EXPECTS(ptr != nullptr || count == 0, invalid_argument, op, ": ", arg,
                   " is a null pointer but holds ", count,
                   " elements (a non-empty buffer needs device memory)");
}

void rank(const char* op, const char* arg, int value, int size) {
  MEGALITH_EXPECTS(value >= 0 && value < size, invalid_argument, op, ": ", arg, " ", value,
                   " is not a rank of this communicator (ranks are 0..", size - 1, ")");
}

void reduction(const char* op, ReduceOp red, DType dtype) {
  MEGALITH_EXPECTS(supports(red, dtype), invalid_argument, op, ": op '", reduce_op_name(red),
                   "' is not defined for ", dtype_name(dtype),
                   " (an integer mean would truncate): use 'sum' and divide, or a float dtype");
}

std::int64_t splits(const char* op, const char* counts_arg, const std::vector<std::int64_t>& counts,
                    const char* displs_arg, const std::vector<std::int64_t>& displs, int size) {
  MEGALITH_EXPECTS(counts.size() == static_cast<std::size_t>(size), invalid_argument, op, ": ",
                   counts_arg, " needs one entry per rank (", size, "), got ", counts.size());
  MEGALITH_EXPECTS(displs.size() == static_cast<std::size_t>(size), invalid_argument, op, ": ",
                   displs_arg, " needs one entry per rank (", size, "), got ", displs.size());
  std::int64_t extent = 0;
  for (int r = 0; r < size; ++r) {
    MEGALITH_EXPECTS(counts[r] >= 0, invalid_argument, op, ": ", counts_arg, "[", r,
                     "] must be >= 0, got ", counts[r]);
    MEGALITH_EXPECTS(displs[r] >= 0, invalid_argument, op, ": ", displs_arg, "[", r,
                     "] must be >= 0, got ", displs[r]);
    if (counts[r] > 0 && displs[r] + counts[r] > extent) extent = displs[r] + counts[r];
  }
  return extent;
}

void init(std::size_t unique_id_bytes, int world_size, int rank_, int device, double timeout_s) {
  const char* op = "Communicator";
  MEGALITH_EXPECTS(unique_id_bytes == kUniqueIdBytes, invalid_argument, op,
                   ": unique_id must be the ", kUniqueIdBytes,
                   " bytes nccl_unique_id() returned on one rank, got ", unique_id_bytes, " bytes");
  MEGALITH_EXPECTS(world_size >= 1, invalid_argument, op, ": world_size must be >= 1, got ",
                   world_size);
  MEGALITH_EXPECTS(rank_ >= 0 && rank_ < world_size, invalid_argument, op, ": rank ", rank_,
                   " is outside 0..", world_size - 1, " (world_size ", world_size, ")");
  MEGALITH_EXPECTS(device >= 0, invalid_argument, op,
                   ": device must be a CUDA device index >= 0, got ", device);
  MEGALITH_EXPECTS(timeout_s > 0.0, invalid_argument, op, ": timeout_s must be > 0, got ",
                   timeout_s);
}

}  // namespace argcheck
}  // namespace megalith::comm
