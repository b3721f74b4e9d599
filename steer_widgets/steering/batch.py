"""Many requests as one ragged batch: each request's rows on its own prompt and sampling.

``engine.steer_batch`` gathers every planned output of every request into rows of one decode
(``generation.decode`` runs rows of different prompts side by side, each exactly its solo
run). Requests on the same prompt and sampling share one DEFAULT row, and a DEFAULT already
in the decoder's cache is not decoded again. Past ``MAX_ROWS`` rows a batch is split into the
fewest parts of at most that many, in request order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .generation import Row, Sampling
from .requests import Plan
from .results import Completion

# Rows per decode. Each row's KV cache is (prompt + new tokens) x layers x 2 x kv width:
# the default model at 300 + 64 positions holds 8 MB a row. Past this a part of a batch
# waits for the one before; below it, every extra row is cheaper than its solo run.
MAX_ROWS = 64

Slot = tuple[str, str]  # (request name, output label)


@dataclass
class Batch:
    """The rows to decode and, for each, the outputs it answers; outputs taken from the
    DEFAULT cache in ``cached``."""

    rows: list[Row] = field(default_factory=list)
    slots: list[list[Slot]] = field(default_factory=list)
    cached: dict[Slot, Completion] = field(default_factory=dict)

    def parts(self, size: int = MAX_ROWS) -> list[tuple[list[Row], list[list[Slot]]]]:
        """The rows in parts of at most ``size`` rows (one part when they fit)."""
        return [
            (self.rows[i : i + size], self.slots[i : i + size])
            for i in range(0, len(self.rows), size)
        ]

    def defaults(self) -> list[tuple[int, Slot]]:
        """The row index and first slot of each decoded DEFAULT (for the DEFAULT cache)."""
        return [(r, s[0]) for r, s in enumerate(self.slots) if s[0][1] == "DEFAULT"]


def plan_batch(
    plans: Mapping[str, tuple[Sequence[int], Sampling, Plan]],
    cached_default: Callable[[Sequence[int], Sampling], Completion | None],
) -> Batch:
    """The rows of every request's plan (``name -> (prompt ids, sampling, plan)``), each with
    its own prompt and sampling, one DEFAULT row per prompt and sampling."""
    batch = Batch()
    default_rows: dict[tuple, int] = {}
    for name, (ids, sampling, plan) in plans.items():
        key = (tuple(ids), sampling)
        for out in plan.outputs:
            slot = (name, out.label)
            if out.label == "DEFAULT":
                hit = cached_default(ids, sampling)
                if hit is not None:
                    batch.cached[slot] = hit
                    continue
                if key in default_rows:
                    batch.slots[default_rows[key]].append(slot)
                    continue
                default_rows[key] = len(batch.rows)
            batch.rows.append(replace(out.row, prompt_ids=tuple(ids), sampling=sampling))
            batch.slots.append([slot])
    return batch
