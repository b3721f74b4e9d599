// y = x @ W.T for fp32 on a CPU, with every row of y computed exactly as it is alone.
//
// W is packed once as [N/16][K][16]: block b holds output columns 16b..16b+15, one 16-float
// line per k, so a block streams from memory in order. Each output element y[r, n] is one
// chain of fused multiply-adds over k = 0..K-1, in order, from zero: the same instructions
// whatever the number of rows, the rows it is grouped with, or the thread it runs on. Rows
// are grouped (up to kRows) only so that they share each weight load: one pass over the
// weights serves every decode row. Threads split the output columns (the pool below, sized
// by torch.set_num_threads), and one thread computes each output element whole.
#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

// ---------------------------------------------------------------- idle work: sampling noise
//
// A sampled decode step draws Exp(1) noise over the vocabulary for every sampling row (the
// draw torch.multinomial makes), serially from that row's generator: 1.8 ms a row on one
// core, about an eighth of a decode step of the default model (2026-12-02). The draw depends
// on nothing the step computes, so the next step's draws are queued before the model runs,
// and the pool's workers draw them in chunks between the kernel calls they would otherwise
// spin through; whoever needs a draw finishes it. Each chunk is torch's own exponential_ on a
// slice, drawn in order by one thread at a time: exponential_ draws the generator's values
// element by element, so the result is the bits of one exponential_ over the whole tensor,
// whoever drew which chunk.
class Idle {
 public:
  static Idle& get() {  // never destroyed; a forked child starts with no jobs
    static const bool once = [] {
      pthread_atfork(nullptr, nullptr, [] { instance() = new Idle(); });
      return true;
    }();
    (void)once;
    return *instance();
  }

  int64_t submit(const at::Tensor& out, const at::Generator& gen) {
    auto job = std::make_shared<Job>(out, gen);
    std::lock_guard<std::mutex> lock(m_);
    const int64_t ticket = next_ticket_++;
    jobs_.emplace(ticket, job);
    open_.fetch_add(1, std::memory_order_release);
    return ticket;
  }

  // the job's remaining chunks drawn here, then it is forgotten
  void finish(int64_t ticket) {
    auto job = take(ticket);
    TORCH_CHECK(job, "no noise job ", ticket, " (finished already, or begun in a parent process)");
    while (job->step(true, open_)) {
    }
  }

  // the job is dropped, drawn or not (its generator then stands wherever the draw stopped)
  void cancel(int64_t ticket) {
    auto job = take(ticket);
    if (job) job->cancel(open_);
  }

  // a worker's turn: one chunk of the oldest job nobody is drawing; false if there was none
  bool step() {
    if (open_.load(std::memory_order_acquire) == 0) return false;
    std::vector<std::shared_ptr<Job>> jobs;
    {
      std::lock_guard<std::mutex> lock(m_);
      for (auto& entry : jobs_) jobs.push_back(entry.second);
    }
    for (auto& job : jobs)
      if (job->step(false, open_)) return true;
    return false;
  }

  bool pending() const { return open_.load(std::memory_order_acquire) > 0; }

 private:
  static constexpr int64_t kChunk = 512;  // draws per chunk: ~20 us, the most a kernel call waits

  struct Job {
    Job(at::Tensor o, at::Generator g) : out(std::move(o)), gen(std::move(g)) {}
    // one more chunk (block: after the one another thread is drawing); false once none is left
    bool step(bool block, std::atomic<int64_t>& open) {
      std::unique_lock<std::mutex> lock(m, std::defer_lock);
      if (block) {
        lock.lock();
      } else if (!lock.try_lock()) {
        return false;
      }
      const int64_t n = out.numel();
      if (next >= n) return false;
      const int64_t end = std::min(n, next + kChunk);
      c10::InferenceMode guard;  // the tensor may have been made in inference mode
      out.slice(0, next, end).exponential_(1.0, gen);
      next = end;
      if (next == n) open.fetch_sub(1, std::memory_order_acq_rel);
      return true;
    }
    void cancel(std::atomic<int64_t>& open) {
      std::lock_guard<std::mutex> lock(m);
      if (next < out.numel()) open.fetch_sub(1, std::memory_order_acq_rel);
      next = out.numel();
    }
    at::Tensor out;
    at::Generator gen;
    int64_t next = 0;  // draws made, under m
    std::mutex m;
  };

