#pragma once
// One optimizer problem on the GPU beside its double-precision host reference
// (torch.optim's formulas): device buffers for a layout of tensors, fresh
// random gradients each step, and a comparison of every buffer at the end.
#include <memory>

#include "cuda_test_support.h"
#include "megalith/cuda/optim.h"

namespace megalith_cuda_test {

using namespace megalith::optim;
namespace gpu = megalith::optim::cuda;

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
  float grad_std = 1.0f;    // gradients ~ N(0, grad_std), then rounded to `grad`
  float grad_scale = 1.0f;  // StepArgs::grad_scale
  float inv_scale = 0.0f;   // DeviceScalars::inv_scale when > 0
  float max_norm = 0.0f;    // clipping when > 0 (grad_sum_sq from the host)
  int steps = 3;
  bool own_stream = false;
};

inline int states_of(const Config& c) {
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

inline const char* kind_name(Kind k) {
  return k == Kind::adam ? "Adam" : k == Kind::sgd ? "SGD" : "Lion";
}

/// Elements whose gradient is always exactly 0 and whose state starts at 0:
/// they pin sign(0) = 0 for Lion and the eps floor for Adam.
inline bool zero_lane(std::int64_t i) { return i % 13 == 5; }

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
        gf[i] = zero_lane(static_cast<std::int64_t>(i))
                    ? 0.0f
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
        std::vector<float> cp =
            decode(download<std::uint8_t>(bufs_[k].copy, n * dtype_size(c_.copy)), c_.copy);
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
    for (int s = 0; s < ns; ++s)
      expect_close(tag + " " + names[s], s_all[s], rs_all[s], 2e-5, 2e-6);
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

inline void run(const Config& c, const std::vector<Tensor>& layout, const std::string& tag = "") {
  Config named = c;
  named.name = c.name + tag;
  Problem pb(named, layout);
  for (int s = 1; s <= c.steps; ++s) pb.step(s);
  pb.verify();
}

}  // namespace megalith_cuda_test
