// torch.ops.steer_widgets.*: the kernels of kernels.h and the noise queue, bound to tensors.
// Each op checks its tensors (a named error before any work), then calls the pointer-level
// kernel with the calling thread's kernel thread count. Plain ATen and the op registry, no
// Python headers: that keeps the one-time build short.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/silu.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "exp_lanes.h"
#include "kernels.h"
#include "mt_uniform.h"
#include "noise_queue.h"
#include "pool.h"
#include "simd.h"
#include "vocab_pass.h"

namespace {

// Threads the kernels use for a call from this thread: torch's count (at::get_num_threads(),
// which reads the calling thread's OpenMP count), or the count it had before openmp_threads
// lowered that for torch's own ops.
thread_local int64_t kernel_threads = 0;
int64_t threads_for_kernels() {
  return kernel_threads > 0 ? kernel_threads : at::get_num_threads();
}

// the bias pointer (nullptr for none), checked against n_out
const float* bias_of(const std::optional<at::Tensor>& bias, int64_t n_out) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n_out && bias->is_contiguous() &&
                  bias->scalar_type() == at::kFloat,
              "bias must be a contiguous float32 [n_out]");
  return bias->data_ptr<float>();
}

// y [..., n_out] for x [..., K]
at::Tensor output_of(const at::Tensor& x, int64_t n_out) {
  auto sizes = x.sizes().vec();
  sizes.back() = n_out;
  return at::empty(sizes, x.options());
}

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
  TORCH_CHECK(x_in.size(-1) == K && packed.size(2) == sw::kBlock, "packed weight does not fit x");
  TORCH_CHECK(blocks == (n_out + sw::kBlock - 1) / sw::kBlock, "packed weight does not match n_out");
  const at::Tensor x = x_in.reshape({-1, K}).contiguous();
  const float* bp = bias_of(bias, n_out);
  auto y = output_of(x_in, n_out);
  sw::float_linear(x.data_ptr<float>(), packed.data_ptr<float>(), bp, y.data_ptr<float>(),
                   x.size(0), K, n_out, threads_for_kernels());
  return y;
}

void check_quant(const at::Tensor& packed, int64_t qtype, int64_t K) {
  TORCH_CHECK(sw::quant_group_bytes(qtype) > 0, "qtype must be 2, 3, 7, 8, 12, 13 or 14");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 3,
              "packed must be contiguous uint8 [N/16, K/32, bytes]");
  TORCH_CHECK(K % sw::kQK == 0 && packed.size(1) == K / sw::kQK &&
                  packed.size(2) == sw::quant_group_bytes(qtype),
              "packed weight does not fit K and qtype");
}

using QuantKernel = void (*)(const float*, const uint8_t*, const float*, float*, int64_t,
                             int64_t, int64_t, int64_t, int64_t);

// x [..., K] (fp32) times a quantized weight packed as [ceil(N/16), K/32, bytes] (uint8) by
// `kernel`: x @ W.T (+ bias), [..., N]
at::Tensor quant_product(QuantKernel kernel, const at::Tensor& x_in, const at::Tensor& packed,
                         int64_t n_out, int64_t qtype, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() >= 1 && x_in.scalar_type() == at::kFloat, "x must be float32 [..., K]");
  const int64_t K = x_in.size(-1);
  check_quant(packed, qtype, K);
  TORCH_CHECK(packed.size(0) == (n_out + sw::kBlock - 1) / sw::kBlock,
              "packed weight does not match n_out");
  const at::Tensor x = x_in.reshape({-1, K}).contiguous();
  const float* bp = bias_of(bias, n_out);
  auto y = output_of(x_in, n_out);
  kernel(x.data_ptr<float>(), packed.data_ptr<uint8_t>(), bp, y.data_ptr<float>(), x.size(0), K,
         n_out, qtype, threads_for_kernels());
  return y;
}

