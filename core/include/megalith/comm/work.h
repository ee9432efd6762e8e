#pragma once
// The handle of one asynchronous communicator operation.

#include <string>

#include "megalith/export.h"

namespace megalith::comm {

/// Returned by every Communicator operation. The operation is ordered on the
/// stream it was issued on; a CUDA event recorded after it (at group_end() for
/// operations issued inside a group) marks its completion.
class MEGALITH_API Work {
 public:
  virtual ~Work() = default;

  /// Makes `stream` (a cudaStream_t as void*, nullptr: the legacy default
  /// stream of the communicator's device) wait for the operation, on the device:
  /// the host does not block.
  virtual void wait(void* stream) = 0;

  /// Blocks the host until the operation finished. Throws megalith::error when
  /// the communicator failed first (timeout, NCCL error, abort) with that text,
  /// and megalith::invalid_argument inside an unfinished group.
  virtual void synchronize() = 0;

  /// Whether the operation finished; throws like synchronize() when it cannot
  /// finish because the communicator failed.
  virtual bool is_completed() = 0;

  /// "all_reduce on 'dp' (rank 1 of 2, 1048576 x float32)".
  virtual std::string describe() const = 0;
};

}  // namespace megalith::comm
