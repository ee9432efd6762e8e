#pragma once
// Validation of DLPack arrays passed to the engine's safe (flat-buffer) API.
// Every failure names the argument and what was expected.
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "megalith/dtype.h"

namespace megalith::bindings {

struct Buffer {
  const char* name;
  void* ptr;
  DType dtype;
  std::int64_t numel;
  int device_type;  // DLPack device type: 1 = CPU, 2 = CUDA
  int device_id;
};

/// Checks that `a` is C-contiguous with one of `allowed` dtypes (TypeError
/// otherwise) and returns its description.
Buffer as_buffer(const nanobind::ndarray<>& a, const char* name,
                 std::initializer_list<DType> allowed);

/// All buffers have the first one's element count and device, and no two overlap.
void check_same_layout(const std::vector<Buffer>& buffers);

}  // namespace megalith::bindings