// W dequantized as gguf does it (the float32 kernel's bits on the dequantized matrix)
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n_out,
                        int64_t qtype, const std::optional<at::Tensor>& bias) {
  return quant_product(sw::quant_linear, x, packed, n_out, qtype, bias);
}

// products="int8": x's rows quantized to int8 per 32 k, W packed by quant.py's pack_int8
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n_out,
                       int64_t qtype, const std::optional<at::Tensor>& bias) {
  return quant_product(sw::int8_linear, x, packed, n_out, qtype, bias);
}

// Rows `ids` (int64 [...]) of the quantized matrix of n_out rows, dequantized: [..., K]
// float32 (the embedding lookup of a tied Q8_0 embedding, and the dense copy when one is
// wanted). An id outside [0, n_out) is an IndexError, as torch's embedding raises: the
// packed blocks go on to a multiple of 16 rows, and the padding's zeros are no row.
at::Tensor quant_rows(const at::Tensor& packed, const at::Tensor& ids_in, int64_t n_out,
                      int64_t K, int64_t qtype) {
  check_quant(packed, qtype, K);
  TORCH_CHECK(n_out >= 0 && packed.size(0) == (n_out + sw::kBlock - 1) / sw::kBlock,
              "packed weight does not match n_out");
  TORCH_CHECK(ids_in.scalar_type() == at::kLong, "ids must be int64");
  const at::Tensor ids = ids_in.contiguous();
  const int64_t n = ids.numel();
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t j = 0; j < n; ++j)  // every id checked before any work
    TORCH_CHECK_INDEX(ip[j] >= 0 && ip[j] < n_out, "row id ", ip[j], " out of range for ",
                      n_out, " rows");
  auto sizes = ids.sizes().vec();
  sizes.push_back(K);
  auto y = at::empty(sizes, packed.options().dtype(at::kFloat));
  for (int64_t j = 0; j < n; ++j)
    sw::quant_row(packed.data_ptr<uint8_t>(), ip[j], K, qtype, y.data_ptr<float>() + j * K);
  return y;
}

// Rows [first, stop) of the quantized matrix of n_out rows, dequantized and transposed:
// [K, stop - first] float32, quant_rows' values from the forward's vector dequantization on
// the pool (a backward's weight, remade for each product; transposed, it is written whole
// lines at a time).
at::Tensor quant_dense(const at::Tensor& packed, int64_t first, int64_t stop, int64_t n_out,
                       int64_t K, int64_t qtype) {
  check_quant(packed, qtype, K);
  TORCH_CHECK(n_out >= 0 && packed.size(0) == (n_out + sw::kBlock - 1) / sw::kBlock,
              "packed weight does not match n_out");
  TORCH_CHECK_INDEX(0 <= first && first <= stop && stop <= n_out, "rows ", first, ":", stop,
                    " out of range for ", n_out, " rows");
  auto y = at::empty({K, stop - first}, packed.options().dtype(at::kFloat));
  sw::quant_dense(packed.data_ptr<uint8_t>(), first, stop - first, K, qtype,
                  y.data_ptr<float>(), threads_for_kernels());
  return y;
}

// RMSNorm of each row of x [..., D] (fp32; copied only where not contiguous), w [D].
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& w, double eps) {
  TORCH_CHECK(x_in.dim() >= 1 && w.dim() == 1 && x_in.size(-1) == w.size(0),
              "x must be [..., D], w [D]");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(w.is_contiguous(), "w must be contiguous");
  const at::Tensor x = x_in.contiguous();
  const int64_t D = x.size(-1), M = D ? x.numel() / D : 0;
  auto y = at::empty_like(x);
  sw::rms_norm(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), M, D,
               static_cast<float>(eps));
  return y;
}

