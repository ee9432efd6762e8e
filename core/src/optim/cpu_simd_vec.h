#pragma once
// The vector types of one SIMD level (Scalar, Vec) and the element access the
// kernels share. Included only by the per-level kernel sources
// (cpu_kernels.cpp, cpu_lean_kernels.cpp), after nothing else: everything lands
// in that level's namespace and an anonymous namespace (see cpu_kernel_table.h).

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


// [Note: stochastic rounding] bf16 keeps the top 16 bits of an fp32. Adding a
// uniform 16-bit integer r to the bits before truncating rounds away from zero
// with probability (low 16 bits)/65536, exactly the value's fractional position
// between its two bf16 neighbours, so the rounding is unbiased. r comes from a
// counter-based hash of (seed, step, slot, element index): the same bits at
// every SIMD level and for every thread split.
inline u32 lowbias32(u32 x) {  // a 32-bit integer hash (bijective, good avalanche)
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

inline u16 f32_to_bf16_sr(float f, u32 r16) {
  u32 u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<u16>((u >> 16) | 0x40u);
  return static_cast<u16>((u + r16) >> 16);
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
  // lean-state formats (cpu_lean_kernels.cpp)
  using I = u32;
  static I lane_hash(u32 base, i64 i) { return lowbias32(base + static_cast<u32>(i)); }
  static I hi16(I r) { return r >> 16; }
  static I lo16(I r) { return r & 0xffffu; }
  static T round_bf16(T x) { return bf16_to_f32(f32_to_bf16(x)); }
  static void store_bf16_sr(u16* p, T x, I r16) { *p = f32_to_bf16_sr(x, r16); }
  static T abs(T a) { return fabsf(a); }
  static T round(T a) { return nearbyintf(a); }
  static T min(T a, T b) { return a < b ? a : b; }
  static T load_i8(const std::int8_t* p) { return static_cast<float>(*p); }
  static T load_u8(const std::uint8_t* p) { return static_cast<float>(*p); }
  static void store_i8(std::int8_t* p, T x) { *p = static_cast<std::int8_t>(static_cast<int>(x)); }
  static void store_u8(std::uint8_t* p, T x) { *p = static_cast<std::uint8_t>(static_cast<int>(x)); }
  static float hmax(T a) { return a; }
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
  // lean-state formats (cpu_lean_kernels.cpp)
  using I = __m256i;
  static I lane_hash(u32 base, i64 i) {
    I x = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base + static_cast<u32>(i))),
                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  }
  static I hi16(I r) { return _mm256_srli_epi32(r, 16); }
  static I lo16(I r) { return _mm256_and_si256(r, _mm256_set1_epi32(0xffff)); }
  static T round_bf16(T x) {  // to nearest even, kept as fp32
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  static void store_bf16_sr(u16* p, T x, I r16) {
    __m256i u = _mm256_castps_si256(x);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, r16), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static T abs(T a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static T round(T a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T min(T a, T b) { return _mm256_min_ps(a, b); }
  static T load_i8(const std::int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static T load_u8(const std::uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // x holds whole numbers in the code's range; packs 8 of them into 8 bytes.
  static __m128i pack8(__m256i w, bool is_signed) {
    __m256i h = _mm256_packs_epi32(w, w);
    __m256i b = is_signed ? _mm256_packs_epi16(h, h) : _mm256_packus_epi16(h, h);
    return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)));
  }
  static void store_i8(std::int8_t* p, T x) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), pack8(_mm256_cvttps_epi32(x), true));
  }
  static void store_u8(std::uint8_t* p, T x) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), pack8(_mm256_cvttps_epi32(x), false));
  }
  static float hmax(T a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
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
  // lean-state formats (cpu_lean_kernels.cpp)
  using I = __m512i;
  static I lane_hash(u32 base, i64 i) {
    I x = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base + static_cast<u32>(i))),
                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  }
  static I hi16(I r) { return _mm512_srli_epi32(r, 16); }
  static I lo16(I r) { return _mm512_and_si512(r, _mm512_set1_epi32(0xffff)); }
  static T round_bf16(T x) {  // to nearest even, kept as fp32
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castsi512_ps(r), x);
  }
  static void store_bf16_sr(u16* p, T x, I r16) {
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, r16), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, q);
    __m256i h = _mm512_cvtepi32_epi16(r);
    asm("" : "+v"(h));  // see [Note: narrowing stores]
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static T abs(T a) { return _mm512_abs_ps(a); }
  static T round(T a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T min(T a, T b) { return _mm512_min_ps(a, b); }
  static T load_i8(const std::int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static T load_u8(const std::uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store_i8(std::int8_t* p, T x) {
    __m128i b = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(x));
    asm("" : "+v"(b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), b);
  }
  static void store_u8(std::uint8_t* p, T x) {
    __m128i b = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(x));
    asm("" : "+v"(b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), b);
  }
  static float hmax(T a) { return _mm512_reduce_max_ps(a); }
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

}  // namespace
}  // namespace megalith::optim::cpu::detail::MEGALITH_LEVEL
