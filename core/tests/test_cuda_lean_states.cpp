// The CUDA Adam step over lean state formats against the host step (which
// test_cpu_lean_states checks against a double reference of the same rules):
// the same inputs through both, the same rounding stream, so bf16 states and q8
// codes agree but for values that straddle a rounding threshold between the two
// fp32 evaluation orders. Skips (exit 77) on machines without a CUDA device.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "harness.h"
#include "megalith/cuda/optim.h"
#include "megalith/optim/cpu.h"

using namespace megalith_cuda_test;
using namespace megalith::optim;

namespace {

std::mt19937_64 rng(7);
const std::vector<std::int64_t> kSizes = {1000, 70001, 257};

template <class T>
struct Pair {  // one buffer on the host and its device twin
  std::vector<T> host;
  T* dev = nullptr;
  explicit Pair(std::vector<T> h) : host(std::move(h)) {
    void* raw = nullptr;
    CUDA_OK(cudaMalloc(&raw, host.size() * sizeof(T) + 1));
    dev = static_cast<T*>(raw);
    CUDA_OK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Pair() { cudaFree(dev); }
  Pair(Pair&& o) noexcept : host(std::move(o.host)), dev(o.dev) { o.dev = nullptr; }
  std::vector<T> fetch() const {
    std::vector<T> out(host.size());
    CUDA_OK(cudaMemcpy(out.data(), dev, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

template <class T, class Gen>
std::vector<T> fill(std::int64_t n, Gen gen) {
  std::vector<T> v(n);
  for (auto& x : v) x = gen();
  return v;
}

float normal(float s) { return std::normal_distribution<float>(0.0f, s)(rng); }

std::uint16_t bf16_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// Counts elements further apart than one code (or one bf16 step) and those one apart.
template <class T>
void compare_codes(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  std::size_t apart = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    int d = std::abs(int(a[i]) - int(b[i]));
    if (d > 1) {
      std::printf("  %s[%zu]: %d vs %d\n", what.c_str(), i, int(a[i]), int(b[i]));
      CHECK(false);
      return;
    }
    apart += d;
  }
  CHECK(apart * 500 <= a.size());
}

float bf16_value(std::uint16_t h) {
  std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// bf16 states: as compare_codes, but a moment that cancels to near zero may land on
// another bf16 value where the kernels' reciprocals differ by an ulp; such an element
// counts as equal when the values agree to 1e-6 of the tensor's largest.
void compare_bf16(const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b,
                  const std::string& what) {
  float largest = 0.0f;
  for (auto h : a) largest = std::fmax(largest, std::fabs(bf16_value(h)));
  std::vector<std::uint16_t> near(b);
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(bf16_value(a[i]) - bf16_value(b[i])) <= 1e-6f * largest) near[i] = a[i];
  }
  compare_codes(a, near, what);
}

void compare_params(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(std::fabs(a[i] - b[i]) <= 2e-6f * std::fmax(1.0f, std::fabs(a[i])));
  }
}

AdamHyper hyper() {
  AdamHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  return h;
}

void run_both(std::vector<ParamSlots>& host, std::vector<ParamSlots>& dev, const StepArgs& args) {
  cpu::adam_step(host.data(), host.size(), hyper(), args);
  cuda::adam_step(dev.data(), dev.size(), hyper(), args, cuda::DeviceScalars{}, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace

TEST(cuda_bf16_states_match_host) {
  require_gpu();
  std::vector<Pair<float>> p, g;
  std::vector<Pair<std::uint16_t>> m, v;
  for (auto n : kSizes) {
    p.emplace_back(fill<float>(n, [] { return normal(1.0f); }));
    g.emplace_back(fill<float>(n, [] { return normal(1.0f); }));
    m.emplace_back(fill<std::uint16_t>(n, [] { return bf16_of(normal(0.1f)); }));
    v.emplace_back(fill<std::uint16_t>(n, [] { float x = normal(0.1f); return bf16_of(x * x); }));
  }
  std::vector<ParamSlots> hs(kSizes.size()), ds(kSizes.size());
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    hs[k] = {p[k].host.data(), g[k].host.data(),
             {reinterpret_cast<float*>(m[k].host.data()), reinterpret_cast<float*>(v[k].host.data()), nullptr},
             nullptr, kSizes[k]};
    ds[k] = {p[k].dev, g[k].dev, {reinterpret_cast<float*>(m[k].dev), reinterpret_cast<float*>(v[k].dev), nullptr},
             nullptr, kSizes[k]};
  }
  StepArgs args;
  args.step = 5;
  args.seed = 11;
  args.state_format = StateFormat::bf16;
  run_both(hs, ds, args);
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    compare_params(p[k].host, p[k].fetch());
    compare_bf16(m[k].host, m[k].fetch(), "exp_avg");
    compare_bf16(v[k].host, v[k].fetch(), "exp_avg_sq");
  }
}

TEST(cuda_q8_states_match_host) {
  require_gpu();
  std::uniform_int_distribution<int> code(-127, 127), ucode(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 0.2f);
  std::vector<Pair<float>> p, g, a, u;
  std::vector<Pair<std::int8_t>> mc;
  std::vector<Pair<std::uint8_t>> vc;
  for (auto n : kSizes) {
    p.emplace_back(fill<float>(n, [] { return normal(1.0f); }));
    g.emplace_back(fill<float>(n, [] { return normal(1.0f); }));
    mc.emplace_back(fill<std::int8_t>(n, [&] { return static_cast<std::int8_t>(code(rng)); }));
    vc.emplace_back(fill<std::uint8_t>(n, [&] { return static_cast<std::uint8_t>(ucode(rng)); }));
    a.emplace_back(fill<float>(q8_scale_count(n), [&] { return scale(rng); }));
    u.emplace_back(fill<float>(q8_scale_count(n), [&] { return scale(rng); }));
  }
  std::vector<ParamSlots> hs(kSizes.size()), ds(kSizes.size());
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    hs[k].param = p[k].host.data();
    hs[k].grad = g[k].host.data();
    hs[k].state[0] = reinterpret_cast<float*>(mc[k].host.data());
    hs[k].state[1] = reinterpret_cast<float*>(vc[k].host.data());
    hs[k].state_scale[0] = a[k].host.data();
    hs[k].state_scale[1] = u[k].host.data();
    hs[k].numel = kSizes[k];
    ds[k] = hs[k];
    ds[k].param = p[k].dev;
    ds[k].grad = g[k].dev;
    ds[k].state[0] = reinterpret_cast<float*>(mc[k].dev);
    ds[k].state[1] = reinterpret_cast<float*>(vc[k].dev);
    ds[k].state_scale[0] = a[k].dev;
    ds[k].state_scale[1] = u[k].dev;
  }
  StepArgs args;
  args.step = 5;
  args.state_format = StateFormat::q8;
  run_both(hs, ds, args);
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    compare_params(p[k].host, p[k].fetch());
    compare_codes(mc[k].host, mc[k].fetch(), "exp_avg codes");
    compare_codes(vc[k].host, vc[k].fetch(), "exp_avg_sq codes");
    auto da = a[k].fetch(), du = u[k].fetch();
    for (std::size_t b = 0; b < da.size(); ++b) {
      CHECK_NEAR(da[b], a[k].host[b], 1e-5);
      CHECK_NEAR(du[b], u[k].host[b], 1e-5);
    }
  }
}

TEST(cuda_kahan_master_matches_host) {
  require_gpu();
  const std::int64_t n = 50021;
  auto p32 = fill<float>(n, [] { return normal(1.0f); });
  std::vector<std::uint16_t> hi(n), lo(n);
  for (std::int64_t i = 0; i < n; ++i) {
    hi[i] = bf16_of(p32[i]);
    std::uint32_t bits = static_cast<std::uint32_t>(hi[i]) << 16;
    float h;
    std::memcpy(&h, &bits, 4);
    lo[i] = bf16_of(p32[i] - h);
  }
  Pair<std::uint16_t> ph(hi), pl(lo);
  Pair<float> g(fill<float>(n, [] { return normal(1.0f); }));
  Pair<float> m(fill<float>(n, [] { return normal(0.1f); }));
  Pair<float> v(fill<float>(n, [] { float x = normal(0.1f); return x * x; }));
  ParamSlots hs, ds;
  hs.param = reinterpret_cast<float*>(ph.host.data());
  hs.param_comp = pl.host.data();
  hs.grad = g.host.data();
  hs.state[0] = m.host.data();
  hs.state[1] = v.host.data();
  hs.numel = n;
  ds = hs;
  ds.param = reinterpret_cast<float*>(ph.dev);
  ds.param_comp = pl.dev;
  ds.grad = g.dev;
  ds.state[0] = m.dev;
  ds.state[1] = v.dev;
  StepArgs args;
  args.master_format = MasterFormat::bf16_kahan;
  std::vector<ParamSlots> h1{hs}, d1{ds};
  run_both(h1, d1, args);
  compare_codes(ph.host, ph.fetch(), "bf16 master");
  compare_params(m.host, m.fetch());
}

TEST(cuda_lean_buffers_are_named) {
  require_gpu();
  ParamSlots s;
  float dummy[4];
  s.param = dummy;
  s.grad = dummy;
  s.state[0] = dummy;
  s.state[1] = dummy;
  s.numel = 4;
  StepArgs args;
  args.state_format = StateFormat::q8;
  try {
    cuda::adam_step(&s, 1, hyper(), args, cuda::DeviceScalars{}, nullptr);
    CHECK(false);
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("state_scale[0]") != std::string::npos);
  }
}

MEGALITH_TEST_MAIN()