  static Idle*& instance() {
    static Idle* idle = new Idle();
    return idle;
  }

  std::shared_ptr<Job> take(int64_t ticket) {
    std::lock_guard<std::mutex> lock(m_);
    auto it = jobs_.find(ticket);
    if (it == jobs_.end()) return nullptr;
    auto job = it->second;
    jobs_.erase(it);
    return job;
  }

  std::mutex m_;
  std::map<int64_t, std::shared_ptr<Job>> jobs_;  // by ticket: the oldest first
  int64_t next_ticket_ = 1;
  std::atomic<int64_t> open_{0};  // jobs with draws left
};

// ---------------------------------------------------------------- one thread pool for all callers
//
// The kernels split their work over this pool rather than at::parallel_for. OpenMP gives each
// calling thread its own team: the explorer decodes on worker threads while the kernel's main
// thread has a team too, and once a process holds more OpenMP threads than cores libgomp
// stops spinning and every parallel region pays a futex wake-up. A decode step makes ~120
// kernel calls, so decoding on a worker thread ran at 47 tokens/s against 111 on the main
// thread (the default model, 2 threads, 2026-12-01). This pool has at::get_num_threads() - 1
// threads whoever calls; they spin a little between calls (a step's calls come tens of us
// apart), then sleep. One caller uses it at a time; a second one meanwhile runs its work
// alone on its own thread, so results never depend on it (each output is computed whole by
// one thread in a fixed order, whatever the split).
// Threads the kernels use for a call from this thread: torch's count (at::get_num_threads(),
// which reads the calling thread's OpenMP count), or the count it had before openmp_threads
// lowered that for torch's own ops.
thread_local int64_t kernel_threads = 0;
inline int64_t threads_for_kernels() {
  return kernel_threads > 0 ? kernel_threads : at::get_num_threads();
}

class Pool {
 public:
  using Fn = std::function<void(int64_t, int64_t)>;

  // never destroyed (its threads live as long as the process); a forked child, which has
  // none of its parent's threads, starts a fresh one
  static Pool& get() {
    static const bool once = [] {
      pthread_atfork(nullptr, nullptr, [] { instance() = new Pool(); });
      return true;
    }();
    (void)once;
    return *instance();
  }

