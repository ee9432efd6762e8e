// CUDA optimizer steps and grad_check against a double-precision host
// reference, with torch.optim's semantics. Every case runs a few steps on
// fresh random gradients over single tensors of awkward sizes and over a list
// of ~330 tensors of mixed sizes (more than one launch group; empty slots;
// sub-buffers at odd offsets, which take the scalar path), for every gradient
// dtype and copy dtype. Skips (exit 77) on machines without a CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.h"
#include "megalith/cuda/device.h"
#include "megalith/cuda/optim.h"
#include "megalith/error.h"

using namespace megalith;
using namespace megalith::optim;
namespace gpu = megalith::optim::cuda;

namespace {

// ------------------------------------------------------------------ plumbing

#define CUDA_OK(call)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_) + " at " \
                               + __FILE__ + ":" + std::to_string(__LINE__));             \
    }                                                                                    \
  } while (0)

void require_gpu() {
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
void upload(void* dst, const std::vector<T>& src) {
  CUDA_OK(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
std::vector<T> download(const void* src, std::size_t n) {
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

std::uint16_t bf16_bits(float f) {  // round to nearest even
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float bf16_value(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t f16_bits(float f) {  // round to nearest even, subnormals and overflow included
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24
    float a;
    std::memcpy(&a, &ax, 4);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  const std::uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u;
  return static_cast<std::uint16_t>(sign | (r >> 13));
}
float f16_value(std::uint16_t h) {
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
float quantize(float x, DType t) {
  if (t == DType::bf16) return bf16_value(bf16_bits(x));
  if (t == DType::f16) return f16_value(f16_bits(x));
  return x;
}

/// Host bytes of `v` in dtype `t` (each value already representable, or rounded).
std::vector<std::uint8_t> encode(const std::vector<float>& v, DType t) {
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
std::vector<float> decode(const std::vector<std::uint8_t>& b, DType t) {
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
TEST(host_half_conversions_are_right) {
  require_gpu();  // needs no GPU, but the suite must exit 77 (skipped) without one
  CHECK(f16_bits(1.0f) == 0x3c00);
  CHECK(f16_bits(65504.0f) == 0x7bff);
  CHECK(f16_bits(65520.0f) == 0x7c00);
  CHECK(f16_bits(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(f16_bits(std::ldexp(1.0f, -25)) == 0x0000);          // tie to even (0)
  CHECK(f16_bits(std::ldexp(3.0f, -25)) == 0x0002);          // tie to even (2)
  CHECK(f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);   // tie to even
  CHECK(f16_bits(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);   // tie to even
  CHECK(f16_value(0x3555) == quantize(1.0f / 3.0f, DType::f16));
  CHECK(bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);   // tie to even
  CHECK(bf16_bits(1.0f + std::ldexp(3.0f, -8)) == 0x3f82);
  CHECK(bf16_value(bf16_bits(-2.5f)) == -2.5f);
}

// ------------------------------------------------------------- comparisons

/// |got - want| <= rtol*|want| + atol_frac*max|want| + extra[i], reporting
/// the worst element. One CHECK per buffer.
void expect_close(const std::string& what, const std::vector<float>& got,
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
void expect_throw_with(F&& f, const std::string& needle) {
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

std::vector<Tensor> single(std::int64_t n, unsigned misalign = 0) { return {{n, misalign, true}}; }

/// 333 tensors (two launch groups) of mixed sizes, a few empty, some at odd
/// offsets, some with and some without a param copy.
std::vector<Tensor> mixed_list() {
  std::mt19937 r(7);
  std::uniform_int_distribution<int> small(1, 3000);
  const std::int64_t special[] = {1, 2, 3, 4, 5, 255, 1024, 4096, 4099, 16383, 16384, 16385,
                                  32768, 65541, 100003};
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

// ------------------------------------------------------------------ cases

enum class Kind { adam, sgd, lion };

struct Config {
  std::string name;
  Kind kind = Kind::adam;
  AdamHyper adam{};
  SgdHyper sgd{};
  LionHyper lion{};
  DType grad = DType::f32;
  DType copy = DType::bf16;
  bool copies = true;
  float grad_std = 1.0f;     // gradients ~ N(0, grad_std), then rounded to `grad`
  float grad_scale = 1.0f;   // StepArgs::grad_scale
  float inv_scale = 0.0f;    // DeviceScalars::inv_scale when > 0
  float max_norm = 0.0f;     // clipping when > 0 (grad_sum_sq from the host)
  int steps = 3;
  bool own_stream = false;
};

int states_of(const Config& c) {
  switch (c.kind) {
    case Kind::adam:
      return c.adam.amsgrad ? 3 : 2;
    case Kind::sgd:
      return c.sgd.momentum != 0.0f ? 1 : 0;
    case Kind::lion:
      return 1;
  }
  return 0;
}

const char* kind_name(Kind k) { return k == Kind::adam ? "Adam" : k == Kind::sgd ? "SGD" : "Lion"; }

/// Elements whose gradient is always exactly 0 and whose state starts at 0:
/// they pin sign(0) = 0 for Lion and the eps floor for Adam.
bool zero_lane(std::int64_t i) { return i % 13 == 5; }

/// One problem: device buffers, the host reference in double, and a step loop.
class Problem {
 public:
  Problem(const Config& c, std::vector<Tensor> layout)
      : c_(c), layout_(std::move(layout)), rng_(1234 + layout_.size()) {
    std::size_t total = 0;
    for (auto& t : layout_) total += static_cast<std::size_t>(t.numel);
    const std::size_t per = total * 4 + layout_.size() * 512;
    arena_ = std::make_unique<Arena>(per * 6);
    const int ns = states_of(c_);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    // States sized like the effective gradient the step will see.
    const float eff = c_.grad_std * (c_.inv_scale > 0 ? c_.inv_scale : 1.0f) * c_.grad_scale;
    for (std::size_t k = 0; k < layout_.size(); ++k) {
      const Tensor& t = layout_[k];
      const std::size_t n = static_cast<std::size_t>(t.numel);
      Buffers b;
      if (n > 0) {
        b.param = static_cast<float*>(arena_->take(n * 4, 4, t.misalign & 1));
        b.grad = arena_->take(n * dtype_size(c_.grad), dtype_size(c_.grad), t.misalign & 2);
        for (int s = 0; s < ns; ++s) {
          b.state[s] = static_cast<float*>(arena_->take(n * 4, 4, t.misalign & (4u << s)));
        }
        if (c_.copies && t.copy) {
          b.copy = arena_->take(n * dtype_size(c_.copy), dtype_size(c_.copy), t.misalign & 32);
        }
      }
      // Initial values: p ~ N(0,1); states of the right sign and size.
      std::vector<float> p(n), s[3];
      for (auto& x : p) x = n01(rng_);
      for (int s_i = 0; s_i < ns; ++s_i) s[s_i].resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        const bool z = zero_lane(static_cast<std::int64_t>(i));
        const float m = z ? 0.0f : 0.1f * n01(rng_) * eff;
        const float v = z ? 0.0f : 0.01f * std::fabs(n01(rng_)) * eff * eff;
        if (c_.kind == Kind::adam) {
          s[0][i] = m;
          s[1][i] = v;
          if (ns > 2) s[2][i] = z ? 0.0f : v * (0.5f + std::fabs(n01(rng_)));
        } else if (ns > 0) {
          // SGD: garbage before step 1 (torch ignores it); Lion: exp_avg.
          s[0][i] = c_.kind == Kind::sgd ? 1e3f * n01(rng_) : m;
        }
      }
      if (n > 0) {
        upload(b.param, p);
        for (int s_i = 0; s_i < ns; ++s_i) upload(b.state[s_i], s[s_i]);
        if (b.copy) CUDA_OK(cudaMemset(b.copy, 0xff, n * dtype_size(c_.copy)));
      }
      Ref r;
      r.p.assign(p.begin(), p.end());
      for (int s_i = 0; s_i < ns; ++s_i) r.s[s_i].assign(s[s_i].begin(), s[s_i].end());
      r.extra.assign(n, 0.0);
      bufs_.push_back(b);
      ref_.push_back(std::move(r));
      ParamSlots slot;
      slot.param = b.param;
      slot.grad = b.grad;
      for (int s_i = 0; s_i < 3; ++s_i) slot.state[s_i] = b.state[s_i];
      slot.param_copy = b.copy;
      slot.numel = t.numel;
      slots_.push_back(slot);
    }
    if (c_.own_stream) CUDA_OK(cudaStreamCreate(&stream_));
  }
  ~Problem() {
    if (stream_) cudaStreamDestroy(stream_);
  }

  const std::vector<ParamSlots>& slots() const { return slots_; }

  /// Draws fresh gradients, runs the GPU step `step` and the reference.
  /// With skip, *found_inf = 1: the GPU must change nothing, the reference does nothing.
  void step(int step, bool skip = false) {
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<std::vector<double>> g(layout_.size());
    double sum_sq = 0;  // of the unscaled gradients, for clipping
    const double inv = c_.inv_scale > 0 ? c_.inv_scale : 1.0;
    for (std::size_t k = 0; k < layout_.size(); ++k) {
      const std::size_t n = static_cast<std::size_t>(layout_[k].numel);
      std::vector<float> gf(n);
      for (std::size_t i = 0; i < n; ++i) {
        gf[i] = zero_lane(static_cast<std::int64_t>(i)) ? 0.0f
                                                        : quantize(c_.grad_std * n01(rng_), c_.grad);
      }
      if (n > 0) upload(const_cast<void*>(bufs_[k].grad), encode(gf, c_.grad));
      g[k].assign(gf.begin(), gf.end());
      for (double x : g[k]) sum_sq += (x * inv) * (x * inv);
    }
    DevFloat found(skip ? 1.0f : 0.0f), inv_scale(c_.inv_scale),
        grad_sum_sq(static_cast<float>(sum_sq));
    gpu::DeviceScalars dev;
    dev.found_inf = found.p;
    if (c_.inv_scale > 0) dev.inv_scale = inv_scale.p;
    if (c_.max_norm > 0) {
      dev.grad_sum_sq = grad_sum_sq.p;
      dev.max_grad_norm = c_.max_norm;
    }
    StepArgs args;
    args.grad_dtype = c_.grad;
    args.copy_dtype = c_.copy;
    args.grad_scale = c_.grad_scale;
    args.step = step;
    switch (c_.kind) {
      case Kind::adam:
        gpu::adam_step(slots_.data(), slots_.size(), c_.adam, args, dev, stream_);
        break;
      case Kind::sgd:
        gpu::sgd_step(slots_.data(), slots_.size(), c_.sgd, args, dev, stream_);
        break;
      case Kind::lion:
        gpu::lion_step(slots_.data(), slots_.size(), c_.lion, args, dev, stream_);
        break;
    }
    CUDA_OK(cudaStreamSynchronize(stream_));
    CUDA_OK(cudaGetLastError());
    if (skip) return;

    double k = static_cast<double>(c_.grad_scale) * inv;
    if (c_.max_norm > 0) {
      const double norm = std::sqrt(static_cast<double>(static_cast<float>(sum_sq)));
      k *= std::min(1.0, static_cast<double>(c_.max_norm) / (norm + 1e-6));
    }
    for (std::size_t t = 0; t < layout_.size(); ++t) reference(ref_[t], g[t], k, step);
  }

  /// Compares every buffer with the reference; copies must be the rounded param exactly.
  void verify(const std::string& when = "") {
    const int ns = states_of(c_);
    static const char* const names[3] = {"state0", "state1", "state2"};
    std::vector<float> p_all, s_all[3];
    std::vector<double> rp_all, rs_all[3], extra_all;
    std::size_t copy_bad = 0, copies = 0;
    for (std::size_t k = 0; k < layout_.size(); ++k) {
      const std::size_t n = static_cast<std::size_t>(layout_[k].numel);
      if (n == 0) continue;
      std::vector<float> p = download<float>(bufs_[k].param, n);
      p_all.insert(p_all.end(), p.begin(), p.end());
      rp_all.insert(rp_all.end(), ref_[k].p.begin(), ref_[k].p.end());
      extra_all.insert(extra_all.end(), ref_[k].extra.begin(), ref_[k].extra.end());
      for (int s = 0; s < ns; ++s) {
        std::vector<float> v = download<float>(bufs_[k].state[s], n);
        s_all[s].insert(s_all[s].end(), v.begin(), v.end());
        rs_all[s].insert(rs_all[s].end(), ref_[k].s[s].begin(), ref_[k].s[s].end());
      }
      if (bufs_[k].copy) {
        std::vector<float> cp = decode(
            download<std::uint8_t>(bufs_[k].copy, n * dtype_size(c_.copy)), c_.copy);
        for (std::size_t i = 0; i < n; ++i) {
          ++copies;
          const float want = quantize(p[i], c_.copy);
          if (std::memcmp(&cp[i], &want, 4) != 0) {
            if (copy_bad++ == 0) {
              std::printf("  %s copy tensor %zu [%zu]: got %.9g want %.9g\n", c_.name.c_str(), k, i,
                          static_cast<double>(cp[i]), static_cast<double>(want));
            }
          }
        }
      }
    }
    const std::string tag = c_.name + when;
    expect_close(tag + " param", p_all, rp_all, 2e-5, 2e-6, &extra_all);
    for (int s = 0; s < ns; ++s) expect_close(tag + " " + names[s], s_all[s], rs_all[s], 2e-5, 2e-6);
    if (copy_bad) std::printf("  %s: %zu of %zu copies wrong\n", tag.c_str(), copy_bad, copies);
    CHECK(copy_bad == 0);
    if (c_.copies) CHECK(copies > 0);
  }

  /// Bit-exact snapshot of every buffer the step may write.
  std::vector<std::uint8_t> snapshot() const {
    std::vector<std::uint8_t> out;
    const int ns = states_of(c_);
    for (std::size_t k = 0; k < layout_.size(); ++k) {
      const std::size_t n = static_cast<std::size_t>(layout_[k].numel);
      if (n == 0) continue;
      auto add = [&](const void* p, std::size_t bytes) {
        auto v = download<std::uint8_t>(p, bytes);
        out.insert(out.end(), v.begin(), v.end());
      };
      add(bufs_[k].param, n * 4);
      for (int s = 0; s < ns; ++s) add(bufs_[k].state[s], n * 4);
      if (bufs_[k].copy) add(bufs_[k].copy, n * dtype_size(c_.copy));
    }
    return out;
  }

 private:
  struct Buffers {
    float* param = nullptr;
    const void* grad = nullptr;
    float* state[3] = {nullptr, nullptr, nullptr};
    void* copy = nullptr;
  };
  struct Ref {
    std::vector<double> p, s[3];
    std::vector<double> extra;  // tolerance for Lion elements whose sign(c) is a rounding call
  };

  void reference(Ref& r, const std::vector<double>& g_in, double k, int step) {
    const std::size_t n = r.p.size();
    if (c_.kind == Kind::adam) {
      const AdamHyper& h = c_.adam;
      const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, wd = h.weight_decay, eps = h.eps;
      const double bc1 = h.bias_correction ? 1.0 - std::pow(b1, step) : 1.0;
      const double bc2 = h.bias_correction ? 1.0 - std::pow(b2, step) : 1.0;
      for (std::size_t i = 0; i < n; ++i) {
        double g = g_in[i] * k;
        if (h.maximize) g = -g;
        if (h.decoupled_weight_decay) {
          r.p[i] *= 1.0 - lr * wd;
        } else {
          g += wd * r.p[i];
        }
        r.s[0][i] = b1 * r.s[0][i] + (1.0 - b1) * g;
        r.s[1][i] = b2 * r.s[1][i] + (1.0 - b2) * g * g;
        double vhat = r.s[1][i];
        if (h.amsgrad) {
          r.s[2][i] = std::max(r.s[2][i], r.s[1][i]);
          vhat = r.s[2][i];
        }
        const double denom = std::sqrt(vhat) / std::sqrt(bc2) + eps;
        r.p[i] -= lr / bc1 * r.s[0][i] / denom;
      }
    } else if (c_.kind == Kind::sgd) {
      const SgdHyper& h = c_.sgd;
      const double mu = h.momentum, damp = h.dampening, lr = h.lr, wd = h.weight_decay;
      for (std::size_t i = 0; i < n; ++i) {
        double g = g_in[i] * k;
        if (h.maximize) g = -g;
        g += wd * r.p[i];
        if (mu != 0.0) {
          double& buf = r.s[0][i];
          buf = step == 1 ? g : mu * buf + (1.0 - damp) * g;
          g = h.nesterov ? g + mu * buf : buf;
        }
        r.p[i] -= lr * g;
      }
    } else {
      const LionHyper& h = c_.lion;
      const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, wd = h.weight_decay;
      for (std::size_t i = 0; i < n; ++i) {
        double g = g_in[i] * k;
        if (h.maximize) g = -g;
        r.p[i] *= 1.0 - lr * wd;
        r.extra[i] *= 1.0 - lr * wd;
        const double a = b1 * r.s[0][i], b = (1.0 - b1) * g, c = a + b;
        // fp32 may round c to the other side of 0 when |c| is tiny against its terms.
        if (std::fabs(c) < 1e-5 * (std::fabs(a) + std::fabs(b))) r.extra[i] += 2.0 * lr;
        r.p[i] -= lr * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
        r.s[0][i] = b2 * r.s[0][i] + (1.0 - b2) * g;
      }
    }
  }

  Config c_;
  std::vector<Tensor> layout_;
  std::mt19937 rng_;
  std::unique_ptr<Arena> arena_;
  std::vector<Buffers> bufs_;
  std::vector<Ref> ref_;
  std::vector<ParamSlots> slots_;
  cudaStream_t stream_ = nullptr;
};

void run(const Config& c, const std::vector<Tensor>& layout, const std::string& tag = "") {
  Config named = c;
  named.name = c.name + tag;
  Problem pb(named, layout);
  for (int s = 1; s <= c.steps; ++s) pb.step(s);
  pb.verify();
}

const DType kGradTypes[] = {DType::f32, DType::bf16, DType::f16};
const DType kCopyTypes[] = {DType::bf16, DType::f16, DType::f32};

Config adamw() {
  Config c;
  c.name = "AdamW";
  c.adam.lr = 1e-2f;
  c.adam.beta1 = 0.9f;
  c.adam.beta2 = 0.95f;
  c.adam.eps = 1e-3f;  // large enough that a missing or misplaced eps shows
  c.adam.weight_decay = 0.1f;
  return c;
}

std::string dtypes_tag(const Config& c) {
  return std::string(" grad=") + dtype_name(c.grad) +
         (c.copies ? std::string(" copy=") + dtype_name(c.copy) : std::string(" no copy"));
}

/// Every grad dtype x copy dtype (and no copy) on the mixed list.
void all_dtypes(Config c) {
  for (DType g : kGradTypes) {
    c.grad = g;
    c.copies = false;
    run(c, mixed_list(), dtypes_tag(c));
    c.copies = true;
    for (DType cp : kCopyTypes) {
      c.copy = cp;
      run(c, mixed_list(), dtypes_tag(c));
    }
  }
}

// ------------------------------------------------------------------- tests

TEST(device_reports) {
  CHECK(megalith::cuda::compiled());
  const int n = megalith::cuda::device_count();
  const std::string s = megalith::cuda::status();
  std::printf("  cuda status: %s\n", s.c_str());
  if (n > 0) {
    CHECK(s.rfind(std::to_string(n) + " device(s): ", 0) == 0);
    CHECK(s.find("(sm_") != std::string::npos);
  } else {
    CHECK(s.rfind("no ", 0) == 0);
  }
  require_gpu();
}

TEST(adamw_single_tensor_sizes) {
  require_gpu();
  Config c = adamw();
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1023},
                         std::int64_t{(1 << 20) + 3}}) {
    run(c, single(n), " n=" + std::to_string(n));
    run(c, single(n, 63), " misaligned n=" + std::to_string(n));
  }
  c.steps = 5;
  c.grad = DType::bf16;
  run(c, single((1 << 20) + 3), " 5 steps bf16 grads");
}

TEST(adamw_every_dtype_mixed_list) {
  require_gpu();
  all_dtypes(adamw());
}

TEST(adam_options) {
  require_gpu();
  Config c = adamw();
  c.name = "Adam L2";
  c.adam.decoupled_weight_decay = false;
  c.adam.weight_decay = 0.05f;
  c.grad = DType::bf16;
  run(c, mixed_list());

  c = adamw();
  c.name = "AdamW amsgrad";
  c.adam.amsgrad = true;
  c.steps = 4;
  all_dtypes(c);

  c = adamw();
  c.name = "Adam L2 amsgrad maximize";
  c.adam.amsgrad = true;
  c.adam.decoupled_weight_decay = false;
  c.adam.maximize = true;
  c.grad = DType::f16;
  c.copy = DType::f16;
  run(c, mixed_list());

  c = adamw();
  c.name = "AdamW no bias correction";
  c.adam.bias_correction = false;
  c.copy = DType::f32;
  run(c, mixed_list());

  c = adamw();
  c.name = "AdamW maximize";
  c.adam.maximize = true;
  run(c, mixed_list());

  c = adamw();
  c.name = "Adam wd=0 eps=1e-8 torch defaults";
  c.adam = AdamHyper{};
  c.adam.weight_decay = 0.0f;
  c.steps = 4;
  run(c, mixed_list());
  run(c, single((1 << 20) + 3));

  c = adamw();
  c.name = "AdamW late step";  // bias corrections near 1
  c.steps = 2;
  {
    Problem pb(c, mixed_list());
    pb.step(1000);
    pb.step(1001);
    pb.verify();
  }
}

TEST(sgd_variants) {
  require_gpu();
  Config base;
  base.kind = Kind::sgd;
  base.sgd.lr = 0.05f;

  Config c = base;
  c.name = "SGD plain";
  all_dtypes(c);

  c = base;
  c.name = "SGD momentum dampening wd";
  c.sgd.momentum = 0.9f;
  c.sgd.dampening = 0.1f;
  c.sgd.weight_decay = 0.01f;
  c.steps = 4;
  all_dtypes(c);

  c = base;
  c.name = "SGD nesterov wd";
  c.sgd.momentum = 0.8f;
  c.sgd.nesterov = true;
  c.sgd.weight_decay = 0.02f;
  c.grad = DType::bf16;
  run(c, mixed_list());
  run(c, single((1 << 20) + 3, 2));

  c = base;
  c.name = "SGD momentum maximize";
  c.sgd.momentum = 0.5f;
  c.sgd.maximize = true;
  c.grad = DType::f16;
  c.copy = DType::f16;
  run(c, mixed_list());

  c = base;
  c.name = "SGD wd maximize no momentum";
  c.sgd.weight_decay = 0.1f;
  c.sgd.maximize = true;
  run(c, single(1023));
}

TEST(sgd_momentum_buffer_starts_at_step_one_only) {
  require_gpu();
  // Step 3 first: the (garbage) buffer must be used, not overwritten.
  Config c;
  c.kind = Kind::sgd;
  c.name = "SGD resumed at step 3";
  c.sgd.lr = 0.05f;
  c.sgd.momentum = 0.9f;
  c.sgd.dampening = 0.25f;
  Problem pb(c, mixed_list());
  pb.step(3);
  pb.step(4);
  pb.verify();
}

TEST(lion_variants) {
  require_gpu();
  Config c;
  c.kind = Kind::lion;
  c.name = "Lion";
  c.lion.lr = 1e-3f;
  c.lion.weight_decay = 0.1f;
  c.steps = 4;
  all_dtypes(c);

  c.name = "Lion maximize";
  c.lion.maximize = true;
  c.lion.beta1 = 0.95f;
  c.lion.beta2 = 0.98f;
  c.grad = DType::bf16;
  run(c, mixed_list());
  run(c, single((1 << 20) + 3));
}

TEST(found_inf_skips_the_step) {
  require_gpu();
  Config a = adamw();
  a.adam.amsgrad = true;
  Config s;
  s.kind = Kind::sgd;
  s.sgd.momentum = 0.9f;
  s.sgd.lr = 0.1f;
  Config l;
  l.kind = Kind::lion;
  l.lion.weight_decay = 0.1f;
  for (Config c : {a, s, l}) {
    c.name = std::string(kind_name(c.kind)) + " found_inf";
    c.grad = DType::f16;
    Problem pb(c, mixed_list());
    pb.step(1);
    const auto before = pb.snapshot();
    pb.step(2, /*skip=*/true);
    const auto after = pb.snapshot();
    CHECK(before == after);
    pb.step(2);  // the same step number again, now taken
    pb.verify();
  }
  {
    // A skipped first step leaves the copies untouched (still the 0xff fill).
    Config c = adamw();
    c.name = "AdamW found_inf at step 1";
    Problem pb(c, single(4099));
    const auto before = pb.snapshot();
    pb.step(1, /*skip=*/true);
    CHECK(before == pb.snapshot());
    pb.step(1);
    pb.verify();
  }
}

TEST(inv_scale_grad_scale_and_clipping) {
  require_gpu();
  for (Kind kind : {Kind::adam, Kind::sgd, Kind::lion}) {
    Config c = adamw();
    c.kind = kind;
    c.sgd.lr = 0.05f;
    c.sgd.momentum = 0.9f;
    c.name = std::string(kind_name(kind)) + " inv_scale 1/1024, grad_scale 0.5, f16";
    c.grad = DType::f16;
    c.grad_std = 1024.0f;  // as a loss-scaled fp16 gradient
    c.inv_scale = 1.0f / 1024.0f;
    c.grad_scale = 0.5f;
    run(c, mixed_list());

    c.name = std::string(kind_name(kind)) + " clipped (active)";
    c.max_norm = 10.0f;  // sum of ~7e5 unit gradients: norm ~420, so clip ~0.05
    run(c, mixed_list());

    c.name = std::string(kind_name(kind)) + " clipped (inactive)";
    c.max_norm = 1e6f;
    c.grad = DType::f32;
    run(c, mixed_list());
  }
}

TEST(own_stream) {
  require_gpu();
  Config c = adamw();
  c.name = "AdamW on a created stream";
  c.own_stream = true;
  run(c, mixed_list());
}

TEST(invalid_arguments_are_named) {
  require_gpu();
  Config c = adamw();
  c.adam.amsgrad = true;
  Problem pb(c, mixed_list());
  pb.step(1);  // real gradients in the buffers: the valid calls below do run
  std::vector<ParamSlots> slots = pb.slots();
  const AdamHyper h = c.adam;
  StepArgs args;
  gpu::DeviceScalars dev;
  auto adam = [&](const std::vector<ParamSlots>& s, const AdamHyper& hh, const StepArgs& a,
                  const gpu::DeviceScalars& d) {
    gpu::adam_step(s.data(), s.size(), hh, a, d, nullptr);
  };

  auto bad = slots;
  bad[3].state[1] = nullptr;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 3: exp_avg_sq (state[1]) is null");
  bad = slots;
  bad[5].state[2] = nullptr;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 5: max_exp_avg_sq (state[2])");
  bad = slots;
  bad[2].param = nullptr;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 2: param is null");
  bad = slots;
  bad[4].grad = nullptr;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 4: grad is null");
  bad = slots;
  bad[6].numel = -5;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 6: numel is -5");
  bad = slots;
  bad[8] = ParamSlots{};  // an empty slot needs no buffers
  adam(bad, h, args, dev);
  CUDA_OK(cudaDeviceSynchronize());

  StepArgs a2 = args;
  a2.nonfinite = NonFinite::skip;
  expect_throw_with([&] { adam(slots, h, a2, dev); }, "grad_check");
  a2 = args;
  a2.step = 0;
  expect_throw_with([&] { adam(slots, h, a2, dev); }, "step is 0");
  gpu::DeviceScalars d2;
  d2.max_grad_norm = 1.0f;
  expect_throw_with([&] { adam(slots, h, args, d2); }, "grad_sum_sq is null");
  ParamSlots* none = nullptr;
  expect_throw_with([&] { gpu::adam_step(none, 3, h, args, dev, nullptr); }, "slots is null");

  SgdHyper sh;
  sh.momentum = 0.9f;
  bad = slots;
  bad[11].state[0] = nullptr;
  expect_throw_with([&] { gpu::sgd_step(bad.data(), bad.size(), sh, args, dev, nullptr); },
                    "slot 11: momentum_buffer (state[0]) is null");
  sh.momentum = 0.0f;  // no buffer needed then
  gpu::sgd_step(bad.data(), bad.size(), sh, args, dev, nullptr);
  sh.nesterov = true;
  expect_throw_with([&] { gpu::sgd_step(slots.data(), slots.size(), sh, args, dev, nullptr); },
                    "nesterov");
  LionHyper lh;
  bad = slots;
  bad[9].state[0] = nullptr;
  expect_throw_with([&] { gpu::lion_step(bad.data(), bad.size(), lh, args, dev, nullptr); },
                    "slot 9: exp_avg (state[0]) is null");
  CUDA_OK(cudaDeviceSynchronize());

  float* f = nullptr;
  std::int64_t n = 4;
  void* g = slots[0].param;
  expect_throw_with(
      [&] { gpu::grad_check(&g, &n, 1, DType::f32, nullptr, false, f, nullptr, nullptr); },
      "found_inf is null");
}

// --------------------------------------------------------------- grad_check

struct CheckSet {
  std::vector<Tensor> layout;
  std::unique_ptr<Arena> arena;
  std::vector<void*> ptrs;
  std::vector<std::int64_t> numels;
  std::vector<std::vector<float>> values;  // what the buffers hold
};

CheckSet make_check_set(DType t, float std_dev, std::uint32_t seed) {
  CheckSet cs;
  cs.layout = mixed_list();
  cs.layout.push_back({(1 << 20) + 3, 0, false});
  cs.layout.push_back({(1 << 20) + 1, 2, false});
  std::size_t total = 0;
  for (auto& x : cs.layout) total += static_cast<std::size_t>(x.numel);
  cs.arena = std::make_unique<Arena>(total * 4 + cs.layout.size() * 512);
  std::mt19937 r(seed);
  std::normal_distribution<float> n01(0.0f, std_dev);
  for (auto& x : cs.layout) {
    const std::size_t n = static_cast<std::size_t>(x.numel);
    std::vector<float> v(n);
    for (auto& e : v) e = quantize(n01(r), t);
    void* p = n ? cs.arena->take(n * dtype_size(t), dtype_size(t), x.misalign & 2) : nullptr;
    if (n) upload(p, encode(v, t));
    cs.ptrs.push_back(p);
    cs.numels.push_back(x.numel);
    cs.values.push_back(std::move(v));
  }
  return cs;
}

TEST(grad_check_sum_sq_unscale_and_flags) {
  require_gpu();
  for (DType t : kGradTypes) {
    const std::string tag = std::string("grad_check ") + dtype_name(t);
    CheckSet cs = make_check_set(t, 8.0f, 99);
    DevFloat found(0.0f), sum(0.0f), inv(0.3f);

    // Pass 1: unscale in place by 0.3.
    gpu::grad_check(cs.ptrs.data(), cs.numels.data(), cs.ptrs.size(), t, inv.p, true, found.p,
                    sum.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    double want = 0;
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < cs.ptrs.size(); ++k) {
      const std::size_t n = cs.values[k].size();
      if (n == 0) continue;
      std::vector<float> got =
          decode(download<std::uint8_t>(cs.ptrs[k], n * dtype_size(t)), t);
      for (std::size_t i = 0; i < n; ++i) {
        const float x = cs.values[k][i] * 0.3f;  // fp32 product, as on the device
        want += static_cast<double>(x) * x;
        cs.values[k][i] = quantize(x, t);
        if (std::memcmp(&got[i], &cs.values[k][i], 4) != 0 && wrong++ == 0) {
          std::printf("  %s: tensor %zu [%zu] unscaled to %.9g, want %.9g\n", tag.c_str(), k, i,
                      static_cast<double>(got[i]), static_cast<double>(cs.values[k][i]));
        }
      }
    }
    CHECK(wrong == 0);
    CHECK(found.get() == 0.0f);
    CHECK_NEAR(sum.get(), want, 1e-5);

    // Pass 2: no unscale, no inv_scale: adds the sum of squares of what is there now.
    double want2 = 0;
    for (auto& v : cs.values) {
      for (float x : v) want2 += static_cast<double>(x) * x;
    }
    gpu::grad_check(cs.ptrs.data(), cs.numels.data(), cs.ptrs.size(), t, nullptr, true, found.p,
                    sum.p, nullptr);
    CHECK(found.get() == 0.0f);
    CHECK_NEAR(sum.get(), want + want2, 1e-5);

    // Pass 3: inv_scale given but not in place: sum of (g*inv)^2, buffers unchanged.
    sum.set(0.0f);
    DevFloat two(2.0f);
    gpu::grad_check(cs.ptrs.data(), cs.numels.data(), cs.ptrs.size(), t, two.p, false, found.p,
                    sum.p, nullptr);
    CHECK_NEAR(sum.get(), 4.0 * want2, 1e-5);
    const std::size_t probe = 283;  // 100003 elements, misaligned
    std::vector<float> again = decode(
        download<std::uint8_t>(cs.ptrs[probe], cs.values[probe].size() * dtype_size(t)), t);
    CHECK(again == cs.values[probe]);

    // An inf, then a nan, in different tensors (vector path and scalar path), each
    // found with and without sum_sq; found_inf only ever goes to 1.
    const float specials[] = {std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
    const std::size_t where[][2] = {{cs.ptrs.size() - 2, 777777}, {3, 0}, {283, 99999}, {1, 5}};
    for (float bad : specials) {
      for (auto& w : where) {
        const std::size_t k = w[0], i = std::min<std::size_t>(w[1], cs.values[k].size() - 1);
        std::vector<float> one = {bad};
        auto bytes = encode(one, t);
        void* dst = static_cast<char*>(cs.ptrs[k]) + i * dtype_size(t);
        CUDA_OK(cudaMemcpy(dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
        found.set(0.0f);
        gpu::grad_check(cs.ptrs.data(), cs.numels.data(), cs.ptrs.size(), t, inv.p, false,
                        found.p, (&w - where) % 2 ? nullptr : sum.p, nullptr);
        if (found.get() != 1.0f) {
          std::printf("  %s: %g at tensor %zu [%zu] not found\n", tag.c_str(),
                      static_cast<double>(bad), k, i);
        }
        CHECK(found.get() == 1.0f);
        std::vector<float> orig = {cs.values[k][i]};
        auto ob = encode(orig, t);
        CUDA_OK(cudaMemcpy(dst, ob.data(), ob.size(), cudaMemcpyHostToDevice));
      }
    }
    // All clean again: the flag stays as the caller left it (1 here).
    gpu::grad_check(cs.ptrs.data(), cs.numels.data(), cs.ptrs.size(), t, inv.p, false, found.p,
                    nullptr, nullptr);
    CHECK(found.get() == 1.0f);
    found.set(0.0f);
    gpu::grad_check(cs.ptrs.data(), cs.numels.data(), cs.ptrs.size(), t, inv.p, false, found.p,
                    nullptr, nullptr);
    CHECK(found.get() == 0.0f);
  }
}

TEST(grad_check_flag_skips_the_next_step) {
  require_gpu();
  // The intended pipeline: grad_check -> adam_step reading found_inf and
  // grad_sum_sq on the device, with no host sync in between. An inf that
  // grad_check finds must leave every buffer of the step untouched.
  Config c = adamw();
  c.name = "grad_check -> AdamW";
  c.grad = DType::bf16;
  Problem pb(c, mixed_list());
  std::vector<void*> grads;
  std::vector<std::int64_t> numels;
  for (auto& s : pb.slots()) {
    grads.push_back(const_cast<void*>(s.grad));
    numels.push_back(s.numel);
  }
  pb.step(1);
  std::vector<float> inf = {std::numeric_limits<float>::infinity()};
  auto bytes = encode(inf, DType::bf16);
  CUDA_OK(cudaMemcpy(grads[10], bytes.data(), 2, cudaMemcpyHostToDevice));
  DevFloat found(0.0f), sum(0.0f);
  gpu::grad_check(grads.data(), numels.data(), grads.size(), DType::bf16, nullptr, false, found.p,
                  sum.p, nullptr);
  gpu::DeviceScalars dev;
  dev.found_inf = found.p;
  dev.grad_sum_sq = sum.p;
  dev.max_grad_norm = 1.0f;
  StepArgs args;
  args.grad_dtype = DType::bf16;
  args.step = 2;
  const auto before = pb.snapshot();
  gpu::adam_step(pb.slots().data(), pb.slots().size(), c.adam, args, dev, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(found.get() == 1.0f);
  CHECK(before == pb.snapshot());
}

}  // namespace

MEGALITH_TEST_MAIN()