// Rotary embedding of x [B, T, H, D] (fp32, each head contiguous, any other strides: the q and
// k heads of a fused qkv are read in place) with cos and signed sin [T, R] (R <= D, even), or
// [B, T, R] where rows sit at positions of their own (a ragged batch), into a new contiguous
// tensor.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && (cos.dim() == 2 || cos.dim() == 3) && sin.sizes() == cos.sizes(),
              "x must be [B, T, H, D], cos and sin [T, R] or [B, T, R]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              "float32 only");
  TORCH_CHECK(x.stride(3) == 1 && cos.is_contiguous() && sin.is_contiguous(),
              "x's heads and cos and sin must be contiguous");
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  const int64_t R = cos.size(-1);
  const bool per_row = cos.dim() == 3;
  TORCH_CHECK(cos.size(-2) == T && (!per_row || cos.size(0) == B) && R <= D && R % 2 == 0,
              "cos and sin do not fit x");
  auto y = at::empty({B, T, H, D}, x.options());
  const int64_t strides[3] = {x.stride(0), x.stride(1), x.stride(2)};
  sw::rotary(x.data_ptr<float>(), strides, cos.data_ptr<float>(), sin.data_ptr<float>(),
             per_row ? T * R : 0, y.data_ptr<float>(), B, T, H, D, R);
  return y;
}

// whether keys and values k and v are halves (products="int8"'s cache) rather than float32;
// either way both are the same type
bool half_kv(const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(k.scalar_type() == v.scalar_type() &&
                  (k.scalar_type() == at::kFloat || k.scalar_type() == at::kHalf),
              "the keys and values must both be float32 or both float16");
  return k.scalar_type() == at::kHalf;
}

uint16_t* halves(const at::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data_ptr<at::Half>());
}

// a cache's data as the kernels take it: halves or float32, as half_kv found it
void* kv_data(const at::Tensor& t, bool half) {
  return half ? static_cast<void*>(halves(t)) : t.data_ptr<float>();
}

// Causal attention of T positions: q [B, H, T, D] over keys and values [B, Hkv, L, D] (each
// position's D contiguous, any other strides: a slice of the KV cache or of a fused qkv is
// read in place), H a multiple of Hkv (grouped-query heads share their group's keys), scale
// applied to q.k. Query t sits at position start + t (start + T <= L) and attends the keys
// up to it, the last `window` of them where window > 0. k and v may be halves (float16).
// Returns [B, H, T, D].
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale, int64_t start, int64_t window) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(),
              "q must be [B, H, T, D], k and v [B, Hkv, L, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat, "q must be float32");
  const bool half = half_kv(k, v);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), L = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(3) == D && Hkv > 0 && H % Hkv == 0,
              "k and v do not fit q");
  TORCH_CHECK(T > 0 && start >= 0 && start + T <= L && window >= 0,
              "positions start..start+T must lie within the L keys");
  TORCH_CHECK(D % sw::kBlock == 0 && D <= sw::kMaxHead,
              "head size must be a multiple of 16, at most 256");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "the last dim of q, k and v must be contiguous");
  auto y = at::empty({B, H, T, D}, q.options());
  sw::AttentionShape shape{};
  shape.B = B, shape.H = H, shape.Hkv = Hkv, shape.T = T, shape.L = L, shape.D = D;
  shape.qs0 = q.stride(0), shape.qs1 = q.stride(1), shape.qs2 = q.stride(2);
  shape.ks0 = k.stride(0), shape.ks1 = k.stride(1), shape.ks2 = k.stride(2);
  shape.vs0 = v.stride(0), shape.vs1 = v.stride(1), shape.vs2 = v.stride(2);
  shape.start = start, shape.window = window;
  const auto sc = static_cast<float>(scale);
  if (half)
    sw::causal_attention(q.data_ptr<float>(), halves(k), halves(v), y.data_ptr<float>(), shape,
                         sc, threads_for_kernels());
  else
    sw::causal_attention(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                         y.data_ptr<float>(), shape, sc, threads_for_kernels());
  return y;
}

