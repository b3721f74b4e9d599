// The end of a decode step, every row at once: the next token and the row's log-probabilities.
//
// Per row the decoder needs the next token (the first argmax of the logits, or the draw
// torch.multinomial makes: the first argmax of softmax(logits / T - penalty * counts) / noise,
// noise one Exp(1) draw over the vocabulary, given as its values or as the uniform draws they
// are made of: draw_uniform) and its TokenProb (log_softmax of the logits: the
// chosen token's value and the k most likely tokens). In Python that is a dozen torch calls a
// row, one row after another. Here each row is one task on the pool, so the rows of a step run
// side by side. The softmax and log_softmax are ATen's own, called on the row alone, as the
// Python path calls them: the probabilities are torch's bits on every CPU torch dispatches
// for, so a seed's tokens stay torch.multinomial's. The scaling is the same float32 division,
// product and difference torch computes element by element (correctly rounded, no fused
// multiply-add: the build's -ffp-contract=off), and the argmax, the checks and the top k are
// scans on four floats at a time. A row's results depend on its own inputs alone, whichever thread ran it.
#include <ATen/core/Tensor.h>
#include <ATen/core/TransformationHelper.h>
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/empty.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "pool.h"
#include "vocab_pass.h"

namespace sw {
namespace {

// a before b in a descending order: NaN first (torch and numpy rank it as the largest),
// equal values by the lower index
bool before(float a, int64_t ia, float b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na && (!nb || ia < ib);
  return a > b || (a == b && ia < ib);
}

// Four floats as one value (GCC and Clang vector extensions): SSE2 on any x86-64, NEON on ARM,
// so the scans below need no build of their own. Loops over plain floats with a NaN test and
// a comparison the compilers leave scalar; these run at a few microseconds per vocabulary.
typedef float F4 __attribute__((vector_size(16)));
typedef int I4 __attribute__((vector_size(16)));

F4 load4(const float* p) {
  F4 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

struct Extremes {
  float min, max;  // read only where nan is false
  bool nan;
};

// the least and largest values and whether any is NaN (n >= 1)
Extremes extremes(const float* v, int64_t n) {
  int64_t i = 0;
  float lo = v[0], hi = v[0];
  bool nan = false;
  if (n >= 4) {
    F4 low = load4(v), high = low;
    I4 nans = {};
    for (; i + 4 <= n; i += 4) {
      const F4 x = load4(v + i);
      nans |= x != x;
      low = x < low ? x : low;
      high = x > high ? x : high;
    }
    for (int j = 0; j < 4; ++j) {
      nan |= nans[j] != 0;
      lo = low[j] < lo ? low[j] : lo;
      hi = high[j] > hi ? high[j] : hi;
    }
  }
  for (; i < n; ++i) {
    nan |= v[i] != v[i];
    lo = v[i] < lo ? v[i] : lo;
    hi = v[i] > hi ? v[i] : hi;
  }
  return {lo, hi, nan};
}

// the first index of the largest value (a NaN's, where there is one), given v's extremes e
int64_t first_at(const float* v, int64_t n, const Extremes& e) {
  for (int64_t i = 0; i < n; ++i)
    if (e.nan ? v[i] != v[i] : v[i] == e.max) return i;
  return 0;  // not reached: some element is NaN or the largest
}

// numpy's and torch's argmax, in two scans (the largest value, then its first index)
int64_t first_argmax(const float* v, int64_t n) { return first_at(v, n, extremes(v, n)); }

// torch.multinomial's own checks of probs, with its messages; probs' extremes
Extremes check_distribution(const float* probs, int64_t n) {
  const Extremes e = extremes(probs, n);
  if (e.nan || e.min < 0.0f || e.max == std::numeric_limits<float>::infinity())
    throw std::runtime_error("probability tensor contains either `inf`, `nan` or element < 0");
  if (!(e.max > 0.0f))
    throw std::runtime_error("invalid multinomial distribution (sum of probabilities <= 0)");
  return e;
}

// the first argmax of probs / noise (scratch holds the quotients), after torch.multinomial's
// checks of probs
int64_t draw(const float* probs, const float* noise, float* scratch, int64_t n) {
  check_distribution(probs, n);
  for (int64_t i = 0; i < n; ++i) scratch[i] = probs[i] / noise[i];
  return first_argmax(scratch, n);
}

// torch's Exp(1) value of one uniform draw: exponential_distribution<double> with lambda 1
// (ATen's own expression), as exponential_ stores it in float32
inline float exponential(double u) {
  return static_cast<float>(at::transformation::exponential<double>(u, 1.0));
}

typedef double D4 __attribute__((vector_size(32)));
typedef int64_t L4 __attribute__((vector_size(32)));

// draw() with the noise given as the uniform draws u it is made of (E = -log1p(-u)), taking
// the logarithm only where a token can still win. E >= u (the series of -log1p(-u)), so p / E
// <= p / u: a token with p < best * u * (1 - 2^-18) has a quotient below the best one found so
// far, whatever the roundings (log1p within an ulp, E rounded to float32, the quotient
// rounded: well inside the margin), and is passed over. Every other token's quotient is
// draw()'s and is compared as first_argmax compares (NaN first, then the larger, ties by the
// lower index), so the token is draw()'s on the Exp(1) values. Almost every token is passed
// over in a vector comparison: a step costs the uniform draws and a scan, not 49k logarithms.
int64_t draw_uniform(const float* probs, const double* u, int64_t n) {
  // the most likely token's quotient to start from
  int64_t at = first_at(probs, n, check_distribution(probs, n));
  float best = probs[at] / exponential(u[at]);
  constexpr double kMargin = 1.0 - 0x1p-18;
  double bound = best * kMargin;  // NaN (a NaN quotient) or inf passes nothing over
  const auto offer = [&](int64_t i) {
    if (!(static_cast<double>(probs[i]) < bound * u[i])) {
      const float q = probs[i] / exponential(u[i]);
      if (before(q, i, best, at)) best = q, at = i, bound = best * kMargin;
    }
  };
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    D4 p, w;
    for (int j = 0; j < 4; ++j) p[j] = probs[i + j];
    std::memcpy(&w, u + i, sizeof w);
    const D4 b = {bound, bound, bound, bound};
    const L4 skip = p < b * w;
    if (!(skip[0] && skip[1] && skip[2] && skip[3]))
      for (int j = 0; j < 4; ++j) offer(i + j);
  }
  for (; i < n; ++i) offer(i);
  return at;
}

// whether any of the 16 values at p is NaN or above floor
bool any_above(const float* p, float floor) {
  const F4 f = {floor, floor, floor, floor};
  I4 hit = {};
  for (int j = 0; j < 16; j += 4) {
    const F4 x = load4(p + j);
    hit |= (x > f) | (x != x);
  }
  return (hit[0] | hit[1] | hit[2] | hit[3]) != 0;
}

// the k first of v in `before` order, written to ids and vals (k <= n). Once k are held, a
// block of 16 with no NaN and nothing above the k-th is skipped after one vector comparison
// (an equal value comes later, so it ranks lower): past the first blocks, almost all are.
void top_k(const float* v, int64_t n, int64_t k, int64_t* ids, float* vals) {
  int64_t have = 0;
  auto offer = [&](int64_t i) {
    if (have == k && !before(v[i], i, vals[k - 1], ids[k - 1])) return;
    int64_t at = have < k ? have++ : k - 1;
    for (; at > 0 && before(v[i], i, vals[at - 1], ids[at - 1]); --at) {
      ids[at] = ids[at - 1];
      vals[at] = vals[at - 1];
    }
    ids[at] = i;
    vals[at] = v[i];
  };
  int64_t i = 0;
  for (; i < n && have < k; ++i) offer(i);
  for (; i + 16 <= n; i += 16)
    if (any_above(v + i, vals[k - 1]))
      for (int64_t j = 0; j < 16; ++j) offer(i + j);
  for (; i < n; ++i) offer(i);
}

// one row's token (greedy at temperature 0), counts[token] raised by one
int64_t choose(const at::Tensor& logits, double temperature, double penalty, float* counts,
               const at::Tensor* noise) {
  const int64_t n = logits.numel();
  const float* l = logits.data_ptr<float>();
  int64_t token;
  if (temperature == 0.0) {
    token = first_argmax(l, n);
  } else {
    at::Tensor scaled = at::empty({n}, logits.options());
    float* s = scaled.data_ptr<float>();
    const float t = static_cast<float>(temperature), f = static_cast<float>(penalty);
    for (int64_t i = 0; i < n; ++i) s[i] = l[i] / t;
    if (penalty > 0.0)
      for (int64_t i = 0; i < n; ++i) s[i] = s[i] - counts[i] * f;
    at::Tensor probs = at::_softmax(scaled, 0, false);
    if (noise->scalar_type() == at::kDouble)
      token = draw_uniform(probs.data_ptr<float>(), noise->data_ptr<double>(), n);
    else  // scaled is free again: the scratch
      token = draw(probs.data_ptr<float>(), noise->data_ptr<float>(), s, n);
  }
  counts[token] += 1.0f;
  return token;
}

}  // namespace

void exponential_of(const double* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = exponential(u[i]);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> vocab_pass(
    const at::Tensor& logits, c10::ArrayRef<double> temperature, c10::ArrayRef<double> penalty,
    const std::vector<std::optional<at::Tensor>>& counts,
    const std::vector<std::optional<at::Tensor>>& noise, c10::ArrayRef<int64_t> follow,
    int64_t k, int64_t threads) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.scalar_type() == at::kFloat &&
                  logits.device().is_cpu(),
              "logits must be a contiguous float32 CPU [rows, vocab]");
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(n >= 1 && k >= 1 && k <= n, "k must be in [1, vocab]");
  const auto entries = [rows](size_t size) { return static_cast<int64_t>(size) == rows; };
  TORCH_CHECK(entries(temperature.size()) && entries(penalty.size()) && entries(counts.size()) &&
                  entries(noise.size()) && entries(follow.size()),
              "temperature, penalty, counts, noise and follow need one entry per row");
  auto vector = [n](const std::optional<at::Tensor>& t, bool uniform) {
    return !t.has_value() ||
           (t->dim() == 1 && t->size(0) == n && t->is_contiguous() && t->device().is_cpu() &&
            (t->scalar_type() == at::kFloat || (uniform && t->scalar_type() == at::kDouble)));
  };
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(vector(counts[r], false) && vector(noise[r], true), "row ", r,
                ": counts (float32) and noise (float32 or float64) must be contiguous CPU "
                "[vocab]");
    const bool chooses = counts[r].has_value();
    TORCH_CHECK(chooses == (follow[r] < 0), "row ", r,
                " needs either its counts (it chooses its token) or a row to follow");
    TORCH_CHECK(chooses || (follow[r] < rows && counts[follow[r]].has_value()), "row ", r,
                " follows ", follow[r], ", which is not a row that chooses its token");
    TORCH_CHECK(!chooses || temperature[r] == 0.0 || noise[r].has_value(), "row ", r,
                " samples at temperature ", temperature[r], " and needs its noise");
  }
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  at::Tensor chosen = at::empty({rows}, logits.options());
  at::Tensor ids = at::empty({rows, k}, logits.options().dtype(at::kLong));
  at::Tensor vals = at::empty({rows, k}, logits.options());
  int64_t* token = tokens.data_ptr<int64_t>();
  std::vector<at::Tensor> logp(rows);
  parallel_for(threads, 0, rows, 1, [&](int64_t r0, int64_t r1) {
    c10::InferenceMode guard;  // the caller's tensors may be inference tensors
    for (int64_t r = r0; r < r1; ++r) {
      const at::Tensor row = logits[r];
      if (counts[r].has_value()) {
        const at::Tensor* drawn = noise[r].has_value() ? &*noise[r] : nullptr;
        token[r] = choose(row, temperature[r], penalty[r], counts[r]->data_ptr<float>(), drawn);
      }
      logp[r] = at::_log_softmax(row, 0, false);
      top_k(logp[r].data_ptr<float>(), n, k, ids.data_ptr<int64_t>() + r * k,
            vals.data_ptr<float>() + r * k);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {  // the followed rows have their tokens now
    if (follow[r] >= 0) token[r] = token[follow[r]];
    chosen.data_ptr<float>()[r] = logp[r].data_ptr<float>()[token[r]];
  }
  return {tokens, chosen, ids, vals};
}

}  // namespace sw
