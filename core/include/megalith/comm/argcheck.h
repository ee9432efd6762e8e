#pragma once
// Argument checks of the NCCL communicator, run before any CUDA or NCCL call so
// a bad call fails on the rank that made it instead of hanging the others.
// Each throws megalith::invalid_argument naming the op and the argument, with
// the numbers (after NCCL's src/include/argcheck.h).

#include <cstdint>
#include <vector>

#include "megalith/comm/types.h"
#include "megalith/dtype.h"
#include "megalith/export.h"

namespace megalith::comm::argcheck {

/// count >= 0, and ptr != nullptr when count > 0.
MEGALITH_API void buffer(const char* op, const char* arg, const void* ptr, std::int64_t count);

/// 0 <= value < size (a peer or a root).
MEGALITH_API void rank(const char* op, const char* arg, int value, int size);

/// The operator is defined for the dtype (see supports()).
MEGALITH_API void reduction(const char* op, ReduceOp red, DType dtype);

/// counts/displs of all_to_allv: one entry per rank, none negative. Returns
/// the extent the buffer must cover: max over ranks of displ + count (0 if all empty).
MEGALITH_API std::int64_t splits(const char* op, const char* counts_arg,
                                 const std::vector<std::int64_t>& counts, const char* displs_arg,
                                 const std::vector<std::int64_t>& displs, int size);

/// Constructor arguments: a 128-byte id, 1 <= world_size, 0 <= rank < world_size,
/// device >= 0, timeout_s > 0.
MEGALITH_API void init(std::size_t unique_id_bytes, int world_size, int rank, int device,
                       double timeout_s);

}  // namespace megalith::comm::argcheck