// a ragged step's rows: each a cache row (of n) at a position (of L), no cache row twice
void check_ragged_rows(const at::Tensor& rows, const at::Tensor& starts, int64_t B, int64_t n,
                       int64_t L) {
  TORCH_CHECK(rows.scalar_type() == at::kLong && starts.scalar_type() == at::kLong &&
                  rows.dim() == 1 && starts.dim() == 1 && rows.size(0) == B &&
                  starts.size(0) == B && rows.is_contiguous() && starts.is_contiguous(),
              "rows and starts must be contiguous int64 [B]");
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* sp = starts.data_ptr<int64_t>();
  std::vector<bool> taken(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < B; ++i) {
    TORCH_CHECK(rp[i] >= 0 && rp[i] < n && sp[i] >= 0 && sp[i] < L, "row ", i, ": cache row ",
                rp[i], " position ", sp[i], " outside k");
    TORCH_CHECK(!taken[rp[i]], "cache row ", rp[i], " appears twice in one step");
    taken[rp[i]] = true;
  }
}

// One decode position per row of a ragged batch: q [B, H, 1, D], row b of q at position
// starts[b] of cache row rows[b] of k and v [N, Hkv, L, D] (starts[b] < L). First each row's
// new key and value (k_new and v_new [B, Hkv, 1, D]) are written at its position of its cache
// row (the cache write of the step, here rather than as two index_put calls per layer), then
// each row attends its keys up to its position (the last `window` where window > 0). Each
// row's bits are those of the same row decoded alone (causal_attention with start =
// starts[b]). k and v may be halves (float16), k_new and v_new float32 rounded into them.
// Every argument is checked before anything is written.
at::Tensor ragged_attention(const at::Tensor& q, at::Tensor& k, at::Tensor& v,
                            const at::Tensor& k_new, const at::Tensor& v_new, double scale,
                            const at::Tensor& rows, const at::Tensor& starts, int64_t window) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 1 && k.dim() == 4 && v.sizes() == k.sizes(),
              "q must be [B, H, 1, D], k and v [N, Hkv, L, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_new.scalar_type() == at::kFloat &&
                  v_new.scalar_type() == at::kFloat,
              "q, k_new and v_new must be float32");
  const bool half = half_kv(k, v);
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  const int64_t N = k.size(0), Hkv = k.size(1), L = k.size(2);
  TORCH_CHECK(k.size(3) == D && Hkv > 0 && H % Hkv == 0 && window >= 0, "k and v do not fit q");
  TORCH_CHECK(k_new.sizes() == at::IntArrayRef({B, Hkv, 1, D}) && v_new.sizes() == k_new.sizes(),
              "k_new and v_new must be [B, Hkv, 1, D]");
  TORCH_CHECK(D % sw::kBlock == 0 && D <= sw::kMaxHead,
              "head size must be a multiple of 16, at most 256");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 &&
                  k_new.stride(3) == 1 && v_new.stride(3) == 1,
              "the last dim of q, k, v, k_new and v_new must be contiguous");
  check_ragged_rows(rows, starts, B, N, L);
  const int64_t kn[3] = {k_new.stride(0), k_new.stride(1), k_new.stride(2)};
  const int64_t vn[3] = {v_new.stride(0), v_new.stride(1), v_new.stride(2)};
  auto y = at::empty({B, H, 1, D}, q.options());
  sw::AttentionShape shape{};
  shape.B = B, shape.H = H, shape.Hkv = Hkv, shape.T = 1, shape.L = L, shape.D = D;
  shape.qs0 = q.stride(0), shape.qs1 = q.stride(1), shape.qs2 = q.stride(2);
  shape.ks0 = k.stride(0), shape.ks1 = k.stride(1), shape.ks2 = k.stride(2);
  shape.vs0 = v.stride(0), shape.vs1 = v.stride(1), shape.vs2 = v.stride(2);
  shape.start = 0, shape.window = window;
  shape.rows = rows.data_ptr<int64_t>(), shape.starts = starts.data_ptr<int64_t>();
  sw::write_and_attend(q.data_ptr<float>(), kv_data(k, half), kv_data(v, half), half,
                       k_new.data_ptr<float>(), kn, v_new.data_ptr<float>(), vn,
                       y.data_ptr<float>(), shape, static_cast<float>(scale),
                       threads_for_kernels());
  return y;
}

