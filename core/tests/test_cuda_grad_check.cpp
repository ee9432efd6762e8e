// grad_check (fused unscale + inf/nan flag + sum of squares) against the
// host, over the mixed layout plus two 1M-element buffers, for every
// gradient dtype. Skips (exit 77) on machines without a CUDA device.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "harness.h"
#include "megalith/cuda/optim.h"

using namespace megalith_cuda_test;
using megalith::DType;
namespace gpu = megalith::optim::cuda;

namespace {

TEST(host_half_conversions_are_right) {
  require_gpu();  // needs no GPU, but the suite must exit 77 (skipped) without one
  CHECK(f16_bits(1.0f) == 0x3c00);
  CHECK(f16_bits(65504.0f) == 0x7bff);
  CHECK(f16_bits(65520.0f) == 0x7c00);
  CHECK(f16_bits(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(f16_bits(std::ldexp(1.0f, -25)) == 0x0000);         // tie to even (0)
  CHECK(f16_bits(std::ldexp(3.0f, -25)) == 0x0002);         // tie to even (2)
  CHECK(f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie to even
  CHECK(f16_bits(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);  // tie to even
  CHECK(f16_value(0x3555) == quantize(1.0f / 3.0f, DType::f16));
  CHECK(bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);  // tie to even
  CHECK(bf16_bits(1.0f + std::ldexp(3.0f, -8)) == 0x3f82);
  CHECK(bf16_value(bf16_bits(-2.5f)) == -2.5f);
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
      std::vector<float> got = decode(download<std::uint8_t>(cs.ptrs[k], n * dtype_size(t)), t);
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
    std::vector<float> again =
        decode(download<std::uint8_t>(cs.ptrs[probe], cs.values[probe].size() * dtype_size(t)), t);
    CHECK(again == cs.values[probe]);

    // An inf, then a nan, in different tensors (vector path and scalar path), each
    // found with and without sum_sq; found_inf only ever goes to 1.
    const float specials[] = {std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
    // (last element of an aligned tensor: the vector path's scalar tail)
    const std::size_t last = static_cast<std::size_t>(-1);
    const std::size_t where[][2] = {
        {cs.ptrs.size() - 2, 777777}, {3, 0}, {283, 99999}, {1, 5}, {cs.ptrs.size() - 2, last},
        {cs.ptrs.size() - 1, 4242}};
    for (float bad : specials) {
      for (auto& w : where) {
        const std::size_t k = w[0], i = std::min<std::size_t>(w[1], cs.values[k].size() - 1);
        std::vector<float> one = {bad};
        auto bytes = encode(one, t);
        void* dst = static_cast<char*>(cs.ptrs[k]) + i * dtype_size(t);
        CUDA_OK(cudaMemcpy(dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
        found.set(0.0f);
        gpu::grad_check(cs.ptrs.data(), cs.numels.data(), cs.ptrs.size(), t, inv.p, false, found.p,
                        (&w - where) % 2 ? nullptr : sum.p, nullptr);
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

}  // namespace

MEGALITH_TEST_MAIN()
