// exps() of exp_lanes.h: glibc's expf a float at a time, and on AVX-512 8 at a time.
#include "exp_lanes.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "pool.h"
#include "simd.h"

namespace sw {

namespace {

// __exp2f_data of glibc (e_exp2f_data.c): 2^(i/32) less i << 47 in its bits, and the scaled
// constants of expf: k = round(x * 32/ln2), r = x * 32/ln2 - k, 2^(r/32) ~ C0 r^3 + C1 r^2 +
// C2 r + 1, the result 2^(k/32) times that
alignas(64) constexpr uint64_t kTable[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};
constexpr double kInvLn2N = 0x1.71547652b82fep+5, kShift = 0x1.8p+52;
constexpr double kC0 = 0x1.c6af84b912394p-20, kC1 = 0x1.ebfce50fac4f3p-13;
constexpr double kC2 = 0x1.62e42ff0c52d6p-6;
// expf's ranges below zero: from kLow up the formula; below it the least subnormal; below
// kZero (and -inf) zero
constexpr float kLow = -0x1.9d1d9ep6f, kZero = -0x1.9fe368p6f;

// the bits of `from` as a To of the same size (C++20's std::bit_cast)
template <typename To, typename From>
To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// glibc's expf of one x <= 0, or NaN
float exp_one(float x) {
  if (std::isnan(x)) return x + x;
  if (x > 0.0f) return std::exp(x);
  if (x < kZero) return 0.0f;
  if (x < kLow) return 0x1.4p-75f * 0x1.4p-75f;  // rounds to the least subnormal
  const double xd = x;
  double kd = std::fma(kInvLn2N, xd, kShift);
  const auto ki = bit_cast<uint64_t>(kd);
  kd -= kShift;
  const double r = std::fma(kInvLn2N, xd, -kd);
  const double z = std::fma(r, kC0, kC1);
  const auto s = bit_cast<double>(kTable[ki % 32] + (ki << 47));
  const double r2 = r * r;
  double y = std::fma(r, kC2, 1.0);
  y = std::fma(z, r2, y);
  return static_cast<float>(y * s);
}

#if defined(__AVX512F__)
// exp_one of 8 floats in [kLow, 0], as the same operations on 8 lanes
inline __m256 exp8(__m256 xf) {
  const __m512d xd = _mm512_cvtps_pd(xf);
  const __m512d inv = _mm512_set1_pd(kInvLn2N), shift = _mm512_set1_pd(kShift);
  __m512d kd = _mm512_fmadd_pd(inv, xd, shift);
  const __m512i ki = _mm512_castpd_si512(kd);
  kd = _mm512_sub_pd(kd, shift);
  const __m512d r = _mm512_fmsub_pd(inv, xd, kd);
  const __m512d z = _mm512_fmadd_pd(r, _mm512_set1_pd(kC0), _mm512_set1_pd(kC1));
  const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
  const __m512i lo = _mm512_permutex2var_epi64(_mm512_load_si512(kTable), idx,
                                               _mm512_load_si512(kTable + 8));
  const __m512i hi = _mm512_permutex2var_epi64(_mm512_load_si512(kTable + 16), idx,
                                               _mm512_load_si512(kTable + 24));
  const __mmask8 upper = _mm512_test_epi64_mask(idx, _mm512_set1_epi64(16));
  const __m512i t = _mm512_add_epi64(_mm512_mask_blend_epi64(upper, lo, hi),
                                     _mm512_slli_epi64(ki, 47));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(kC2), _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(z, r2, y);
  return _mm512_cvtpd_ps(_mm512_mul_pd(y, _mm512_castsi512_pd(t)));
}

// whether all 8 floats lie in [kLow, 0] (a NaN does not)
inline bool in_range8(__m256 xf) {
  const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(xf, _mm256_set1_ps(kLow), _CMP_GE_OQ),
                                  _mm256_cmp_ps(xf, _mm256_setzero_ps(), _CMP_LE_OQ));
  return _mm256_movemask_ps(ok) == 0xff;
}
#endif

bool same_bits(float a, float b) { return bit_cast<uint32_t>(a) == bit_cast<uint32_t>(b); }

// exps() against exp_one and std::exp of `count` floats from bit pattern `first` on,
// `stride` apart
ExpMismatches mismatches_in(uint32_t first, int64_t count, int64_t stride) {
  constexpr int64_t kChunk = 1024;
  float in[kChunk], out[kChunk];
  ExpMismatches bad;
  for (int64_t done = 0; done < count; done += kChunk) {
    const int64_t m = std::min<int64_t>(kChunk, count - done);
    for (int64_t j = 0; j < m; ++j)
      in[j] = out[j] = bit_cast<float>(first + static_cast<uint32_t>((done + j) * stride));
    exps(out, m);
    for (int64_t j = 0; j < m; ++j) {
      bad.algorithm += !same_bits(out[j], exp_one(in[j]));
      bad.libm += !same_bits(out[j], std::exp(in[j]));
    }
  }
  return bad;
}

}  // namespace

void exps(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 8 <= n; i += 8) {
    const __m256 xf = _mm256_loadu_ps(x + i);
    if (in_range8(xf))
      _mm256_storeu_ps(x + i, exp8(xf));
    else
      for (int64_t j = i; j < i + 8; ++j) x[j] = exp_one(x[j]);
  }
#endif
  for (; i < n; ++i) x[i] = exp_one(x[i]);
}

ExpMismatches exp_mismatches(int64_t stride, int64_t threads) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float got = nan;
  exps(&got, 1);
  // 0x80000000 (-0) to 0xff800000 (-inf): the non-positive floats, in pieces on the pool
  const int64_t count = int64_t{0x7f800000} / stride + 1;
  constexpr int64_t kPiece = 1 << 12;  // floats a task: the harness's 2^16 make 16 tasks
  std::atomic<int64_t> algorithm{!same_bits(got, exp_one(nan))};
  std::atomic<int64_t> libm{!same_bits(got, std::exp(nan))};
  parallel_for(threads, 0, (count + kPiece - 1) / kPiece, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t from = p * kPiece;
      const uint32_t first = 0x80000000u + static_cast<uint32_t>(from * stride);
      const ExpMismatches bad = mismatches_in(first, std::min(kPiece, count - from), stride);
      algorithm += bad.algorithm;
      libm += bad.libm;
    }
  });
  return {algorithm.load(), libm.load()};
}

}  // namespace sw
