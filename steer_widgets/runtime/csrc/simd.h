// The 16-float line every kernel computes with, for the instruction set this build targets
// (AVX-512, AVX2 with FMA, or portable C++), and the tile shapes that fit its registers.
// Tile shapes change speed only, never a result: every output is one in-order chain of fused
// multiply-adds whatever the shape.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "half.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace sw {

constexpr int64_t kBlock = 16;  // output columns per packed block, floats per line

// Tile shapes (rows sharing each weight load x column blocks at once) fit the registers;
// they change speed only, never a result. Up to kWideRows rows take kWide column blocks at
// once: each block is its own stream from memory, and one row is bound by how many streams
// the memory system has in flight (a Xeon, one thread: a row's products 3-5% faster at 8).
constexpr int kWideRows = 2;
#if defined(__AVX512F__)
constexpr int kRows = 6, kTile = 4;  // 24 accumulators + 4 weight lines of 32 registers
constexpr int kWide = 8;  // two rows: 16 accumulators + 8 weight lines
// Above this many rows the quantized kernel dequantizes each column block once into a panel
// for the float32 tiles; up to it, each group of kRows rows dequantizes in registers again
// (the panel's writes and reads cost more than dequantizing again up to about 4 groups:
// docs/benchmarks.md).
constexpr int64_t kPanelRows = 4 * kRows;
struct Vec {
  __m512 v;
};
inline Vec zero() { return {_mm512_setzero_ps()}; }
inline Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline Vec load(const uint16_t* p) {  // 16 halves, exactly
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline Vec fma(float a, const Vec& w, const Vec& acc) {
  return {_mm512_fmadd_ps(_mm512_set1_ps(a), w.v, acc.v)};
}
inline Vec fmav(const Vec& a, const Vec& b, const Vec& acc) {
  return {_mm512_fmadd_ps(a.v, b.v, acc.v)};
}
inline float hsum(const Vec& v) { return _mm512_reduce_add_ps(v.v); }  // a fixed tree
// y = acc (+ bias): one rounded add, as torch's separate ``out + bias`` (the same bits)
inline void store(float* p, const Vec& v, int64_t n, const float* bias) {
  const auto mask = static_cast<__mmask16>(n == kBlock ? 0xffffu : (1u << n) - 1);
  const __m512 out = bias ? _mm512_add_ps(v.v, _mm512_maskz_loadu_ps(mask, bias)) : v.v;
  _mm512_mask_storeu_ps(p, mask, out);
}
#elif defined(__AVX2__) && defined(__FMA__)
// 12 accumulators + 2 weight lines + a broadcast of 16 registers (a block is two of them):
// the 3 x 2 tiles before needed 17 and spilled (docs/benchmarks.md#tiles-on-avx2-2026-12-04)
constexpr int kRows = 6, kTile = 1;
constexpr int kWide = 2;  // two rows: 8 accumulators + 4 weight lines
// Dequantizing in registers again for every group of kRows rows measured faster here than
// the panel path at every row count up to 64 and in a 300-token prefill: no panels.
constexpr int64_t kPanelRows = std::numeric_limits<int64_t>::max();
struct Vec {
  __m256 lo, hi;
};
inline Vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vec load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline Vec load(const uint16_t* p) {  // 16 halves, exactly
#if defined(__F16C__)
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
#else
  alignas(32) float f[kBlock];
  for (int64_t i = 0; i < kBlock; ++i) f[i] = half_to_float(p[i]);
  return load(f);
#endif
}
inline Vec fma(float a, const Vec& w, const Vec& acc) {
  const __m256 b = _mm256_set1_ps(a);
  return {_mm256_fmadd_ps(b, w.lo, acc.lo), _mm256_fmadd_ps(b, w.hi, acc.hi)};
}
inline Vec fmav(const Vec& a, const Vec& b, const Vec& acc) {
  return {_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)};
}
inline float hsum(const Vec& v) {  // a fixed tree
  const __m256 s8 = _mm256_add_ps(v.lo, v.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
inline void store(float* p, const Vec& v, int64_t n, const float* bias) {
  alignas(32) float tmp[kBlock];
  _mm256_store_ps(tmp, v.lo);
  _mm256_store_ps(tmp + 8, v.hi);
  for (int64_t i = 0; i < n; ++i) p[i] = bias ? tmp[i] + bias[i] : tmp[i];
}
#else
constexpr int kRows = 4, kTile = 1, kWide = 1;
constexpr int64_t kPanelRows = 2 * kRows;
struct Vec {
  float f[kBlock];
};
inline Vec zero() { return Vec{}; }
inline Vec load(const float* p) {
  Vec v;
  std::copy(p, p + kBlock, v.f);
  return v;
}
inline Vec load(const uint16_t* p) {  // 16 halves, exactly
  Vec v;
  for (int64_t i = 0; i < kBlock; ++i) v.f[i] = half_to_float(p[i]);
  return v;
}
inline Vec fma(float a, const Vec& w, const Vec& acc) {
  Vec out;
  for (int64_t i = 0; i < kBlock; ++i) out.f[i] = std::fma(a, w.f[i], acc.f[i]);
  return out;
}
inline Vec fmav(const Vec& a, const Vec& b, const Vec& acc) {
  Vec out;
  for (int64_t i = 0; i < kBlock; ++i) out.f[i] = std::fma(a.f[i], b.f[i], acc.f[i]);
  return out;
}
inline float hsum(Vec v) {  // a fixed tree
  for (int64_t half = kBlock / 2; half > 0; half /= 2)
    for (int64_t i = 0; i < half; ++i) v.f[i] += v.f[i + half];
  return v.f[0];
}
inline void store(float* p, const Vec& v, int64_t n, const float* bias) {
  for (int64_t i = 0; i < n; ++i) p[i] = bias ? v.f[i] + bias[i] : v.f[i];
}
#endif

// out[j] = hsum(v[j]) * scale for 4 lines, each reduced by hsum's own tree (lanes i and i + 8,
// then i and i + 4, i and i + 2, 0 and 1, each pair added in hsum's operand order) and scaled
// by one rounded product: hsum's bits. AVX-512 reduces the four lines together, side by side
// in each register.
inline void hsum4(const Vec* v, float scale, float* out) {
#if defined(__AVX512F__)
  __m512 pair[2];
  for (int i = 0; i < 2; ++i) {  // [line 2i's 8 sums | line 2i + 1's]: upper 256 + lower
    const __m512 a = v[2 * i].v, b = v[2 * i + 1].v;
    pair[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0xEE), _mm512_shuffle_f32x4(a, b, 0x44));
  }
  // [4 sums of each line]: upper 128 + lower
  const __m512 quad = _mm512_add_ps(_mm512_shuffle_f32x4(pair[0], pair[1], 0xDD),
                                    _mm512_shuffle_f32x4(pair[0], pair[1], 0x88));
  const __m512d q = _mm512_castps_pd(quad);  // lane j: line j's sums 0 + 2, 1 + 3, then 0 + 1
  const __m512 two = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(q, q)),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(q, q)));
  const __m512 one = _mm512_add_ps(two, _mm512_permute_ps(two, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m128 sums = _mm512_castps512_ps128(_mm512_permutexvar_ps(order, one));
  _mm_storeu_ps(out, _mm_mul_ps(sums, _mm_set1_ps(scale)));
#else
  for (int j = 0; j < 4; ++j) out[j] = hsum(v[j]) * scale;
#endif
}

// The largest of x[0..n), NaNs skipped (std::max(top, x) in order: a NaN never wins), -inf
// for n = 0. A maximum is exact whatever the order, so lanes give the serial loop's value
// (up to a zero's sign, which no difference x - top can tell).
inline float max_of(const float* x, int64_t n) {
  float top = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 lanes = _mm512_set1_ps(top);
  for (; i + kBlock <= n; i += kBlock) lanes = _mm512_max_ps(_mm512_loadu_ps(x + i), lanes);
  top = _mm512_reduce_max_ps(lanes);  // the second operand wins where the first is NaN
#elif defined(__AVX2__)
  __m256 lanes = _mm256_set1_ps(top);
  for (; i + 8 <= n; i += 8) lanes = _mm256_max_ps(_mm256_loadu_ps(x + i), lanes);
  alignas(32) float part[8];
  _mm256_store_ps(part, lanes);
  for (float v : part) top = std::max(top, v);
#endif
  for (; i < n; ++i) top = std::max(top, x[i]);
  return top;
}

}  // namespace sw
