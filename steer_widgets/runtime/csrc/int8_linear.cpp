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
// The wide types (quant.py's float32 sub-block scales s and offsets o, weight s * q + o)
// take the Q4_1 form with s and o for dw and mw: Q4_K's 4-bit codes, Q5_1's and Q5_K's
// 5-bit ones (0..31, summed in int16 four k-quads at a time). Q6_K (signed codes q - 32,
// one scale per 16 k) sums k 0-15 and 16-31 apart: acc = fma(float(t_lo), s_lo * dx, acc),
// then the same for t_hi.
//
// so each output depends only on its own row, in one fixed order of float operations,
// whatever the tile, the thread or the other rows: rows equal solo runs, at any thread count.
// The vector paths compute the same operations lane by lane (a lane is a column), so they
// give the portable build's bits. Integer sums cannot overflow: a 4-bit code times a code of
// at most 127 is at most 1905, and 16 of them fit an int16 lane (30480); a 5-bit one at most
// 3937, 8 of them 31496; Q8_0 and Q6_K take |qw| (at most 128, 32) times qx with qw's sign,
// so a pair is at most 32512 (Q6_K: 8 products, 32512).
//
// The layout (quant.py's pack_int8), per 16 output columns and 32 k: the 16 scales dw (f16),
// for Q4_1 the 16 mins mw (f16), then the codes in two halves of 8 columns; the wide types'
// scales (Q6_K: two lines) and offsets as float32 lines, as quant_linear's wide layout.
// Within a half, a 32-bit lane holds one column's 4 consecutive k (byte 4c + j: column c,
// k = 4q + j), so one multiply-add of 32 bytes (vpmaddubsw, or VNNI's vpdpbusd) takes 8
// columns x 4 k: the byte types as 8 such lines (k-quads q = 0..7; Q8_0 and Q6_K signed,
// Q5_1 and Q5_K unsigned), the 4-bit types as 4 lines of bytes whose low nibble is quad 2l
// and high nibble quad 2l + 1. The bytes per group equal quant_linear's. AVX-512 VNNI reads
// both halves' line q into one 64-byte register: a column block's 16 columns at once.
//
// Builds: AVX-512 with VNNI (16 columns a register, vpdpbusd), AVX2 with AVX-VNNI or
// AVX-512 VNNI's 256-bit form (8 columns, vpdpbusd), AVX2 (8 columns, vpmaddubsw), and the
// portable C++; every one sums the same integers, so every one gives the same bits.
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

constexpr bool wide(int64_t t) { return t == kQ5_1 || t >= kQ4_K; }  // float32 scales
constexpr bool nibbles(int64_t t) { return t == kQ4_0 || t == kQ4_1 || t == kQ4_K; }
constexpr bool signed_codes(int64_t t) { return t == kQ8_0 || t == kQ6_K; }
constexpr bool has_offset(int64_t t) {
  return t == kQ4_1 || t == kQ5_1 || t == kQ4_K || t == kQ5_K;
}
constexpr int64_t scale_bytes(int64_t t) { return wide(t) ? 128 : t == kQ4_1 ? 64 : 32; }
constexpr int64_t half_bytes(int64_t t) { return nibbles(t) ? 128 : 256; }

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr bool kOffsetCodes = true;  // the VNNI tiles of signed weight codes read x + 128
#else
constexpr bool kOffsetCodes = false;
#endif

// Each row's codes, scales and code sums per 32 k (see the top of this file).
struct Rows {
  std::vector<int8_t> q;   // [M, K]
  std::vector<float> d;    // [M, K / 32]
  std::vector<int32_t> s;  // [M, K / 32]
  std::vector<float> ds;   // [M, K / 32]: d * float(s), the offset term's factor
  // [M, K] or empty: each code + 128 as an unsigned byte (its top bit flipped), made once a
  // row for the VNNI tiles of signed weight codes, which broadcast it straight from memory
  // (built in a register, every quad of every column block cost a move to the vector unit)
  std::vector<uint8_t> u;
};

