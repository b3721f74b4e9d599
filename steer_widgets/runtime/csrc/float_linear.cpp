// float_linear of kernels.h: the float32 tiles over the pool.
#include <algorithm>

#include "float_tiles.h"
#include "kernels.h"
#include "pool.h"

namespace sw {

void float_linear(const float* xp, const float* wp, const float* bp, float* yp, int64_t M,
                  int64_t K, int64_t n_out, int64_t threads) {
  const int64_t blocks = (n_out + kBlock - 1) / kBlock;
  const bool wide = M >= 1 && M <= kWideRows;
  const int64_t width = wide ? kWide : kTile;
  parallel_for(threads, 0, blocks, linear_grain(M, K), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b += width) {
      const int cols = static_cast<int>(std::min<int64_t>(width, b1 - b));
      if (wide) {
        kWideTiles[M - 1][cols - 1](xp, wp, bp, yp, K, n_out, b);
        continue;
      }
      for (int64_t m = 0; m < M; m += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, M - m));
        kTiles[rows - 1][cols - 1](xp + m * K, wp, bp, yp + m * n_out, K, n_out, b);
      }
    }
  });
}

}  // namespace sw
