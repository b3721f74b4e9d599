// rms_norm, rotary and causal_attention of kernels.h: outside the matrix products a decode
// step is a few hundred small torch ops, and these replace the largest groups of them, each
// row (and each head) computed alone in a fixed order.
#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels.h"
#include "pool.h"
#include "simd.h"

namespace sw {

// RMSNorm of each row: w * (x * rsqrt(mean(x^2) + eps)), the order of transformers'
// LlamaRMSNorm (Gemma's (1 + w) comes folded into w). One kernel instead of six small torch
// ops per norm. The sum of squares runs in kLanes partial sums combined in a fixed order, so
// a row's result never depends on the other rows.
void rms_norm(const float* x, const float* wp, float* y, int64_t M, int64_t D, float eps) {
  constexpr int64_t kLanes = 8;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * D;
    float* yr = y + m * D;
    float part[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= D; j += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) part[l] += xr[j + l] * xr[j + l];
    float sum = 0.0f;
    for (; j < D; ++j) sum += xr[j] * xr[j];
    for (int64_t l = 0; l < kLanes; ++l) sum += part[l];
    const float r = 1.0f / std::sqrt(sum / static_cast<float>(D) + eps);
    for (j = 0; j < D; ++j) yr[j] = wp[j] * (xr[j] * r);
  }
}

// out = x * cos + roll(x, R/2) * sin on each head's first R dims, the rest copied. Two
// rounded products and one rounded sum per element, as the three torch ops it replaces
// (built with -ffp-contract=off, so no fused multiply-add), hence the same bits.
void rotary(const float* x, const int64_t* xs, const float* cos, const float* sin, float* y,
            int64_t B, int64_t T, int64_t H, int64_t D, int64_t R) {
  const int64_t half = R / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* c = cos + t * R;
      const float* s = sin + t * R;
      for (int64_t h = 0; h < H; ++h) {
        const float* xr = x + b * xs[0] + t * xs[1] + h * xs[2];
        float* yr = y + ((b * T + t) * H + h) * D;
        for (int64_t j = 0; j < half; ++j) yr[j] = xr[j] * c[j] + xr[j + half] * s[j];
        for (int64_t j = half; j < R; ++j) yr[j] = xr[j] * c[j] + xr[j - half] * s[j];
        for (int64_t j = R; j < D; ++j) yr[j] = xr[j];
      }
    }
  }
}

namespace {

// One (row, head) of decode attention: C lines of 16 per head, held in registers; w holds
// the L weights. 16-lane fused dot products summed as a fixed tree, a max-subtracted exp,
// the weights summed in key order and the values accumulated in key order, then one
// scaling. SDPA's flash kernel pays tiles, buffers and a thread team for a 1 x L product:
// in a decode step of the default model it took 43 us a layer against 15 us here
// (2026-12-01, profiled).
template <int C>
void attend_one(const float* qr, const float* kr, int64_t ks, const float* vr, int64_t vs,
                int64_t L, float sc, float* w, float* out) {
  Vec qv[C], acc[C];
  for (int c = 0; c < C; ++c) qv[c] = load(qr + c * kBlock);
  float top = -INFINITY;
  for (int64_t l = 0; l < L; ++l) {
    const float* kl = kr + l * ks;
    Vec part = zero();
    for (int c = 0; c < C; ++c) part = fmav(qv[c], load(kl + c * kBlock), part);
    w[l] = hsum(part) * sc;
    top = std::max(top, w[l]);
  }
  float total = 0.0f;
  for (int64_t l = 0; l < L; ++l) {
    w[l] = std::exp(w[l] - top);
    total += w[l];
  }
  for (int c = 0; c < C; ++c) acc[c] = zero();
  for (int64_t l = 0; l < L; ++l)
    for (int c = 0; c < C; ++c) acc[c] = fma(w[l], load(vr + l * vs + c * kBlock), acc[c]);
  const float inv = 1.0f / total;
  for (int c = 0; c < C; ++c) store(out + c * kBlock, fma(inv, acc[c], zero()), kBlock, nullptr);
}

using AttendFn = void (*)(const float*, const float*, int64_t, const float*, int64_t, int64_t,
                          float, float*, float*);
template <int... Cs>
constexpr std::array<AttendFn, sizeof...(Cs)> attends(std::integer_sequence<int, Cs...>) {
  return {attend_one<Cs + 1>...};
}
constexpr auto kAttends = attends(std::make_integer_sequence<int, kMaxHead / kBlock>{});

}  // namespace

void causal_attention(const float* qp, const float* kp, const float* vp, float* yp,
                      const AttentionShape& s, float scale, int64_t threads) {
  const int64_t group = s.H / s.Hkv;
  const AttendFn attend = kAttends[s.D / kBlock - 1];
  // below ~64k multiply-adds per thread, starting threads costs more than it saves
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, 2 * s.L * s.D));
  parallel_for(threads, 0, s.B * s.H * s.T, grain, [&](int64_t i0, int64_t i1) {
    std::vector<float> w(static_cast<size_t>(s.L));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i % s.T, bh = i / s.T, b = bh / s.H, h = bh % s.H, g = h / group;
      const int64_t hi = s.start + t + 1;  // keys up to this query's own position
      const int64_t lo = s.window > 0 ? std::max<int64_t>(0, hi - s.window) : 0;
      const float* kr = kp + b * s.ks0 + g * s.ks1 + lo * s.ks2;
      const float* vr = vp + b * s.vs0 + g * s.vs1 + lo * s.vs2;
      attend(qp + b * s.qs0 + h * s.qs1 + t * s.qs2, kr, s.ks2, vr, s.vs2, hi - lo, scale,
             w.data(), yp + i * s.D);
    }
  });
}

}  // namespace sw
