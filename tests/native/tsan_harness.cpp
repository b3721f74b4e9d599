// ThreadSanitizer harness for the native kernels' pool, noise queue and kernels, without
// torch or OpenMP (neither is instrumented). Built by tests/test_kernel_threads.py with
// -fsanitize=thread together with steer_widgets/runtime/csrc's torch-free sources.
//
// For each thread count it runs calls of varying shapes (float32, quantized and int8
// products, causal attention, ragged decode steps and whole blocks) and compares each bit for
// bit with the same call at one thread, while a second caller thread makes calls of its own
// (it runs them alone: one caller uses the pool at a time; every other one is a block, whose
// workspace must be its own thread's) and noise jobs are queued for the idle workers. Noise jobs
// draw an order-dependent sequence (each element a step of one generator), so a chunk drawn out of
// order or twice shows; one a round draws as the queue's float64 draws do (mt_uniform.h), in
// chunks of its own size, and must equal one call over its whole length. Before all that, on
// the fresh pool, chunks that throw (throwing_chunk) and a noise draw that throws on a worker
// (throwing_draw); after it, attention's exp check (exp_lanes.h) with its pieces on 2 to 16
// threads.
// Prints "ok <calls>" and exits 0, or names the first mismatch and exits 1; ThreadSanitizer
// itself reports races on stderr (and exits 66 with TSAN_OPTIONS=exitcode=66).
#include <algorithm>
#include <array>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "exp_lanes.h"
#include "half.h"
#include "kernels.h"
#include "mt_uniform.h"
#include "noise_queue.h"
#include "pool.h"

namespace {

struct Case {
  std::string name;
  int64_t kind;  // 0 float, 1 quantized, 2 attention (causal or ragged), 3 dequantized
                // rows, 4 int8 products, 5 a whole block (decoder_block)
  int64_t M, K, N, qtype;
  std::vector<float> x, w, bias;
  std::vector<uint8_t> qw;
  sw::AttentionShape shape;
  std::vector<int64_t> rows, starts;  // a ragged step: each q row's cache row and position
  std::vector<uint16_t> hw;  // attention over a half cache (products="int8"): w as halves
  std::vector<float> want;
  std::shared_ptr<struct Block> block;  // kind 5
};

// A decoder_block call: a small block (d 64, 4 query heads on 2 key heads of 16, MLP 128)
// with int8 and GGUF products, continuing a cache of 3 rows; each run writes a copy of the
// cache (a second caller runs the same case at the same time)
struct Block {
  static constexpr int64_t d = 64, H = 4, Hkv = 2, D = 16, F = 128, C = 3, L = 24;
  int64_t B, T, start;
  bool ragged;
  std::vector<float> norms, cos, sin, cache;  // norms: attention's then the MLP's
  std::vector<uint8_t> packed[4];
  int64_t kinds[4], qtypes[4];
  std::vector<int64_t> rows, starts;
};

// silu(gate) * up in plain C++ (the op supplies torch's SiLU; here any fixed function will do)
void silu_gated(const float* gu, float* out, int64_t M, int64_t F, void*) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t f = 0; f < F; ++f) {
      const float g = gu[m * 2 * F + f];
      out[m * F + f] = g / (1.0f + std::exp(-g)) * gu[m * 2 * F + F + f];
    }
}

