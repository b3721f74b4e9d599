// decoder_block of kernels.h: one pre-norm block on plain pointers, every intermediate in one
// workspace of the calling thread. Between its kernels a block did about 60 small tensor
// operations (views, slices, allocations, copies), each of them serial work on the calling
// thread while the pool's workers wait; here the same kernels run back to back on pointers.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels.h"

namespace sw {
namespace {

// y [M, n_out] = x [M, K] @ W.T (+ bias) by the product's kind
void product(const BlockProduct& p, const float* x, float* y, int64_t M, int64_t K,
             int64_t threads) {
  switch (p.kind) {
    case 0:
      return float_linear(x, static_cast<const float*>(p.packed), p.bias, y, M, K, p.n_out,
                          threads);
    case 1:
      return quant_linear(x, static_cast<const uint8_t*>(p.packed), p.bias, y, M, K, p.n_out,
                          p.qtype, threads);
    default:
      return int8_linear(x, static_cast<const uint8_t*>(p.packed), p.bias, y, M, K, p.n_out,
                         p.qtype, threads);
  }
}

// a + b elementwise into y: one rounded sum each, the bits of torch's add
void add(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// Workspaces of up to kKept floats (16 MB: a decode step of 64 rows needs about 2 MB, a
// prefill of 470 positions of the default model all of it) are the calling thread's, kept
// from call to call; a larger one (a longer prompt's prefill) is the call's own, left
// uninitialized and freed when it returns, so a long prompt leaves nothing behind.
constexpr int64_t kKept = int64_t{1} << 22;

float* scratch(int64_t n, std::unique_ptr<float[]>& own) {
  thread_local std::vector<float> kept;
  if (n > kKept) {
    own.reset(new float[static_cast<size_t>(n)]);
    return own.get();
  }
  if (static_cast<int64_t>(kept.size()) < n) kept.resize(static_cast<size_t>(n));
  return kept.data();
}

}  // namespace

void decoder_block(const BlockArgs& a, float* out, int64_t threads) {
  const int64_t M = a.B * a.T, d = a.d, D = a.D, H = a.H, Hkv = a.Hkv;
  const int64_t W = (H + 2 * Hkv) * D;  // a row of the fused q, k, v product
  const int64_t F = a.products[2].n_out / 2;  // the gated MLP's width
  const int64_t sizes[] = {M * d, M * W, M * (H + Hkv) * D, M * H * D, M * H * D, M * d,
                           M * 2 * F, M * F};
  int64_t total = 0;
  for (const int64_t s : sizes) total += s;
  std::unique_ptr<float[]> own;  // a workspace too large to keep (see scratch)
  float* at = scratch(total, own);
  float* buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = at, at += sizes[i];
  float *h = buf[0], *qkv = buf[1], *qk = buf[2], *z = buf[3], *zt = buf[4], *mid = buf[5],
        *gu = buf[6], *act = buf[7];

  rms_norm(a.x, a.attn_norm, h, M, d, a.eps);
  product(a.products[0], h, qkv, M, d, threads);
  const int64_t xs[3] = {a.T * W, W, D};  // q and k heads of qkv, read in place
  rotary(qkv, xs, a.cos, a.sin, a.cos_stride, qk, a.B, a.T, H + Hkv, D, a.R);

  AttentionShape s{};
  s.B = a.B, s.H = H, s.Hkv = Hkv, s.T = a.T, s.D = D;
  s.L = a.rows ? a.L : a.start + a.T;  // a ragged step reads each row up to its own position
  s.qs0 = a.T * (H + Hkv) * D, s.qs1 = D, s.qs2 = (H + Hkv) * D;
  s.ks0 = a.ks[0], s.ks1 = a.ks[1], s.ks2 = a.ks[2];
  s.vs0 = a.vs[0], s.vs1 = a.vs[1], s.vs2 = a.vs[2];
  s.start = a.rows ? 0 : a.start, s.window = a.window, s.rows = a.rows, s.starts = a.starts;
  // the new keys (rotated) and values at each row's positions of its cache row, then the
  // attention over the cache: float32 or halves (BlockArgs::half_cache)
  const int64_t kn[3] = {a.T * (H + Hkv) * D, D, (H + Hkv) * D}, vn[3] = {a.T * W, D, W};
  write_and_attend(qk, a.cache_k, a.cache_v, a.half_cache, qk + H * D, kn, qkv + (H + Hkv) * D,
                   vn, z, s, a.scale, threads);

  // z [B, H, T, D] to [B, T, H * D] (at one position the same memory)
  const float* zin = z;
  if (a.T > 1) {
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t g = 0; g < H; ++g)
        for (int64_t t = 0; t < a.T; ++t)
          std::memcpy(zt + ((b * a.T + t) * H + g) * D, z + ((b * H + g) * a.T + t) * D,
                      static_cast<size_t>(D) * sizeof(float));
    zin = zt;
  }
  product(a.products[1], zin, h, M, H * D, threads);  // h is free again: the attention's out
  add(a.x, h, mid, M * d);
  rms_norm(mid, a.mlp_norm, h, M, d, a.eps);
  product(a.products[2], h, gu, M, d, threads);
  a.gated(gu, act, M, F, a.gated_ctx);
  product(a.products[3], act, h, M, F, threads);
  add(mid, h, out, M * d);
}

}  // namespace sw
