"""A row's sampler draws the tokens ``torch.multinomial`` draws from the same generator (its
noise queued on the native kernels' idle threads is tested in ``tests/test_noise.py``)."""

from __future__ import annotations

import pytest
import torch

from steer_widgets.steering.generation import RowSampler, Sampling


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


def test_a_torch_whose_multinomial_differs_is_detected_and_called_itself(monkeypatch):
    """``draws_are_torchs`` checks the fast path against torch.multinomial once; where it
    fails (simulated: a fast path that takes the likeliest token) rows call torch's own."""
    from steer_widgets.steering import generation

    monkeypatch.setattr(generation, "_multinomial", lambda probs, noise: int(probs.argmax()))
    with pytest.warns(RuntimeWarning, match="samples unlike torch 2.13"):
        assert generation.draws_are_torchs.__wrapped__() is False
    monkeypatch.setattr(generation, "draws_are_torchs", lambda: False)
    vocab, prompt = 3000, [5, 9]
    gen = torch.Generator().manual_seed(3)
    logits = [torch.randn(vocab, generator=gen) * 4 for _ in range(20)]
    sampling = Sampling(temperature=0.8, freq_penalty=0.5, seed=4)
    row = RowSampler(sampling, prompt, vocab)
    row.prefetch()
    assert row._queued is None  # nothing queued on this path
    assert [row.next(step) for step in logits] == _reference(logits, sampling, prompt)


def test_this_torch_samples_as_the_fast_path_assumes():
    from steer_widgets.steering.generation import draws_are_torchs

    assert draws_are_torchs.__wrapped__() is True
