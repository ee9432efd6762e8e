// Optimizer kernels for one SIMD level. This file is compiled once per level
// (cmake/MegalithSimd.cmake defines MEGALITH_SIMD_<LEVEL> and the ISA flags);
// everything in it lives in that level's namespace and in an anonymous
// namespace, and it includes no header with inline code the other levels share
// except cpu_simd_vec.h, which is per level too (see cpu_kernel_table.h for why).
//
// Each kernel is one pass: every buffer is read once and written once, the
// loss-scale/clip multiply, the inf/nan check and the low-precision param copy
// ride along in registers.

#include "cpu_simd_vec.h"

namespace megalith::optim::cpu::detail::MEGALITH_LEVEL {
namespace {

// ----------------------------------------------------------------- Adam ----

template <class V, int G, int C, bool AMS, bool CHECK>
bool adam_part(const Range& r, const AdamConsts& k, i64 begin, i64 end) {
  using T = typename V::T;
  const T b2 = V::set1(k.beta2), omb1 = V::set1(k.one_minus_beta1), omb2 = V::set1(k.one_minus_beta2);
  const T step = V::set1(-k.step_size), inv_bc2 = V::set1(k.inv_bc2_sqrt), eps = V::set1(k.eps);
  const T decay = V::set1(k.decay), l2 = V::set1(k.l2), gs = V::set1(k.grad_scale);
  const bool has_l2 = k.l2 != 0.0f;  // skipped, not times 0: inf params stay inf
  T bad = V::zero();
  auto one = [&](i64 i) {
    T g = V::mul(load_grad<V, G>(r.grad, i), gs);
    if constexpr (CHECK) bad = track_nonfinite<V>(bad, g);
    T p = V::load(r.param + i);
    if (has_l2) g = V::fma(p, l2, g);
    p = V::mul(p, decay);
    T m = V::load(r.s0 + i);
    T v = V::load(r.s1 + i);
    m = V::fma(V::sub(g, m), omb1, m);  // lerp(m, g, 1 - beta1)
    v = V::fma(V::mul(g, g), omb2, V::mul(v, b2));
    V::store(r.s0 + i, m);
    V::store(r.s1 + i, v);
    if constexpr (AMS) {
      v = V::max(V::load(r.s2 + i), v);
      V::store(r.s2 + i, v);
    }
    T denom = V::fma(V::sqrt(v), inv_bc2, eps);
    p = V::fma(V::mul(m, V::recip(denom)), step, p);
    V::store(r.param + i, p);
    if constexpr (C != kNoCopy) store_copy<V, C>(r.copy, i, p);
  };
  for (i64 i = begin; i < end; i += V::W) one(i);  // a 2x unroll measured no faster
  return CHECK && V::any_nan(bad);
}

template <class V, int G, int C, bool AMS, bool CHECK>
bool adam_range(const Range& r, const AdamConsts& k) {
  i64 vec_end = r.begin + (r.end - r.begin) / V::W * V::W;
  bool bad = adam_part<V, G, C, AMS, CHECK>(r, k, r.begin, vec_end);
  if constexpr (C != kNoCopy) V::fence();
  bad |= adam_part<Scalar, G, C, AMS, CHECK>(r, k, vec_end, r.end);
  return bad;
}

// ------------------------------------------------------------------ SGD ----

template <class V, int G, int C, bool CHECK>
bool sgd_part(const Range& r, const SgdConsts& k, i64 begin, i64 end) {
  using T = typename V::T;
  const T gs = V::set1(k.grad_scale), wd = V::set1(k.weight_decay), lr = V::set1(-k.lr);
  const T mom = V::set1(k.momentum), omd = V::set1(k.one_minus_dampening);
  T bad = V::zero();
  for (i64 i = begin; i < end; i += V::W) {
    T g = V::mul(load_grad<V, G>(r.grad, i), gs);
    if constexpr (CHECK) bad = track_nonfinite<V>(bad, g);
    T p = V::load(r.param + i);
    if (k.weight_decay != 0.0f) g = V::fma(p, wd, g);
    if (k.has_momentum) {
      T buf = k.first_step ? g : V::fma(V::load(r.s0 + i), mom, V::mul(g, omd));
      V::store(r.s0 + i, buf);
      g = k.nesterov ? V::fma(buf, mom, g) : buf;
    }
    p = V::fma(g, lr, p);
    V::store(r.param + i, p);
    if constexpr (C != kNoCopy) store_copy<V, C>(r.copy, i, p);
  }
  return CHECK && V::any_nan(bad);
}

template <class V, int G, int C, bool CHECK>
bool sgd_range(const Range& r, const SgdConsts& k) {
  i64 vec_end = r.begin + (r.end - r.begin) / V::W * V::W;
  bool bad = sgd_part<V, G, C, CHECK>(r, k, r.begin, vec_end);
  if constexpr (C != kNoCopy) V::fence();
  bad |= sgd_part<Scalar, G, C, CHECK>(r, k, vec_end, r.end);
  return bad;
}

// ----------------------------------------------------------------- Lion ----

template <class V, int G, int C, bool CHECK>
bool lion_part(const Range& r, const LionConsts& k, i64 begin, i64 end) {
  using T = typename V::T;
  const T gs = V::set1(k.grad_scale), decay = V::set1(k.decay), lr = V::set1(-k.lr);
  const T b1 = V::set1(k.beta1), omb1 = V::set1(k.one_minus_beta1);
  const T b2 = V::set1(k.beta2), omb2 = V::set1(k.one_minus_beta2);
  T bad = V::zero();
  for (i64 i = begin; i < end; i += V::W) {
    T g = V::mul(load_grad<V, G>(r.grad, i), gs);
    if constexpr (CHECK) bad = track_nonfinite<V>(bad, g);
    T p = V::mul(V::load(r.param + i), decay);
    T m = V::load(r.s0 + i);
    T c = V::fma(m, b1, V::mul(g, omb1));
    p = V::fma(V::sign(c), lr, p);
    V::store(r.s0 + i, V::fma(m, b2, V::mul(g, omb2)));
    V::store(r.param + i, p);
    if constexpr (C != kNoCopy) store_copy<V, C>(r.copy, i, p);
  }
  return CHECK && V::any_nan(bad);
}

template <class V, int G, int C, bool CHECK>
bool lion_range(const Range& r, const LionConsts& k) {
  i64 vec_end = r.begin + (r.end - r.begin) / V::W * V::W;
  bool bad = lion_part<V, G, C, CHECK>(r, k, r.begin, vec_end);
  if constexpr (C != kNoCopy) V::fence();
  bad |= lion_part<Scalar, G, C, CHECK>(r, k, vec_end, r.end);
  return bad;
}

// ----------------------------------------------------------- grad stats ----

template <class V, int G>
bool stats_part(const void* grad, i64 begin, i64 end, float scale, double* sum_sq) {
  using T = typename V::T;
  constexpr i64 kBlock = 256 * V::W;  // each fp32 lane sums 256 terms; blocks add up in double
  const T gs = V::set1(scale);
  T bad = V::zero();
  double total = 0.0;
  for (i64 b = begin; b < end; b += kBlock) {
    i64 e = b + kBlock < end ? b + kBlock : end;
    T acc = V::zero();
    for (i64 i = b; i < e; i += V::W) {
      T g = V::mul(load_grad<V, G>(grad, i), gs);
      bad = track_nonfinite<V>(bad, g);
      acc = V::fma(g, g, acc);
    }
    alignas(64) float lanes[V::W];
    V::store(lanes, acc);
    for (int l = 0; l < V::W; ++l) total += lanes[l];
  }
  *sum_sq += total;
  return V::any_nan(bad);
}

template <class V, int G>
bool stats_range(const void* grad, i64 begin, i64 end, float scale, double* sum_sq) {
  i64 vec_end = begin + (end - begin) / V::W * V::W;
  bool bad = stats_part<V, G>(grad, begin, vec_end, scale, sum_sq);
  bad |= stats_part<Scalar, G>(grad, vec_end, end, scale, sum_sq);
  return bad;
}

struct AdamCall {
  const Range& r;
  const AdamConsts& k;
  bool check;
  template <int G, int C>
  bool operator()() const {
    if (k.amsgrad) {
      return check ? adam_range<Vec, G, C, true, true>(r, k) : adam_range<Vec, G, C, true, false>(r, k);
    }
    return check ? adam_range<Vec, G, C, false, true>(r, k) : adam_range<Vec, G, C, false, false>(r, k);
  }
};

struct SgdCall {
  const Range& r;
  const SgdConsts& k;
  bool check;
  template <int G, int C>
  bool operator()() const {
    return check ? sgd_range<Vec, G, C, true>(r, k) : sgd_range<Vec, G, C, false>(r, k);
  }
};

struct LionCall {
  const Range& r;
  const LionConsts& k;
  bool check;
  template <int G, int C>
  bool operator()() const {
    return check ? lion_range<Vec, G, C, true>(r, k) : lion_range<Vec, G, C, false>(r, k);
  }
};

bool adam(const Range& r, const AdamConsts& k, DType grad, int copy, bool check) {
  return dispatch(grad, copy, AdamCall{r, k, check});
}

bool sgd(const Range& r, const SgdConsts& k, DType grad, int copy, bool check) {
  return dispatch(grad, copy, SgdCall{r, k, check});
}

bool lion(const Range& r, const LionConsts& k, DType grad, int copy, bool check) {
  return dispatch(grad, copy, LionCall{r, k, check});
}

bool grad_stats(const void* grad, i64 begin, i64 end, DType dtype, float scale, double* sum_sq) {
  switch (dtype) {
    case DType::bf16:
      return stats_range<Vec, kBF16>(grad, begin, end, scale, sum_sq);
    case DType::f16:
      return stats_range<Vec, kF16>(grad, begin, end, scale, sum_sq);
    default:
      return stats_range<Vec, kF32>(grad, begin, end, scale, sum_sq);
  }
}

}  // namespace

extern const KernelTable kKernels;
const KernelTable kKernels = {&adam, &sgd, &lion, &grad_stats};

}  // namespace megalith::optim::cpu::detail::MEGALITH_LEVEL