// One block of 32: its codes, scale and code sum. Every path computes the same numbers: the
// maximum is exact in any order (a NaN |x| is passed over, as std::max(amax, |x|) does), the
// product is one rounded multiply, the rounding half to even, and the clamp takes a NaN to
// -127 (as the vector max does), so no build differs on any input.
inline float clamp127(float v) {
  v = v > -127.0f ? v : -127.0f;
  return v < 127.0f ? v : 127.0f;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
inline void quantize_block(const float* xb, int8_t* q, float& d, int32_t& s) {
  const __m512 a = _mm512_loadu_ps(xb), b = _mm512_loadu_ps(xb + 16);
  const __m512 m =
      _mm512_max_ps(_mm512_abs_ps(b), _mm512_max_ps(_mm512_abs_ps(a), _mm512_setzero_ps()));
  const float amax = _mm512_reduce_max_ps(m);
  const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m512i c[2];
  const __m512 v[2] = {a, b};
  for (int h = 0; h < 2; ++h) {
    const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v[h], inv), kNearest);
    c[h] = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), _mm512_cvtepi32_epi8(c[h]));
  }
  d = amax / 127.0f;
  s = _mm512_reduce_add_epi32(_mm512_add_epi32(c[0], c[1]));
}
#elif defined(__AVX2__)
inline void quantize_block(const float* xb, int8_t* q, float& d, int32_t& s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xb + 8 * i);
    m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i c[4], sum = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], inv),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    c[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
    sum = _mm256_add_epi32(sum, c[i]);
  }
  // llama.cpp's packing order: two packs interleave the lanes, one permute restores k order
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1)));
  d = amax / 127.0f;
}
#else
inline void quantize_block(const float* xb, int8_t* q, float& d, int32_t& s) {
  float amax = 0.0f;
  for (int64_t k = 0; k < kQK; ++k) amax = std::max(amax, std::fabs(xb[k]));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t sum = 0;
  for (int64_t k = 0; k < kQK; ++k) {
    q[k] = static_cast<int8_t>(clamp127(std::nearbyint(xb[k] * inv)));  // half to even
    sum += q[k];
  }
  d = amax / 127.0f;
  s = sum;
}
#endif

// A column block kAhead blocks on is fetched into L2 while this one computes, at every row
// count: with many rows a block computes long enough that the hardware prefetcher, which runs
// a few lines ahead of the reads, leaves the memory bus idle meanwhile; with one or two rows
// each block is short, and the explicit fetch keeps more of the stream in flight than the
// hardware prefetcher alone (docs/benchmarks.md).
constexpr int64_t kAhead = 2;

// whether column block b's first row tile fetches block b + kAhead (see above)
inline bool fetches_ahead(int64_t b, int64_t N) { return (b + kAhead) * kBlock < N; }

inline void prefetch_group(const uint8_t* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(p + at, 0, 2);  // read, L2
}

// blocks of 32 a pool chunk takes: a decode step's few rows stay on the calling thread
constexpr int64_t kQuantizeGrain = 2048;

// every row's blocks, rows side by side on the pool (each block is computed alone)
// (with offset, Rows::u too)
Rows quantize(const float* x, int64_t M, int64_t K, int64_t threads, bool offset) {
  const int64_t G = K / kQK;
  Rows r{std::vector<int8_t>(static_cast<size_t>(M * K)),
         std::vector<float>(static_cast<size_t>(M * G)),
         std::vector<int32_t>(static_cast<size_t>(M * G)),
         std::vector<float>(static_cast<size_t>(M * G)),
         std::vector<uint8_t>(offset ? static_cast<size_t>(M * K) : 0)};
  parallel_for(threads, 0, M * G, kQuantizeGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const auto at = static_cast<size_t>(i);
      quantize_block(x + i * kQK, r.q.data() + i * kQK, r.d[at], r.s[at]);
      r.ds[at] = r.d[at] * static_cast<float>(r.s[at]);  // once, not once a column block
      if (offset)  // two's complement code + 128: the top bit flipped
        for (auto k = static_cast<size_t>(i * kQK); k < static_cast<size_t>((i + 1) * kQK); ++k)
          r.u[k] = static_cast<uint8_t>(static_cast<uint8_t>(r.q[k]) ^ 0x80u);
    }
  });
  return r;
}

