#pragma once
// Element types that cross into the engine. Buffers are (pointer, dtype, count).

#include <cstddef>
#include <cstdint>
#include <string>

#include "megalith/export.h"

namespace megalith {

/// Floating types come first: the optimizers take f32/f16/bf16; collectives take all.
enum class DType : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2, f64 = 3, i8 = 4, u8 = 5, i32 = 6, i64 = 7 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::i8:
    case DType::u8:
      return 1;
    default:
      return 4;
  }
}

/// True for the gradient/copy types of the fused optimizers.
constexpr bool is_optimizer_float(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

MEGALITH_API const char* dtype_name(DType t);

/// Parses "float32"/"f32", "float16"/"f16"/"half", "bfloat16"/"bf16", "float64"/"f64",
/// "int8", "uint8", "int32", "int64"; throws
/// megalith::invalid_argument naming the accepted spellings otherwise.
MEGALITH_API DType dtype_from_name(const std::string& name);

}  // namespace megalith