// n of gen's uniform draws, torch's uniform_(0, 1) bits (mt_uniform.h), under gen's lock as
// torch draws
void uniform_draws(at::Generator& gen, double* out, int64_t n) {
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(impl->mutex_);
  at::mt19937 engine = impl->engine();
  at::mt19937_data_pod data = engine.data();
  sw::mt_uniform(data.state_.data(), data.left_, data.next_, out, n);
  engine.set_data(data);
  impl->set_engine(engine);
}

// Fills out (1-D, contiguous) with gen's next draws on the pool's workers while they are
// idle: float32, the Exp(1) draws out.exponential_(1, gen) makes; float64, the uniform draws
// in [0, 1) those are made of (exponential_ turns each into -log1p(-u), which vocab_pass then
// computes only where a token can win: exponential_of). Returns a ticket for noise_finish
// (which completes the draw on the calling thread) or noise_cancel. Until then nothing else
// may draw from gen. Each chunk is torch's own exponential_ on a slice, or the uniform_
// draws uniform_draws makes as torch does: both take the generator's values element by
// element, one 64-bit draw each, so the chunks in order give the bits of one call over the
// whole tensor.
int64_t noise_start(const at::Tensor& out, const std::optional<at::Generator>& gen) {
  const bool uniform = out.scalar_type() == at::kDouble;
  TORCH_CHECK(out.dim() == 1 && out.is_contiguous() && out.device().is_cpu() &&
                  (uniform || out.scalar_type() == at::kFloat),
              "out must be a contiguous 1-D float32 or float64 CPU tensor");
  TORCH_CHECK(gen.has_value() && gen->device().is_cpu(), "a CPU generator is needed");
  auto draw = [out, g = *gen, uniform](int64_t begin, int64_t end) mutable {
    if (uniform) return uniform_draws(g, out.data_ptr<double>() + begin, end - begin);
    c10::InferenceMode guard;  // the tensor may have been made in inference mode
    out.slice(0, begin, end).exponential_(1.0, g);
  };
  // mt_uniform's draws cost a small fraction of exponential_'s (docs/benchmarks.md): more of
  // them fit the wait a chunk may cost a kernel call
  constexpr int64_t kUniformChunk = 8192;
  const int64_t chunk = uniform ? kUniformChunk : sw::NoiseQueue::kChunk;
  const int64_t ticket = sw::NoiseQueue::get().submit(out.numel(), std::move(draw), chunk);
  sw::pool_nudge(threads_for_kernels());
  return ticket;
}

void noise_finish(int64_t ticket) {
  TORCH_CHECK(sw::NoiseQueue::get().finish(ticket), "no noise job ", ticket,
              " (finished already, or begun in a parent process)");
}

void noise_cancel(int64_t ticket) { sw::NoiseQueue::get().cancel(ticket); }

// Sets the calling thread's OpenMP thread count (torch's own ops read it) and returns the
// previous one. Unlike torch.set_num_threads it touches nothing else: not the default of
// threads started later, not MKL's or the pthreadpool's sizes. The kernels keep the count
// the thread had before it was first lowered (at::get_num_threads() would read the lowered
// one) until it is set back to that count.
int64_t openmp_threads(int64_t n) {
  TORCH_CHECK(n >= 1, "n must be at least 1");
#ifdef _OPENMP
  const int64_t before = omp_get_max_threads();
  if (kernel_threads == 0 && n < before) kernel_threads = before;
  if (n == kernel_threads) kernel_threads = 0;
  omp_set_num_threads(static_cast<int>(n));
  return before;
#else
  return 1;
#endif
}

// The threads the kernels use for a call from the calling thread.
int64_t kernel_thread_count() { return threads_for_kernels(); }

