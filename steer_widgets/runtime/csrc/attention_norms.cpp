// rms_norm, rotary and causal_attention of kernels.h: outside the matrix products a decode
// step is a few hundred small torch ops, and these replace the largest groups of them, each
// row (and each head) computed alone in a fixed order.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "exp_lanes.h"
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
void rotary(const float* x, const int64_t* xs, const float* cos, const float* sin, int64_t cs,
            float* y, int64_t B, int64_t T, int64_t H, int64_t D, int64_t R) {
  const int64_t half = R / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* c = cos + b * cs + t * R;
      const float* s = sin + b * cs + t * R;
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

constexpr int kQueryTile = 4;  // query positions of one head that share each key and value load
// (the loops over a tile's positions below are unrolled by this count: `#pragma GCC unroll 4`)

// The keys and values of the task after this one (another row or key head): fetched a key
// at a time while this task reads its own, so the next one starts on keys already in cache.
// A task's keys are a few kilobytes, over before the hardware prefetcher has followed them,
// and every task began with a stall on its first keys (docs/benchmarks.md).
template <typename E>  // float, or uint16_t: a half-precision cache (products="int8")
struct Next {
  const E* k = nullptr;
  const E* v = nullptr;
  int64_t first = 0, n = 0;  // its keys [first, first + n) (n = 0: nothing to fetch)
};

// the cache lines of one key (or value) of C blocks
template <typename E>
inline void fetch_key(const E* p, int C) {
  const auto* bytes = reinterpret_cast<const char*>(p);
  for (int64_t at = 0; at < C * kBlock * static_cast<int64_t>(sizeof(E)); at += 64)
    __builtin_prefetch(bytes + at, 0, 3);
}

// Up to kQueryTile query positions of one (row, head), each attending keys [lo[p], hi[p]) of the
// head's K and V (key l at k + l * ks). Per position the arithmetic is that of a position
// alone: 16-lane fused dot products over the C lines summed as a fixed tree, a max-subtracted
// exp, the weights summed in key order, the values accumulated in key order, one scaling.
// Only the loop order across positions changes: keys all of them attend are loaded once for
// the tile (a long prefill read each key once per position before). hi rises with p and so
// does lo, so [max lo, min hi) is shared and each position's own keys lie before and after
// it, which keeps every position's key order. SDPA's flash kernel pays tiles, buffers and a
// thread team for a 1 x L product (docs/benchmarks.md). Half-precision keys and values
// are widened exactly as they load, so the arithmetic is the float32 cache's.
template <typename E, int C>
void attend_tile(const float* const* q, int n, const E* k, int64_t ks, const E* v, int64_t vs,
                 const int64_t* lo, const int64_t* hi, float sc, float* w, int64_t wn,
                 float* const* out, const Next<E>& next) {
  int64_t clo = lo[n - 1], chi = hi[0];  // the keys every position attends
  if (clo >= chi) clo = chi = std::numeric_limits<int64_t>::max();  // none: each its own
  Vec qv[kQueryTile][C];
  for (int p = 0; p < n; ++p)
    for (int c = 0; c < C; ++c) qv[p][c] = load(q[p] + c * kBlock);
  // position p's dot product with a key: the one chain every score takes, alone or four at once
  auto dot = [&](int p, const Vec* kl) {
    Vec part = zero();
    for (int c = 0; c < C; ++c) part = fmav(qv[p][c], kl[c], part);
    return part;
  };
  auto score = [&](int p, int64_t l, const Vec* kl) { w[p * wn + l] = hsum(dot(p, kl)) * sc; };
  // shared key l's line of the next task's keys (kv: next.k) or values (next.v), fetched now
  auto fetch_next = [&](const E* kv, int64_t stride, int64_t l) {
    if (l - clo < next.n) fetch_key(kv + (next.first + l - clo) * stride, C);
  };
  auto key = [&](int64_t l, Vec* kl) {
    for (int c = 0; c < C; ++c) kl[c] = load(k + l * ks + c * kBlock);
  };
  Vec kl[C];
  int64_t l = clo;
  // the shared keys 4 at a time: each key loaded once for every position, and each position's
  // 4 dot products reduced together (hsum4: the bits of 4 hsums)
  for (; chi - l >= 4; l += 4) {  // (not l + 4 <= chi: with no shared keys both are the max)
    Vec part[kQueryTile][4];
    for (int j = 0; j < 4; ++j) {
      fetch_next(next.k, ks, l + j);
      key(l + j, kl);
#pragma GCC unroll 4
      for (int p = 0; p < kQueryTile; ++p)
        if (p < n) part[p][j] = dot(p, kl);
    }
#pragma GCC unroll 4
    for (int p = 0; p < kQueryTile; ++p)
      if (p < n) hsum4(part[p], sc, w + p * wn + l);
  }
  for (; l < chi; ++l) {
    fetch_next(next.k, ks, l);
    key(l, kl);
    for (int p = 0; p < n; ++p) score(p, l, kl);
  }
  for (int p = 0; p < n; ++p) {
    for (int64_t l = lo[p]; l < std::min(clo, hi[p]); ++l) key(l, kl), score(p, l, kl);
    for (int64_t l = std::max(chi, lo[p]); l < hi[p]; ++l) key(l, kl), score(p, l, kl);
  }
  for (int p = 0; p < n; ++p) {
    float* wp = w + p * wn;
    const float top = max_of(wp + lo[p], hi[p] - lo[p]);
    for (int64_t l = lo[p]; l < hi[p]; ++l) wp[l] -= top;
    exps(wp + lo[p], hi[p] - lo[p]);
  }
  // each position's weights summed in key order (apart from the exp calls, which would spill
  // the sums); positions over the same keys (a decode step's heads of one key head) side by
  // side, so their additions overlap instead of waiting on each other
  float total[kQueryTile] = {};
  if (lo[0] == lo[n - 1] && hi[0] == hi[n - 1]) {
    for (int64_t l = lo[0]; l < hi[0]; ++l)
#pragma GCC unroll 4
      for (int p = 0; p < kQueryTile; ++p)
        if (p < n) total[p] += w[p * wn + l];
  } else {
    for (int p = 0; p < n; ++p)
      for (int64_t l = lo[p]; l < hi[p]; ++l) total[p] += w[p * wn + l];
  }
  // The positions' value sums: every loop over positions runs to kQueryTile (those past n
  // skipped), so each index is a constant and the sums stay in registers (indexed by n they
  // lived on the stack, each multiply-add waiting on a store and a load)
  Vec acc[kQueryTile][C];
  auto add = [&](int p, int64_t l, const Vec* vl) {
    for (int c = 0; c < C; ++c) acc[p][c] = fma(w[p * wn + l], vl[c], acc[p][c]);
  };
  auto value = [&](int64_t l, Vec* vl) {
    for (int c = 0; c < C; ++c) vl[c] = load(v + l * vs + c * kBlock);
  };
  Vec vl[C];
#pragma GCC unroll 4
  for (int p = 0; p < kQueryTile; ++p) {
    if (p >= n) continue;
    for (int c = 0; c < C; ++c) acc[p][c] = zero();
    for (int64_t l = lo[p]; l < std::min(clo, hi[p]); ++l) value(l, vl), add(p, l, vl);
  }
  for (int64_t l = clo; l < chi; ++l) {
    fetch_next(next.v, vs, l);
    value(l, vl);
#pragma GCC unroll 4
    for (int p = 0; p < kQueryTile; ++p)
      if (p < n) add(p, l, vl);
  }
#pragma GCC unroll 4
  for (int p = 0; p < kQueryTile; ++p) {
    if (p >= n) continue;
    for (int64_t l = std::max(chi, lo[p]); l < hi[p]; ++l) value(l, vl), add(p, l, vl);
    const float inv = 1.0f / total[p];
    for (int c = 0; c < C; ++c)
      store(out[p] + c * kBlock, fma(inv, acc[p][c], zero()), kBlock, nullptr);
  }
}

template <typename E>
using TileFn = void (*)(const float* const*, int, const E*, int64_t, const E*, int64_t,
                        const int64_t*, const int64_t*, float, float*, int64_t, float* const*,
                        const Next<E>&);
template <typename E, int... Cs>
constexpr std::array<TileFn<E>, sizeof...(Cs)> attend_tiles(std::integer_sequence<int, Cs...>) {
  return {attend_tile<E, Cs + 1>...};
}
template <typename E>
constexpr auto kAttendTiles =
    attend_tiles<E>(std::make_integer_sequence<int, kMaxHead / kBlock>{});

}  // namespace