// the code of column c (0..15) at k (0..31) of a group's codes (see the layout above)
inline int32_t weight_code(int64_t t, const uint8_t* codes, int64_t c, int64_t k) {
  const int64_t h = c / kHalf, col = c % kHalf, quad = k / 4, j = k % 4;
  const uint8_t* half = codes + h * half_bytes(t);
  if (!nibbles(t)) {
    const uint8_t byte = half[quad * 32 + col * 4 + j];
    return signed_codes(t) ? static_cast<int8_t>(byte) : byte;
  }
  const uint8_t byte = half[quad / 2 * 32 + col * 4 + j];
  return quad % 2 ? byte >> 4 : byte & 0x0f;
}

// a scale (line 0 or 1: Q6_K's k 16-31) or an offset (line -1) of column c, as float
inline float factor(int64_t t, const uint8_t* grp, int64_t line, int64_t c) {
  if (!wide(t)) return half_at(grp + (line < 0 ? 32 : 0) + 2 * c);
  const int64_t at = line < 0 ? 64 * (t == kQ6_K ? 2 : 1) : 64 * line;
  float f;
  std::memcpy(&f, grp + at + 4 * c, 4);
  return f;
}

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
// AVX-512 VNNI: a column block's 16 columns in one register (column c in lane c), both halves'
// codes side by side; signed weight codes take the activations offset by 128 and give the
// offset back (below), so every sum is the same integer as the other paths'.
constexpr int kRowTile = 6;  // the most rows a tile takes (docs/benchmarks.md)

// the 16 columns' scale (line 0 or 1: Q6_K's k 16-31) or offset (line -1) of a group
template <int64_t T>
inline __m512 factors16(const uint8_t* grp, int64_t line) {
  if constexpr (wide(T)) {
    const int64_t at = line < 0 ? 64 * (T == kQ6_K ? 2 : 1) : 64 * line;
    return _mm512_loadu_ps(reinterpret_cast<const float*>(grp + at));
  }
  return _mm512_cvtph_ps(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + (line < 0 ? 32 : 0))));
}

// line l of both halves of a group's codes: columns 0-7 then 8-15
template <int64_t T>
inline __m512i codes16(const uint8_t* codes, int l) {
  const auto* lo = reinterpret_cast<const __m256i*>(codes + 32 * l);
  const auto* hi = reinterpret_cast<const __m256i*>(codes + half_bytes(T) + 32 * l);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(lo)),
                            _mm256_loadu_si256(hi), 1);
}

