// quant_linear and quant_row of kernels.h: GGUF blocks read as they ship.
//
// The same products with the weight read as GGUF quantized blocks (Q4_0, Q4_1, Q8_0: 32
// weights along k share an f16 scale d, and for Q4_1 an f16 min m). Packed once at load
// (quant.py) as [N/16][K/32][bytes]: per 16 output columns and 32 k, the 16 scales (f16), the
// 16 mins (Q4_1), then the 16 columns' codes, 16 bytes per load: 8-bit, one k (signed bytes,
// column i in byte i); 4-bit, two k (column i of k in the low nibble of byte i, of k + 1 in
// its high one), so one zero-extending load and a mask or a shift give each line.
// Each weight is dequantized in registers to the float32 value gguf.quants computes in numpy
// (Q4_0: d * (q - 8); Q4_1: (d * q) + m; Q8_0: q * d), and then enters the same in-order
// fused multiply-add chain as the float32 kernel (float_tiles.h): the bits of that kernel on the
// dequantized matrix. The product d * q is always exact in float32 (an 11-bit half
// significand times an integer of at most 8 bits, far from overflow and underflow), so
// Q4_1's (d * q) + m rounds once whether the add is separate or fused: the vector paths
// fuse it (one instruction less per weight line), the scalar one keeps numpy's two steps.
//
// Q5_1 and the K-quants (Q4_K, Q5_K: 256-weight super-blocks of eight 32-weight
// sub-blocks, 6-bit scales and mins under two f16 factors; Q6_K: sixteen 16-weight
// sub-blocks, int8 scales under one f16 factor) are "wide": quant.py computes each
// sub-block's float32 scale s and offset o at load exactly as gguf.quants does (d * sc,
// dmin * m: exact products) and packs, per 16 columns and 32 k, the 16 scales (Q6_K: two
// lines, for k 0-15 and 16-31), the 16 offsets (Q5_1's min m; the K-quants' -(dmin * m)),
// then the codes: Q4_K's as 16 loads of nibbles as the 4-bit types'; the five- and six-bit
// types' as whole signed bytes (Q6_K's q - 32), one 16-byte load per k, column i in byte i
// (putting high bits back cost more instructions per weight than the bytes cost to read; a
// decode step on a few cores is bound by instructions). A weight is s * q, or s * q + o:
// gguf's (d * q) + m and d * q - dm, whose product is exact (at most 23 significant bits), so
// the fused form rounds once as numpy's two steps. (Q5_0 arrives as Q8_0: quant.py.)
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "float_tiles.h"
#include "half.h"
#include "kernels.h"
#include "pool.h"

