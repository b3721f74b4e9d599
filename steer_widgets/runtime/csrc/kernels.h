// The kernels on plain pointers (no torch): ops.cpp checks tensors and calls these; the
// sanitizer harness (tests/native/tsan_harness.cpp) calls them without torch or OpenMP.
// `threads` is how many threads of the pool (pool.h) a call may use, the caller included.
// Every kernel computes each output whole on one thread in a fixed order, so no result
// depends on `threads`, on how the work was split, or on the other rows of a batch.
#pragma once

#include <cstdint>
#include <type_traits>

namespace sw {

// y [M, N] = x [M, K] @ W.T (+ bias [N]), W packed as [ceil(N/16), K, 16] floats
void float_linear(const float* x, const float* packed, const float* bias, float* y, int64_t M,
                  int64_t K, int64_t N, int64_t threads);

// ggml's type ids; Q5_1 to Q6_K are repacked with float32 scales (quant_linear.cpp); Q5_0
// arrives as Q8_0 (quant.py: the same weights in whole bytes)
enum QType : int64_t {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14
};
constexpr int64_t kQK = 32;  // weights per GGUF block along k
constexpr int64_t quant_group_bytes(int64_t t) {  // bytes per 16 columns x 32 k; 0: not read
  switch (t) {
    case kQ4_0: return 32 + 8 * kQK;
    case kQ4_1: return 64 + 8 * kQK;
    case kQ8_0: return 32 + 16 * kQK;
    case kQ5_1: case kQ5_K: return 128 + 16 * kQK;  // scales, offsets, bytes
    case kQ4_K: return 128 + 8 * kQK;                // scales, offsets, nibbles
    case kQ6_K: return 128 + 16 * kQK;               // two scales, signed bytes
    default: return 0;
  }
}

// f(std::integral_constant<int64_t, T>{}) for the QType T = qtype: the one switch from a
// run-time type id to a kernel compiled for that type (an id that is none of them is Q4_0's;
// the ops refuse such ids before any kernel runs)
template <class F>
void with_qtype(int64_t qtype, F&& f) {
  switch (qtype) {
    case kQ4_1: return f(std::integral_constant<int64_t, kQ4_1>{});
    case kQ8_0: return f(std::integral_constant<int64_t, kQ8_0>{});
    case kQ5_1: return f(std::integral_constant<int64_t, kQ5_1>{});
    case kQ4_K: return f(std::integral_constant<int64_t, kQ4_K>{});
    case kQ5_K: return f(std::integral_constant<int64_t, kQ5_K>{});
    case kQ6_K: return f(std::integral_constant<int64_t, kQ6_K>{});
    default: return f(std::integral_constant<int64_t, kQ4_0>{});
  }
}

// y [M, N] = x [M, K] @ W.T (+ bias), W as GGUF blocks packed [ceil(N/16), K/32, group bytes]
void quant_linear(const float* x, const uint8_t* packed, const float* bias, float* y, int64_t M,
                  int64_t K, int64_t N, int64_t qtype, int64_t threads);

// The products="int8" option (int8_linear.cpp): y [M, N] = x @ W.T (+ bias) with each row of
// x quantized to int8 per 32 k and integer block sums; W packed by quant.py's pack_int8 (the
// bytes per group of quant_group_bytes, every type quant_linear reads).
void int8_linear(const float* x, const uint8_t* packed, const float* bias, float* y, int64_t M,
                 int64_t K, int64_t N, int64_t qtype, int64_t threads);

// row `id` of the quantized matrix, dequantized into y [K]
void quant_row(const uint8_t* packed, int64_t id, int64_t K, int64_t qtype, float* y);

// rows [first, first + n) of the quantized matrix, dequantized and transposed into y [K, n]
// on the pool (a backward's weight: quant_row's values, vectorized)
void quant_dense(const uint8_t* packed, int64_t first, int64_t n, int64_t K, int64_t qtype,
                 float* y, int64_t threads);

// y [M, D] = w * (x * rsqrt(mean(x^2) + eps)) for each row of x [M, D]
void rms_norm(const float* x, const float* w, float* y, int64_t M, int64_t D, float eps);

// Rotary embedding: x [B, T, H, D] with strides xs (the last one 1), cos and signed sin
// [T, R] (cs = 0) or, for rows at their own positions, [B, T, R] (cs = T * R, row b's tables
// at cos + b * cs); y [B, T, H, D] contiguous
void rotary(const float* x, const int64_t* xs, const float* cos, const float* sin, int64_t cs,
            float* y, int64_t B, int64_t T, int64_t H, int64_t D, int64_t R);

constexpr int64_t kMaxHead = 256;  // the largest head causal_attention reads

// Causal attention of T positions: q [B, H, T, D] (strides qs0, qs1, qs2) over keys and
// values [B, Hkv, L, D] (strides ks and vs), y [B, H, T, D] contiguous; D a multiple of 16 up
// to kMaxHead. Query t sits at position start + t and attends the keys up to that position
// (and, with window > 0, the last `window` of them): each (row, head, position) is computed
// alone in the same fixed order, so a prefill's position equals that position decoded alone.
//
// A ragged batch (rows of different prompts, each at its own position) sets rows and starts:
// q's row b reads the keys and values of row rows[b] and sits at position starts[b] (in
// place of start), so each row is exactly what it would be decoded alone.
struct AttentionShape {
  int64_t B, H, Hkv, T, L, D;
  int64_t qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2;
  int64_t start, window;
  const int64_t* rows = nullptr;    // [B]: the K and V row of each q row (nullptr: b itself)
  const int64_t* starts = nullptr;  // [B]: each row's position (nullptr: start for every row)
};
//
// Keys and values are float32, or halves (products="int8": a half-precision cache), widened
// exactly as they load: the same arithmetic on the values the cache holds.
void causal_attention(const float* q, const float* k, const float* v, float* y,
                      const AttentionShape& s, float scale, int64_t threads);
void causal_attention(const float* q, const uint16_t* k, const uint16_t* v, float* y,
                      const AttentionShape& s, float scale, int64_t threads);

// One attention step over a cache, the one owner of "write, then attend" (decoder_block's
// and the ragged_attention op's): the new keys and values k_new and v_new (line (b, head, t)
// at strides kn and vn, D contiguous) go to cache row s.rows[b] (b itself without rows) at
// position s.starts[b] (s.start without starts) + t of cache_k and cache_v (strides s.ks*,
// s.vs*), then causal_attention reads them. The caches are float32, or halves where
// half_cache, each new value rounded to nearest even (half.h's float_to_half, torch's float16
// conversion).
void write_and_attend(const float* q, void* cache_k, void* cache_v, bool half_cache,
                      const float* k_new, const int64_t* kn, const float* v_new,
                      const int64_t* vn, float* y, const AttentionShape& s, float scale,
                      int64_t threads);

// One pre-norm block with rotary attention and a gated MLP (Llama's, Mistral's, Qwen2's) for
// x [B, T, d] (contiguous), op for op and in the order of transformer.py's _ops_block, so its
// bits: RMSNorm, the fused q, k, v product, rotary on the q and k heads, the new keys and
// values written to the cache, causal attention, the output product and residual, RMSNorm, the
// gate-and-up product, gated(gate, up) (the activation, the caller's: torch's SiLU bits come
// from torch), the down product and residual, into out [B, T, d].
struct BlockProduct {
  const void* packed;  // float32 blocks (kind 0), GGUF blocks (1), or int8_linear's (2)
  int64_t kind, qtype, n_out;
  const float* bias;  // [n_out] or nullptr
};
// out [M, F] = act(gate_up[:, :F]) * gate_up[:, F:] for gate_up [M, 2F]
using GatedFn = void (*)(const float* gate_up, float* out, int64_t M, int64_t F, void* ctx);
struct BlockArgs {
  const float* x;
  int64_t B, T, d;
  const float *attn_norm, *mlp_norm;
  float eps;
  BlockProduct products[4];  // wqkv, wo, w_gate_up, w_down
  GatedFn gated;
  void* gated_ctx;
  const float *cos, *sin;  // [T, R], or [B, T, R] with cos_stride = T * R (a ragged step)
  int64_t cos_stride, R;
  int64_t H, Hkv, D;  // query heads, key and value heads, head size
  void *cache_k, *cache_v;  // [N, Hkv, L, D], each position's D contiguous: float32 ...
  bool half_cache = false;  // ... or halves (uint16_t)
  int64_t ks[3], vs[3], L;  // their first three strides and their length
  int64_t start, window;   // every row continues its cache row b at start ...
  const int64_t* rows = nullptr;    // ... or row b of x is at starts[b] of cache row rows[b]
  const int64_t* starts = nullptr;  // (T = 1, a ragged step)
  float scale;
};
void decoder_block(const BlockArgs& args, float* out, int64_t threads);

}  // namespace sw