// R rows x the 16 columns of column block b, every group: y (+ bias); with ahead, block
// b + kAhead is fetched meanwhile
template <int64_t T, int R>
void block_tile(const Rows& x, int64_t m0, const uint8_t* w, const float* bias, float* y,
                int64_t K, int64_t N, int64_t b, bool ahead) {
  const int64_t G = K / kQK, gb = quant_group_bytes(T);
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* grp = w + (b * G + g) * gb;
    if (ahead) prefetch_group(grp + kAhead * G * gb, gb);
    const __m512 sw = factors16<T>(grp, 0);
    const __m512 sw2 = T == kQ6_K ? factors16<T>(grp, 1) : _mm512_setzero_ps();
    const __m512 ow = has_offset(T) ? factors16<T>(grp, -1) : _mm512_setzero_ps();
    const uint8_t* codes = grp + scale_bytes(T);
    __m512i wq[8];
    for (int l = 0; l < (nibbles(T) ? 4 : 8); ++l) {
      const __m512i v = codes16<T>(codes, l);
      if constexpr (!nibbles(T)) {
        wq[l] = v;
      } else {
        wq[2 * l] = _mm512_and_si512(v, low);
        wq[2 * l + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    }
    // Signed codes: each row's codes go in offset by 128 (x + 128 in 1..255, unsigned), the
    // weight codes as they are (signed), and 128 times each column's code sum comes off:
    // sum (x + 128) w - 128 sum w is the same integer, with no per-row sign work.
    __m512i wsum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    if constexpr (signed_codes(T)) {
      const __m512i ones = _mm512_set1_epi8(1);
      for (int q = 0; q < 8; ++q) {
        const int a = T == kQ6_K ? q / 4 : 0;
        wsum[a] = _mm512_dpbusd_epi32(wsum[a], ones, wq[q]);
      }
      for (int a = 0; a < 2; ++a) wsum[a] = _mm512_slli_epi32(wsum[a], 7);
    }
    for (int r = 0; r < R; ++r) {
      const int64_t row = m0 + r;
      // the row's codes: x + 128 (Rows::u) against signed weight codes, else x itself
      const uint8_t* xcodes =
          signed_codes(T) ? x.u.data() : reinterpret_cast<const uint8_t*>(x.q.data());
      const uint8_t* xb = xcodes + row * K + g * kQK;
      __m512i s[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
      for (int q = 0; q < 8; ++q) {
        uint32_t quad;
        std::memcpy(&quad, xb + 4 * q, 4);
        const int a = T == kQ6_K ? q / 4 : q % 2;  // Q6_K: k 0-15 in s0, 16-31 in s1
        if constexpr (signed_codes(T))  // unsigned x + 128 times the signed weight codes
          s[a] = _mm512_dpbusd_epi32(s[a], _mm512_set1_epi32(static_cast<int32_t>(quad)), wq[q]);
        else
          s[a] = _mm512_dpbusd_epi32(s[a], wq[q], _mm512_set1_epi32(static_cast<int32_t>(quad)));
      }
      if constexpr (signed_codes(T)) {
        s[0] = _mm512_sub_epi32(s[0], wsum[0]);
        if constexpr (T == kQ6_K) s[1] = _mm512_sub_epi32(s[1], wsum[1]);
      }
      const auto at = static_cast<size_t>(row * G + g);
      const float dx = x.d[at];
      const int32_t sx = x.s[at];
      __m512i t = T == kQ6_K ? s[0] : _mm512_add_epi32(s[0], s[1]);
      if constexpr (T == kQ4_0) t = _mm512_sub_epi32(t, _mm512_set1_epi32(8 * sx));
      const __m512 dxv = _mm512_set1_ps(dx);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(sw, dxv), acc[r]);
      if constexpr (T == kQ6_K)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[1]), _mm512_mul_ps(sw2, dxv), acc[r]);
      if constexpr (has_offset(T))
        acc[r] = _mm512_fmadd_ps(ow, _mm512_set1_ps(x.ds[at]), acc[r]);
    }
  }
  const int64_t col = b * kBlock, n = std::min(kBlock, N - col);
  const auto mask = static_cast<__mmask16>(n == kBlock ? 0xffffu : (1u << n) - 1);
  for (int r = 0; r < R; ++r) {
    const __m512 out =
        bias ? _mm512_add_ps(acc[r], _mm512_maskz_loadu_ps(mask, bias + col)) : acc[r];
    _mm512_mask_storeu_ps(y + (m0 + r) * N + col, mask, out);
  }
}

template <int64_t T, int... Rs>
constexpr auto block_tiles(std::integer_sequence<int, Rs...>) {
  using Fn = void (*)(const Rows&, int64_t, const uint8_t*, const float*, float*, int64_t,
                      int64_t, int64_t, bool);
  return std::array<Fn, sizeof...(Rs)>{block_tile<T, Rs + 1>...};
}