namespace sw {
namespace {


// Groups ahead to prefetch, every cache line of each (a Q4_1 group is five lines, a Q8_0
// one eight and a half): with one line per group, as the float32 kernel's one line per k,
// a decode step read the blocks at half the rate (16.3 against 10.5 ms per step for the
// default model, one thread, 2026-12-01); farther ahead measured no better.
constexpr int64_t kQPrefetch = 1;

constexpr int64_t scale_bytes(int64_t t) { return t == kQ4_1 ? 64 : 32; }

// the wide types' layout (see the top of this file)
constexpr bool wide(int64_t t) { return t == kQ5_1 || t >= kQ4_K; }
constexpr bool byte_codes(int64_t t) { return wide(t) && t != kQ4_K; }  // signed bytes
constexpr int64_t subs(int64_t t) { return t == kQ6_K ? 2 : 1; }  // scale lines per group
constexpr bool has_offset(int64_t t) { return t == kQ5_1 || t == kQ4_K || t == kQ5_K; }
constexpr int64_t codes_at(int64_t t) { return 64 * subs(t) + (has_offset(t) ? 64 : 0); }
constexpr int64_t lines_per_load(int64_t t) { return t == kQ8_0 ? 1 : 2; }  // 16 bytes each
constexpr int64_t group_bytes(int64_t t) { return quant_group_bytes(t); }

// the code of column i at k = kk (0..31) of a group, from the group's codes
inline float code(int64_t t, const uint8_t* codes, int64_t kk, int64_t i) {
  if (t == kQ8_0) return static_cast<float>(static_cast<int8_t>(codes[kk * 16 + i]));
  const uint8_t byte = codes[kk / 2 * 16 + i];
  const int q = kk % 2 ? (byte >> 4) : (byte & 0x0f);
  return static_cast<float>(t == kQ4_0 ? q - 8 : q);
}

// a wide type's code of column i at k = kk
inline float wide_code(int64_t t, const uint8_t* group, int64_t kk, int64_t i) {
  if (byte_codes(t))
    return static_cast<float>(static_cast<int8_t>(group[codes_at(t) + kk * 16 + i]));
  return static_cast<float>((group[codes_at(t) + kk / 2 * 16 + i] >> (kk % 2 * 4)) & 0x0f);
}

inline float wide_one(int64_t t, const uint8_t* group, int64_t kk, int64_t i) {
  float s, o;
  std::memcpy(&s, group + (subs(t) == 2 && kk >= 16 ? 64 : 0) + 4 * i, 4);
  const float q = wide_code(t, group, kk, i);
  if (!has_offset(t)) return q * s;
  std::memcpy(&o, group + 64 * subs(t) + 4 * i, 4);
  return s * q + o;  // no contraction: -ffp-contract=off
}

inline float dequant_one(int64_t t, const uint8_t* group, int64_t kk, int64_t i) {
  if (wide(t)) return wide_one(t, group, kk, i);
  uint16_t h[2];
  std::memcpy(&h[0], group + 2 * i, 2);
  const float d = half_to_float(h[0]);
  const float q = code(t, group + scale_bytes(t), kk, i);
  if (t != kQ4_1) return d * q;
  std::memcpy(&h[1], group + 32 + 2 * i, 2);
  return d * q + half_to_float(h[1]);  // no contraction: -ffp-contract=off
}

struct Scales {
  Vec d, m, d2;  // scales, mins or offsets, Q6_K's scales of k 16-31
};

#if defined(__AVX512F__)
inline Vec halves(const uint8_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
template <int64_t T>
inline Vec scaled(__m512i qi, const Scales& s) {
  if constexpr (T == kQ4_0) qi = _mm512_sub_epi32(qi, _mm512_set1_epi32(8));
  const __m512 q = _mm512_cvtepi32_ps(qi);
  // one rounding either way: d * q is exact (see above), so the fused form has the bits
  // of gguf's separate multiply and add
  return {T == kQ4_1 ? _mm512_fmadd_ps(s.d.v, q, s.m.v) : _mm512_mul_ps(q, s.d.v)};
}
// 16 bytes widened to 32-bit lanes, unsigned or signed
inline __m512i bytes16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m512i signed16(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// the lines_per_load(T) weight lines of one 16-byte load
template <int64_t T>
inline void dequant(const uint8_t* p, const Scales& s, Vec* out) {
  if constexpr (T == kQ8_0) {
    out[0] = scaled<T>(signed16(p), s);
  } else {
    const __m512i b = bytes16(p);
    out[0] = scaled<T>(_mm512_and_si512(b, _mm512_set1_epi32(0x0f)), s);
    out[1] = scaled<T>(_mm512_srli_epi32(b, 4), s);
  }
}
// a wide type's two weight lines of k = kk and kk + 1
template <int64_t T>
inline void dequant_wide(const uint8_t* grp, int64_t kk, const Scales& s, Vec* out) {
  __m512i q[2];
  if constexpr (byte_codes(T)) {
    for (int j = 0; j < 2; ++j) q[j] = signed16(grp + codes_at(T) + (kk + j) * 16);
  } else {
    const __m512i nib = bytes16(grp + codes_at(T) + kk / 2 * 16);
    q[0] = _mm512_and_si512(nib, _mm512_set1_epi32(0x0f));
    q[1] = _mm512_srli_epi32(nib, 4);
  }
  const __m512 sc = subs(T) == 2 && kk >= 16 ? s.d2.v : s.d.v;
  for (int j = 0; j < 2; ++j) {
    const __m512 f = _mm512_cvtepi32_ps(q[j]);
    if constexpr (has_offset(T)) out[j] = {_mm512_fmadd_ps(sc, f, s.m.v)};
    else out[j] = {_mm512_mul_ps(f, sc)};
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
inline Vec halves(const uint8_t* p) {
#if defined(__F16C__)
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  return {_mm256_cvtph_ps(lo), _mm256_cvtph_ps(hi)};
#else
  alignas(32) float f[kBlock];
  for (int64_t i = 0; i < kBlock; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    f[i] = half_to_float(h);
  }
  return load(f);
#endif
}
template <int64_t T>
inline Vec scaled(__m256i a, __m256i b, const Scales& s) {
  if constexpr (T == kQ4_0) {
    a = _mm256_sub_epi32(a, _mm256_set1_epi32(8));
    b = _mm256_sub_epi32(b, _mm256_set1_epi32(8));
  }
  const __m256 qa = _mm256_cvtepi32_ps(a), qb = _mm256_cvtepi32_ps(b);
  if constexpr (T == kQ4_1)  // d * q is exact: the fused form has gguf's bits (see above)
    return {_mm256_fmadd_ps(s.d.lo, qa, s.m.lo), _mm256_fmadd_ps(s.d.hi, qb, s.m.hi)};
  return {_mm256_mul_ps(qa, s.d.lo), _mm256_mul_ps(qb, s.d.hi)};
}
// 8 bytes widened to 32-bit lanes, unsigned or signed
inline __m256i bytes8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i signed8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// the lines_per_load(T) weight lines of one 16-byte load
template <int64_t T>
inline void dequant(const uint8_t* p, const Scales& s, Vec* out) {
  if constexpr (T == kQ8_0) {
    out[0] = scaled<T>(signed8(p), signed8(p + 8), s);
  } else {
    const __m256i a = bytes8(p), b = bytes8(p + 8);
    const __m256i nib = _mm256_set1_epi32(0x0f);
    out[0] = scaled<T>(_mm256_and_si256(a, nib), _mm256_and_si256(b, nib), s);
    out[1] = scaled<T>(_mm256_srli_epi32(a, 4), _mm256_srli_epi32(b, 4), s);
  }
}
// eight columns of a wide type's line j (k = kk + j): their codes, scales and offsets
template <int64_t T>
inline __m256 wide_half(__m256i q, __m256 sc, __m256 o) {
  const __m256 f = _mm256_cvtepi32_ps(q);
  if constexpr (has_offset(T)) return _mm256_fmadd_ps(sc, f, o);
  else return _mm256_mul_ps(f, sc);
}
// eight columns' nibble-packed codes of line j (Q4_K)
inline __m256i nibble_codes(__m256i nib, int j) {
  return j ? _mm256_srli_epi32(nib, 4) : _mm256_and_si256(nib, _mm256_set1_epi32(0x0f));
}
// a wide type's two weight lines of k = kk and kk + 1
template <int64_t T>
inline void dequant_wide(const uint8_t* grp, int64_t kk, const Scales& s, Vec* out) {
  const Vec& sc = subs(T) == 2 && kk >= 16 ? s.d2 : s.d;
  if constexpr (byte_codes(T)) {
    for (int j = 0; j < 2; ++j) {
      const uint8_t* c = grp + codes_at(T) + (kk + j) * 16;
      out[j] = {wide_half<T>(signed8(c), sc.lo, s.m.lo),
                wide_half<T>(signed8(c + 8), sc.hi, s.m.hi)};
    }
    return;
  }
  const uint8_t* n = grp + codes_at(T) + kk / 2 * 16;
  const __m256i na = bytes8(n), nb = bytes8(n + 8);
  for (int j = 0; j < 2; ++j)
    out[j] = {wide_half<T>(nibble_codes(na, j), sc.lo, s.m.lo),
              wide_half<T>(nibble_codes(nb, j), sc.hi, s.m.hi)};
}
#else
inline Vec halves(const uint8_t* p) {
  Vec v;
  for (int64_t i = 0; i < kBlock; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    v.f[i] = half_to_float(h);
  }
  return v;
}
template <int64_t T>
inline void dequant(const uint8_t* p, const Scales& s, Vec* out) {
  for (int64_t j = 0; j < lines_per_load(T); ++j)
    for (int64_t i = 0; i < kBlock; ++i) {
      const float dq = s.d.f[i] * code(T, p, j, i);
      out[j].f[i] = T == kQ4_1 ? dq + s.m.f[i] : dq;
    }
}
// a wide type's two weight lines of k = kk and kk + 1
template <int64_t T>
inline void dequant_wide(const uint8_t* grp, int64_t kk, const Scales& s, Vec* out) {
  const Vec& sc = subs(T) == 2 && kk >= 16 ? s.d2 : s.d;
  for (int64_t j = 0; j < 2; ++j)
    for (int64_t i = 0; i < kBlock; ++i) {
      const float q = wide_code(T, grp, kk + j, i);
      out[j].f[i] = has_offset(T) ? sc.f[i] * q + s.m.f[i] : q * sc.f[i];
    }
}
#endif

inline Scales scales_of(int64_t t, const uint8_t* group) {
  if (wide(t)) {  // float32 lines (a group's bytes are a multiple of 64: aligned)
    const float* f = reinterpret_cast<const float*>(group);
    return {load(f), has_offset(t) ? load(f + 16 * subs(t)) : zero(),
            subs(t) == 2 ? load(f + 16) : zero()};
  }
  return {halves(group), t == kQ4_1 ? halves(group + 32) : zero(), zero()};
}

// the lines_per_load(T) weight lines of a group from k = kk
template <int64_t T>
inline void dequant_at(const uint8_t* grp, int64_t kk, const Scales& s, Vec* out) {
  if constexpr (wide(T)) dequant_wide<T>(grp, kk, s, out);
  else dequant<T>(grp + scale_bytes(T) + kk / lines_per_load(T) * 16, s, out);
}

// R rows times C column blocks from block b, dequantizing each weight line once for all rows
// (decode: the weights stream from memory once, in their quantized size).
template <int64_t T, int R, int C>
void qtile(const float* x, const uint8_t* w, const float* bias, float* y, int64_t K, int64_t N,
           int64_t b) {
  constexpr int64_t G = group_bytes(T), P = lines_per_load(T);
  const int64_t groups = K / kQK;
  Vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = zero();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* grp[C];
    Scales s[C];
    for (int c = 0; c < C; ++c) {
      grp[c] = w + ((b + c) * groups + g) * G;
      for (int64_t o = 0; o < G; o += 64) __builtin_prefetch(grp[c] + kQPrefetch * G + o);
      s[c] = scales_of(T, grp[c]);
    }
    for (int64_t kk = 0; kk < kQK; kk += P) {
      Vec lines[C][P];
      for (int c = 0; c < C; ++c) dequant_at<T>(grp[c], kk, s[c], lines[c]);
      for (int64_t j = 0; j < P; ++j) {  // k ascending, as the float32 kernel
        Vec wk[C];
        for (int c = 0; c < C; ++c) wk[c] = lines[c][j];
        step<R, C>(x, K, g * kQK + kk + j, wk, acc);
      }
    }
  }
  finish<R, C>(acc, bias, y, N, b);
}

// Column block b dequantized whole into `panel` ([K][16] floats, the float32 packing), for
// many rows (prefill): the float32 tiles then run on it unchanged.
template <int64_t T>
void dequant_panel(const uint8_t* w, int64_t K, int64_t b, float* panel) {
  constexpr int64_t G = group_bytes(T), P = lines_per_load(T);
  const int64_t groups = K / kQK;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* grp = w + (b * groups + g) * G;
    const Scales s = scales_of(T, grp);
    for (int64_t kk = 0; kk < kQK; kk += P) {
      Vec v[P];
      dequant_at<T>(grp, kk, s, v);
      std::memcpy(panel + (g * kQK + kk) * kBlock, v, sizeof v);
    }
  }
}

using QTileFn = void (*)(const float*, const uint8_t*, const float*, float*, int64_t, int64_t,
                        int64_t);
template <int64_t T, int R, int... Cs>
constexpr std::array<QTileFn, sizeof...(Cs)> qtiles_of(std::integer_sequence<int, Cs...>) {
  return {qtile<T, R, Cs + 1>...};
}
template <int64_t T, int W, int... Rs>
constexpr auto qtiles(std::integer_sequence<int, Rs...>) {
  return std::array{qtiles_of<T, Rs + 1>(std::make_integer_sequence<int, W>{})...};
}
template <int64_t T>
constexpr auto kQWideTiles = qtiles<T, kWide>(std::make_integer_sequence<int, kWideRows>{});
template <int64_t T>
constexpr auto kQTiles = qtiles<T, kTile>(std::make_integer_sequence<int, kRows>{});

// Up to kPanelRows rows (simd.h), each group of kRows dequantizes the weights again in
// registers; more (a prefill), each column block is dequantized once into a panel.

template <int64_t T>
void qlinear(const float* xp, const uint8_t* wp, const float* bp, float* yp, int64_t M, int64_t K,
             int64_t n_out, int64_t threads) {
  const int64_t blocks = (n_out + kBlock - 1) / kBlock;
  const int64_t grain = linear_grain(M, K);
  if (M <= kWideRows) {
    parallel_for(threads, 0, blocks, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; b += kWide) {
        const int cols = static_cast<int>(std::min<int64_t>(kWide, b1 - b));
        kQWideTiles<T>[M - 1][cols - 1](xp, wp, bp, yp, K, n_out, b);
      }
    });
    return;
  }
  if (M <= kPanelRows) {
    parallel_for(threads, 0, blocks, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; b += kTile) {
        const int cols = static_cast<int>(std::min<int64_t>(kTile, b1 - b));
        for (int64_t m = 0; m < M; m += kRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kRows, M - m));
          kQTiles<T>[rows - 1][cols - 1](xp + m * K, wp, bp, yp + m * n_out, K, n_out, b);
        }
      }
    });
    return;
  }
  parallel_for(threads, 0, blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> panel(static_cast<size_t>(kTile * K * kBlock));
    for (int64_t b = b0; b < b1; b += kTile) {
      const int cols = static_cast<int>(std::min<int64_t>(kTile, b1 - b));
      for (int c = 0; c < cols; ++c) dequant_panel<T>(wp, K, b + c, panel.data() + c * K * kBlock);
      // the float32 tile reads block b at w + b * K * 16: point w there at the panel
      const float* w = panel.data() - b * K * kBlock;
      for (int64_t m = 0; m < M; m += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, M - m));
        kTiles[rows - 1][cols - 1](xp + m * K, w, bp, yp + m * n_out, K, n_out, b);
      }
    }
  });
}


}  // namespace