  // fn over [0, n) in chunks of at least grain, on up to threads_for_kernels() threads
  void run(int64_t n, int64_t grain, const Fn& fn) {
    const int64_t want = std::min<int64_t>(threads_for_kernels(), (n + grain - 1) / grain);
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (want <= 1 || !busy.owns_lock()) {
      if (n > 0) fn(0, n);
      return;
    }
    grow(want - 1);
    const int64_t chunk = (n + want - 1) / want;
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    tasks_ = (n + chunk - 1) / chunk;
    pending_.store(tasks_ - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(wake_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    fn(0, std::min(chunk, n));
    while (pending_.load(std::memory_order_acquire) > 0) _mm_pause_or_yield();
  }

 private:
  static Pool*& instance() {
    static Pool* pool = new Pool();
    return pool;
  }

  static void _mm_pause_or_yield() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }

  void grow(int64_t workers) {
    while (static_cast<int64_t>(threads_.size()) < workers) {
      const int64_t id = static_cast<int64_t>(threads_.size()) + 1;  // task index it takes
      const uint64_t seen = generation_.load(std::memory_order_acquire);  // before the bump
      threads_.emplace_back([this, id, seen] { work(id, seen); });
      threads_.back().detach();
    }
  }

  void work(int64_t id, uint64_t seen) {
    for (;;) {
      uint64_t now = seen;
      auto until = std::chrono::steady_clock::now() + kSpin;
      for (int spin = 1; now == seen; ++spin) {
        if (Idle::get().step()) {  // one chunk of idle work, then look again
          until = std::chrono::steady_clock::now() + kSpin;
        } else {
          _mm_pause_or_yield();
        }
        now = generation_.load(std::memory_order_acquire);
        if (spin % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      }
      if (now == seen) {
        std::unique_lock<std::mutex> lock(wake_);
        cv_.wait(lock, [&] {
          return generation_.load(std::memory_order_acquire) != seen || Idle::get().pending();
        });
        now = generation_.load(std::memory_order_acquire);
        if (now == seen) continue;  // woken for idle work only
      }
      seen = now;
      if (id < tasks_) {
        const int64_t b0 = id * chunk_;
        (*fn_)(b0, std::min(n_, b0 + chunk_));
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

 public:
  // idle work was queued (Idle::submit): the workers wake, started first where none are
  void nudge() {
    {
      std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
      if (busy.owns_lock()) grow(threads_for_kernels() - 1);
    }
    { std::lock_guard<std::mutex> lock(wake_); }
    cv_.notify_all();
  }

 private:
  static constexpr auto kSpin = std::chrono::microseconds(200);  // then sleep
  std::mutex busy_, wake_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> pending_{0};
  const Fn* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1, tasks_ = 0;
};

// at::parallel_for's contract, on the pool
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  Pool::get().run(end - begin, std::max<int64_t>(grain, 1),
                  [&](int64_t b0, int64_t b1) { f(begin + b0, begin + b1); });
}

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
inline Vec fmav(const Vec& a, const Vec& b, const Vec& acc) {
  return {_mm512_fmadd_ps(a.v, b.v, acc.v)};
}
inline float hsum(const Vec& v) { return _mm512_reduce_add_ps(v.v); }  // a fixed tree
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
inline Vec fmav(const Vec& a, const Vec& b, const Vec& acc) {
  return {_mm256_fmadd_ps(a.lo, b.lo, acc.lo), _mm256_fmadd_ps(a.hi, b.hi, acc.hi)};
}
inline float hsum(const Vec& v) {  // a fixed tree
  const __m256 s8 = _mm256_add_ps(v.lo, v.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
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
inline Vec fmav(const Vec& a, const Vec& b, const Vec& acc) {
  Vec out;
  for (int64_t i = 0; i < kBlock; ++i) out.f[i] = std::fma(a.f[i], b.f[i], acc.f[i]);
  return out;
}
inline float hsum(Vec v) {  // a fixed tree
  for (int64_t half = kBlock / 2; half > 0; half /= 2)
    for (int64_t i = 0; i < half; ++i) v.f[i] += v.f[i + half];
  return v.f[0];
}
inline void store(float* p, const Vec& v, int64_t n, const float* bias) {
  for (int64_t i = 0; i < n; ++i) p[i] = bias ? v.f[i] + bias[i] : v.f[i];
}
#endif

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
constexpr auto kTiles = tiles<kTile>(std::make_integer_sequence<int, kRows>{});
constexpr auto kWideTiles = tiles<kWide>(std::make_integer_sequence<int, kWideRows>{});

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
  const float* bp = bias_of(bias, n_out);
  auto y = output_of(x_in, n_out);
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // below ~64k multiply-adds per thread, starting threads costs more than it saves
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, M * K * kBlock));
  const bool wide = M >= 1 && M <= kWideRows;
  const int64_t width = wide ? kWide : kTile;
  parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
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

// ---------------------------------------------------------------- quantized weights (GGUF)
//
// The same products with the weight read as GGUF quantized blocks (Q4_0, Q4_1, Q8_0: 32
// weights along k share an f16 scale d, and for Q4_1 an f16 min m). Packed once at load
// (quant.py) as [N/16][K/32][bytes]: per 16 output columns and 32 k, the 16 scales (f16), the
// 16 mins (Q4_1), then the 16 columns' codes, 16 bytes per load: 8-bit, one k (signed bytes,
// column i in byte i); 4-bit, two k (column i of k in the low nibble of byte i, of k + 1 in
// its high one), so one zero-extending load and a mask or a shift give each line.
// Each weight is dequantized in registers to the float32 value gguf.quants computes in numpy
// (Q4_0: d * (q - 8); Q4_1: (d * q) + m; Q8_0: q * d), and then enters the same in-order
// fused multiply-add chain as the float32 kernel above: the bits of that kernel on the
// dequantized matrix. The product d * q is always exact in float32 (an 11-bit half
// significand times an integer of at most 8 bits, far from overflow and underflow), so
// Q4_1's (d * q) + m rounds once whether the add is separate or fused: the vector paths
// fuse it (one instruction less per weight line), the scalar one keeps numpy's two steps.
namespace {

constexpr int64_t kQK = 32;  // weights per GGUF block along k
// Groups ahead to prefetch, every cache line of each (a Q4_1 group is five lines, a Q8_0
// one eight and a half): with one line per group, as the float32 kernel's one line per k,
// a decode step read the blocks at half the rate (16.3 against 10.5 ms per step for the
// default model, one thread, 2026-12-01); farther ahead measured no better.
constexpr int64_t kQPrefetch = 1;
enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8 };  // ggml's type ids

constexpr int64_t scale_bytes(int64_t t) { return t == kQ4_1 ? 64 : 32; }
constexpr int64_t lines_per_load(int64_t t) { return t == kQ8_0 ? 1 : 2; }  // 16 bytes each
constexpr int64_t group_bytes(int64_t t) { return scale_bytes(t) + kQK / lines_per_load(t) * 16; }

// f16 -> f32, exact (subnormal halves are normal floats; inf and NaN are refused at load)
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  const uint32_t bits = sign | ((exp == 31 ? 255u : exp + 112u) << 23) | (mant << 13);
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// the code of column i at k = kk (0..31) of a group, from the group's codes
inline float code(int64_t t, const uint8_t* codes, int64_t kk, int64_t i) {
  if (t == kQ8_0) return static_cast<float>(static_cast<int8_t>(codes[kk * 16 + i]));
  const uint8_t byte = codes[kk / 2 * 16 + i];
  const int q = kk % 2 ? (byte >> 4) : (byte & 0x0f);
  return static_cast<float>(t == kQ4_0 ? q - 8 : q);
}

inline float dequant_one(int64_t t, const uint8_t* group, int64_t kk, int64_t i) {
  uint16_t h[2];
  std::memcpy(&h[0], group + 2 * i, 2);
  const float d = half_to_float(h[0]);
  const float q = code(t, group + scale_bytes(t), kk, i);
  if (t != kQ4_1) return d * q;
  std::memcpy(&h[1], group + 32 + 2 * i, 2);
  return d * q + half_to_float(h[1]);  // no contraction: -ffp-contract=off
}

struct Scales {
  Vec d, m;
};

#if defined(__AVX512F__)
inline Vec halves(const uint8_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
template <int64_t T>
inline Vec scaled(__m512i qi, const Scales& s) {
  if constexpr (T == kQ4_0) qi = _mm512_sub_epi32(qi, _mm512_set1_epi32(8));
  const __m512 q = _mm512_cvtepi32_ps(qi);
  // one rounding either way: d * q is exact (see above), so the fused form has the bits
  // of gguf's separate multiply and add
  return {T == kQ4_1 ? _mm512_fmadd_ps(s.d.v, q, s.m.v) : _mm512_mul_ps(q, s.d.v)};
}
// the lines_per_load(T) weight lines of one 16-byte load
template <int64_t T>
inline void dequant(const uint8_t* p, const Scales& s, Vec* out) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (T == kQ8_0) {
    out[0] = scaled<T>(_mm512_cvtepi8_epi32(v), s);
  } else {
    const __m512i b = _mm512_cvtepu8_epi32(v);
    out[0] = scaled<T>(_mm512_and_si512(b, _mm512_set1_epi32(0x0f)), s);
    out[1] = scaled<T>(_mm512_srli_epi32(b, 4), s);
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
inline Vec halves(const uint8_t* p) {
#if defined(__F16C__)
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  return {_mm256_cvtph_ps(lo), _mm256_cvtph_ps(hi)};
#else
  alignas(32) float f[kBlock];
  for (int64_t i = 0; i < kBlock; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    f[i] = half_to_float(h);
  }
  return load(f);
#endif
}
template <int64_t T>
inline Vec scaled(__m256i a, __m256i b, const Scales& s) {
  if constexpr (T == kQ4_0) {
    a = _mm256_sub_epi32(a, _mm256_set1_epi32(8));
    b = _mm256_sub_epi32(b, _mm256_set1_epi32(8));
  }
  const __m256 qa = _mm256_cvtepi32_ps(a), qb = _mm256_cvtepi32_ps(b);
  if constexpr (T == kQ4_1)  // d * q is exact: the fused form has gguf's bits (see above)
    return {_mm256_fmadd_ps(s.d.lo, qa, s.m.lo), _mm256_fmadd_ps(s.d.hi, qb, s.m.hi)};
  return {_mm256_mul_ps(qa, s.d.lo), _mm256_mul_ps(qb, s.d.hi)};
}
// the lines_per_load(T) weight lines of one 16-byte load
template <int64_t T>
inline void dequant(const uint8_t* p, const Scales& s, Vec* out) {
  const __m128i lo8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i hi8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8));
  if constexpr (T == kQ8_0) {
    out[0] = scaled<T>(_mm256_cvtepi8_epi32(lo8), _mm256_cvtepi8_epi32(hi8), s);
  } else {
    const __m256i a = _mm256_cvtepu8_epi32(lo8), b = _mm256_cvtepu8_epi32(hi8);
    const __m256i nib = _mm256_set1_epi32(0x0f);
    out[0] = scaled<T>(_mm256_and_si256(a, nib), _mm256_and_si256(b, nib), s);
    out[1] = scaled<T>(_mm256_srli_epi32(a, 4), _mm256_srli_epi32(b, 4), s);
  }
}
#else
inline Vec halves(const uint8_t* p) {
  Vec v;
  for (int64_t i = 0; i < kBlock; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    v.f[i] = half_to_float(h);
  }
  return v;
}
template <int64_t T>
inline void dequant(const uint8_t* p, const Scales& s, Vec* out) {
  for (int64_t j = 0; j < lines_per_load(T); ++j)
    for (int64_t i = 0; i < kBlock; ++i) {
      const float dq = s.d.f[i] * code(T, p, j, i);
      out[j].f[i] = T == kQ4_1 ? dq + s.m.f[i] : dq;
    }
}
#endif

inline Scales scales_of(int64_t t, const uint8_t* group) {
  return {halves(group), t == kQ4_1 ? halves(group + 32) : zero()};
}

// R rows times C column blocks from block b, dequantizing each weight line once for all rows
// (decode: the weights stream from memory once, in their quantized size).
template <int64_t T, int R, int C>
void qtile(const float* x, const uint8_t* w, const float* bias, float* y, int64_t K, int64_t N,
           int64_t b) {
  constexpr int64_t G = group_bytes(T), P = lines_per_load(T), S = scale_bytes(T);
  const int64_t groups = K / kQK;
  Vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = zero();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* grp[C];
    Scales s[C];
    for (int c = 0; c < C; ++c) {
      grp[c] = w + ((b + c) * groups + g) * G;
      for (int64_t o = 0; o < G; o += 64) __builtin_prefetch(grp[c] + kQPrefetch * G + o);
      s[c] = scales_of(T, grp[c]);
    }
    for (int64_t kk = 0; kk < kQK; kk += P) {
      Vec lines[C][P];
      for (int c = 0; c < C; ++c) dequant<T>(grp[c] + S + kk / P * 16, s[c], lines[c]);
      for (int64_t j = 0; j < P; ++j) {  // k ascending, as the float32 kernel
        Vec wk[C];
        for (int c = 0; c < C; ++c) wk[c] = lines[c][j];
        step<R, C>(x, K, g * kQK + kk + j, wk, acc);
      }
    }
  }
  finish<R, C>(acc, bias, y, N, b);
}

// Column block b dequantized whole into `panel` ([K][16] floats, the float32 packing), for
// many rows (prefill): the float32 tiles then run on it unchanged.
template <int64_t T>
void dequant_panel(const uint8_t* w, int64_t K, int64_t b, float* panel) {
  constexpr int64_t G = group_bytes(T), P = lines_per_load(T), S = scale_bytes(T);
  const int64_t groups = K / kQK;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* grp = w + (b * groups + g) * G;
    const Scales s = scales_of(T, grp);
    for (int64_t kk = 0; kk < kQK; kk += P) {
      Vec v[P];
      dequant<T>(grp + S + kk / P * 16, s, v);
      std::memcpy(panel + (g * kQK + kk) * kBlock, v, sizeof v);
    }
  }
}

using QTileFn = void (*)(const float*, const uint8_t*, const float*, float*, int64_t, int64_t,
                        int64_t);
template <int64_t T, int R, int... Cs>
constexpr std::array<QTileFn, sizeof...(Cs)> qtiles_of(std::integer_sequence<int, Cs...>) {
  return {qtile<T, R, Cs + 1>...};
}
template <int64_t T, int W, int... Rs>
constexpr auto qtiles(std::integer_sequence<int, Rs...>) {
  return std::array{qtiles_of<T, Rs + 1>(std::make_integer_sequence<int, W>{})...};
}
template <int64_t T>
constexpr auto kQWideTiles = qtiles<T, kWide>(std::make_integer_sequence<int, kWideRows>{});
template <int64_t T>
constexpr auto kQTiles = qtiles<T, kTile>(std::make_integer_sequence<int, kRows>{});

// Up to this many rows (decode rows), each group of kRows dequantizes the weights again in
// registers; more (a prefill), each column block is dequantized once into a panel.
constexpr int64_t kPanelRows = 2 * kRows;

template <int64_t T>
void qlinear(const float* xp, const uint8_t* wp, const float* bp, float* yp, int64_t M, int64_t K,
             int64_t n_out, int64_t blocks) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, M * K * kBlock));
  if (M <= kWideRows) {
    parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; b += kWide) {
        const int cols = static_cast<int>(std::min<int64_t>(kWide, b1 - b));
        kQWideTiles<T>[M - 1][cols - 1](xp, wp, bp, yp, K, n_out, b);
      }
    });
    return;
  }
  if (M <= kPanelRows) {
    parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; b += kTile) {
        const int cols = static_cast<int>(std::min<int64_t>(kTile, b1 - b));
        for (int64_t m = 0; m < M; m += kRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kRows, M - m));
          kQTiles<T>[rows - 1][cols - 1](xp + m * K, wp, bp, yp + m * n_out, K, n_out, b);
        }
      }
    });
    return;
  }
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> panel(static_cast<size_t>(kTile * K * kBlock));
    for (int64_t b = b0; b < b1; b += kTile) {
      const int cols = static_cast<int>(std::min<int64_t>(kTile, b1 - b));
      for (int c = 0; c < cols; ++c) dequant_panel<T>(wp, K, b + c, panel.data() + c * K * kBlock);
      // the float32 tile reads block b at w + b * K * 16: point w there at the panel
      const float* w = panel.data() - b * K * kBlock;
      for (int64_t m = 0; m < M; m += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, M - m));
        kTiles[rows - 1][cols - 1](xp + m * K, w, bp, yp + m * n_out, K, n_out, b);
      }
    }
  });
}

