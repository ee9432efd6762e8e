// adamw_demo: the megalith engine used from plain C++, with no Python and no PyTorch.
//
// Runs 10 AdamW steps with megalith::optim::cpu::adam_step on std::vector
// buffers (~1e5 fp32 parameters in three tensors of uneven sizes, so the
// kernels' vector tails and the split across threads are exercised) with
// deterministic pseudo-random gradients, at every SIMD level this build has
// and this CPU can run. After each run it compares parameters and both Adam
// moments with a double-precision reference written out below, and exits
// non-zero when any relative error reaches 1e-6.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "megalith/megalith.h"

namespace {

constexpr int kSteps = 10;
// [Note: why 1e-6 holds for a correct fp32 kernel]
// The error is measured as max |p - ref| / max |ref|. Parameters start in
// [-1, 1) and move by about lr per step, so every fp32 rounding of p costs at
// most half an ulp of 1, 3e-8. A kernel rounds p about twice per step (the
// decay p *= 1 - lr*wd, then p -= update), and since p barely changes those
// errors can add up in one direction: 10 steps * 2 * 3e-8 = 6e-7 at worst
// (5e-7 is what this build shows). The moments are rounded once per step and
// stay near 1e-7. A wrong formula (bias correction, eps placement, decay, a
// missed tail element) shows up at 1e-5 or more.
constexpr double kTolerance = 1e-6;
// Three tensors, about 1e5 elements in all; none is a multiple of a SIMD width.
const std::vector<std::int64_t> kSizes = {65537, 31, 34435};

// splitmix64: a tiny deterministic generator, the same on every platform.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A float in [-1, 1) determined by (stream, step, index).
float uniform(std::uint64_t stream, std::uint64_t step, std::uint64_t index) {
  std::uint64_t bits = mix(mix(stream * 0x100000001B3ull + step) ^ index) >> 40;  // 24 bits
  return static_cast<float>(bits) / static_cast<float>(1u << 23) - 1.0f;
}

// Gradient of element `index` of tensor `tensor` at `step`: varied magnitudes, both signs.
float grad_value(std::size_t tensor, int step, std::int64_t index) {
  float scale = 1.0f + 9.0f * (uniform(7, 0, index) + 1.0f) / 2.0f;  // in [1, 10)
  return scale * uniform(100 + tensor, static_cast<std::uint64_t>(step), index);
}

// One tensor: the engine's fp32 buffers and the reference's doubles.
struct Tensor {
  std::vector<float> param, grad, exp_avg, exp_avg_sq;
  std::vector<double> ref_param, ref_exp_avg, ref_exp_avg_sq;
};

std::vector<Tensor> make_tensors() {
  std::vector<Tensor> tensors(kSizes.size());
  for (std::size_t t = 0; t < kSizes.size(); ++t) {
    auto n = static_cast<std::size_t>(kSizes[t]);
    Tensor& x = tensors[t];
    x.param.resize(n);
    x.grad.assign(n, 0.0f);
    x.exp_avg.assign(n, 0.0f);
    x.exp_avg_sq.assign(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) x.param[i] = uniform(t, 0, i);
    x.ref_param.assign(x.param.begin(), x.param.end());
    x.ref_exp_avg.assign(n, 0.0);
    x.ref_exp_avg_sq.assign(n, 0.0);
  }
  return tensors;
}

// torch.optim.AdamW, in double, for one tensor and one step (1-based `step`).
void reference_adamw(Tensor& x, const megalith::optim::AdamHyper& h, int step) {
  const double lr = h.lr, beta1 = h.beta1, beta2 = h.beta2, eps = h.eps;
  const double bias_correction1 = 1.0 - std::pow(beta1, step);
  const double bias_correction2 = 1.0 - std::pow(beta2, step);
  const double step_size = lr / bias_correction1;
  for (std::size_t i = 0; i < x.param.size(); ++i) {
    const double g = x.grad[i];
    double& p = x.ref_param[i];
    double& m = x.ref_exp_avg[i];
    double& v = x.ref_exp_avg_sq[i];
    p *= 1.0 - lr * static_cast<double>(h.weight_decay);  // decoupled weight decay
    m = beta1 * m + (1.0 - beta1) * g;
    v = beta2 * v + (1.0 - beta2) * g * g;
    const double denom = std::sqrt(v) / std::sqrt(bias_correction2) + eps;
    p -= step_size * m / denom;
  }
}

// max |got - want| / max |want| over all tensors: a relative error on the buffer's scale.
double relative_error(const std::vector<Tensor>& tensors, std::vector<float> Tensor::* got,
                      std::vector<double> Tensor::* want) {
  double max_err = 0.0, max_ref = 0.0;
  for (const Tensor& x : tensors) {
    const std::vector<float>& g = x.*got;
    const std::vector<double>& w = x.*want;
    for (std::size_t i = 0; i < g.size(); ++i) {
      max_err = std::max(max_err, std::abs(static_cast<double>(g[i]) - w[i]));
      max_ref = std::max(max_ref, std::abs(w[i]));
    }
  }
  return max_ref > 0.0 ? max_err / max_ref : max_err;
}

// Runs the steps at the active SIMD level; returns true when all errors are below tolerance.
bool run_and_check() {
  megalith::optim::AdamHyper hyper;
  hyper.lr = 1e-3f;
  hyper.beta1 = 0.9f;
  hyper.beta2 = 0.999f;
  hyper.eps = 1e-8f;
  hyper.weight_decay = 0.01f;
  hyper.decoupled_weight_decay = true;  // AdamW

  std::vector<Tensor> tensors = make_tensors();
  std::vector<megalith::optim::ParamSlots> slots(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    slots[t].param = tensors[t].param.data();
    slots[t].grad = tensors[t].grad.data();
    slots[t].state[0] = tensors[t].exp_avg.data();
    slots[t].state[1] = tensors[t].exp_avg_sq.data();
    slots[t].numel = kSizes[t];
  }

  for (int step = 1; step <= kSteps; ++step) {
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      std::vector<float>& g = tensors[t].grad;
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_value(t, step, i);
      reference_adamw(tensors[t], hyper, step);
    }
    megalith::optim::StepArgs args;
    args.grad_dtype = megalith::DType::f32;
    args.step = step;
    megalith::optim::cpu::adam_step(slots.data(), slots.size(), hyper, args);
  }