// column block b for every row: the block's codes stay in L1 across the row tiles
template <int64_t T>
void column_block(const Rows& x, int64_t M, const uint8_t* w, const float* bias, float* y,
                  int64_t K, int64_t N, int64_t b) {
  static constexpr auto tiles = block_tiles<T>(std::make_integer_sequence<int, kRowTile>{});
  const bool ahead = fetches_ahead(b, N);
  const int64_t n = (M + kRowTile - 1) / kRowTile;  // tiles of even size: 5 rows one tile
  for (int64_t i = 0, m = 0; i < n; ++i) {
    const int rows = static_cast<int>(M / n + (i < M % n));
    tiles[rows - 1](x, m, w, bias, y, K, N, b, ahead && m == 0);
    m += rows;
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
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

// 8 columns' scale (line 0 or 1) or offset (line -1) of half h of a group, as floats
template <int64_t T>
inline __m256 factors8(const uint8_t* grp, int64_t line, int64_t h) {
  if constexpr (wide(T)) {
    const int64_t at = line < 0 ? 64 * (T == kQ6_K ? 2 : 1) : 64 * line;
    return _mm256_loadu_ps(reinterpret_cast<const float*>(grp + at + 32 * h));
  }
  return scales8(grp + (line < 0 ? 32 : 0) + 16 * h);
}

// VNNI's 256-bit byte dot products, where the build has them (AVX-512 VNNI or AVX-VNNI)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SW_DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVXVNNI__)
#define SW_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#endif

// a row's integer sums over one half-group: t[0] (every k; Q6_K: k 0-15) and t[1] (Q6_K:
// k 16-31), 8 columns each
template <int64_t T>
inline void row_sums(const __m256i (&wq)[8], const int8_t* xq, __m256i (&t)[2]) {
#if defined(SW_DPBUSD)
  // VNNI: each lane's 4 byte products summed straight into int32 (no int16 stage to keep
  // from saturating), the same integers as below; four chains, as one is latency-bound
  __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                  _mm256_setzero_si256()};
  for (int q = 0; q < 8; ++q) {
    int32_t quad;
    std::memcpy(&quad, xq + 4 * q, 4);
    const __m256i xb = _mm256_set1_epi32(quad);
    const int a = T == kQ6_K ? q / 4 * 2 + q % 2 : q % 4;  // Q6_K: k 0-15 in s0, s1
    if constexpr (signed_codes(T))
      s[a] = SW_DPBUSD(s[a], _mm256_sign_epi8(wq[q], wq[q]), _mm256_sign_epi8(xb, wq[q]));
    else
      s[a] = SW_DPBUSD(s[a], wq[q], xb);
  }
  if constexpr (T == kQ6_K) {
    t[0] = _mm256_add_epi32(s[0], s[1]);
    t[1] = _mm256_add_epi32(s[2], s[3]);
  } else {
    t[0] = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
  }
#else
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s16[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i s32 = _mm256_setzero_si256();
  for (int q = 0; q < 8; ++q) {
    int32_t quad;
    std::memcpy(&quad, xq + 4 * q, 4);
    const __m256i xb = _mm256_set1_epi32(quad);
    if constexpr (T == kQ8_0) {  // |qw| up to 128: a pair at most 32512, summed as int32
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wq[q], wq[q]),
                                             _mm256_sign_epi8(xb, wq[q]));
      s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(p, ones));
    } else if constexpr (signed_codes(T)) {  // Q6_K: |qw| up to 32, 8 products per lane
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wq[q], wq[q]),
                                             _mm256_sign_epi8(xb, wq[q]));
      s16[q / 4] = _mm256_add_epi16(s16[q / 4], p);
    } else {  // unsigned codes: 16 4-bit or 8 5-bit products per int16 lane
      const int half = nibbles(T) ? 0 : q / 4;
      s16[half] = _mm256_add_epi16(s16[half], _mm256_maddubs_epi16(wq[q], xb));
    }
  }
  if constexpr (T == kQ8_0) {
    t[0] = s32;
  } else if constexpr (T == kQ6_K) {
    t[0] = _mm256_madd_epi16(s16[0], ones);
    t[1] = _mm256_madd_epi16(s16[1], ones);
  } else if constexpr (nibbles(T)) {
    t[0] = _mm256_madd_epi16(s16[0], ones);
  } else {
    t[0] = _mm256_add_epi32(_mm256_madd_epi16(s16[0], ones), _mm256_madd_epi16(s16[1], ones));
  }
#endif
}

