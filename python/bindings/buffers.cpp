#include "buffers.h"

#include <algorithm>
#include <string>

#include "megalith/error.h"

namespace nb = nanobind;

namespace megalith::bindings {
namespace {

std::optional<DType> dtype_of(const nb::ndarray<>& a) {
  nb::dlpack::dtype t = a.dtype();
  if (t.lanes != 1) return std::nullopt;
  if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 32) return DType::f32;
  if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 16) return DType::f16;
  if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) return DType::bf16;
  if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 64) return DType::f64;
  if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int)) {
    if (t.bits == 8) return DType::i8;
    if (t.bits == 32) return DType::i32;
    if (t.bits == 64) return DType::i64;
  }
  if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt) && t.bits == 8) return DType::u8;
  return std::nullopt;
}

std::string describe(const nb::ndarray<>& a) {
  nb::dlpack::dtype t = a.dtype();
  const char* kind = t.code == 0 ? "int" : t.code == 1 ? "uint" : t.code == 2 ? "float" : t.code == 4 ? "bfloat" : "other";
  return std::string(kind) + std::to_string(t.bits);
}

const char* device_name(int type) { return type == 1 ? "cpu" : type == 2 ? "cuda" : "another device"; }

}  // namespace

Buffer as_buffer(const nb::ndarray<>& a, const char* name, std::initializer_list<DType> allowed) {
  std::optional<DType> dt = dtype_of(a);
  bool ok = dt && std::find(allowed.begin(), allowed.end(), *dt) != allowed.end();
  if (!ok) {
    std::string want;
    for (DType d : allowed) want += std::string(want.empty() ? "" : " or ") + dtype_name(d);
    MEGALITH_FAIL(type_error, name, ": expected dtype ", want, ", got ", describe(a));
  }
  std::int64_t expected_stride = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1) {
      MEGALITH_EXPECTS(a.stride(d) == expected_stride, invalid_argument, name,
                       ": expected a contiguous array, got strides that skip elements"
                       " (call .contiguous() first)");
    }
    expected_stride *= static_cast<std::int64_t>(a.shape(d));
  }
  int type = a.device_type();
  MEGALITH_EXPECTS(type == nb::device::cpu::value || type == nb::device::cuda::value,
                   invalid_argument, name, ": expected a CPU or CUDA array, got ",
                   device_name(type));
  return Buffer{name, a.data(), *dt, static_cast<std::int64_t>(a.size()), type, a.device_id()};
}

void check_same_layout(const std::vector<Buffer>& bufs) {
  const Buffer& ref = bufs.front();
  for (const Buffer& b : bufs) {
    MEGALITH_EXPECTS(b.numel == ref.numel, invalid_argument, b.name, ": expected ", ref.numel,
                     " elements like ", ref.name, ", got ", b.numel);
    MEGALITH_EXPECTS(b.device_type == ref.device_type && b.device_id == ref.device_id,
                     invalid_argument, b.name, ": expected the device of ", ref.name, " (",
                     device_name(ref.device_type), ":", ref.device_id, "), got ",
                     device_name(b.device_type), ":", b.device_id);
  }
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    for (std::size_t j = i + 1; j < bufs.size(); ++j) {
      auto lo1 = reinterpret_cast<std::uintptr_t>(bufs[i].ptr);
      auto lo2 = reinterpret_cast<std::uintptr_t>(bufs[j].ptr);
      auto hi1 = lo1 + bufs[i].numel * dtype_size(bufs[i].dtype);
      auto hi2 = lo2 + bufs[j].numel * dtype_size(bufs[j].dtype);
      MEGALITH_EXPECTS(bufs[i].numel == 0 || hi1 <= lo2 || hi2 <= lo1, invalid_argument,
                       bufs[i].name, " and ", bufs[j].name,
                       " overlap in memory; each buffer must be distinct");
    }
  }
}

}  // namespace megalith::bindings
