#pragma once
// Small value types of the NCCL communicator: reduction operators and options.

#include <cstdint>
#include <string>

#include "megalith/dtype.h"
#include "megalith/export.h"

namespace megalith::comm {

/// Reduction of all_reduce / reduce_scatter / reduce (NCCL's built-in operators).
enum class ReduceOp : std::uint8_t { sum = 0, avg = 1, min = 2, max = 3, prod = 4 };

/// "sum", "avg", "min", "max", "prod".
MEGALITH_API const char* reduce_op_name(ReduceOp op);

/// Parses a name as reduce_op_name() writes it (also "mean" for avg, "product"
/// for prod); throws megalith::invalid_argument listing the accepted names.
MEGALITH_API ReduceOp reduce_op_from_name(const std::string& name);

/// avg needs a floating type (an integer mean would silently truncate); every
/// other operator works on every DType.
constexpr bool supports(ReduceOp op, DType t) {
  return op != ReduceOp::avg || t == DType::f32 || t == DType::f16 || t == DType::bf16 ||
         t == DType::f64;
}

/// Settings of one communicator.
struct Options {
  /// An operation that has not finished this many seconds after it was issued
  /// fails the communicator (see [Note: watchdog] in core/src/comm/watchdog.cu).
  /// Also bounds initialisation: every rank must join within it.
  double timeout_s = 600.0;
  /// Shown in every error ("all_reduce on 'dp' ..."); empty: "comm<N>", N
  /// counting the communicators this process made.
  std::string name;
};

}  // namespace megalith::comm
