#pragma once
// Plumbing of the CUDA tests: device buffers with plain cudaMalloc, host
// bf16/f16 rounding (the reference for copies and quantised gradients),
// tolerance checks, and the tensor layouts every case runs over.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.h"
#include "megalith/cuda/device.h"
#include "megalith/dtype.h"
#include "megalith/error.h"

namespace megalith_cuda_test {

using megalith::DType;
using megalith::dtype_name;
using megalith::dtype_size;

// ------------------------------------------------------------------ plumbing

#define CUDA_OK(call)                                                                        \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_) + " at " + \
                               __FILE__ + ":" + std::to_string(__LINE__));                   \
    }                                                                                        \
  } while (0)

inline void require_gpu() {
  if (megalith::cuda::device_count() == 0) SKIP("no CUDA device: " + megalith::cuda::status());
}

/// One cudaMalloc carved into sub-buffers; `misalign` shifts a sub-buffer by
/// one element so that it is not 16-byte aligned.
class Arena {
 public:
  explicit Arena(std::size_t bytes) : size_(bytes + 4096) { CUDA_OK(cudaMalloc(&base_, size_)); }
  ~Arena() { cudaFree(base_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* take(std::size_t bytes, std::size_t elem, bool misalign) {
    used_ = (used_ + 255) / 256 * 256 + (misalign ? elem : 0);
    if (used_ + bytes > size_) throw std::runtime_error("test arena too small");
    void* p = static_cast<char*>(base_) + used_;
    used_ += bytes;
    return p;
  }

 private:
  void* base_ = nullptr;
  std::size_t size_;
  std::size_t used_ = 0;
};

template <typename T>
inline void upload(void* dst, const std::vector<T>& src) {
  CUDA_OK(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
inline std::vector<T> download(const void* src, std::size_t n) {
  std::vector<T> out(n);
  CUDA_OK(cudaMemcpy(out.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

/// A device float holding one value (DeviceScalars members).
struct DevFloat {
  float* p = nullptr;
  explicit DevFloat(float v) {
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&p), sizeof(float)));
    set(v);
  }
  ~DevFloat() { cudaFree(p); }
  DevFloat(const DevFloat&) = delete;
  DevFloat& operator=(const DevFloat&) = delete;
  void set(float v) { CUDA_OK(cudaMemcpy(p, &v, sizeof v, cudaMemcpyHostToDevice)); }
  float get() const {
    float v;
    CUDA_OK(cudaMemcpy(&v, p, sizeof v, cudaMemcpyDeviceToHost));
    return v;
  }
};

// ------------------------------------------------- 16-bit floats on the host

inline std::uint16_t bf16_bits(float f) {  // round to nearest even
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_value(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t f16_bits(float f) {  // round to nearest even, subnormals and overflow included
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24
    float a;
    std::memcpy(&a, &ax, 4);
    return static_cast<std::uint16_t>(sign |
                                      static_cast<std::uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  const std::uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u;
  return static_cast<std::uint16_t>(sign | (r >> 13));
}
inline float f16_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -24);
  } else if (e == 31) {
    v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    v = std::ldexp(static_cast<float>(m | 0x400), e - 25);
  }
  return (h & 0x8000) ? -v : v;
}

/// Rounds to `t` and back: the value a buffer of that dtype holds.
inline float quantize(float x, DType t) {
  if (t == DType::bf16) return bf16_value(bf16_bits(x));
  if (t == DType::f16) return f16_value(f16_bits(x));
  return x;
}

/// Host bytes of `v` in dtype `t` (each value already representable, or rounded).
inline std::vector<std::uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<std::uint8_t> out(v.size() * dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[4 * i], &v[i], 4);
    } else {
      std::uint16_t h = t == DType::bf16 ? bf16_bits(v[i]) : f16_bits(v[i]);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}
inline std::vector<float> decode(const std::vector<std::uint8_t>& b, DType t) {
  const std::size_t n = b.size() / dtype_size(t);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[i], &b[4 * i], 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, &b[2 * i], 2);
      out[i] = t == DType::bf16 ? bf16_value(h) : f16_value(h);
    }
  }
  return out;
}

// Host conversion self-check on values whose rounding is known.
// ------------------------------------------------------------- comparisons

/// |got - want| <= rtol*|want| + atol_frac*max|want| + extra[i], reporting
/// the worst element. One CHECK per buffer.
inline void expect_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<double>& want, double rtol, double atol_frac,
                         const std::vector<double>* extra = nullptr) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double tol = rtol * std::fabs(want[i]) + atol_frac * scale + (extra ? (*extra)[i] : 0.0);
    double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= tol)) {
      ++bad;
      double ratio = tol > 0 ? err / tol : std::numeric_limits<double>::infinity();
      if (!(ratio <= worst_ratio)) {
        worst_ratio = ratio;
        worst = i;
      }
    }
  }
  if (bad) {
    std::printf("  %s: %zu of %zu elements off; worst [%zu] got %.9g want %.9g\n", what.c_str(),
                bad, got.size(), worst, static_cast<double>(got[worst]), want[worst]);
  }
  CHECK(bad == 0);
}

template <class F>
inline void expect_throw_with(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const megalith::invalid_argument& e) {
    if (std::string(e.what()).find(needle) == std::string::npos) {
      std::printf("  message \"%s\" lacks \"%s\"\n", e.what(), needle.c_str());
      CHECK(false);
    }
    return;
  }
  std::printf("  expected megalith::invalid_argument containing \"%s\"\n", needle.c_str());
  CHECK(false);
}

// ---------------------------------------------------------------- layouts

struct Tensor {
  std::int64_t numel;
  unsigned misalign;  // bits: 1 param, 2 grad, 4 state0, 8 state1, 16 state2, 32 copy
  bool copy;
};

inline std::vector<Tensor> single(std::int64_t n, unsigned misalign = 0) {
  return {{n, misalign, true}};
}

/// 333 tensors (two launch groups) of mixed sizes, a few empty, some at odd
/// offsets, some with and some without a param copy.
inline std::vector<Tensor> mixed_list() {
  std::mt19937 r(7);
  std::uniform_int_distribution<int> small(1, 3000);
  const std::int64_t special[] = {1,    2,     3,     4,     5,     255,   1024,  4096,
                                  4099, 16383, 16384, 16385, 32768, 65541, 100003};
  std::vector<Tensor> out;
  for (int i = 0; i < 333; ++i) {
    Tensor t{};
    if (i % 50 == 7) {
      t.numel = 0;
    } else if (i % 20 == 3) {
      t.numel = special[(i / 20) % 15];
    } else {
      t.numel = small(r);
    }
    if (i % 7 == 3) t.misalign |= 1;
    if (i % 11 == 4) t.misalign |= 2;
    if (i % 13 == 6) t.misalign |= 4;
    if (i % 17 == 8) t.misalign |= 8;
    if (i % 19 == 9) t.misalign |= 16;
    if (i % 23 == 10) t.misalign |= 32;
    if (i == 283) t.misalign = 63;  // 100003 elements, every buffer off
    t.copy = i % 3 != 0;
    out.push_back(t);
  }
  return out;
}

inline const DType kGradTypes[] = {DType::f32, DType::bf16, DType::f16};

}  // namespace megalith_cuda_test
