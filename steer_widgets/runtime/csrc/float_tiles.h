// The float32 tiles: R rows x C column blocks, one in-order fused multiply-add chain per
// output element (shared by the float32 kernel and the quantized one's prefill panels).
//
// W is packed once as [N/16][K][16]: block b holds output columns 16b..16b+15, one 16-float
// line per k, so a block streams from memory in order. Each output element y[r, n] is one
// chain of fused multiply-adds over k = 0..K-1, in order, from zero: the same instructions
// whatever the number of rows, the rows it is grouped with, or the thread it runs on. Rows
// are grouped (up to kRows) only so that they share each weight load: one pass over the
// weights serves every decode row.
#pragma once

#include <array>
#include <cstdint>
#include <utility>

#include "simd.h"

namespace sw {

constexpr int64_t kPrefetch = 32;  // lines ahead (2 KB per block): several rows keep the stream

// One k of the chain: every row's x[r, k] times each weight line, added to its accumulator.
template <int R, int C>
inline void step(const float* x, int64_t K, int64_t k, const Vec (&wk)[C], Vec (&acc)[R][C]) {
  for (int r = 0; r < R; ++r) {
    const float a = x[r * K + k];
    for (int c = 0; c < C; ++c) acc[r][c] = fma(a, wk[c], acc[r][c]);
  }
}

// The accumulators of R rows x C column blocks from block b into y (+ bias).
template <int R, int C>
inline void finish(const Vec (&acc)[R][C], const float* bias, float* y, int64_t N, int64_t b) {
  for (int c = 0; c < C; ++c) {
    const int64_t col = (b + c) * kBlock;
    const int64_t n = std::min(kBlock, N - col);
    for (int r = 0; r < R; ++r) store(y + r * N + col, acc[r][c], n, bias ? bias + col : nullptr);
  }
}

// R rows (x: row stride K) times C consecutive column blocks starting at block b.
template <int R, int C>
void tile(const float* x, const float* w, const float* bias, float* y, int64_t K, int64_t N,
          int64_t b) {
  Vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = zero();
  const float* wb = w + b * K * kBlock;
  for (int64_t k = 0; k < K; ++k) {
    Vec wk[C];
    for (int c = 0; c < C; ++c) {
      const float* line = wb + (c * K + k) * kBlock;
      __builtin_prefetch(line + kPrefetch * kBlock);  // a hint: past the end it is a no-op
      wk[c] = load(line);
    }
    step<R, C>(x, K, k, wk, acc);
  }
  finish<R, C>(acc, bias, y, N, b);
}

using TileFn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t,
                       int64_t);

// kTiles[r - 1][c - 1] is tile<r, c>: every shape up to kRows x kTile, chosen at run time
// (kWideTiles: up to kWideRows x kWide)
template <int R, int... Cs>
constexpr std::array<TileFn, sizeof...(Cs)> tiles_of(std::integer_sequence<int, Cs...>) {
  return {tile<R, Cs + 1>...};
}
template <int W, int... Rs>
constexpr auto tiles(std::integer_sequence<int, Rs...>) {
  return std::array{tiles_of<Rs + 1>(std::make_integer_sequence<int, W>{})...};
}
inline constexpr auto kTiles = tiles<kTile>(std::make_integer_sequence<int, kRows>{});
inline constexpr auto kWideTiles = tiles<kWide>(std::make_integer_sequence<int, kWideRows>{});

// below ~64k multiply-adds per thread, starting threads costs more than it saves
inline int64_t linear_grain(int64_t M, int64_t K) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, M * K * kBlock));
}

}  // namespace sw
