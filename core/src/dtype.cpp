#include "megalith/dtype.h"

#include "megalith/error.h"

namespace megalith {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
    case DType::f64:
      return "float64";
    case DType::i8:
      return "int8";
    case DType::u8:
      return "uint8";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  if (name == "float32" || name == "f32" || name == "float") return DType::f32;
  if (name == "float16" || name == "f16" || name == "half") return DType::f16;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  if (name == "float64" || name == "f64" || name == "double") return DType::f64;
  if (name == "int8") return DType::i8;
  if (name == "uint8") return DType::u8;
  if (name == "int32") return DType::i32;
  if (name == "int64") return DType::i64;
  MEGALITH_FAIL(invalid_argument, "unknown dtype '", name,
                "': expected one of float32/f32, float16/f16/half, bfloat16/bf16, float64, int8, "
                "uint8, int32, int64");
}

}  // namespace megalith
