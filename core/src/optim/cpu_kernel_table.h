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
  // lean formats only (see megalith/optim/slots.h)
  float* scale0 = nullptr;
  float* scale1 = nullptr;
  void* comp = nullptr;
  std::uint32_t slot = 0;  // index of the slot in the call: part of the rounding stream
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

/// Adam over lean state formats (cpu_lean_kernels.cpp). state_format and
/// master_format are StateFormat / MasterFormat values; sr_key mixes the seed
/// and the step (the stochastic-rounding stream). For q8 a range starts on a
/// block boundary of its slot and ends on one or at the slot's end.
struct LeanKernelTable {
  bool (*adam)(const Range&, const AdamConsts&, DType grad, int copy_dtype, int state_format,
               int master_format, std::uint32_t sr_key, bool check);
};

namespace scalar {
extern const KernelTable kKernels;
extern const LeanKernelTable kLeanKernels;
}
namespace avx2 {
extern const KernelTable kKernels;
extern const LeanKernelTable kLeanKernels;
}
namespace avx512 {
extern const KernelTable kKernels;
extern const LeanKernelTable kLeanKernels;
}

}  // namespace megalith::optim::cpu::detail
