#pragma once
// The contract between cpu_step.cpp (validation, threading, dispatch) and
// cpu_kernels.cpp (compiled once per SIMD level, see cmake/MegalithSimd.cmake).
// Only plain structs and function pointers cross it: the per-level objects must
// not share inline functions or templates with the rest of the library, or the
// linker could hand AVX-512 code to a machine without it.

#include <cstdint>

#include "megalith/dtype.h"

namespace megalith::optim::cpu::detail {

/// A sub-range [begin, end) of one parameter's buffers (pointers are the
/// tensor bases; indices are elements).
struct Range {
  float* param;
  const void* grad;
  float* s0;
  float* s1;
  float* s2;
  void* copy;
  std::int64_t begin;
  std::int64_t end;
};

/// Per-step constants, derived once on the calling thread.
struct AdamConsts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / bias_correction1
  float inv_bc2_sqrt;  // 1 / sqrt(bias_correction2)
  float eps;
  float decay;         // 1 - lr*wd for AdamW, 1 otherwise
  float l2;            // wd for L2 Adam, 0 otherwise
  float grad_scale;    // includes the sign for maximize
  bool amsgrad;
};

struct SgdConsts {
  float lr, momentum, one_minus_dampening, weight_decay, grad_scale;
  bool has_momentum, first_step, nesterov;
};

struct LionConsts {
  float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, decay, grad_scale;
};

/// copy_dtype is -1 when the range has no param copy, else a DType value.
struct KernelTable {
  // Each returns true when it saw a non-finite scaled gradient (only when check).
  bool (*adam)(const Range&, const AdamConsts&, DType grad, int copy_dtype, bool check);
  bool (*sgd)(const Range&, const SgdConsts&, DType grad, int copy_dtype, bool check);
  bool (*lion)(const Range&, const LionConsts&, DType grad, int copy_dtype, bool check);
  // Adds sum((g*scale)^2) over [begin, end) to *sum_sq; returns true on inf/nan.
  bool (*grad_stats)(const void* grad, std::int64_t begin, std::int64_t end, DType grad_dtype,
                     float scale, double* sum_sq);
};

namespace scalar {
extern const KernelTable kKernels;
}
namespace avx2 {
extern const KernelTable kKernels;
}
namespace avx512 {
extern const KernelTable kKernels;
}

}  // namespace megalith::optim::cpu::detail