namespace {

// Task boundaries that split [0, n) into up to `parts` contiguous ranges of about equal cost
// (cost(i): task i's keys): a ragged step's rows read from a few keys to a long prompt's
// hundreds, so an even count of tasks a thread left one thread with most of the keys.
// Which thread runs a task changes nothing in it.
template <typename Cost>
std::vector<int64_t> even_cuts(int64_t n, int64_t parts, const Cost& cost) {
  std::vector<int64_t> ends(static_cast<size_t>(n));
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) ends[static_cast<size_t>(i)] = total += 1 + cost(i);
  std::vector<int64_t> cuts{0};
  for (int64_t p = 1; p < parts; ++p) {
    // the task that crosses this part's share of the cost goes where it overshoots less
    const int64_t target = total * p / parts;
    int64_t at = std::upper_bound(ends.begin(), ends.end(), target) - ends.begin();
    const int64_t before = at > 0 ? ends[static_cast<size_t>(at - 1)] : 0;
    if (at < n && ends[static_cast<size_t>(at)] - target < target - before) ++at;
    if (at > cuts.back() && at < n) cuts.push_back(at);
  }
  cuts.push_back(n);
  return cuts;
}

// causal_attention's work as tasks: for each row, `units` groups of `per_unit` queries (query
// j of unit u is head and position query(u, j), every query of a unit on one key head), in
// tiles of up to kQueryTile queries that attend_tile takes together.
template <typename E, typename Query>
void attend_tasks(const float* qp, const E* kp, const E* vp, float* yp, const AttentionShape& s,
                  float scale, int64_t threads, int64_t units, int64_t per_unit,
                  const Query& query) {
  const int64_t group = s.H / s.Hkv, tiles = (per_unit + kQueryTile - 1) / kQueryTile;
  const TileFn<E> attend = kAttendTiles<E>[s.D / kBlock - 1];
  // below ~64k multiply-adds per thread, starting threads costs more than it saves
  const int64_t work = 2 * s.L * s.D * std::min<int64_t>(per_unit, kQueryTile);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, work));
  // task i's keys and values, from its last query's first key to that query's position
  auto keys_of = [&](int64_t i) {
    const int64_t j0 = (i % tiles) * kQueryTile, bu = i / tiles, b = bu / units, u = bu % units;
    const int64_t kb = s.rows ? s.rows[b] : b, start = s.starts ? s.starts[b] : s.start;
    const int64_t g = query(u, j0).first / group;
    const int64_t last = std::min<int64_t>(per_unit, j0 + kQueryTile) - 1;
    const int64_t hi = start + query(u, last).second + 1;
    const int64_t lo = s.window > 0 ? std::max<int64_t>(0, hi - s.window) : 0;
    return Next<E>{kp + kb * s.ks0 + g * s.ks1, vp + kb * s.vs0 + g * s.vs1, lo, hi - lo};
  };
  const int64_t tasks = s.B * units * tiles;
  const std::vector<int64_t> cuts =
      even_cuts(tasks, std::min(threads, (tasks + grain - 1) / grain),
                [&](int64_t i) { return keys_of(i).n; });
  const int64_t parts = static_cast<int64_t>(cuts.size()) - 1;
  parallel_for(threads, 0, parts, 1, [&](int64_t p0, int64_t p1) {
    const int64_t i0 = cuts[static_cast<size_t>(p0)], i1 = cuts[static_cast<size_t>(p1)];
    std::vector<float> w(static_cast<size_t>(kQueryTile * s.L));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t j0 = (i % tiles) * kQueryTile, bu = i / tiles, b = bu / units, u = bu % units;
      const int64_t start = s.starts ? s.starts[b] : s.start;
      const int n = static_cast<int>(std::min<int64_t>(kQueryTile, per_unit - j0));
      const float* q[kQueryTile];
      float* out[kQueryTile];
      int64_t lo[kQueryTile], hi[kQueryTile];
      for (int p = 0; p < n; ++p) {
        const auto [h, t] = query(u, j0 + p);
        hi[p] = start + t + 1;  // keys up to this query's own position
        lo[p] = s.window > 0 ? std::max<int64_t>(0, hi[p] - s.window) : 0;
        q[p] = qp + b * s.qs0 + h * s.qs1 + t * s.qs2;
        out[p] = yp + ((b * s.H + h) * s.T + t) * s.D;
      }
      const Next<E> own = keys_of(i);
      Next<E> next = i + 1 < i1 ? keys_of(i + 1) : Next<E>{};
      if (next.k == own.k) next = Next<E>{};  // the same keys (a prefill's next tile): in cache
      attend(q, n, own.k, s.ks2, own.v, s.vs2, lo, hi, scale, w.data(), s.L, out, next);
    }
  });
}

}  // namespace