void run_block(const Block& k, const float* x, float* y, int64_t threads) {
  std::vector<float> cache = k.cache;  // keys then values, [C, Hkv, L, D] each
  sw::BlockArgs a{};
  a.x = x, a.B = k.B, a.T = k.T, a.d = Block::d;
  a.attn_norm = k.norms.data(), a.mlp_norm = k.norms.data() + Block::d, a.eps = 1e-5f;
  const int64_t outs[4] = {(Block::H + 2 * Block::Hkv) * Block::D, Block::d, 2 * Block::F,
                           Block::d};
  for (int i = 0; i < 4; ++i) a.products[i] = {k.packed[i].data(), k.kinds[i], k.qtypes[i], outs[i], nullptr};
  a.gated = silu_gated, a.gated_ctx = nullptr;
  a.cos = k.cos.data(), a.sin = k.sin.data(), a.R = Block::D;
  a.cos_stride = k.ragged ? k.T * Block::D : 0;
  a.H = Block::H, a.Hkv = Block::Hkv, a.D = Block::D;
  const int64_t half = Block::C * Block::Hkv * Block::L * Block::D;
  a.cache_k = cache.data(), a.cache_v = cache.data() + half;
  a.ks[0] = a.vs[0] = Block::Hkv * Block::L * Block::D;
  a.ks[1] = a.vs[1] = Block::L * Block::D, a.ks[2] = a.vs[2] = Block::D;
  a.L = Block::L, a.start = k.start, a.window = 0, a.scale = 0.25f;
  if (k.ragged) a.rows = k.rows.data(), a.starts = k.starts.data();
  sw::decoder_block(a, y, threads);
}

std::vector<float> randn(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (auto& f : v) f = dist(rng);
  return v;
}

// finite scales (f16: exponent below 31; the wide types' float32 ones below 2), random codes
std::vector<uint8_t> quant_blocks(std::mt19937& rng, int64_t N, int64_t K, int64_t qtype) {
  const int64_t blocks = (N + 15) / 16, groups = K / sw::kQK, G = sw::quant_group_bytes(qtype);
  std::vector<uint8_t> out(static_cast<size_t>(blocks * groups * G));
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  const bool wide = qtype != sw::kQ4_0 && qtype != sw::kQ4_1 && qtype != sw::kQ8_0;
  const int64_t scale_bytes = wide ? 128 : qtype == sw::kQ4_1 ? 64 : 32;
  const int64_t step = wide ? 4 : 2;  // the byte holding the exponent's top bits
  for (int64_t g = 0; g < blocks * groups; ++g)
    for (int64_t i = 0; i < scale_bytes; i += step) out[g * G + i + step - 1] &= wide ? 0x3f : 0x3b;
  return out;
}

void run_case(const Case& c, std::vector<float>& y, int64_t threads) {
  const float* bias = c.bias.empty() ? nullptr : c.bias.data();
  if (c.kind == 0) {
    sw::float_linear(c.x.data(), c.w.data(), bias, y.data(), c.M, c.K, c.N, threads);
  } else if (c.kind == 1) {
    sw::quant_linear(c.x.data(), c.qw.data(), bias, y.data(), c.M, c.K, c.N, c.qtype, threads);
  } else if (c.kind == 4) {  // products="int8" (random bytes are valid codes)
    sw::int8_linear(c.x.data(), c.qw.data(), bias, y.data(), c.M, c.K, c.N, c.qtype, threads);
  } else if (c.kind == 5) {
    run_block(*c.block, c.x.data(), y.data(), threads);
  } else if (c.kind == 3) {  // rows M..N-1 of the matrix (a backward's slice), [K][N - M]
    sw::quant_dense(c.qw.data(), c.M, c.N - c.M, c.K, c.qtype, y.data(), threads);
  } else {
    const float* q = c.x.data();
    const float* k = c.w.data();
    const float* v = k + c.w.size() / 2;
    sw::AttentionShape shape = c.shape;
    if (!c.rows.empty()) shape.rows = c.rows.data(), shape.starts = c.starts.data();
    if (c.hw.empty()) {
      sw::causal_attention(q, k, v, y.data(), shape, 0.125f, threads);
    } else {
      const uint16_t* hk = c.hw.data();
      sw::causal_attention(q, hk, hk + c.hw.size() / 2, y.data(), shape, 0.125f, threads);
    }
  }
}