void quant_linear(const float* x, const uint8_t* packed, const float* bias, float* y, int64_t M,
                  int64_t K, int64_t N, int64_t qtype, int64_t threads) {
  if (M == 0) return;
  with_qtype(qtype, [&](auto t) {
    qlinear<decltype(t)::value>(x, packed, bias, y, M, K, N, threads);
  });
}

namespace {
// Rows [first, first + n) of W, dequantized column block by column block on the pool, each
// block through dequant_panel (the forward's own vector dequantization, so gguf's bits, as
// quant_row's) into a [K][16] panel, written out transposed, y [K][n]: a panel's line is 16
// neighbouring floats of a y row, so the copy is contiguous (a row-major W took 3x longer).
template <int64_t T>
void qdense(const uint8_t* wp, int64_t first, int64_t n, int64_t K, float* y, int64_t threads) {
  const int64_t b_first = first / kBlock, b_last = (first + n + kBlock - 1) / kBlock;
  parallel_for(threads, b_first, b_last, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> panel(static_cast<size_t>(K * kBlock));
    for (int64_t b = b0; b < b1; ++b) {
      dequant_panel<T>(wp, K, b, panel.data());
      const int64_t lo = std::max(first, b * kBlock), hi = std::min(first + n, (b + 1) * kBlock);
      const float* src = panel.data() + (lo - b * kBlock);
      float* dst = y + (lo - first);
      for (int64_t k = 0; k < K; ++k)
        std::memcpy(dst + k * n, src + k * kBlock, static_cast<size_t>(hi - lo) * sizeof(float));
    }
  });
}
}  // namespace

void quant_dense(const uint8_t* packed, int64_t first, int64_t n, int64_t K, int64_t qtype,
                 float* y, int64_t threads) {
  if (n == 0) return;
  with_qtype(qtype, [&](auto t) { qdense<decltype(t)::value>(packed, first, n, K, y, threads); });
}

void quant_row(const uint8_t* packed, int64_t id, int64_t K, int64_t qtype, float* y) {
  const int64_t groups = K / kQK, G = group_bytes(qtype);
  const int64_t b = id / kBlock, i = id % kBlock;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* grp = packed + (b * groups + g) * G;
    for (int64_t kk = 0; kk < kQK; ++kk) y[g * kQK + kk] = dequant_one(qtype, grp, kk, i);
  }
}

}  // namespace sw
