// y = x @ W.T for fp32 on a CPU, with every row of y computed exactly as it is alone.
//
// W is packed once as [N/16][K][16]: block b holds output columns 16b..16b+15, one 16-float
// line per k, so a block streams from memory in order. Each output element y[r, n] is one
// chain of fused multiply-adds over k = 0..K-1, in order, from zero: the same instructions
// whatever the number of rows, the rows it is grouped with, or the thread it runs on. Rows
// are grouped (up to kRows) only so that they share each weight load: one pass over the
// weights serves every decode row. Threads split the output columns (at::parallel_for, so
// torch.set_num_threads governs it), and one thread computes each output element whole.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 16;  // output columns per packed block
constexpr int64_t kPrefetch = 32;  // lines ahead (2 KB per block): several rows keep the stream

// Tile shapes (rows sharing each weight load x column blocks at once) fit the registers;
// they change speed only, never a result. Up to kWideRows rows take kWide column blocks at
// once: each block is its own stream from memory, and one row is bound by how many streams
// the memory system has in flight (a Xeon, one thread: a row's products 3-5% faster at 8).
constexpr int kWideRows = 2;
#if defined(__AVX512F__)
constexpr int kRows = 6, kTile = 4;  // 24 accumulators + 4 weight lines of 32 registers
constexpr int kWide = 8;  // two rows: 16 accumulators + 8 weight lines
struct Vec {
  __m512 v;
};
inline Vec zero() { return {_mm512_setzero_ps()}; }
inline Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline Vec fma(float a, const Vec& w, const Vec& acc) {
  return {_mm512_fmadd_ps(_mm512_set1_ps(a), w.v, acc.v)};
}
// y = acc (+ bias): one rounded add, as torch's separate ``out + bias`` (the same bits)
inline void store(float* p, const Vec& v, int64_t n, const float* bias) {
  const auto mask = static_cast<__mmask16>(n == kBlock ? 0xffffu : (1u << n) - 1);
  const __m512 out = bias ? _mm512_add_ps(v.v, _mm512_maskz_loadu_ps(mask, bias)) : v.v;
  _mm512_mask_storeu_ps(p, mask, out);
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kRows = 3, kTile = 2;  // 12 + 4 of 16 registers (a block is two of them)
constexpr int kWide = kTile;
struct Vec {
  __m256 lo, hi;
};
inline Vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vec load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline Vec fma(float a, const Vec& w, const Vec& acc) {
  const __m256 b = _mm256_set1_ps(a);
  return {_mm256_fmadd_ps(b, w.lo, acc.lo), _mm256_fmadd_ps(b, w.hi, acc.hi)};
}
inline void store(float* p, const Vec& v, int64_t n, const float* bias) {
  alignas(32) float tmp[kBlock];
  _mm256_store_ps(tmp, v.lo);
  _mm256_store_ps(tmp + 8, v.hi);
  for (int64_t i = 0; i < n; ++i) p[i] = bias ? tmp[i] + bias[i] : tmp[i];
}
#else
constexpr int kRows = 4, kTile = 1, kWide = 1;
struct Vec {
  float f[kBlock];
};
inline Vec zero() { return Vec{}; }
inline Vec load(const float* p) {
  Vec v;
  std::copy(p, p + kBlock, v.f);
  return v;
}
inline Vec fma(float a, const Vec& w, const Vec& acc) {
  Vec out;
  for (int64_t i = 0; i < kBlock; ++i) out.f[i] = std::fma(a, w.f[i], acc.f[i]);
  return out;
}
inline void store(float* p, const Vec& v, int64_t n, const float* bias) {
  for (int64_t i = 0; i < n; ++i) p[i] = bias ? v.f[i] + bias[i] : v.f[i];
}
#endif

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
    for (int r = 0; r < R; ++r) {
      const float a = x[r * K + k];
      for (int c = 0; c < C; ++c) acc[r][c] = fma(a, wk[c], acc[r][c]);
    }
  }
  for (int c = 0; c < C; ++c) {
    const int64_t col = (b + c) * kBlock;
    const int64_t n = std::min(kBlock, N - col);
    for (int r = 0; r < R; ++r) store(y + r * N + col, acc[r][c], n, bias ? bias + col : nullptr);
  }
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
constexpr auto kTiles = tiles<kTile>(std::make_integer_sequence<int, kRows>{});
constexpr auto kWideTiles = tiles<kWide>(std::make_integer_sequence<int, kWideRows>{});

}  // namespace