std::vector<Case> build(std::mt19937& rng) {
  std::vector<Case> cases;
  for (int64_t K : {64, 576}) {
    for (int64_t N : {16, 40, 192, 1536}) {
      for (int64_t M : {1, 2, 5, 13}) {
        Case c{"float " + std::to_string(M) + "x" + std::to_string(K) + "->" + std::to_string(N),
               0, M, K, N, 0};
        c.x = randn(rng, M * K);
        c.w = randn(rng, (N + 15) / 16 * 16 * K);
        if (M % 2) c.bias = randn(rng, N);
        cases.push_back(std::move(c));
        for (int64_t qtype : {sw::kQ4_0, sw::kQ4_1, sw::kQ8_0, sw::kQ5_1, sw::kQ4_K,
                              sw::kQ5_K, sw::kQ6_K}) {
          Case q{"quant" + std::to_string(qtype) + " " + std::to_string(M) + "x" +
                     std::to_string(K) + "->" + std::to_string(N),
                 1, M, K, N, qtype};
          q.x = randn(rng, M * K);
          q.qw = quant_blocks(rng, N, K, qtype);
          if (M == 1) {  // the same blocks dequantized, from a row inside the first block
            Case d{"dense" + std::to_string(qtype) + " " + std::to_string(K) + "x" +
                       std::to_string(N),
                   3, 5, K, N, qtype};
            d.qw = q.qw;
            cases.push_back(std::move(d));
          }
          if (M == 1 || M == 13) {  // the int8 kernel on the same bytes: one row; tiles
            Case i8 = q;
            i8.name = "int8 " + q.name, i8.kind = 4;
            if (M % 2) i8.bias = randn(rng, N);
            cases.push_back(std::move(i8));
          }
          cases.push_back(std::move(q));
        }
      }
    }
  }
  for (int64_t B : {1, 3, 8}) {
    for (int64_t L : {1, 40, 300}) {
      for (int64_t T : {int64_t{1}, std::min<int64_t>(L, 7)}) {  // a decode step, a prefill
        Case a{"attention b" + std::to_string(B) + " L" + std::to_string(L) + " T" +
                   std::to_string(T),
               2, B, 0, 0, 0};
        const int64_t H = 9, Hkv = 3, D = 64;
        sw::AttentionShape& s = a.shape;
        s = sw::AttentionShape{};
        s.B = B, s.H = H, s.Hkv = Hkv, s.T = T, s.L = L, s.D = D;
        s.qs0 = H * T * D, s.qs1 = T * D, s.qs2 = D;
        s.ks0 = s.vs0 = Hkv * L * D, s.ks1 = s.vs1 = L * D, s.ks2 = s.vs2 = D;
        s.start = L - T, s.window = T > 1 ? 16 : 0;
        a.x = randn(rng, B * H * T * D);
        a.w = randn(rng, 2 * B * Hkv * L * D);
        a.N = H * T * D;  // output floats per row
        cases.push_back(std::move(a));
      }
    }
  }
  for (int64_t qtype : {sw::kQ4_1, sw::kQ8_0}) {  // a prefill's rows: int8 codes on the pool
    Case i8{"int8 prefill" + std::to_string(qtype) + " 150x576->40", 4, 150, 576, 40, qtype};
    i8.x = randn(rng, 150 * 576);
    i8.qw = quant_blocks(rng, 40, 576, qtype);
    cases.push_back(std::move(i8));
  }
  for (int64_t C : {3, 8, 16}) {  // ragged decode steps over a cache of C rows
    for (int64_t window : {0, 16}) {
      const int64_t H = 9, Hkv = 3, D = 64, L = 300;
      const int64_t B = 1 + static_cast<int64_t>(rng() % C);
      const bool half = C >= 8 && window == 0;  // a half cache (products="int8")
      Case a{"ragged c" + std::to_string(C) + " b" + std::to_string(B) + " w" +
                 std::to_string(window) + (half ? " half" : ""),
             2, B, 0, 0, 0};
      for (int64_t r = 0; r < C; ++r) a.rows.push_back(C - 1 - r);  // rows out of order
      a.rows.resize(B);
      for (int64_t b = 0; b < B; ++b) a.starts.push_back(static_cast<int64_t>(rng() % L));
      sw::AttentionShape& s = a.shape;
      s = sw::AttentionShape{};
      s.B = B, s.H = H, s.Hkv = Hkv, s.T = 1, s.L = L, s.D = D;
      s.qs0 = H * D, s.qs1 = D, s.qs2 = D;
      s.ks0 = s.vs0 = Hkv * L * D, s.ks1 = s.vs1 = L * D, s.ks2 = s.vs2 = D;
      s.start = 0, s.window = window;
      a.x = randn(rng, B * H * D);
      a.w = randn(rng, 2 * C * Hkv * L * D);
      if (half)
        for (const float f : a.w) a.hw.push_back(sw::float_to_half(f));
      a.N = H * D;
      cases.push_back(std::move(a));
    }
  }
  for (int ragged = 0; ragged < 2; ++ragged) {  // prefill, decode and ragged blocks
    for (int64_t T : {int64_t{1}, int64_t{5}}) {
      if (ragged && T > 1) continue;
      auto k = std::make_shared<Block>();
      k->B = ragged ? 3 : T > 1 ? 1 : 2, k->T = T, k->start = ragged ? 0 : 9, k->ragged = ragged;
      k->norms = randn(rng, 2 * Block::d);
      const int64_t positions = ragged ? k->B * T : T;
      k->cos = randn(rng, positions * Block::D);
      k->sin = randn(rng, positions * Block::D);
      k->cache = randn(rng, 2 * Block::C * Block::Hkv * Block::L * Block::D);
      const int64_t ins[4] = {Block::d, Block::H * Block::D, Block::d, Block::F};
      const int64_t outs[4] = {(Block::H + 2 * Block::Hkv) * Block::D, Block::d, 2 * Block::F,
                               Block::d};
      const int64_t types[4] = {sw::kQ4_1, sw::kQ8_0, sw::kQ4_K, sw::kQ6_K};
      for (int i = 0; i < 4; ++i) {
        k->kinds[i] = i % 2 ? 1 : 2, k->qtypes[i] = types[i];
        k->packed[i] = quant_blocks(rng, outs[i], ins[i], types[i]);
      }
      if (ragged) k->rows = {2, 0, 1}, k->starts = {4, 17, 9};
      Case c{"block b" + std::to_string(k->B) + " t" + std::to_string(T) +
                 (ragged ? " ragged" : ""),
             5, k->B * T, Block::d, Block::d, 0};
      c.x = randn(rng, k->B * T * Block::d);
      c.block = k;
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

size_t out_size(const Case& c) {
  return static_cast<size_t>(c.kind == 3 ? c.K * (c.N - c.M) : c.M * c.N);
}

// an order-dependent draw: element i is the generator's i-th step
struct Sequence {
  explicit Sequence(uint64_t seed) : state(seed) {}
  float next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(state >> 40);
  }
  uint64_t state;
};

// The queue's float64 draws (ops.cpp's uniform_draws): csrc/mt_uniform.cpp advancing one
// Twister state, chunk by chunk on whichever thread; in order, they are one call's draws.
struct Twister {
  explicit Twister(uint64_t seed) {
    Sequence words(seed);
    for (auto& w : state) w = static_cast<uint32_t>(words.next());
  }
  void draw(double* out, int64_t n) { sw::mt_uniform(state.data(), left, next, out, n); }
  std::array<uint32_t, sw::kMtWords> state{};
  int left = 1;  // a fresh state: the first draw twists
  uint32_t next = 0;
};

// A chunk that throws. On the caller's thread: the call must not return while a worker still
// runs a chunk (the chunks reference the caller's stack), then rethrows. On a worker: the
// exception must reach the caller, once every chunk under way has ended (an exception leaving
// a worker's thread ends the process). Each worker chunk waits, up to kPatience yields, for
// the call to have returned: a call that returned early finds that chunk still running. The
// caller's chunk waits, up to 50 * kPatience yields, for a worker to take the other; a try
// that no worker joined (a worker started for this call may sleep through it) proves nothing
// and is made again, up to kTries times. The first try runs on a fresh pool (threads - 1
// workers for `threads` chunks, so the caller gets one).
constexpr int kPatience = 20000;
constexpr int kTries = 100;

enum class Outcome { kRight, kWrong, kNoWorker };

Outcome throwing_chunk_once(int64_t threads, bool on_caller) {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int64_t> entered{0}, ended{0};
  std::atomic<bool> worker_in{false}, worker_threw{false}, returned{false};
  auto chunk = [&](int64_t, int64_t) {
    if (std::this_thread::get_id() == caller) {
      for (int i = 0; i < 50 * kPatience && !worker_in.load(); ++i) std::this_thread::yield();
      if (on_caller) throw std::runtime_error("caller chunk");
      return;
    }
    ++entered;
    worker_in = true;
    if (!on_caller && !worker_threw.exchange(true)) throw std::bad_alloc();
    for (int i = 0; i < kPatience && !returned.load(); ++i) std::this_thread::yield();
    ++ended;
  };
  std::string got = "nothing rethrown";
  try {
    sw::parallel_for(threads, 0, threads, 1, chunk);
  } catch (const std::runtime_error& e) {
    got = e.what();
  } catch (const std::bad_alloc&) {
    got = "bad_alloc";
  }
  const int64_t running = entered.load() - ended.load() - (on_caller ? 0 : 1);
  returned = true;
  if (!worker_in.load() && got == (on_caller ? "caller chunk" : "nothing rethrown"))
    return Outcome::kNoWorker;
  if (got == (on_caller ? "caller chunk" : "bad_alloc") && running == 0 && worker_in.load())
    return Outcome::kRight;
  std::fprintf(stderr, "wrong: a chunk throwing on the %s at %lld threads: %s, %lld running\n",
               on_caller ? "caller" : "worker", static_cast<long long>(threads), got.c_str(),
               static_cast<long long>(running));
  return Outcome::kWrong;
}

int64_t throwing_chunk(int64_t threads, bool on_caller) {
  for (int attempt = 0; attempt < kTries; ++attempt) {
    const Outcome got = throwing_chunk_once(threads, on_caller);
    if (got != Outcome::kNoWorker) return got == Outcome::kRight ? 0 : 1;
  }
  std::fprintf(stderr, "wrong: no worker took a chunk in %d calls at %lld threads\n", kTries,
               static_cast<long long>(threads));
  return 1;
}

// A noise draw that throws on a worker: the job ends, the process lives, and finish rethrows
// it on the caller's thread; the queue then draws the next job as before. The caller waits
// for a worker to take the job (however long: the test's timeout catches one that never does).
int64_t throwing_draw() {
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> thrown{false};
  const int64_t t = sw::NoiseQueue::get().submit(4 * sw::NoiseQueue::kChunk, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() == caller) return;
    thrown = true;
    throw std::runtime_error("worker draw");
  });
  sw::pool_nudge(4);
  while (sw::NoiseQueue::get().pending()) {
    sw::pool_nudge(4);
    std::this_thread::yield();
  }
  std::string got = "nothing rethrown";
  try {
    sw::NoiseQueue::get().finish(t);
  } catch (const std::runtime_error& e) {
    got = e.what();
  }
  std::vector<float> after(3000, -1.0f);  // a job after it is drawn whole
  const int64_t next = sw::NoiseQueue::get().submit(3000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) after[i] = static_cast<float>(i);
  });
  sw::pool_nudge(4);
  const bool drawn = sw::NoiseQueue::get().finish(next) &&
                     std::all_of(after.begin(), after.end(), [&](float f) { return f >= 0; });
  if (thrown.load() && got == "worker draw" && drawn) return 0;
  std::fprintf(stderr, "wrong: a noise draw throwing on a worker: thrown %d, %s, next job %s\n",
               static_cast<int>(thrown.load()), got.c_str(), drawn ? "drawn" : "not drawn");
  return 1;
}

}  // namespace

