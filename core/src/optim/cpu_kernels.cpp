// Optimizer kernels for one SIMD level. This file is compiled once per level
// (cmake/MegalithSimd.cmake defines MEGALITH_SIMD_<LEVEL> and the ISA flags);
// everything in it lives in that level's namespace and in an anonymous
// namespace, and it includes no header with inline code the other levels share
// (see cpu_kernel_table.h for why).
//
// Each kernel is one pass: every buffer is read once and written once, the
// loss-scale/clip multiply, the inf/nan check and the low-precision param copy
// ride along in registers.

#include <cstdint>
#include <cstring>

#include "cpu_kernel_table.h"

#if defined(MEGALITH_SIMD_AVX512) || defined(MEGALITH_SIMD_AVX2)
#include <immintrin.h>
#endif
#include <math.h>

#if defined(MEGALITH_SIMD_AVX512)
#define MEGALITH_LEVEL avx512
#elif defined(MEGALITH_SIMD_AVX2)
#define MEGALITH_LEVEL avx2
#else
#define MEGALITH_LEVEL scalar
#endif

namespace megalith::optim::cpu::detail::MEGALITH_LEVEL {
namespace {

using u16 = std::uint16_t;
using u32 = std::uint32_t;
using i64 = std::int64_t;

constexpr int kNoCopy = -1;
constexpr int kF32 = static_cast<int>(DType::f32);
constexpr int kF16 = static_cast<int>(DType::f16);
constexpr int kBF16 = static_cast<int>(DType::bf16);

// ---------------------------------------------------------------- scalar ----

inline float bits_to_f32(u32 u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline u32 f32_to_bits(float f) {
  u32 u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(u16 h) { return bits_to_f32(static_cast<u32>(h) << 16); }

inline u16 f32_to_bf16(float f) {  // round to nearest even; NaN stays a quiet NaN
  u32 u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<u16>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<u16>(u >> 16);
}

inline float f16_to_f32(u16 h) {
  u32 sign = static_cast<u32>(h & 0x8000u) << 16;
  u32 exp = (h >> 10) & 0x1fu;
  u32 mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_f32(sign);
  u32 shift = 0;  // subnormal: normalise so the leading one reaches bit 10
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    ++shift;
  }
  return bits_to_f32(sign | ((113u - shift) << 23) | ((mant & 0x3ffu) << 13));
}

inline u16 f32_to_f16(float f) {  // round to nearest even
  u32 u = f32_to_bits(f);
  u32 sign = (u >> 16) & 0x8000u;
  u32 a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<u16>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<u16>(sign | 0x7c00u);  // rounds past 65504
  if (a < 0x38800000u) {  // half subnormal or zero: value / 2^-24, rounded to even
    float scaled = bits_to_f32(a) * 16777216.0f;
    return static_cast<u16>(sign | static_cast<u32>(nearbyintf(scaled)));
  }
  u32 r = a - (112u << 23);
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<u16>(sign | (r >> 13));
}

struct Scalar {
  using T = float;
  static constexpr int W = 1;
  static T set1(float x) { return x; }
  static T zero() { return 0.0f; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T x) { *p = x; }
  static T load_bf16(const u16* p) { return bf16_to_f32(*p); }
  static T load_f16(const u16* p) { return f16_to_f32(*p); }
  static void store_bf16(u16* p, T x) { *p = f32_to_bf16(x); }
  static void store_f16(u16* p, T x) { *p = f32_to_f16(x); }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  static T recip(T a) { return 1.0f / a; }
  static T fma(T a, T b, T c) { return a * b + c; }
  static T sqrt(T a) { return sqrtf(a); }
  static T max(T a, T b) { return a > b || a != a ? a : b; }
  static T sign(T a) { return static_cast<float>((a > 0.0f) - (a < 0.0f)); }
  static bool any_nan(T a) { return a != a; }
  static void fence() {}
};

// ------------------------------------------------------------------ AVX2 ----
#if defined(MEGALITH_SIMD_AVX2)
struct Vec {
  using T = __m256;
  static constexpr int W = 8;
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T load_bf16(const u16* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static T load_f16(const u16* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_bf16(u16* p, T x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static void store_f16(u16* p, T x) {
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    asm("" : "+x"(h));  // see [Note: narrowing stores]
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T recip(T a) {  // see [Note: reciprocal]
    T r = _mm256_rcp_ps(a);
    T e = _mm256_fnmadd_ps(a, r, _mm256_set1_ps(1.0f));
    return _mm256_fmadd_ps(e, r, r);
  }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T sqrt(T a) { return _mm256_sqrt_ps(a); }
  static T max(T a, T b) {  // NaN in a wins, like torch.maximum
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static T sign(T a) {
    T one = _mm256_set1_ps(1.0f);
    T pos = _mm256_and_ps(_mm256_cmp_ps(a, zero(), _CMP_GT_OQ), one);
    T neg = _mm256_and_ps(_mm256_cmp_ps(a, zero(), _CMP_LT_OQ), one);
    return _mm256_sub_ps(pos, neg);
  }
  static bool any_nan(T a) { return _mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)) != 0; }
  static void fence() {}
};
#endif

// --------------------------------------------------------------- AVX-512 ----
#if defined(MEGALITH_SIMD_AVX512)
struct Vec {
  using T = __m512;
  static constexpr int W = 16;
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T load_bf16(const u16* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static T load_f16(const u16* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_bf16(u16* p, T x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_blend_epi32(nan, r, q);
    store_half(p, _mm512_cvtepi32_epi16(r));
  }
  static void store_f16(u16* p, T x) {
    store_half(p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // [Note: narrowing stores] The compiler folds "convert, then store" into
  // the memory forms of vpmovdw / vcvtps2ph, which are microcoded on AMD Zen 4/5
  // (the bf16-copy step ran at 60% of the fp32 one's bandwidth). The empty asm
  // keeps the conversion in a register so the store is a plain vmovdqu.
  // The copy is write-only: where aligned, a streaming store skips the read
  // for ownership that a plain store pays (2 of the 30 bytes per param).
  static void store_half(u16* p, __m256i h) {
    if ((reinterpret_cast<std::uintptr_t>(p) & 31) == 0) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
      return;
    }
    asm("" : "+v"(h));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static void fence() { _mm_sfence(); }  // orders the streaming stores before returning
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  // [Note: reciprocal] Adam's m / denom as m * (1/denom): an approximate
  // reciprocal plus one Newton step (within ~1 ulp of the quotient) keeps the
  // divider, whose throughput is a few cycles per vector, off the critical path.
  static T recip(T a) {
    T r = _mm512_rcp14_ps(a);
    T e = _mm512_fnmadd_ps(a, r, _mm512_set1_ps(1.0f));
    return _mm512_fmadd_ps(e, r, r);
  }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T sqrt(T a) { return _mm512_sqrt_ps(a); }
  static T max(T a, T b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_max_ps(a, b), a);
  }
  static T sign(T a) {
    T one = _mm512_set1_ps(1.0f);
    T pos = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, zero(), _CMP_GT_OQ), one);
    T neg = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, zero(), _CMP_LT_OQ), one);
    return _mm512_sub_ps(pos, neg);
  }
  static bool any_nan(T a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) != 0; }
};
#endif

#if !defined(MEGALITH_SIMD_AVX2) && !defined(MEGALITH_SIMD_AVX512)
using Vec = Scalar;
#endif

// ------------------------------------------------------- element access ----

template <class V, int G>
inline typename V::T load_grad(const void* g, i64 i) {
  if constexpr (G == kF32) return V::load(static_cast<const float*>(g) + i);
  if constexpr (G == kBF16) return V::load_bf16(static_cast<const u16*>(g) + i);
  if constexpr (G == kF16) return V::load_f16(static_cast<const u16*>(g) + i);
}

template <class V, int C>
inline void store_copy(void* c, i64 i, typename V::T x) {
  if constexpr (C == kF32) V::store(static_cast<float*>(c) + i, x);
  if constexpr (C == kBF16) V::store_bf16(static_cast<u16*>(c) + i, x);
  if constexpr (C == kF16) V::store_f16(static_cast<u16*>(c) + i, x);
}

// inf * 0 and nan * 0 are nan: one multiply-add per vector tracks "any non-finite".
template <class V>
inline typename V::T track_nonfinite(typename V::T acc, typename V::T g) {
  return V::fma(g, V::zero(), acc);
}

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

// -------------------------------------------- run-time -> template dispatch ----

template <int N>
struct IntTag {
  static constexpr int value = N;
};

// Calls f.template operator()<G, C>() for the run-time dtypes.
template <class F>
bool dispatch(DType grad, int copy, F&& f) {
  auto with_grad = [&](auto gtag) {
    constexpr int G = decltype(gtag)::value;
    switch (copy) {
      case kF32:
        return f.template operator()<G, kF32>();
      case kF16:
        return f.template operator()<G, kF16>();
      case kBF16:
        return f.template operator()<G, kBF16>();
      default:
        return f.template operator()<G, kNoCopy>();
    }
  };
  switch (grad) {
    case DType::bf16:
      return with_grad(IntTag<kBF16>{});
    case DType::f16:
      return with_grad(IntTag<kF16>{});
    default:
      return with_grad(IntTag<kF32>{});
  }
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