// R rows x the 8 columns of half h of column block b, every group: y (+ bias); with ahead,
// block b + kAhead is fetched meanwhile
template <int64_t T, int R>
void half_tile(const Rows& x, int64_t m0, const uint8_t* w, const float* bias, float* y,
               int64_t K, int64_t N, int64_t b, int64_t h, bool ahead) {
  const int64_t G = K / kQK, gb = quant_group_bytes(T);
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* grp = w + (b * G + g) * gb;
    if (ahead) prefetch_group(grp + kAhead * G * gb, gb);
    const __m256 sw = factors8<T>(grp, 0, h);
    const __m256 sw2 = T == kQ6_K ? factors8<T>(grp, 1, h) : _mm256_setzero_ps();
    const __m256 ow = has_offset(T) ? factors8<T>(grp, -1, h) : _mm256_setzero_ps();
    const uint8_t* codes = grp + scale_bytes(T) + h * half_bytes(T);
    __m256i wq[8];
    for (int l = 0; l < (nibbles(T) ? 4 : 8); ++l) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * l));
      if constexpr (!nibbles(T)) {
        wq[l] = v;
      } else {
        wq[2 * l] = _mm256_and_si256(v, low);
        wq[2 * l + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t row = m0 + r;
      __m256i t[2];
      row_sums<T>(wq, x.q.data() + row * K + g * kQK, t);
      const auto at = static_cast<size_t>(row * G + g);
      const float dx = x.d[at];
      const int32_t sx = x.s[at];
      if constexpr (T == kQ4_0) t[0] = _mm256_sub_epi32(t[0], _mm256_set1_epi32(8 * sx));
      const __m256 dxv = _mm256_set1_ps(dx);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t[0]), _mm256_mul_ps(sw, dxv), acc[r]);
      if constexpr (T == kQ6_K)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t[1]), _mm256_mul_ps(sw2, dxv), acc[r]);
      if constexpr (has_offset(T))
        acc[r] = _mm256_fmadd_ps(ow, _mm256_set1_ps(x.ds[at]), acc[r]);
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
                      int64_t, int64_t, int64_t, bool);
  return std::array<Fn, sizeof...(Rs)>{half_tile<T, Rs + 1>...};
}

// column block b for every row: each half's codes stay in L1 across the row tiles
template <int64_t T>
void column_block(const Rows& x, int64_t M, const uint8_t* w, const float* bias, float* y,
                  int64_t K, int64_t N, int64_t b) {
  static constexpr auto tiles = half_tiles<T>(std::make_integer_sequence<int, kRowTile>{});
  const bool ahead = fetches_ahead(b, N);
  for (int64_t h = 0; h < 2 && b * kBlock + h * kHalf < N; ++h)
    for (int64_t m = 0; m < M; m += kRowTile) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowTile, M - m));
      tiles[rows - 1](x, m, w, bias, y, K, N, b, h, ahead && h == 0 && m == 0);
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
        int32_t t[2] = {0, 0};  // Q6_K: k 0-15 and 16-31 apart; every other type in t[0]
        for (int64_t k = 0; k < kQK; ++k)
          t[T == kQ6_K && k >= 16] += weight_code(T, grp + scale_bytes(T), c, k) * xq[k];
        const auto at = static_cast<size_t>(row * G + g);
        const float dx = x.d[at];
        const int32_t sx = x.s[at];
        if (T == kQ4_0) t[0] -= 8 * sx;
        acc = std::fma(static_cast<float>(t[0]), factor(T, grp, 0, c) * dx, acc);
        if (T == kQ6_K) acc = std::fma(static_cast<float>(t[1]), factor(T, grp, 1, c) * dx, acc);
        if (has_offset(T))
          acc = std::fma(factor(T, grp, -1, c), x.ds[at], acc);
      }
      y[row * N + col] = bias ? acc + bias[col] : acc;
    }
  }
}
#endif

template <int64_t T>
void int8_products(const float* x, const uint8_t* w, const float* bias, float* y, int64_t M,
                   int64_t K, int64_t N, int64_t threads) {
  const Rows rows = quantize(x, M, K, threads, kOffsetCodes && signed_codes(T));
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  parallel_for(threads, 0, blocks, linear_grain(M, K), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) column_block<T>(rows, M, w, bias, y, K, N, b);
  });
}

}  // namespace

void int8_linear(const float* x, const uint8_t* packed, const float* bias, float* y, int64_t M,
                 int64_t K, int64_t N, int64_t qtype, int64_t threads) {
  if (M == 0) return;
  with_qtype(qtype, [&](auto t) {
    int8_products<decltype(t)::value>(x, packed, bias, y, M, K, N, threads);
  });
}

}  // namespace sw
