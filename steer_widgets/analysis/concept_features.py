"""A concept as a few SAE features that steer together.

Why this exists: the single SAE feature whose decoder row points most nearly along a concept
direction steers far less often than the direction itself (docs/steering-efficacy.md), because
one row carries only part of it. A concept vector is a sum of many directions; written as a
sparse non-negative sum of decoder rows, the same push becomes a handful of features a user
can read, weigh and remove one by one, and it steers nearly as the vector does.

The set is found by orthogonal matching pursuit over the decoder rows of the SAEs at the
vector's hook, with non-negative strengths (a feature in a set adds its row, as a picked
feature does; a negative strength would be a "remove this" that reads poorly as an
explanation and steers the text away from what the feature names). The strengths are then
scaled together so that the set pushes along the concept as far as the concept vector's
recommended strength does. How this rule was chosen, and what was tried beside it, is in
docs/steering-efficacy.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import checks
from ..errors import RequestError
from ..steering.requests import Feature, Vector

# Measured on the dev half of benchmarks/data/steer_concepts.json with
# scripts/tune_concept_features.py (docs/steering-efficacy.md, "Concept features").
DEFAULT_K = 16  # features in a set when ``k=None``
PUSH = 0.75  # the set's push along the concept, as a multiple of the vector's strength
EXPLAINED = 0.999  # stop adding features once the set's direction has this cosine


@dataclass(frozen=True)
class Fit:
    """Decoder rows (indices into the stacked rows) and their non-negative coefficients."""

    indices: list[int]
    coefs: list[float]


def fit_rows(rows: Tensor, target: Tensor, k: int) -> Fit:
    """At most ``k`` rows of ``rows`` [n, d] whose non-negative combination best reproduces
    ``target`` [d] (orthogonal matching pursuit with a non-negative least-squares refit).

    Each step adds the row most aligned with what is still unexplained (only rows that push
    toward it: positive correlation), then refits every coefficient by least squares and
    drops rows whose coefficient would turn negative. Deterministic: ties go to the lowest
    index. A target planted as a positive sum of a few rows comes back exactly."""
    rows, target = rows.double(), target.double()
    unit = torch.nn.functional.normalize(rows, dim=1)
    picked: list[int] = []
    tried: list[int] = []  # picked once: never again, kept or dropped
    coefs = torch.zeros(0, dtype=torch.float64)
    residual = target.clone()
    norm = float(target.norm())
    for _ in range(min(k, rows.shape[0])):
        score = unit @ residual
        if tried:
            score[tried] = float("-inf")
        best = int(score.argmax())
        if float(score[best]) <= 1e-9 * norm:
            break
        tried.append(best)
        picked, coefs = _nonnegative_refit(rows, target, [*picked, best])
        residual = target - coefs @ rows[picked] if picked else target.clone()
        if float(residual.norm()) <= (1 - EXPLAINED) * norm:
            break
    return Fit(picked, coefs.tolist())


def _nonnegative_refit(rows: Tensor, target: Tensor, picked: list[int]):
    """Least squares on ``picked``; rows whose coefficient comes out negative or zero are
    dropped (the lowest first) and the rest refitted, until every one is positive: a set's
    features all push, none sits in it at strength 0."""
    picked = list(picked)
    while picked:
        a = rows[picked].T  # [d, m]
        coefs = torch.linalg.lstsq(a, target.unsqueeze(1)).solution.squeeze(1)
        worst = int(coefs.argmin())
        if float(coefs[worst]) > 0:
            return picked, coefs
        del picked[worst]
    return picked, torch.zeros(0, dtype=torch.float64)


class ConceptFeatures(list):
    """A concept as SAE features: a list of plain ``Feature`` (source, index, fitted
    strength) that a ``SteerRequest`` takes as its ``features``, with the explanation beside
    it: ``concept`` (the name, or ``None`` for texts or a vector), ``labels`` (each feature's
    label), ``weights`` (each feature's share of the set's total strength), and ``cosine``
    (how well the set's direction reproduces the concept's)."""

    def __init__(
        self,
        features: Sequence[Feature],
        concept: str | None,
        labels: Sequence[str],
        weights: Sequence[float],
        cosine: float,
    ) -> None:
        super().__init__(features)
        self.concept = concept
        self.labels = list(labels)
        self.weights = list(weights)
        self.cosine = cosine

    def to_frame(self):
        """One row per feature: source, index, strength, weight, label."""
        import pandas as pd

        return pd.DataFrame(
            [
                [f.source, f.index, f.strength, w, label]
                for f, w, label in zip(self, self.weights, self.labels, strict=True)
            ],
            columns=["source", "index", "strength", "weight", "label"],
        )

    def __repr__(self) -> str:
        name = repr(self.concept) if self.concept is not None else "a vector"
        pairs = zip(self, self.labels, strict=True)
        parts = ", ".join(f"{f.source}#{f.index} {label!r}" for f, label in pairs)
        return f"ConceptFeatures({name}, cosine {self.cosine:.2f}: {parts})"


def check_k(k) -> int:
    """``k=None`` is the recommended size; otherwise a positive integer."""
    if k is None:
        return DEFAULT_K
    return checks.integer("k", k, lo=1)


def check_concept(concept) -> None:
    """A concept is a name, a list of texts or chats, or a ``Vector``: anything else is a
    named error before any work."""
    if isinstance(concept, Vector):
        return
    if isinstance(concept, str):
        if not concept.strip():
            raise RequestError("concept", "is empty")
        return
    if isinstance(concept, Sequence) and concept:
        return  # texts or chats: checked item by item where they are read
    raise RequestError(
        "concept", f"must be a concept name, a list of texts or chats, or a Vector, got {concept!r}"
    )


def set_from_fit(
    fit: Fit,
    owners: Sequence[tuple[str, int]],
    rows: Tensor,
    direction: Tensor,
    strength: float,
    labels: Sequence[str],
    concept: str | None,
) -> ConceptFeatures:
    """The fitted rows as features, their strengths scaled together so that the set's push
    along ``direction`` (unit) is ``PUSH * strength``."""
    coefs = torch.tensor(fit.coefs, dtype=torch.float64)
    total = coefs @ rows[fit.indices].double()
    along = float(total @ direction.double())
    if along <= 0:
        raise RequestError("concept", "no SAE feature pushes along this concept's direction")
    scale = PUSH * strength / along
    # Rounded, and everything else derived from the rounded strengths: a least-squares solve
    # may differ in its last bits from one call to the next (BLAS picks kernels by memory
    # alignment), and a set must come back the same every time it is asked for.
    strengths = [round(float(c) * scale, 4) for c in coefs]
    features = [
        Feature(owners[i][0], owners[i][1], s) for i, s in zip(fit.indices, strengths, strict=True)
    ]
    weights = [round(s / sum(strengths), 6) for s in strengths]
    pushed = torch.tensor(strengths, dtype=torch.float64) @ rows[fit.indices].double()
    cosine = round(float(pushed @ direction.double()) / max(float(pushed.norm()), 1e-12), 6)
    return ConceptFeatures(features, concept, labels, weights, cosine)
