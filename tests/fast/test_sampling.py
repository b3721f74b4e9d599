"""A row's sampler draws the tokens ``torch.multinomial`` draws from the same generator (its
noise queued on the native kernels' idle threads is tested in ``tests/test_noise.py``)."""

from __future__ import annotations

import pytest
import torch

from steer_widgets.generation import RowSampler, Sampling


def _reference(logits: list[torch.Tensor], sampling: Sampling, prompt: list[int]) -> list[int]:
    """torch.multinomial on the penalised, tempered softmax, one generator per row."""
    gen = torch.Generator().manual_seed(sampling.seed)
    counts = torch.bincount(torch.tensor(prompt), minlength=logits[0].numel()).float()
    out = []
    for step in logits:
        scaled = step / sampling.temperature - sampling.freq_penalty * counts
        token = int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=gen))
        counts[token] += 1
        out.append(token)
    return out


@pytest.mark.parametrize(("temperature", "freq_penalty", "seed"), [(0.5, 0.0, 0), (1.0, 1.0, 16),
                                                                  (2.0, 0.3, 7)])  # fmt: skip
def test_sampled_tokens_are_torch_multinomial(temperature, freq_penalty, seed):
    vocab, prompt = 3000, [5, 9, 9, 2]
    gen = torch.Generator().manual_seed(seed + 100)
    logits = [torch.randn(vocab, generator=gen) * 4 for _ in range(40)]
    sampling = Sampling(temperature=temperature, freq_penalty=freq_penalty, seed=seed)
    inline = RowSampler(sampling, prompt, vocab)
    assert [inline.next(step) for step in logits] == _reference(logits, sampling, prompt)


def test_greedy_rows_draw_no_noise_and_invalid_probabilities_fail_as_multinomial_does():
    greedy = RowSampler(Sampling(temperature=0.0), [1], 10)
    greedy.prefetch()
    assert not greedy.draws and greedy._queued is None
    sampled = RowSampler(Sampling(temperature=1.0), [1], 10)
    with pytest.raises(RuntimeError, match="inf.*nan"):
        sampled.next(torch.full((10,), float("nan")))
