// The end of a decode step for every row at once (vocab_pass.cpp): ATen inside, unlike the
// torch-free kernels of kernels.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace sw {

// For each row r of logits [rows, vocab] (float32, contiguous): a row with counts[r] chooses its
// token (the first argmax at temperature[r] == 0, else the first argmax of
// softmax(logits / temperature - penalty * counts) / noise[r], the penalty only where > 0;
// noise[r] float32, the Exp(1) draws, or float64, the uniform draws they are made of) and
// counts[r][token] grows by one; a row with follow[r] >= 0 takes that row's token (a sweep's
// copy of a row, with probabilities of its own). Every row gets log_softmax(logits[r]) at its
// token and the k largest values of it (NaN first, ties by the lower index). Returns (tokens
// [rows] int64, their log-probabilities [rows], top ids [rows, k] int64, top values [rows, k]);
// rows run on `threads` of the pool. Arguments are checked before any row runs.
// Exp(1) draws as torch's exponential_ makes them of its uniform draws u (in [0, 1)): out[i] =
// float(-log1p(-u[i])), in torch's own double expression.
void exponential_of(const double* u, float* out, int64_t n);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> vocab_pass(
    const at::Tensor& logits, c10::ArrayRef<double> temperature, c10::ArrayRef<double> penalty,
    const std::vector<std::optional<at::Tensor>>& counts,
    const std::vector<std::optional<at::Tensor>>& noise, c10::ArrayRef<int64_t> follow,
    int64_t k, int64_t threads);

}  // namespace sw
