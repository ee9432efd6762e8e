// Adam over lean state formats (bf16 with stochastic rounding, q8 block codes,
// bf16 Kahan masters) against a double-precision reference of the same rules
// ([Note: lean states] in megalith/optim/slots.h), at every SIMD level this CPU
// runs and at two thread counts; and the same bits whatever the thread split.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.h"
#include "megalith/cpu/simd_level.h"
#include "megalith/cpu/thread_pool.h"
#include "megalith/optim/cpu.h"

using megalith::DType;
using namespace megalith::optim;
using megalith::optim::cpu::adam_step;
namespace mcpu = megalith::cpu;

namespace {

std::mt19937_64 rng(2026);

// Sizes that end mid-block and mid-vector, and a total that splits over 3 threads.
const std::vector<std::int64_t> kSizes = {1000, 70001, 40037};

std::vector<float> randn(std::size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bf16(std::uint16_t h) { return from_bits(static_cast<std::uint32_t>(h) << 16); }
std::uint16_t to_bf16_rne(float f) {
  std::uint32_t u = to_bits(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// The documented stochastic-rounding stream, written out independently of the kernels.
std::uint32_t lowbias32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
std::uint32_t stream_bits(std::uint64_t seed, std::int64_t step, std::uint32_t slot,
                          std::int64_t i) {
  std::uint64_t z = seed + static_cast<std::uint64_t>(step) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  std::uint32_t key = static_cast<std::uint32_t>(z ^ (z >> 32));
  std::uint32_t base = lowbias32(key ^ (slot * 0x9e3779b9u));
  return lowbias32(base + static_cast<std::uint32_t>(i));
}
std::uint16_t sr_bf16(double x, std::uint32_t r16) {
  return static_cast<std::uint16_t>((to_bits(static_cast<float>(x)) + r16) >> 16);
}

struct Hyper {
  AdamHyper h;
  std::int64_t step = 7;
  Hyper() {
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
  }
  // One Adam update in double; m and v in/out.
  double update(double p, double g, double& m, double& v) const {
    p *= 1.0 - double(h.lr) * h.weight_decay;
    m = h.beta1 * m + (1.0 - double(h.beta1)) * g;
    v = h.beta2 * v + (1.0 - double(h.beta2)) * g * g;
    double bc1 = 1.0 - std::pow(double(h.beta1), double(step));
    double bc2 = 1.0 - std::pow(double(h.beta2), double(step));
    return p - double(h.lr) / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + h.eps);
  }
};

template <class Body>
void at_every_level(Body body) {
  for (auto level : mcpu::compiled_simd_levels()) {
    if (!mcpu::cpu_supports(level)) continue;
    mcpu::force_simd_level(level);
    for (int threads : {1, 3}) {
      mcpu::set_num_threads(threads);
      body();
    }
  }
  mcpu::reset_simd_level();
}

// ------------------------------------------------------------------ bf16 ----

struct Bf16Case {
  std::vector<std::vector<float>> p, g;
  std::vector<std::vector<std::uint16_t>> m, v;
  Bf16Case() {
    for (auto n : kSizes) {
      p.push_back(randn(n, 1.0f));
      g.push_back(randn(n, 1.0f));
      auto mf = randn(n, 0.1f), vf = randn(n, 0.1f);
      std::vector<std::uint16_t> mh(n), vh(n);
      for (std::int64_t i = 0; i < n; ++i) {
        mh[i] = to_bf16_rne(mf[i]);
        vh[i] = to_bf16_rne(vf[i] * vf[i]);
      }
      m.push_back(mh);
      v.push_back(vh);
    }
  }
  std::vector<ParamSlots> slots() {
    std::vector<ParamSlots> s(kSizes.size());
    for (std::size_t k = 0; k < s.size(); ++k) {
      s[k].param = p[k].data();
      s[k].grad = g[k].data();
      s[k].state[0] = reinterpret_cast<float*>(m[k].data());
      s[k].state[1] = reinterpret_cast<float*>(v[k].data());
      s[k].numel = kSizes[k];
    }
    return s;
  }
};

TEST(bf16_states_match_reference_with_the_same_stream) {
  at_every_level([] {
    Hyper hy;
    Bf16Case c;
    const Bf16Case before = c;
    StepArgs args;
    args.step = hy.step;
    args.state_format = StateFormat::bf16;
    args.seed = 99;
    auto slots = c.slots();
    adam_step(slots.data(), slots.size(), hy.h, args);
    std::int64_t total = 0, off_by_one = 0;
    for (std::size_t k = 0; k < kSizes.size(); ++k) {
      for (std::int64_t i = 0; i < kSizes[k]; ++i) {
        double m = from_bf16(before.m[k][i]), v = from_bf16(before.v[k][i]);
        double p = hy.update(before.p[k][i], before.g[k][i], m, v);
        std::uint32_t r = stream_bits(args.seed, args.step, static_cast<std::uint32_t>(k), i);
        std::uint16_t want_m = sr_bf16(m, r >> 16), want_v = sr_bf16(v, r & 0xffffu);
        // fp32 and fp64 m can straddle a rounding threshold: then one bf16 step apart.
        for (auto [got, want] : {std::pair{c.m[k][i], want_m}, std::pair{c.v[k][i], want_v}}) {
          int d = std::abs(int(got) - int(want));
          CHECK(d <= 1);
          off_by_one += d;
        }
        CHECK(std::fabs(c.p[k][i] - p) <= 2e-6 * std::fmax(1.0, std::fabs(p)));
        total += 2;
      }
    }
    CHECK(off_by_one * 1000 <= total);  // at most 0.1% straddle
  });
}

TEST(bf16_rounding_is_unbiased) {
  // v = 0, g constant: every element's exact new m is the same value between two bf16s.
  const std::int64_t n = 1 << 16;
  std::vector<float> p(n, 1.0f), g(n, 1.0f / 3.0f);
  std::vector<std::uint16_t> m(n, 0), v(n, 0);
  ParamSlots s;
  s.param = p.data();
  s.grad = g.data();
  s.state[0] = reinterpret_cast<float*>(m.data());
  s.state[1] = reinterpret_cast<float*>(v.data());
  s.numel = n;
  StepArgs args;
  args.state_format = StateFormat::bf16;
  AdamHyper h;
  adam_step(&s, 1, h, args);
  const float exact = (1.0f - 0.9f) * (1.0f / 3.0f);  // (1 - beta1) * g in fp32, as the kernel has it
  double lo = from_bf16(static_cast<std::uint16_t>(to_bits(exact) >> 16));
  double hi = from_bf16(static_cast<std::uint16_t>((to_bits(exact) >> 16) + 1));
  double mean = 0;
  for (auto x : m) {
    double f = from_bf16(x);
    CHECK(f == lo || f == hi);
    mean += f;
  }
  mean /= n;
  double q = (exact - lo) / (hi - lo);
  double se = (hi - lo) * std::sqrt(q * (1 - q) / n);
  CHECK(std::fabs(mean - exact) < 4 * se);
}

// -------------------------------------------------------------------- q8 ----

struct Q8Case {
  std::vector<std::vector<float>> p, g, ms, vs;  // ms, vs: scales
  std::vector<std::vector<std::int8_t>> mc;
  std::vector<std::vector<std::uint8_t>> vc;
  Q8Case() {
    std::uniform_int_distribution<int> code(-127, 127), ucode(0, 255);
    std::uniform_real_distribution<float> scale(0.01f, 0.2f);
    for (auto n : kSizes) {
      p.push_back(randn(n, 1.0f));
      g.push_back(randn(n, 1.0f));
      std::vector<std::int8_t> c(n);
      std::vector<std::uint8_t> q(n);
      for (auto& x : c) x = static_cast<std::int8_t>(code(rng));
      for (auto& x : q) x = static_cast<std::uint8_t>(ucode(rng));
      mc.push_back(c);
      vc.push_back(q);
      std::vector<float> a(q8_scale_count(n)), u(q8_scale_count(n));
      for (auto& x : a) x = scale(rng);
      for (auto& x : u) x = scale(rng);
      a.back() = 0.0f;  // an all-zero stored block decodes to zero
      ms.push_back(a);
      vs.push_back(u);
    }
  }
  std::vector<ParamSlots> slots() {
    std::vector<ParamSlots> s(kSizes.size());
    for (std::size_t k = 0; k < s.size(); ++k) {
      s[k].param = p[k].data();
      s[k].grad = g[k].data();
      s[k].state[0] = reinterpret_cast<float*>(mc[k].data());
      s[k].state[1] = reinterpret_cast<float*>(vc[k].data());
      s[k].state_scale[0] = ms[k].data();
      s[k].state_scale[1] = vs[k].data();
      s[k].numel = kSizes[k];
    }
    return s;
  }
};

// Checks a code against the rule applied in double: equal, or one apart where the
// double position sits within `tie` of a rounding boundary (fp32 may land either side).
bool code_ok(int got, double position, double tie) {
  double frac = position - std::floor(position);
  if (got == static_cast<int>(std::nearbyint(position))) return true;
  return std::fabs(frac - 0.5) < tie && std::fabs(got - position) < 0.5 + tie;
}

TEST(q8_states_match_reference) {
  at_every_level([] {
    Hyper hy;
    Q8Case c;
    const Q8Case before = c;
    StepArgs args;
    args.step = hy.step;
    args.state_format = StateFormat::q8;
    auto slots = c.slots();
    adam_step(slots.data(), slots.size(), hy.h, args);
    std::int64_t exact = 0, total = 0;
    for (std::size_t k = 0; k < kSizes.size(); ++k) {
      const std::int64_t n = kSizes[k];
      for (std::int64_t b = 0; b < q8_scale_count(n); ++b) {
        const std::int64_t lo = b * kQ8Block, hi = std::min(n, lo + kQ8Block);
        std::vector<double> m(hi - lo), v(hi - lo);
        double amax = 0, vmax = 0;
        for (std::int64_t i = lo; i < hi; ++i) {
          double cm = before.mc[k][i], q = before.vc[k][i];
          double mm = cm * std::fabs(cm) * before.ms[k][b] / 16129.0;
          double u = q * q * before.vs[k][b] / 65025.0;
          double vv = u * u;
          double p = hy.update(before.p[k][i], before.g[k][i], mm, vv);
          CHECK(std::fabs(c.p[k][i] - p) <= 2e-6 * std::fmax(1.0, std::fabs(p)));
          m[i - lo] = mm;
          v[i - lo] = vv;
          amax = std::fmax(amax, std::fabs(mm));
          vmax = std::fmax(vmax, vv);
        }
        const double umax = std::sqrt(vmax);
        CHECK_NEAR(c.ms[k][b], amax, 1e-5);
        CHECK_NEAR(c.vs[k][b], umax, 1e-5);
        for (std::int64_t i = lo; i < hi; ++i) {
          double pm = 127.0 * std::sqrt(std::fabs(m[i - lo]) / amax);
          double pv = 255.0 * std::sqrt(std::sqrt(v[i - lo]) / umax);
          int got_m = c.mc[k][i];
          CHECK(code_ok(std::abs(got_m), pm, 1e-3));
          CHECK(got_m == 0 || (got_m > 0) == (m[i - lo] > 0));
          CHECK(code_ok(c.vc[k][i], pv, 1e-3));
          exact += (std::abs(got_m) == std::nearbyint(pm)) + (c.vc[k][i] == std::nearbyint(pv));
          total += 2;
        }
      }
    }
    CHECK(exact * 1000 >= total * 999);  // bit-exact but for near-ties
  });
}

TEST(q8_bits_do_not_depend_on_the_thread_split) {
  for (auto level : mcpu::compiled_simd_levels()) {
    if (!mcpu::cpu_supports(level)) continue;
    mcpu::force_simd_level(level);
    Q8Case one;
    Q8Case three = one;
    StepArgs args;
    args.state_format = StateFormat::q8;
    Hyper hy;
    mcpu::set_num_threads(1);
    auto s1 = one.slots();
    adam_step(s1.data(), s1.size(), hy.h, args);
    mcpu::set_num_threads(3);
    auto s3 = three.slots();
    adam_step(s3.data(), s3.size(), hy.h, args);
    CHECK(one.mc == three.mc);
    CHECK(one.vc == three.vc);
    CHECK(one.ms == three.ms);
    CHECK(one.p == three.p);
  }
  mcpu::reset_simd_level();
}

// ------------------------------------------------------ bf16 Kahan master ----

TEST(bf16_kahan_master_matches_reference) {
  at_every_level([] {
    Hyper hy;
    const std::int64_t n = 50021;
    auto p32 = randn(n, 1.0f), g = randn(n, 1.0f), mf = randn(n, 0.1f), vf = randn(n, 0.1f);
    std::vector<std::uint16_t> hi(n), lo(n);
    std::vector<float> m(n), v(n);
    for (std::int64_t i = 0; i < n; ++i) {
      hi[i] = to_bf16_rne(p32[i]);
      lo[i] = to_bf16_rne(p32[i] - from_bf16(hi[i]));
      m[i] = mf[i];
      v[i] = vf[i] * vf[i];
    }
    const auto hi0 = hi, lo0 = lo;
    const auto m0 = m, v0 = v;
    ParamSlots s;
    s.param = reinterpret_cast<float*>(hi.data());
    s.param_comp = lo.data();
    s.grad = g.data();
    s.state[0] = m.data();
    s.state[1] = v.data();
    s.numel = n;
    StepArgs args;
    args.step = hy.step;
    args.master_format = MasterFormat::bf16_kahan;
    adam_step(&s, 1, hy.h, args);
    for (std::int64_t i = 0; i < n; ++i) {
      double mm = m0[i], vv = v0[i];
      double p = hy.update(double(from_bf16(hi0[i])) + from_bf16(lo0[i]), g[i], mm, vv);
      double got = double(from_bf16(hi[i])) + from_bf16(lo[i]);
      // hi + lo carries ~16 mantissa bits: far finer than bf16's 8.
      CHECK(std::fabs(got - p) <= 1e-5 * std::fmax(std::fabs(p), 1e-3));
      CHECK(std::fabs(m[i] - mm) <= 1e-6 * (std::fabs(m0[i]) + std::fabs(g[i])));
    }
  });
}

// ------------------------------------------------------------ validation ----

TEST(missing_lean_buffers_are_named) {
  std::vector<float> p(300), g(300);
  std::vector<std::int8_t> c(300);
  std::vector<std::uint8_t> q(300);
  ParamSlots s;
  s.param = p.data();
  s.grad = g.data();
  s.state[0] = reinterpret_cast<float*>(c.data());
  s.state[1] = reinterpret_cast<float*>(q.data());
  s.numel = 300;
  StepArgs args;
  args.state_format = StateFormat::q8;
  auto message = [&](const AdamHyper& h, const StepArgs& a) -> std::string {
    try {
      adam_step(&s, 1, h, a);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  CHECK(message(AdamHyper{}, args).find("state_scale[0]") != std::string::npos);
  CHECK(message(AdamHyper{}, args).find("2 fp32 scales") != std::string::npos);
  AdamHyper ams;
  ams.amsgrad = true;
  std::vector<float> vmax(300);
  s.state[2] = vmax.data();
  CHECK(message(ams, args).find("amsgrad") != std::string::npos);
  StepArgs kahan;
  kahan.master_format = MasterFormat::bf16_kahan;
  CHECK(message(AdamHyper{}, kahan).find("param_comp") != std::string::npos);
  CHECK_THROWS(megalith::optim::cpu::sgd_step(&s, 1, SgdHyper{}, args), std::invalid_argument);
}

}  // namespace

MEGALITH_TEST_MAIN()
