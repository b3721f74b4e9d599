// int8_linear of kernels.h: the products="int8" option, GGUF blocks times int8 activations.
//
// Each row of x is quantized on its own, per 32 k (one GGUF block of the weight): dx =
// max|x| / 127 and codes qx = nearbyint(x * (127 / max|x|)) in [-127, 127], with their sum
// sx. A weight block of codes qw and scale dw (Q4_0: dw * (qw - 8); Q4_1: dw * qw + mw; Q8_0:
// dw * qw) then adds to output y[r, n], for each block g in ascending order, from zero:
//
//   t   = sum_k qw[n, k] * qx[r, k]           (int32, exact: any order gives the same t)
//   Q4_0: t -= 8 * sx                         (exact)
//   acc = fma(float(t), dw * dx, acc)         (dw * dx rounded once)
//   Q4_1: acc = fma(mw, dx * float(sx), acc)  (dx * sx rounded once)
//
// so each output depends only on its own row, in one fixed order of float operations,
// whatever the tile, the thread or the other rows: rows equal solo runs, at any thread count.
// The vector paths compute the same operations lane by lane (a lane is a column), so they
// give the portable build's bits. Integer sums cannot overflow: a 4-bit code times a code of
// at most 127 is at most 1905, and 16 of them fit an int16 lane (30480); Q8_0 takes |qw|
// (at most 128) times qx with qw's sign, so a pair is at most 32512.
//
// The layout (quant.py's pack_int8), per 16 output columns and 32 k: the 16 scales dw (f16),
// for Q4_1 the 16 mins mw (f16), then the codes in two halves of 8 columns. Within a half,
// a 32-bit lane holds one column's 4 consecutive k (byte 4c + j: column c, k = 4q + j), so one
// multiply-add of 32 bytes (vpmaddubsw) takes 8 columns x 4 k: Q8_0 as 8 such lines of signed
// bytes (k-quads q = 0..7), the 4-bit types as 4 lines of bytes whose low nibble is quad 2l
// and high nibble quad 2l + 1. The bytes per group equal quant_linear's.
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

constexpr int64_t kHalf = 8;  // columns per half-group: one 32-byte line of 8 x 4 k

constexpr int64_t scale_bytes(int64_t t) { return t == kQ4_1 ? 64 : 32; }
constexpr int64_t half_bytes(int64_t t) { return t == kQ8_0 ? 256 : 128; }

// Each row's codes, scales and code sums per 32 k (see the top of this file).
struct Rows {
  std::vector<int8_t> q;   // [M, K]
  std::vector<float> d;    // [M, K / 32]
  std::vector<int32_t> s;  // [M, K / 32]
};

Rows quantize(const float* x, int64_t M, int64_t K) {
  const int64_t G = K / kQK;
  Rows r{std::vector<int8_t>(static_cast<size_t>(M * K)),
         std::vector<float>(static_cast<size_t>(M * G)),
         std::vector<int32_t>(static_cast<size_t>(M * G))};
  for (int64_t i = 0; i < M * G; ++i) {
    const float* xb = x + i * kQK;
    float amax = 0.0f;
    for (int64_t k = 0; k < kQK; ++k) amax = std::max(amax, std::fabs(xb[k]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int64_t k = 0; k < kQK; ++k) {
      const float v = std::nearbyint(xb[k] * inv);  // round half to even, as the vector paths
      const int8_t q = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
      r.q[static_cast<size_t>(i * kQK + k)] = q;
      sum += q;
    }
    r.d[static_cast<size_t>(i)] = amax / 127.0f;
    r.s[static_cast<size_t>(i)] = sum;
  }
  return r;
}

// the code of column c (0..15) at k (0..31) of a group's codes (see the layout above)
inline int32_t weight_code(int64_t t, const uint8_t* codes, int64_t c, int64_t k) {
  const int64_t h = c / kHalf, col = c % kHalf, quad = k / 4, j = k % 4;
  const uint8_t* half = codes + h * half_bytes(t);
  if (t == kQ8_0) return static_cast<int8_t>(half[quad * 32 + col * 4 + j]);
  const uint8_t byte = half[quad / 2 * 32 + col * 4 + j];
  return quad % 2 ? byte >> 4 : byte & 0x0f;
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr int kRowTile = 4;

inline __m256 scales8(const uint8_t* p) {  // 8 halves
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float f[8];
  for (int i = 0; i < 8; ++i) f[i] = half_at(p + 2 * i);
  return _mm256_load_ps(f);
#endif
}

// R rows x the 8 columns of half h of column block b, every group: y (+ bias)
template <int64_t T, int R>
void half_tile(const Rows& x, int64_t m0, const uint8_t* w, const float* bias, float* y,
               int64_t K, int64_t N, int64_t b, int64_t h) {
  const int64_t G = K / kQK, gb = quant_group_bytes(T);
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* grp = w + (b * G + g) * gb;
    const __m256 dw = scales8(grp + 16 * h);
    const __m256 mw = T == kQ4_1 ? scales8(grp + 32 + 16 * h) : _mm256_setzero_ps();
    const uint8_t* codes = grp + scale_bytes(T) + h * half_bytes(T);
    __m256i wq[8];
    for (int l = 0; l < (T == kQ8_0 ? 8 : 4); ++l) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * l));
      if constexpr (T == kQ8_0) {
        wq[l] = v;
      } else {
        wq[2 * l] = _mm256_and_si256(v, low);
        wq[2 * l + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t row = m0 + r;
      const int8_t* xq = x.q.data() + row * K + g * kQK;
      __m256i sum;
      if constexpr (T == kQ8_0) {
        sum = _mm256_setzero_si256();
        for (int q = 0; q < 8; ++q) {
          int32_t quad;
          std::memcpy(&quad, xq + 4 * q, 4);
          const __m256i xb = _mm256_set1_epi32(quad);
          const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wq[q], wq[q]),
                                                 _mm256_sign_epi8(xb, wq[q]));
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
        }
      } else {
        __m256i s16 = _mm256_setzero_si256();
        for (int q = 0; q < 8; ++q) {
          int32_t quad;
          std::memcpy(&quad, xq + 4 * q, 4);
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wq[q], _mm256_set1_epi32(quad)));
        }
        sum = _mm256_madd_epi16(s16, ones);
      }
      const float dx = x.d[static_cast<size_t>(row * G + g)];
      const int32_t sx = x.s[static_cast<size_t>(row * G + g)];
      if constexpr (T == kQ4_0) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(8 * sx));
      const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(dx));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[r]);
      if constexpr (T == kQ4_1)
        acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(dx * static_cast<float>(sx)), acc[r]);
    }
  }
  const int64_t col = b * kBlock + h * kHalf, n = std::min(kHalf, N - col);
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[kHalf];
    _mm256_store_ps(out, acc[r]);
    float* yr = y + (m0 + r) * N + col;
    for (int64_t i = 0; i < n; ++i) yr[i] = bias ? out[i] + bias[col + i] : out[i];
  }
}