// The end of a decode step for every row (vocab_pass.h), on the calling thread's kernel threads.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> vocab_pass(
    const at::Tensor& logits, c10::ArrayRef<double> temperature, c10::ArrayRef<double> penalty,
    const c10::List<std::optional<at::Tensor>>& counts,
    const c10::List<std::optional<at::Tensor>>& noise, c10::ArrayRef<int64_t> follow, int64_t k) {
  return sw::vocab_pass(logits, temperature, penalty, counts.vec(), noise.vec(), follow, k,
                        threads_for_kernels());
}

// The Exp(1) values exponential_ makes of the uniform draws u (float64 [n]): float32 [n].
at::Tensor exponential_of(const at::Tensor& u) {
  TORCH_CHECK(u.dim() == 1 && u.is_contiguous() && u.scalar_type() == at::kDouble &&
                  u.device().is_cpu(),
              "u must be a contiguous 1-D float64 CPU tensor");
  auto out = at::empty({u.size(0)}, u.options().dtype(at::kFloat));
  sw::exponential_of(u.data_ptr<double>(), out.data_ptr<float>(), u.size(0));
  return out;
}

// How many non-positive floats `stride` bit patterns apart (1: every one) get other bits
// from attention's exps in lanes than from the same algorithm a float at a time, and than
// from std::exp (exp_lanes.h): [algorithm, libm].
std::vector<int64_t> exp_mismatches(int64_t stride) {
  TORCH_CHECK(stride >= 1, "stride must be at least 1");
  const sw::ExpMismatches bad = sw::exp_mismatches(stride, threads_for_kernels());
  return {bad.algorithm, bad.libm};
}

// The pool's worker threads started so far.
int64_t pool_workers() { return sw::pool_workers(); }

// out [M, F] = silu(gate) * up for gate_up [M, 2F] (sw::GatedFn): torch's SiLU, for its bits
void silu_gated(const float* gate_up, float* out, int64_t M, int64_t F, void*) {
  const auto options = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor gate = at::from_blob(const_cast<float*>(gate_up), {M, F}, {2 * F, 1}, options);
  at::Tensor act = at::from_blob(out, {M, F}, options);
  at::silu_out(act, gate);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t f = 0; f < F; ++f) out[m * F + f] *= gate_up[m * 2 * F + F + f];
}

// decoder_block's product i (wqkv, wo, w_gate_up, w_down), checked against the block: K
// inputs and the n_out it needs
sw::BlockProduct block_product(int i, const at::Tensor& packed, int64_t kind, int64_t qtype,
                               int64_t n_out, const std::optional<at::Tensor>& bias, int64_t K,
                               int64_t needed) {
  TORCH_CHECK(n_out == needed && (i != 2 || n_out % 2 == 0), "product ", i, " has ", n_out,
              " outputs where the block needs ", needed);
  if (kind == 0) {
    TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.is_contiguous() &&
                    packed.dim() == 3 && packed.size(1) == K && packed.size(2) == sw::kBlock &&
                    packed.size(0) == (n_out + sw::kBlock - 1) / sw::kBlock,
                "packed weight ", i, " does not fit the block");
  } else {
    TORCH_CHECK(kind == 1 || kind == 2, "kind must be 0, 1 or 2");
    check_quant(packed, qtype, K);
    TORCH_CHECK(packed.size(0) == (n_out + sw::kBlock - 1) / sw::kBlock,
                "packed weight ", i, " does not match its n_out");
  }
  return {packed.data_ptr(), kind, qtype, n_out, bias_of(bias, n_out)};
}

