#pragma once
// Element types that cross into the engine. Buffers are (pointer, dtype, count).

#include <cstddef>
#include <cstdint>
#include <string>

#include "megalith/export.h"

namespace megalith {

enum class DType : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2 };

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

MEGALITH_API const char* dtype_name(DType t);

/// Parses "float32"/"f32", "float16"/"f16"/"half", "bfloat16"/"bf16"; throws
/// megalith::invalid_argument naming the accepted spellings otherwise.
MEGALITH_API DType dtype_from_name(const std::string& name);

}  // namespace megalith
