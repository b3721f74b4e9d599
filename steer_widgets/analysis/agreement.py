"""How far first-order attributions can be trusted: predicted shares (``attribute``) against
the measured changes of removing each row and ablating each feature (``ablate=True``), as a
Spearman rank correlation and a median relative error over many cases.

Used by the benchmark (benchmarks/bench_explain.py) and the tests, not by the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .explanations import Attribution


@dataclass(frozen=True)
class AgreementReport:
    """First-order attributions against measured ablations over a set of cases: Spearman
    rank correlation and the median relative error ``|predicted - measured| / |measured|``
    over every (row or feature, token) pair."""

    predicted: tuple[float, ...]
    measured: tuple[float, ...]

    @property
    def rank_corr(self) -> float:
        return spearman(self.predicted, self.measured)

    @property
    def median_relative_error(self) -> float:
        errs = sorted(
            abs(p - m) / abs(m) for p, m in zip(self.predicted, self.measured, strict=True) if m
        )
        return errs[len(errs) // 2] if errs else float("nan")


def agreement(attributions: Sequence[Attribution], rows: bool = True) -> AgreementReport:
    """Pairs (predicted, measured) of ``attribute(..., ablate=True)`` results."""
    pred, meas = [], []
    for a in attributions:
        for r in a.rows if rows else ():
            pred.append(r.attribution)
            meas.append(r.removed)
        for f in a.features:
            if f.ablated is not None:
                pred.append(f.attribution)
                meas.append(f.ablated)
    return AgreementReport(tuple(pred), tuple(meas))


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    if len(a) < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / denom if denom else float("nan")


def _ranks(x: Sequence[float]) -> Tensor:
    t = torch.tensor(list(x), dtype=torch.float64)
    order = t.argsort()
    ranks = torch.empty_like(t)
    ranks[order] = torch.arange(len(t), dtype=torch.float64)
    for v in t.unique():  # average ranks of ties
        same = t == v
        ranks[same] = ranks[same].mean()
    return ranks