namespace {

// D floats as halves (D a multiple of 16), each rounded as float_to_half rounds it: the
// vector conversions round to nearest even as it does, and a line holding a NaN takes the
// scalar path, so every build stores the same halves
void to_halves(const float* src, uint16_t* dst, int64_t D) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + kBlock <= D; i += kBlock) {
    const __m512 x = _mm512_loadu_ps(src + i);
    if (_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q)) break;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#elif defined(__F16C__)
  for (; i + 8 <= D; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) break;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i < D; ++i) dst[i] = float_to_half(src[i]);
}

void copy_line(const float* src, float* dst, int64_t D) {
  std::memcpy(dst, src, static_cast<size_t>(D) * sizeof(float));
}
void copy_line(const float* src, uint16_t* dst, int64_t D) { to_halves(src, dst, D); }

template <typename E>
void write_lines(E* cache, const int64_t* cs, const float* src, const int64_t* ss, int64_t B,
                 int64_t T, int64_t Hkv, int64_t D, const int64_t* rows, const int64_t* starts,
                 int64_t start) {
  for (int64_t b = 0; b < B; ++b) {
    const int64_t row = rows ? rows[b] : b, first = starts ? starts[b] : start;
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t t = 0; t < T; ++t)
        copy_line(src + b * ss[0] + g * ss[1] + t * ss[2],
                  cache + row * cs[0] + g * cs[1] + (first + t) * cs[2], D);
  }
}