void check_quant(const at::Tensor& packed, int64_t qtype, int64_t K) {
  TORCH_CHECK(qtype == kQ4_0 || qtype == kQ4_1 || qtype == kQ8_0, "qtype must be 2, 3 or 8");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 3,
              "packed must be contiguous uint8 [N/16, K/32, bytes]");
  TORCH_CHECK(K % kQK == 0 && packed.size(1) == K / kQK && packed.size(2) == group_bytes(qtype),
              "packed weight does not fit K and qtype");
}

}  // namespace

// x [..., K] (fp32) times a quantized weight packed as [ceil(N/16), K/32, bytes] (uint8):
// x @ W.T (+ bias), [..., N], W dequantized as gguf does it.
at::Tensor quant_linear(const at::Tensor& x_in, const at::Tensor& packed, int64_t n_out,
                        int64_t qtype, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() >= 1 && x_in.scalar_type() == at::kFloat, "x must be float32 [..., K]");
  const int64_t K = x_in.size(-1), blocks = packed.size(0);
  check_quant(packed, qtype, K);
  TORCH_CHECK(blocks == (n_out + kBlock - 1) / kBlock, "packed weight does not match n_out");
  const at::Tensor x = x_in.reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  const float* bp = bias_of(bias, n_out);
  auto y = output_of(x_in, n_out);
  if (M == 0) return y;
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  if (qtype == kQ4_1) qlinear<kQ4_1>(xp, wp, bp, yp, M, K, n_out, blocks);
  else if (qtype == kQ8_0) qlinear<kQ8_0>(xp, wp, bp, yp, M, K, n_out, blocks);
  else qlinear<kQ4_0>(xp, wp, bp, yp, M, K, n_out, blocks);
  return y;
}

