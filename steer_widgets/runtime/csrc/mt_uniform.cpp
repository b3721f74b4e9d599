// mt_uniform of mt_uniform.h: at::mt19937's next_state and tempering over whole arrays.
#include "mt_uniform.h"

#include <algorithm>

namespace sw {
namespace {

constexpr int kShift = 397;  // MERSENNE_STATE_M
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr int kLanes = 16;  // words a step of the twist takes at once

inline uint32_t twist(uint32_t u, uint32_t v) {
  const uint32_t mixed = (u & 0x80000000u) | (v & 0x7fffffffu);
  return (mixed >> 1) ^ ((v & 1u) ? kMatrixA : 0u);
}

// word i from i + 1 and i + off, kLanes at a time: every word read is read before this step
// writes (i + 1 .. i + kLanes is this step's last word plus one not yet twisted; i + off lies
// kShift ahead, untouched, or 227 behind, twisted already), so each word is what the
// one-at-a-time loop gives
inline void twist_lanes(uint32_t* s, int i, int off) {
  uint32_t out[kLanes];
  for (int l = 0; l < kLanes; ++l) out[l] = s[i + l + off] ^ twist(s[i + l], s[i + l + 1]);
  for (int l = 0; l < kLanes; ++l) s[i + l] = out[l];
}

// at::mt19937_engine::next_state
void next_state(uint32_t* s) {
  constexpr int first = kMtWords - kShift;  // 227 words read ahead, the rest behind
  int i = 0;
  for (; i + kLanes <= first; i += kLanes) twist_lanes(s, i, kShift);
  for (; i < first; ++i) s[i] = s[i + kShift] ^ twist(s[i], s[i + 1]);
  for (; i + kLanes <= kMtWords - 1; i += kLanes) twist_lanes(s, i, kShift - kMtWords);
  for (; i < kMtWords - 1; ++i) s[i] = s[i + kShift - kMtWords] ^ twist(s[i], s[i + 1]);
  s[kMtWords - 1] = s[kShift - 1] ^ twist(s[kMtWords - 1], s[0]);
}

inline uint32_t temper(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  return y ^ (y >> 18);
}

// the next n 32-bit outputs (at::mt19937_engine::operator() n times)
void words(uint32_t* state, int& left, uint32_t& next, uint32_t* out, int64_t n) {
  while (n > 0) {
    if (left == 1) {  // the call that finds left at 1 twists first, then reads word 0
      next_state(state);
      left = kMtWords + 1;
      next = 0;
    }
    const int64_t take = std::min<int64_t>(n, left - 1);
    const uint32_t* from = state + next;
    for (int64_t j = 0; j < take; ++j) out[j] = temper(from[j]);
    out += take;
    n -= take;
    next += static_cast<uint32_t>(take);
    left -= static_cast<int>(take);
  }
}

}  // namespace

void mt_uniform(uint32_t* state, int& left, uint32_t& next, double* out, int64_t n) {
  constexpr int64_t kPiece = 512;  // draws a round: their words stay in L1
  constexpr double kScale = 1.0 / static_cast<double>(uint64_t{1} << 53);
  uint32_t w[2 * kPiece];
  for (int64_t at = 0; at < n; at += kPiece) {
    const int64_t m = std::min(kPiece, n - at);
    words(state, left, next, w, 2 * m);
    for (int64_t j = 0; j < m; ++j) {
      const uint64_t v = (uint64_t{w[2 * j]} << 32) | w[2 * j + 1];
      out[at + j] = static_cast<double>(v & ((uint64_t{1} << 53) - 1)) * kScale;
    }
  }
}

}  // namespace sw