// x [..., K] and packed [ceil(N/16), K, 16] (fp32): returns x @ W.T (+ bias), [..., N]. The
// bias is added in the same pass, and x is flattened to rows (a copy only where it is not
// contiguous) here rather than in Python: a decode step makes a few hundred of these calls.
at::Tensor linear(const at::Tensor& x_in, const at::Tensor& packed, int64_t n_out,
                  const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() >= 1 && packed.dim() == 3, "x must be [..., K], packed [N/16, K, 16]");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat,
              "float32 only");
  TORCH_CHECK(packed.is_contiguous(), "the packed weight must be contiguous");
  const int64_t K = packed.size(1), blocks = packed.size(0);
  TORCH_CHECK(x_in.size(-1) == K && packed.size(2) == kBlock, "packed weight does not fit x");
  TORCH_CHECK(blocks == (n_out + kBlock - 1) / kBlock, "packed weight does not match n_out");
  const at::Tensor x = x_in.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  const float* bp = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n_out && bias->is_contiguous() &&
                    bias->scalar_type() == at::kFloat,
                "bias must be a contiguous float32 [n_out]");
    bp = bias->data_ptr<float>();
  }
  auto sizes = x_in.sizes().vec();
  sizes.back() = n_out;
  auto y = at::empty(sizes, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // below ~64k multiply-adds per thread, starting threads costs more than it saves
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, M * K * kBlock));
  const bool wide = M >= 1 && M <= kWideRows;
  const int64_t width = wide ? kWide : kTile;
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
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
  return y;
}

// RMSNorm of each row of x [..., D] (fp32; copied only where not contiguous): w * (x * rsqrt(
// mean(x^2) + eps)), the order of transformers' LlamaRMSNorm (Gemma's (1 + w) comes folded
// into w). One kernel instead of six small torch ops per norm. The sum of squares runs in
// kLanes partial sums combined in a fixed order, so a row's result never depends on the
// other rows.
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& w, double eps) {
  TORCH_CHECK(x_in.dim() >= 1 && w.dim() == 1 && x_in.size(-1) == w.size(0),
              "x must be [..., D], w [D]");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(w.is_contiguous(), "w must be contiguous");
  constexpr int64_t kLanes = 8;
  const at::Tensor x = x_in.contiguous();
  const int64_t D = x.size(-1), M = D ? x.numel() / D : 0;
  auto y = at::empty_like(x);
  const float* wp = w.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x.data_ptr<float>() + m * D;
    float* yr = y.data_ptr<float>() + m * D;
    float part[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= D; j += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) part[l] += xr[j + l] * xr[j + l];
    float sum = 0.0f;
    for (; j < D; ++j) sum += xr[j] * xr[j];
    for (int64_t l = 0; l < kLanes; ++l) sum += part[l];
    const float r = 1.0f / std::sqrt(sum / static_cast<float>(D) + static_cast<float>(eps));
    for (j = 0; j < D; ++j) yr[j] = wp[j] * (xr[j] * r);
  }
  return y;
}

// Rotary embedding of x [B, T, H, D] (fp32, each head contiguous, any other strides: the q and
// k heads of a fused qkv are read in place) with cos and signed sin [T, R] (R <= D, even):
// out = x * cos + roll(x, R/2) * sin on each head's first R dims, the rest copied, into a new
// contiguous tensor. Two rounded products and one rounded sum per element, as the three torch
// ops it replaces (built with -ffp-contract=off, so no fused multiply-add), hence the same bits.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && cos.dim() == 2 && sin.sizes() == cos.sizes(),
              "x must be [B, T, H, D], cos and sin [T, R]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              "float32 only");
  TORCH_CHECK(x.stride(3) == 1 && cos.is_contiguous() && sin.is_contiguous(),
              "x's heads and cos and sin must be contiguous");
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), R = cos.size(1);
  TORCH_CHECK(cos.size(0) == T && R <= D && R % 2 == 0, "cos and sin do not fit x");
  auto y = at::empty({B, T, H, D}, x.options());
  const int64_t half = R / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* c = cos.data_ptr<float>() + t * R;
      const float* s = sin.data_ptr<float>() + t * R;
      for (int64_t h = 0; h < H; ++h) {
        const float* xr = x.data_ptr<float>() + b * x.stride(0) + t * x.stride(1) + h * x.stride(2);
        float* yr = y.data_ptr<float>() + ((b * T + t) * H + h) * D;
        for (int64_t j = 0; j < half; ++j) yr[j] = xr[j] * c[j] + xr[j + half] * s[j];
        for (int64_t j = half; j < R; ++j) yr[j] = xr[j] * c[j] + xr[j - half] * s[j];
        for (int64_t j = R; j < D; ++j) yr[j] = xr[j];
      }
    }
  }
  return y;
}

// torch.ops.steer_widgets.* (plain ATen and the op registry: no Python headers, which keeps
// the one-time build short)
TORCH_LIBRARY(steer_widgets, m) {
  m.def("rowwise_linear(Tensor x, Tensor packed, int n_out, Tensor? bias=None) -> Tensor", &linear);
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm);
  m.def("rotary(Tensor x, Tensor cos, Tensor sin) -> Tensor", &rotary);
}