// Rows `ids` (int64 [...]) of the quantized matrix, dequantized: [..., K] float32 (the
// embedding lookup of a tied Q8_0 embedding, and the dense copy when one is wanted).
at::Tensor quant_rows(const at::Tensor& packed, const at::Tensor& ids_in, int64_t K,
                      int64_t qtype) {
  check_quant(packed, qtype, K);
  TORCH_CHECK(ids_in.scalar_type() == at::kLong, "ids must be int64");
  const at::Tensor ids = ids_in.contiguous();
  auto sizes = ids.sizes().vec();
  sizes.push_back(K);
  auto y = at::empty(sizes, packed.options().dtype(at::kFloat));
  const int64_t n = ids.numel(), groups = K / kQK, G = group_bytes(qtype);
  const int64_t rows = packed.size(0) * kBlock;
  const int64_t* ip = ids.data_ptr<int64_t>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t id = ip[j];
    TORCH_CHECK(id >= 0 && id < rows, "row id out of range");
    const int64_t b = id / kBlock, i = id % kBlock;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* grp = wp + (b * groups + g) * G;
      for (int64_t kk = 0; kk < kQK; ++kk) yp[j * K + g * kQK + kk] = dequant_one(qtype, grp, kk, i);
    }
  }
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

// Attention of one decode position: q [B, H, 1, D] over keys and values [B, Hkv, L, D] (each
// position's D contiguous, any other strides: a slice of the KV cache is read in place), H a
// multiple of Hkv (grouped-query heads share their group's keys), scale applied to q.k.
// Returns [B, H, 1, D]. One (row, head) is computed whole by one thread in a fixed order:
// 16-lane fused dot products summed as a fixed tree, a max-subtracted exp, the weights
// summed in key order and the values accumulated in key order, then one scaling. SDPA's
// flash kernel pays tiles, buffers and a thread team for a 1 x L product: in a decode step
// of the default model it took 43 us a layer against 15 us here (2026-12-01, profiled).
// One (row, head): C lines of 16 per head, held in registers; w holds the L weights.
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
constexpr int kMaxLines = 16;  // head sizes up to 256
constexpr auto kAttends = attends(std::make_integer_sequence<int, kMaxLines>{});

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(2) == 1,
              "q must be [B, H, 1, D], k and v [B, Hkv, L, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  v.scalar_type() == at::kFloat,
              "float32 only");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), Hkv = k.size(1), L = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(3) == D && Hkv > 0 && H % Hkv == 0 && L > 0,
              "k and v do not fit q");
  TORCH_CHECK(D % kBlock == 0 && D <= kMaxLines * kBlock,
              "head size must be a multiple of 16, at most 256");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "the last dim of q, k and v must be contiguous");
  auto y = at::empty({B, H, 1, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), ks0 = k.stride(0), ks1 = k.stride(1);
  const int64_t ks2 = k.stride(2), vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  const float sc = static_cast<float>(scale);
  const int64_t group = H / Hkv;
  const AttendFn attend = kAttends[D / kBlock - 1];
  // below ~64k multiply-adds per thread, starting threads costs more than it saves
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, 2 * L * D));
  parallel_for(0, B * H, grain, [&](int64_t i0, int64_t i1) {
    std::vector<float> w(static_cast<size_t>(L));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / H, h = i % H, g = h / group;
      attend(qp + b * qs0 + h * qs1, kp + b * ks0 + g * ks1, ks2, vp + b * vs0 + g * vs1, vs2, L,
             sc, w.data(), yp + i * D);
    }
  });
  return y;
}

