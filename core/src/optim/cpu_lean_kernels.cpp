// Adam over lean state formats, for one SIMD level (compiled once per level,
// like cpu_kernels.cpp): bf16 m and v with stochastic rounding, 8-bit
// block-quantised m and v, and bf16 masters with a Kahan compensation. The
// rules are [Note: lean states] in megalith/optim/slots.h.
//
// Still one pass: each element is read and written once. A q8 block's new m
// and v wait in a 2 KB stack buffer (L1) until the block's scales are known;
// no fp32 copy of the state exists anywhere.

#include "cpu_simd_vec.h"

namespace megalith::optim::cpu::detail::MEGALITH_LEVEL {
namespace {

using i8 = std::int8_t;
using u8 = std::uint8_t;

constexpr int kStateF32 = 0, kStateBF16 = 1, kStateQ8 = 2;  // StateFormat
constexpr int kMasterF32 = 0, kMasterKahan = 1;             // MasterFormat
constexpr i64 kBlock = 256;                                 // kQ8Block
constexpr float kInv127Sq = 1.0f / 16129.0f;                // 1 / 127^2
constexpr float kInv255Sq = 1.0f / 65025.0f;                // 1 / 255^2

/// Adam's per-step constants broadcast once, and the update of one vector.
template <class V>
struct AdamVec {
  using T = typename V::T;
  T b2, omb1, omb2, step, inv_bc2, eps, decay, l2, gs;
  bool has_l2;
  explicit AdamVec(const AdamConsts& k)
      : b2(V::set1(k.beta2)), omb1(V::set1(k.one_minus_beta1)), omb2(V::set1(k.one_minus_beta2)),
        step(V::set1(-k.step_size)), inv_bc2(V::set1(k.inv_bc2_sqrt)), eps(V::set1(k.eps)),
        decay(V::set1(k.decay)), l2(V::set1(k.l2)), gs(V::set1(k.grad_scale)),
        has_l2(k.l2 != 0.0f) {}
  // m and v in: the stored state; out: the new fp32 state. Returns the new p.
  T update(T p, T g, T& m, T& v) const {
    if (has_l2) g = V::fma(p, l2, g);
    p = V::mul(p, decay);
    m = V::fma(V::sub(g, m), omb1, m);
    v = V::fma(V::mul(g, g), omb2, V::mul(v, b2));
    T denom = V::fma(V::sqrt(v), inv_bc2, eps);
    return V::fma(V::mul(m, V::recip(denom)), step, p);
  }
};

template <class V, int M>
inline typename V::T load_master(const Range& r, i64 i) {
  if constexpr (M == kMasterF32) return V::load(r.param + i);
  const u16* hi = reinterpret_cast<const u16*>(r.param) + i;
  return V::add(V::load_bf16(hi), V::load_bf16(static_cast<const u16*>(r.comp) + i));
}

template <class V, int M>
inline void store_master(const Range& r, i64 i, typename V::T p) {
  if constexpr (M == kMasterF32) {
    V::store(r.param + i, p);
  } else {
    typename V::T hi = V::round_bf16(p);
    V::store_bf16(reinterpret_cast<u16*>(r.param) + i, hi);  // exact: hi is a bf16 value
    V::store_bf16(static_cast<u16*>(r.comp) + i, V::sub(p, hi));
  }
}

// ------------------------------------------- fp32 or bf16 m and v, per element ----

template <class V, int G, int C, int S, int M>
bool elementwise_part(const Range& r, const AdamConsts& k, u32 base, i64 begin, i64 end,
                      bool check) {
  using T = typename V::T;
  const AdamVec<V> a(k);
  u16* mh = reinterpret_cast<u16*>(r.s0);
  u16* vh = reinterpret_cast<u16*>(r.s1);
  T bad = V::zero();
  for (i64 i = begin; i < end; i += V::W) {
    T g = V::mul(load_grad<V, G>(r.grad, i), a.gs);
    if (check) bad = track_nonfinite<V>(bad, g);
    T m, v;
    if constexpr (S == kStateBF16) {
      m = V::load_bf16(mh + i);
      v = V::load_bf16(vh + i);
    } else {
      m = V::load(r.s0 + i);
      v = V::load(r.s1 + i);
    }
    T p = a.update(load_master<V, M>(r, i), g, m, v);
    if constexpr (S == kStateBF16) {
      typename V::I rnd = V::lane_hash(base, i);
      V::store_bf16_sr(mh + i, m, V::hi16(rnd));
      V::store_bf16_sr(vh + i, v, V::lo16(rnd));
    } else {
      V::store(r.s0 + i, m);
      V::store(r.s1 + i, v);
    }
    store_master<V, M>(r, i, p);
    if constexpr (C != kNoCopy) store_copy<V, C>(r.copy, i, p);
  }
  return check && V::any_nan(bad);
}

template <class V, int G, int C, int S, int M>
bool elementwise_range(const Range& r, const AdamConsts& k, u32 base, bool check) {
  i64 vec_end = r.begin + (r.end - r.begin) / V::W * V::W;
  bool bad = elementwise_part<V, G, C, S, M>(r, k, base, r.begin, vec_end, check);
  bad |= elementwise_part<Scalar, G, C, S, M>(r, k, base, vec_end, r.end, check);
  return bad;
}

// ------------------------------------------------ q8 m and v, per block ----

struct BlockMax {
  float m_abs = 0.0f;  // max |m|
  float v = 0.0f;      // max v
};

// Decodes, updates and keeps the new m, v of [begin, end) in mb, vb (indexed from b).
template <class V, int G, int C, int M>
bool q8_update(const Range& r, const AdamVec<V>& a, i64 b, i64 begin, i64 end, float dm,
               float du, float* mb, float* vb, BlockMax& mx, bool check) {
  using T = typename V::T;
  const i8* mc = reinterpret_cast<const i8*>(r.s0);
  const u8* vc = reinterpret_cast<const u8*>(r.s1);
  const T dmv = V::set1(dm), duv = V::set1(du);
  T bad = V::zero(), am = V::zero(), av = V::zero();
  for (i64 i = begin; i < end; i += V::W) {
    T g = V::mul(load_grad<V, G>(r.grad, i), a.gs);
    if (check) bad = track_nonfinite<V>(bad, g);
    T c = V::load_i8(mc + i);
    T q = V::load_u8(vc + i);
    T m = V::mul(V::mul(c, V::abs(c)), dmv);
    T u = V::mul(V::mul(q, q), duv);
    T v = V::mul(u, u);
    T p = a.update(load_master<V, M>(r, i), g, m, v);
    store_master<V, M>(r, i, p);
    if constexpr (C != kNoCopy) store_copy<V, C>(r.copy, i, p);
    V::store(mb + (i - b), m);
    V::store(vb + (i - b), v);
    am = V::max(am, V::abs(m));
    av = V::max(av, v);
  }
  if (begin < end) {
    mx.m_abs = fmaxf(mx.m_abs, V::hmax(am));
    mx.v = fmaxf(mx.v, V::hmax(av));
  }
  return check && V::any_nan(bad);
}

template <class V>
void q8_encode(const Range& r, i64 b, i64 begin, i64 end, const float* mb, const float* vb,
               float inv_a, float inv_u) {
  using T = typename V::T;
  i8* mc = reinterpret_cast<i8*>(r.s0);
  u8* vc = reinterpret_cast<u8*>(r.s1);
  const T ia = V::set1(inv_a), iu = V::set1(inv_u);
  const T c127 = V::set1(127.0f), c255 = V::set1(255.0f);
  for (i64 i = begin; i < end; i += V::W) {
    T m = V::load(mb + (i - b));
    T v = V::load(vb + (i - b));
    T cm = V::min(V::round(V::mul(V::sqrt(V::mul(V::abs(m), ia)), c127)), c127);
    T cv = V::min(V::round(V::mul(V::sqrt(V::mul(V::sqrt(v), iu)), c255)), c255);
    V::store_i8(mc + i, V::mul(cm, V::sign(m)));
    V::store_u8(vc + i, cv);
  }
}

template <int G, int C, int M>
bool q8_range(const Range& r, const AdamConsts& k, bool check) {
  alignas(64) float mb[kBlock];
  alignas(64) float vb[kBlock];
  const AdamVec<Vec> av(k);
  const AdamVec<Scalar> as(k);
  bool bad = false;
  for (i64 b = r.begin; b < r.end; b += kBlock) {
    const i64 e = b + kBlock < r.end ? b + kBlock : r.end;
    const i64 blk = b / kBlock;
    const i64 ve = b + (e - b) / Vec::W * Vec::W;
    const float dm = r.scale0[blk] * kInv127Sq;
    const float du = r.scale1[blk] * kInv255Sq;
    BlockMax mx;
    bad |= q8_update<Vec, G, C, M>(r, av, b, b, ve, dm, du, mb, vb, mx, check);
    bad |= q8_update<Scalar, G, C, M>(r, as, b, ve, e, dm, du, mb, vb, mx, check);
    const float u = sqrtf(mx.v);
    r.scale0[blk] = mx.m_abs;
    r.scale1[blk] = u;
    const float inv_a = mx.m_abs > 0.0f ? 1.0f / mx.m_abs : 0.0f;
    const float inv_u = u > 0.0f ? 1.0f / u : 0.0f;
    q8_encode<Vec>(r, b, b, ve, mb, vb, inv_a, inv_u);
    q8_encode<Scalar>(r, b, ve, e, mb, vb, inv_a, inv_u);
  }
  return bad;
}

// -------------------------------------------------------------- dispatch ----

struct LeanCall {
  const Range& r;
  const AdamConsts& k;
  int state_format, master_format;
  u32 base;
  bool check;
  template <int G, int C>
  bool operator()() const {
    const bool kahan = master_format == kMasterKahan;
    switch (state_format) {
      case kStateQ8:
        return kahan ? q8_range<G, C, kMasterKahan>(r, k, check)
                     : q8_range<G, C, kMasterF32>(r, k, check);
      case kStateBF16:
        return kahan ? elementwise_range<Vec, G, C, kStateBF16, kMasterKahan>(r, k, base, check)
                     : elementwise_range<Vec, G, C, kStateBF16, kMasterF32>(r, k, base, check);
      default:  // fp32 m and v with a bf16 master (fp32/fp32 is the plain kernel)
        return elementwise_range<Vec, G, C, kStateF32, kMasterKahan>(r, k, base, check);
    }
  }
};

bool adam_lean(const Range& r, const AdamConsts& k, DType grad, int copy, int state_format,
               int master_format, u32 sr_key, bool check) {
  // The slot's stream; element i then draws lowbias32(base + i) (see [Note: stochastic rounding]).
  const u32 base = lowbias32(sr_key ^ (r.slot * 0x9e3779b9u));
  bool bad = dispatch(grad, copy, LeanCall{r, k, state_format, master_format, base, check});
  if (copy != kNoCopy) Vec::fence();
  return bad;
}

}  // namespace

extern const LeanKernelTable kLeanKernels;
const LeanKernelTable kLeanKernels = {&adam_lean};

}  // namespace megalith::optim::cpu::detail::MEGALITH_LEVEL
