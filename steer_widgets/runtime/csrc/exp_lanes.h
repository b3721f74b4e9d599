// exp of attention's weights, x - max <= 0, many at once. glibc's expf took 38% of
// attend_tile, one call a key. exps() runs glibc's algorithm itself (sysdeps/ieee754/
// flt-32/e_expf.c, with the fused multiply-adds its FMA build compiles) on 8 lanes of doubles
// on AVX-512 and one float at a time elsewhere: the same IEEE operations in every build, so
// every build gives the same bits whatever C library the machine has. On glibc 2.36 they are
// std::exp's bits for every non-positive float (the test checks all 2^31 where it runs).
#pragma once

#include <cstdint>

namespace sw {

// x[i] = exp(x[i]) for i < n, x[i] <= 0 or NaN (a positive x gets std::exp's)
void exps(float* x, int64_t n);

// Of the non-positive floats whose bit pattern is a multiple of `stride` (1: every one of
// about 2^31, -0 to -inf), and NaN, how many get other bits from exps() than from the same
// algorithm a float at a time, and than from std::exp: one pass for both.
struct ExpMismatches {
  int64_t algorithm = 0, libm = 0;
};
ExpMismatches exp_mismatches(int64_t stride, int64_t threads);

}  // namespace sw