// Owned by each noise job's draw: a draw may own what only its caller's thread may free (a
// tensor whose last reference takes Python's lock), so it must be destroyed by finish or
// cancel on the caller's thread, never by a worker that happened to hold the job last.
std::thread::id caller_thread;
std::atomic<int64_t> freed_on_worker{0};
struct Witness {
  ~Witness() {
    if (std::this_thread::get_id() != caller_thread) ++freed_on_worker;
  }
};

int main(int argc, char** argv) {
  caller_thread = std::this_thread::get_id();
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  int64_t thrown = 0;  // first, on a fresh pool (then the pool must work on as before)
  for (int64_t threads : {2, 4})
    for (bool on_caller : {true, false}) thrown += throwing_chunk(threads, on_caller);
  thrown += throwing_draw();
  std::mt19937 rng(7);
  auto cases = build(rng);
  for (auto& c : cases) {
    c.want.assign(out_size(c), 0.0f);
    run_case(c, c.want, 1);
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> wrong{thrown}, calls{0};
  // a second caller: its calls run alone (or on the pool when it is free), never wrong
  std::vector<size_t> blocks;  // the second caller's every other call: a block's workspace is
  for (size_t i = 0; i < cases.size(); ++i)  // its calling thread's, never shared
    if (cases[i].kind == 5) blocks.push_back(i);
  std::thread other([&] {
    std::mt19937 r(11);
    std::vector<float> y;
    for (int64_t n = 0; !stop.load(); ++n) {
      const Case& c = cases[n % 2 ? blocks[r() % blocks.size()] : r() % cases.size()];
      y.assign(out_size(c), 0.0f);
      run_case(c, y, 4);
      if (std::memcmp(y.data(), c.want.data(), y.size() * sizeof(float))) ++wrong;
      ++calls;
    }
  });
  for (int64_t threads : {2, 3, 4, 8, 16}) {
    for (int round = 0; round < rounds; ++round) {
      // noise jobs for the idle workers, finished after this round's calls
      std::vector<std::vector<float>> outs;
      std::vector<uint64_t> seeds;
      std::vector<int64_t> tickets;
      const int jobs = static_cast<int>(rng() % 3);
      outs.resize(jobs);
      for (int j = 0; j < jobs; ++j) {
        outs[j].assign(1 + rng() % 3000, -1.0f);
        seeds.push_back(rng());
      }
      std::vector<Sequence> gens;
      for (int j = 0; j < jobs; ++j) gens.emplace_back(seeds[j]);
      for (int j = 0; j < jobs; ++j) {
        float* out = outs[j].data();
        Sequence* gen = &gens[j];
        auto witness = std::make_shared<Witness>();
        tickets.push_back(sw::NoiseQueue::get().submit(
            static_cast<int64_t>(outs[j].size()), [out, gen, witness](int64_t b, int64_t e) {
              for (int64_t i = b; i < e; ++i) out[i] = gen->next();
            }));
      }
      const uint64_t twister_seed = rng();
      Twister twister(twister_seed);
      std::vector<double> uniforms(1 + rng() % 3000);
      const int64_t twister_ticket = sw::NoiseQueue::get().submit(
          static_cast<int64_t>(uniforms.size()),
          [&](int64_t b, int64_t e) { twister.draw(uniforms.data() + b, e - b); },
          1 + static_cast<int64_t>(rng() % 700));  // chunks of their own size, twists inside
      sw::pool_nudge(threads);
      std::vector<float> y;
      for (size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[(i * 7 + round) % cases.size()];
        y.assign(out_size(c), 0.0f);
        run_case(c, y, threads);
        ++calls;
        if (std::memcmp(y.data(), c.want.data(), y.size() * sizeof(float))) {
          std::fprintf(stderr, "wrong: %s at %lld threads\n", c.name.c_str(),
                       static_cast<long long>(threads));
          ++wrong;
        }
      }
      if (!sw::NoiseQueue::get().finish(twister_ticket)) ++wrong;
      std::vector<double> whole(uniforms.size());
      Twister(twister_seed).draw(whole.data(), static_cast<int64_t>(whole.size()));
      if (std::memcmp(whole.data(), uniforms.data(), whole.size() * sizeof(double))) {
        std::fprintf(stderr, "wrong: queued uniform draws at %lld threads\n",
                     static_cast<long long>(threads));
        ++wrong;
      }
      for (int j = jobs - 1; j >= 0; --j) {  // finished in another order than queued
        if (!sw::NoiseQueue::get().finish(tickets[j])) ++wrong;
        Sequence ref(seeds[j]);
        for (float f : outs[j])
          if (f != ref.next()) {
            std::fprintf(stderr, "wrong: noise job %d at %lld threads\n", j,
                         static_cast<long long>(threads));
            ++wrong;
            break;
          }
      }
      ++calls;
    }
  }
  // attention's exp check, its pieces on the pool: the same counts at every thread count
  for (int64_t threads : {2, 4, 8, 16}) {
    const sw::ExpMismatches bad = sw::exp_mismatches(int64_t{1} << 15, threads);
    ++calls;
    if (bad.algorithm) {
      std::fprintf(stderr, "wrong: %lld exps at %lld threads\n",
                   static_cast<long long>(bad.algorithm), static_cast<long long>(threads));
      ++wrong;
    }
  }
  // jobs finished (or cancelled) while the workers draw them: a worker may still hold a job
  // when its caller takes it back, and must not be the one that frees its draw
  for (int i = 0; i < 300; ++i) {
    std::vector<float> out(20000);
    Sequence gen(i);
    auto witness = std::make_shared<Witness>();
    const int64_t t = sw::NoiseQueue::get().submit(
        static_cast<int64_t>(out.size()), [&out, &gen, witness](int64_t b, int64_t e) {
          for (int64_t k = b; k < e; ++k) out[k] = gen.next();
        });
    witness.reset();
    sw::pool_nudge(4);
    std::this_thread::yield();
    if (i % 3 == 2) {
      sw::NoiseQueue::get().cancel(t);
      continue;
    }
    if (!sw::NoiseQueue::get().finish(t)) ++wrong;
    Sequence ref(i);
    for (float f : out)
      if (f != ref.next()) {
        ++wrong;
        break;
      }
    ++calls;
  }
  // a cancelled job is dropped; an unknown ticket is refused
  std::vector<float> big(100000);
  Sequence seq(3);
  auto witness = std::make_shared<Witness>();
  const int64_t t = sw::NoiseQueue::get().submit(100000, [&, witness](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) big[i] = seq.next();
  });
  witness.reset();
  sw::pool_nudge(4);
  sw::NoiseQueue::get().cancel(t);
  if (sw::NoiseQueue::get().finish(t)) ++wrong;
  stop = true;
  other.join();
  if (freed_on_worker.load()) {
    std::fprintf(stderr, "wrong: %lld noise draws destroyed on a worker thread\n",
                 static_cast<long long>(freed_on_worker.load()));
    wrong += freed_on_worker.load();
  }
  if (wrong.load()) {
    std::printf("wrong %lld of %lld\n", static_cast<long long>(wrong.load()),
                static_cast<long long>(calls.load()));
    return 1;
  }
  std::printf("ok %lld\n", static_cast<long long>(calls.load()));
  return 0;
}