// A prefill's positions of one head share each key load (attend_tile). At one position (a
// decode step) the query heads that share a key and value head (grouped-query attention) go
// through attend_tile together instead, so each of the group's keys and values is read once,
// not once a head. Either way every query keeps its own arithmetic (attend_tile): the bits of
// each head and position alone.
template <typename E>
void attend(const float* qp, const E* kp, const E* vp, float* yp, const AttentionShape& s,
            float scale, int64_t threads) {
  const int64_t group = s.H / s.Hkv;
  using HeadAt = std::pair<int64_t, int64_t>;  // (query head, position)
  if (s.T == 1 && group > 1)
    attend_tasks(qp, kp, vp, yp, s, scale, threads, s.Hkv, group,
                 [group](int64_t u, int64_t j) { return HeadAt{u * group + j, 0}; });
  else
    attend_tasks(qp, kp, vp, yp, s, scale, threads, s.H, s.T,
                 [](int64_t u, int64_t j) { return HeadAt{u, j}; });
}

}  // namespace

void write_and_attend(const float* q, void* cache_k, void* cache_v, bool half_cache,
                      const float* k_new, const int64_t* kn, const float* v_new,
                      const int64_t* vn, float* y, const AttentionShape& s, float scale,
                      int64_t threads) {
  const int64_t ks[3] = {s.ks0, s.ks1, s.ks2}, vs[3] = {s.vs0, s.vs1, s.vs2};
  const auto step = [&](auto* k, auto* v) {
    write_lines(k, ks, k_new, kn, s.B, s.T, s.Hkv, s.D, s.rows, s.starts, s.start);
    write_lines(v, vs, v_new, vn, s.B, s.T, s.Hkv, s.D, s.rows, s.starts, s.start);
    attend(q, k, v, y, s, scale, threads);
  };
  if (half_cache)
    step(static_cast<uint16_t*>(cache_k), static_cast<uint16_t*>(cache_v));
  else
    step(static_cast<float*>(cache_k), static_cast<float*>(cache_v));
}

void causal_attention(const float* q, const float* k, const float* v, float* y,
                      const AttentionShape& s, float scale, int64_t threads) {
  attend(q, k, v, y, s, scale, threads);
}

void causal_attention(const float* q, const uint16_t* k, const uint16_t* v, float* y,
                      const AttentionShape& s, float scale, int64_t threads) {
  attend(q, k, v, y, s, scale, threads);
}

}  // namespace sw