// One pre-norm block with rotary attention and a gated SiLU MLP (Llama's, Mistral's, Qwen2's)
// for x [B, T, d] continuing every row of the cache at `start` (or, with rows and starts, a
// ragged step: row b at position starts[b] of cache row rows[b]): transformer.py's _ops_block,
// op for op and in its order (so its bits), with no Python between the ops (sw::decoder_block).
// products: wqkv, wo, w_gate_up, w_down, each a packed weight of its kind (0: float32 blocks,
// rowwise_linear's; 1: GGUF blocks, quant_linear's; 2: int8_linear's); cos and sin [T, R] at
// these positions, or [B, T, R]. Every argument is checked before anything is written.
at::Tensor decoder_block(const at::Tensor& x_in, const at::Tensor& attn_norm,
                         const at::Tensor& mlp_norm, at::TensorList packed,
                         c10::ArrayRef<int64_t> kinds, c10::ArrayRef<int64_t> qtypes,
                         c10::ArrayRef<int64_t> n_out,
                         const c10::List<std::optional<at::Tensor>>& biases,
                         const at::Tensor& cos, const at::Tensor& sin, at::Tensor& cache_k,
                         at::Tensor& cache_v, int64_t start, int64_t window, double eps,
                         int64_t n_heads, int64_t n_kv, double scale,
                         const std::optional<at::Tensor>& rows,
                         const std::optional<at::Tensor>& starts) {
  TORCH_CHECK(packed.size() == 4 && kinds.size() == 4 && qtypes.size() == 4 &&
                  n_out.size() == 4 && biases.size() == 4,
              "four products: wqkv, wo, w_gate_up, w_down");
  TORCH_CHECK(x_in.dim() == 3 && cache_k.dim() == 4 && cache_v.sizes() == cache_k.sizes(),
              "x must be [B, T, d], the caches [B, Hkv, L, D]");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && attn_norm.scalar_type() == at::kFloat &&
                  mlp_norm.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              "x, the norms, cos and sin must be float32");
  const bool half = half_kv(cache_k, cache_v);  // the caches: float32 or float16
  TORCH_CHECK(x_in.device().is_cpu() && cache_k.device().is_cpu() && cache_v.device().is_cpu(),
              "decoder_block runs on the CPU");
  const at::Tensor x = x_in.contiguous();
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), dh = cache_k.size(3);
  const int64_t L = cache_k.size(2), width = (n_heads + 2 * n_kv) * dh;
  const bool ragged = rows.has_value() && starts.has_value();
  TORCH_CHECK(n_heads > 0 && n_kv > 0 && n_heads % n_kv == 0 && cache_k.size(1) == n_kv,
              "the heads do not fit the caches");
  TORCH_CHECK(ragged ? t == 1 : cache_k.size(0) == b && start >= 0 && start + t <= L,
              "the caches do not fit x at start");
  TORCH_CHECK(dh % sw::kBlock == 0 && dh <= sw::kMaxHead,
              "head size must be a multiple of 16, at most 256");
  TORCH_CHECK(window >= 0, "window must be at least 0");
  TORCH_CHECK(cache_k.stride(3) == 1 && cache_v.stride(3) == 1,
              "the caches' last dim must be contiguous");
  TORCH_CHECK(attn_norm.dim() == 1 && attn_norm.size(0) == d && attn_norm.is_contiguous() &&
                  mlp_norm.dim() == 1 && mlp_norm.size(0) == d && mlp_norm.is_contiguous(),
              "the norms' weights must be contiguous [d]");
  TORCH_CHECK((cos.dim() == 2 || cos.dim() == 3) && sin.sizes() == cos.sizes() &&
                  cos.is_contiguous() && sin.is_contiguous() && cos.size(-2) == t &&
                  (cos.dim() == 2 || cos.size(0) == b) && cos.size(-1) <= dh &&
                  cos.size(-1) % 2 == 0,
              "cos and sin must be contiguous [T, R] or [B, T, R], R even and at most D");
  const int64_t widths[4] = {d, n_heads * dh, d, n_out[2] / 2};  // each product's K
  const int64_t outs[4] = {width, d, n_out[2], d};
  sw::BlockArgs a{};
  for (int i = 0; i < 4; ++i)
    a.products[i] = block_product(i, packed[i], kinds[i], qtypes[i], n_out[i], biases.get(i),
                                  widths[i], outs[i]);
  if (ragged) {  // every row's cache row and position, before anything is written
    check_ragged_rows(*rows, *starts, b, cache_k.size(0), L);
    a.rows = rows->data_ptr<int64_t>(), a.starts = starts->data_ptr<int64_t>();
  }
  a.x = x.data_ptr<float>(), a.B = b, a.T = t, a.d = d;
  a.attn_norm = attn_norm.data_ptr<float>(), a.mlp_norm = mlp_norm.data_ptr<float>();
  a.eps = static_cast<float>(eps);
  a.gated = silu_gated, a.gated_ctx = nullptr;
  a.cos = cos.data_ptr<float>(), a.sin = sin.data_ptr<float>();
  a.cos_stride = cos.dim() == 3 ? t * cos.size(-1) : 0, a.R = cos.size(-1);
  a.H = n_heads, a.Hkv = n_kv, a.D = dh;
  a.half_cache = half;
  a.cache_k = kv_data(cache_k, half), a.cache_v = kv_data(cache_v, half);
  for (int i = 0; i < 3; ++i) a.ks[i] = cache_k.stride(i), a.vs[i] = cache_v.stride(i);
  a.L = L, a.start = ragged ? 0 : start, a.window = window;
  a.scale = static_cast<float>(scale);
  auto out = at::empty({b, t, d}, x.options());
  sw::decoder_block(a, out.data_ptr<float>(), threads_for_kernels());
  return out;
}

}  // namespace

