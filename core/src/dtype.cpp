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
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  if (name == "float32" || name == "f32" || name == "float") return DType::f32;
  if (name == "float16" || name == "f16" || name == "half") return DType::f16;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  MEGALITH_FAIL(invalid_argument, "unknown dtype '", name,
                "': expected one of float32/f32, float16/f16/half, bfloat16/bf16");
}

}  // namespace megalith