template <int64_t T, int... Rs>
constexpr auto half_tiles(std::integer_sequence<int, Rs...>) {
  using Fn = void (*)(const Rows&, int64_t, const uint8_t*, const float*, float*, int64_t,
                      int64_t, int64_t, int64_t);
  return std::array<Fn, sizeof...(Rs)>{half_tile<T, Rs + 1>...};
}

// column block b for every row: each half's codes stay in L1 across the row tiles
template <int64_t T>
void column_block(const Rows& x, int64_t M, const uint8_t* w, const float* bias, float* y,
                  int64_t K, int64_t N, int64_t b) {
  static constexpr auto tiles = half_tiles<T>(std::make_integer_sequence<int, kRowTile>{});
  for (int64_t h = 0; h < 2 && b * kBlock + h * kHalf < N; ++h)
    for (int64_t m = 0; m < M; m += kRowTile) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowTile, M - m));
      tiles[rows - 1](x, m, w, bias, y, K, N, b, h);
    }
}
#else
// the portable build: the same operations, one column at a time
template <int64_t T>
void column_block(const Rows& x, int64_t M, const uint8_t* w, const float* bias, float* y,
                  int64_t K, int64_t N, int64_t b) {
  const int64_t G = K / kQK, gb = quant_group_bytes(T);
  for (int64_t c = 0; c < kBlock && b * kBlock + c < N; ++c) {
    const int64_t col = b * kBlock + c;
    for (int64_t row = 0; row < M; ++row) {
      float acc = 0.0f;
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* grp = w + (b * G + g) * gb;
        const int8_t* xq = x.q.data() + row * K + g * kQK;
        int32_t t = 0;
        for (int64_t k = 0; k < kQK; ++k)
          t += weight_code(T, grp + scale_bytes(T), c, k) * xq[k];
        const float dx = x.d[static_cast<size_t>(row * G + g)];
        const int32_t sx = x.s[static_cast<size_t>(row * G + g)];
        if (T == kQ4_0) t -= 8 * sx;
        acc = std::fma(static_cast<float>(t), half_at(grp + 2 * c) * dx, acc);
        if (T == kQ4_1) acc = std::fma(half_at(grp + 32 + 2 * c), dx * static_cast<float>(sx), acc);
      }
      y[row * N + col] = bias ? acc + bias[col] : acc;
    }
  }
}
#endif

template <int64_t T>
void int8_products(const float* x, const uint8_t* w, const float* bias, float* y, int64_t M,
                   int64_t K, int64_t N, int64_t threads) {
  const Rows rows = quantize(x, M, K);
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  parallel_for(threads, 0, blocks, linear_grain(M, K), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) column_block<T>(rows, M, w, bias, y, K, N, b);
  });
}

}  // namespace

bool int8_type(int64_t qtype) { return qtype == kQ4_0 || qtype == kQ4_1 || qtype == kQ8_0; }

void int8_linear(const float* x, const uint8_t* packed, const float* bias, float* y, int64_t M,
                 int64_t K, int64_t N, int64_t qtype, int64_t threads) {
  if (M == 0) return;
  switch (qtype) {
    case kQ4_1: return int8_products<kQ4_1>(x, packed, bias, y, M, K, N, threads);
    case kQ8_0: return int8_products<kQ8_0>(x, packed, bias, y, M, K, N, threads);
    default: return int8_products<kQ4_0>(x, packed, bias, y, M, K, N, threads);
  }
}

}  // namespace sw