// Fills out (float32, 1-D, contiguous) with gen's next Exp(1) draws, as out.exponential_(1,
// gen) would, on the pool's workers while they are idle; returns a ticket for noise_finish
// (which completes the draw on the calling thread) or noise_cancel. Until then nothing else
// may draw from gen.
int64_t noise_start(const at::Tensor& out, const std::optional<at::Generator>& gen) {
  TORCH_CHECK(out.dim() == 1 && out.is_contiguous() && out.scalar_type() == at::kFloat &&
                  out.device().is_cpu(),
              "out must be a contiguous 1-D float32 CPU tensor");
  TORCH_CHECK(gen.has_value() && gen->device().is_cpu(), "a CPU generator is needed");
  const int64_t ticket = Idle::get().submit(out, *gen);
  Pool::get().nudge();
  return ticket;
}

void noise_finish(int64_t ticket) { Idle::get().finish(ticket); }

void noise_cancel(int64_t ticket) { Idle::get().cancel(ticket); }

// Sets the calling thread's OpenMP thread count (torch's own ops read it) and returns the
// previous one. Unlike torch.set_num_threads it touches nothing else: not the default of
// threads started later, not MKL's or the pthreadpool's sizes. This file's kernels keep the
// count the thread had before it was first lowered (at::get_num_threads() would read the
// lowered one) until it is set back to that count.
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

// The threads this file's kernels use for a call from the calling thread.
int64_t kernel_thread_count() { return threads_for_kernels(); }

// torch.ops.steer_widgets.* (plain ATen and the op registry: no Python headers, which keeps
// the one-time build short)
TORCH_LIBRARY(steer_widgets, m) {
  m.def("rowwise_linear(Tensor x, Tensor packed, int n_out, Tensor? bias=None) -> Tensor", &linear);
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm);
  m.def("rotary(Tensor x, Tensor cos, Tensor sin) -> Tensor", &rotary);
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor",
        &decode_attention);
  m.def("quant_linear(Tensor x, Tensor packed, int n_out, int qtype, Tensor? bias=None) -> Tensor",
        &quant_linear);
  m.def("quant_rows(Tensor packed, Tensor ids, int K, int qtype) -> Tensor", &quant_rows);
  m.def("openmp_threads(int n) -> int", &openmp_threads);
  m.def("kernel_threads() -> int", &kernel_thread_count);
  m.def("noise_start(Tensor out, Generator? gen) -> int", &noise_start);
  m.def("noise_finish(int ticket) -> ()", &noise_finish);
  m.def("noise_cancel(int ticket) -> ()", &noise_cancel);
}