TORCH_LIBRARY(steer_widgets, m) {
  m.def("rowwise_linear(Tensor x, Tensor packed, int n_out, Tensor? bias=None) -> Tensor", &linear);
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm);
  m.def("rotary(Tensor x, Tensor cos, Tensor sin) -> Tensor", &rotary);
  m.def("causal_attention(Tensor q, Tensor k, Tensor v, float scale, int start, int window) -> Tensor",
        &causal_attention);
  m.def("ragged_attention(Tensor q, Tensor(a!) k, Tensor(b!) v, Tensor k_new, Tensor v_new, "
        "float scale, Tensor rows, Tensor starts, int window) -> Tensor",
        &ragged_attention);
  m.def("quant_linear(Tensor x, Tensor packed, int n_out, int qtype, Tensor? bias=None) -> Tensor",
        &quant_linear);
  m.def("int8_linear(Tensor x, Tensor packed, int n_out, int qtype, Tensor? bias=None) -> Tensor",
        &int8_linear);
  m.def("quant_rows(Tensor packed, Tensor ids, int n_out, int K, int qtype) -> Tensor",
        &quant_rows);
  m.def("quant_dense(Tensor packed, int first, int stop, int n_out, int K, int qtype) -> Tensor",
        &quant_dense);
  m.def("openmp_threads(int n) -> int", &openmp_threads);
  m.def("kernel_threads() -> int", &kernel_thread_count);
  m.def("pool_workers() -> int", &pool_workers);
  m.def("exponential_of(Tensor u) -> Tensor", &exponential_of);
  m.def("exp_mismatches(int stride) -> int[]", &exp_mismatches);
  m.def("noise_start(Tensor out, Generator? gen) -> int", &noise_start);
  m.def("noise_finish(int ticket) -> ()", &noise_finish);
  m.def("noise_cancel(int ticket) -> ()", &noise_cancel);
  m.def("decoder_block(Tensor x, Tensor attn_norm, Tensor mlp_norm, Tensor[] packed, "
        "int[] kinds, int[] qtypes, int[] n_out, Tensor?[] biases, Tensor cos, Tensor sin, "
        "Tensor(a!) cache_k, Tensor(b!) cache_v, int start, int window, float eps, int n_heads, "
        "int n_kv, float scale, Tensor? rows=None, Tensor? starts=None) -> Tensor",
        &decoder_block);
  m.def("vocab_pass(Tensor logits, float[] temperature, float[] penalty, Tensor?[] counts, "
        "Tensor?[] noise, int[] follow, int k) -> (Tensor, Tensor, Tensor, Tensor)",
        &vocab_pass);
}
