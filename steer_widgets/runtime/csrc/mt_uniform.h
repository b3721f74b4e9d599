// Uniform draws in [0, 1), float64, as torch's CPU generator makes them (no torch here).
//
// torch's uniform_ on a float64 CPU tensor draws element by element: two 32-bit outputs of
// its Mersenne Twister (at::mt19937: the state, `left` and `next` of mt19937_data_pod), the
// first as the high half of a 64-bit value, whose low 53 bits times 2^-53 are the draw. This
// makes the same outputs from the same state and leaves the state where torch's would, but
// twists and tempers many words at a time: a decode step draws one per vocabulary entry for
// every sampling row, which torch's one-at-a-time loop made a serial cost of each extra row
// (docs/benchmarks.md).
#pragma once

#include <cstdint>

namespace sw {

constexpr int kMtWords = 624;  // MERSENNE_STATE_N

// n draws into out; state, left and next advanced as n calls of torch's random64 would
void mt_uniform(uint32_t* state, int& left, uint32_t& next, double* out, int64_t n);

}  // namespace sw
