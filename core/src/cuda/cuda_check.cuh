#pragma once
// Checks for CUDA runtime calls and kernel launches: a failure becomes
// megalith::cuda_error carrying the call text, the CUDA error name and string,
// and file:line. The error is read with cudaGetLastError so a non-sticky
// failure does not leak into the next, unrelated check.

#include <cuda_runtime_api.h>

#include "megalith/error.h"

namespace megalith::cuda::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* what, const char* where) {
  throw ::megalith::cuda_error(::megalith::detail::concat(
      what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") [", where, "]"));
}

}  // namespace megalith::cuda::detail

/// MEGALITH_CUDA_TRY(cudaMemsetAsync(p, 0, n, s)): throws megalith::cuda_error on failure.
#define MEGALITH_CUDA_TRY(...)                                                     \
  do {                                                                             \
    cudaError_t megalith_cuda_err_ = (__VA_ARGS__);                                \
    if (megalith_cuda_err_ != cudaSuccess) {                                       \
      (void)cudaGetLastError();                                                    \
      ::megalith::cuda::detail::throw_cuda_error(megalith_cuda_err_, #__VA_ARGS__, \
                                                 MEGALITH_WHERE);                  \
    }                                                                              \
  } while (0)

/// After kernel<<<...>>>(...): reports a failed launch (bad configuration, too
/// large a parameter block, no kernel image for this GPU) naming the kernel.
#define MEGALITH_CUDA_CHECK_LAUNCH(kernel_name)                                              \
  do {                                                                                       \
    cudaError_t megalith_cuda_err_ = cudaGetLastError();                                     \
    if (megalith_cuda_err_ != cudaSuccess) {                                                 \
      ::megalith::cuda::detail::throw_cuda_error(                                            \
          megalith_cuda_err_, ::megalith::detail::concat("launch of ", kernel_name).c_str(), \
          MEGALITH_WHERE);                                                                   \
    }                                                                                        \
  } while (0)
