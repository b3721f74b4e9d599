"""What a condition measures on this model: a feature's activation or a direction's cosine.

``steering.gates.resolve`` turns a request's conditions into gates; it asks this module how
to score a condition at its hook (``measure``) and what a prompt-scope one decides
(``decide``). Scores are computed the way ``Engine.feature_values`` computes activations
(the same SAE call, BOS scored 0), so a gate can be checked against them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .. import checks
from ..errors import RequestError, SourceError
from ..steering.conditions import When, check
from ..steering.entries import Feature
from ..steering.gates import Measured
from .activations import Text, residuals
from .text import Analysis


class ConditionScores:
    """Resolves score conditions against one model, its SAEs and their feature indexes."""

    def __init__(self, analysis: Analysis) -> None:
        self.analysis = analysis

    def measure(self, when: When, field: str) -> Measured:
        """How ``when`` is scored: its hook, its score over hook values [T, width] and the
        factor of its thresholds (a feature's top activation under ``relative``)."""
        if isinstance(when.on, Feature):
            return self._feature(when, field)
        return self._direction(when, field)

    def decide(self, when: When, field: str, ids: Sequence[int], special: Sequence[bool]) -> bool:
        """A prompt-scope decision: the scores of an unsteered pass over the prompt, reduced
        over its non-special tokens (all tokens where every one is special)."""
        m = self.measure(when, field)
        value = self.reduced(m, ids, special, when.reduce)
        on = True
        if when.above is not None:
            on &= value > when.above * m.scale
        if when.below is not None:
            on &= value < when.below * m.scale
        return bool(on)

    def scores(self, when: When, prompt, completion=None) -> tuple[Text, list[float], float]:
        """``when``'s score at every token of ``prompt`` (+ ``completion``) under the
        unsteered model (BOS 0), and its threshold in the same units (``above``, else
        ``below``): what a token-scope gate compares, for the heatmap and for users."""
        check(when, "when")
        if not isinstance(when, When):
            raise RequestError("when", f"must be one score condition (sw.When), got {when!r}")
        m = self.measure(when, "when")
        text = self.analysis.text(prompt, completion)
        values = self._token_scores(m, text.ids)
        bound = when.above if when.above is not None else when.below
        return text, [float(v) for v in values], bound * m.scale

    def reduced(self, m: Measured, ids: Sequence[int], special: Sequence[bool], how: str) -> float:
        """The scores of an unsteered pass over ``ids`` at ``m``'s hook, reduced over the
        non-special tokens (``max``, ``min``, ``mean`` or ``last``), BOS scored 0."""
        scores = self._token_scores(m, ids)
        keep = ~torch.tensor(list(special), dtype=torch.bool)
        picked = scores[keep] if keep.any() else scores
        reduce = {"max": picked.max, "min": picked.min, "mean": picked.mean}
        return float(picked[-1] if how == "last" else reduce[how]())

    def fit_threshold(self, when: When, positive: Sequence, negative: Sequence) -> ThresholdFit:
        """The threshold of ``when`` that best tells ``positive`` texts from ``negative``
        ones (F1): a prompt-scope condition decides once per text (its ``reduce`` over the
        non-special tokens, as ``decide``); a token-scope one is on somewhere in a text where
        its top (``above``) or bottom (``below``) score over every position passes, special
        tokens and BOS (scored 0) included, since its gate reads them all. Candidates are the
        midpoints between neighbouring scores."""
        _check_fittable(when)
        m = self.measure(when, "when")
        above = when.below is None
        token = when.scope == "token"  # a token gate reads every position, BOS scoring 0
        how = ("max" if above else "min") if token else when.reduce
        texts = {"positive": positive, "negative": negative}
        values = {}
        for name, group in texts.items():
            values[name] = []
            for i, prompt in enumerate(checks.sequence(name, group)):
                try:
                    text = self.analysis.text(prompt)
                except RequestError as err:  # the text's own problem, named by its place
                    raise RequestError(f"{name}[{i}]", err.problem) from None
                special = [False] * len(text.ids) if token else text.special
                values[name].append(self.reduced(m, text.ids, special, how) / m.scale)
            if not values[name]:
                raise RequestError(name, "is empty: give at least one text")
        return _best_split(when, values["positive"], values["negative"], above)

    def _token_scores(self, m: Measured, ids: Sequence[int]) -> Tensor:
        """``m``'s score at every token of ``ids`` under the unsteered model (the residual
        cache's pass), BOS scored 0, in float64 as thresholds compare."""
        analysis = self.analysis
        runtime = analysis.model.runtime
        resid = residuals(runtime, analysis.residual_cache, tuple(ids), [m.hook])[m.hook]
        scores = m.fn(resid).double()
        if ids and ids[0] == analysis.tokenizer.bos_id:
            scores[0] = 0.0
        return scores

    def _feature(self, when: When, field: str) -> Measured:
        saes = self.analysis.saes
        source, index = when.on.source, when.on.index
        try:
            cfg = saes.check_index(source, index)
        except SourceError as err:
            raise RequestError(f"{field}.on", str(err)) from None
        sae, index = saes.get(source), int(index)
        if cfg.k:  # TopK: whether a feature is active depends on every other one
            fn = lambda flat: sae.encode(flat)[:, index]  # noqa: E731
        else:
            fn = lambda flat: sae.encode_one(flat, index)  # noqa: E731
        scale = 1.0
        if when.relative:
            info = self.analysis.feature_index(source)[index]
            if not info.max_act:
                raise RequestError(
                    f"{field}.relative",
                    f"feature {index} of {source!r} has no top activation in its feature index; "
                    "give an absolute threshold",
                )
            scale = float(info.max_act)
        return Measured(cfg.hook_name, fn, scale)

    def _direction(self, when: When, field: str) -> Measured:
        widths = self.analysis.model.runtime.hook_widths()
        hook = when.on.hook
        if hook not in widths:
            raise RequestError(f"{field}.on.hook", f"the model has no hook {hook!r}")
        vec = checks.floats(f"{field}.on.vector", when.on.vector).flatten()
        if vec.numel() != widths[hook]:
            raise RequestError(
                f"{field}.on.vector", f"has width {vec.numel()}, but {hook} is {widths[hook]} wide"
            )
        norm = vec.norm()
        if not torch.isfinite(norm) or norm == 0:
            raise RequestError(f"{field}.on.vector", "has zero norm: it points nowhere")
        unit = vec / norm
        if when.measure == "projection":
            return Measured(hook, lambda flat: flat @ unit)
        return Measured(hook, lambda flat: _cosine(flat, unit))


@dataclass(frozen=True)
class ThresholdFit:
    """A condition with the threshold that best separated the texts it was fitted on, and
    how well: ``precision`` and ``recall`` of the positive texts, ``f1``, and every text's
    score (in the condition's units) to see the margin."""

    when: When
    threshold: float
    precision: float
    recall: float
    f1: float
    positive_scores: tuple[float, ...]
    negative_scores: tuple[float, ...]


def _check_fittable(when) -> None:
    if not isinstance(when, When):
        raise RequestError("when", f"must be one score condition (sw.When), got {when!r}")
    if (when.above is None) == (when.below is None):
        raise RequestError("when", "needs exactly one of above= and below= (its direction)")
    check(when, "when")


def _best_split(when: When, pos: list[float], neg: list[float], above: bool) -> ThresholdFit:
    """The midpoint threshold with the best F1 (ties: the widest margin)."""
    ordered = sorted(set(pos + neg))
    cuts = [(a + b) / 2 for a, b in zip(ordered, ordered[1:], strict=False)] or [ordered[0]]
    cuts = [ordered[0] - 1.0, *cuts, ordered[-1] + 1.0]
    best = None
    for t in cuts:
        hit = (lambda v, t=t: v > t) if above else (lambda v, t=t: v < t)
        tp, fp = sum(map(hit, pos)), sum(map(hit, neg))
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / len(pos)
        f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
        margin = min(abs(v - t) for v in pos + neg)
        key = (f1, margin)
        if best is None or key > best[0]:
            best = (key, t, precision, recall, f1)
    _, t, precision, recall, f1 = best
    fitted = replace(when, above=t) if above else replace(when, below=t)
    return ThresholdFit(fitted, t, precision, recall, f1, tuple(pos), tuple(neg))


def _cosine(flat: Tensor, unit: Tensor) -> Tensor:
    """The signed cosine of each row of ``flat`` with ``unit`` (0 for a zero row)."""
    return (flat @ unit) / flat.norm(dim=-1).clamp_min(torch.finfo(flat.dtype).tiny)