  const double err_param = relative_error(tensors, &Tensor::param, &Tensor::ref_param);
  const double err_m = relative_error(tensors, &Tensor::exp_avg, &Tensor::ref_exp_avg);
  const double err_v = relative_error(tensors, &Tensor::exp_avg_sq, &Tensor::ref_exp_avg_sq);
  const bool ok = err_param < kTolerance && err_m < kTolerance && err_v < kTolerance;
  std::printf(
      "  %-7s relative error vs double reference: param %.3g, exp_avg %.3g, "
      "exp_avg_sq %.3g -> %s\n",
      megalith::cpu::simd_level_name(megalith::cpu::active_simd_level()), err_param, err_m, err_v,
      ok ? "ok" : "MISMATCH");
  return ok;
}

}  // namespace

int main() {
  try {
    std::printf("megalith %s build_info:\n", megalith::version());
    for (const auto& [key, value] : megalith::build_info()) {
      std::printf("  %-22s %s\n", key.c_str(), value.c_str());
    }
    std::printf("SIMD level: %s (best on this CPU: %s), %d thread(s)\n",
                megalith::cpu::simd_level_name(megalith::cpu::active_simd_level()),
                megalith::cpu::simd_level_name(megalith::cpu::best_simd_level()),
                megalith::cpu::num_threads());

    std::int64_t total = 0;
    for (std::int64_t n : kSizes) total += n;
    std::printf("AdamW, %d steps, %lld fp32 params in %zu tensors, tolerance %g:\n", kSteps,
                static_cast<long long>(total), kSizes.size(), kTolerance);

    // First the automatic level (MEGALITH_SIMD, else the best), then every other one.
    const megalith::cpu::SimdLevel automatic = megalith::cpu::active_simd_level();
    bool ok = run_and_check();
    for (megalith::cpu::SimdLevel level : megalith::cpu::compiled_simd_levels()) {
      if (level == automatic || !megalith::cpu::cpu_supports(level)) continue;
      megalith::cpu::force_simd_level(level);
      ok = run_and_check() && ok;
    }
    megalith::cpu::reset_simd_level();

    std::printf("%s\n", ok ? "adamw_demo: OK" : "adamw_demo: FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "adamw_demo: error: %s\n", e.what());
    return 2;
  }
}
