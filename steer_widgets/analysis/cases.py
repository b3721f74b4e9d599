"""What every explanation starts from: one steered output of a finished result, checked
against the engine (``Explainer`` builds it), with the hook functions that redo its
steering and the key its steered reads are cached by.

Explanations read a finished result again with full forward passes over its text (no KV
cache); ``Case.ops`` gives those passes the row's steering, whole, in part (some of its
directions) or scaled (a point on the path from unsteered to steered).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..steering.gates import recorded
from ..steering.requests import Direction, build_plan
from ..steering.results import Completion, SteerResult

Hooks = dict[str, Callable]


@dataclass
class Case:
    """A checked (result, label): the request's directions, the row's multiplier, the text."""

    result: SteerResult
    label: str
    completion: Completion
    directions: list[Direction]
    multiplier: float | None
    special: tuple[bool, ...]
    ids: tuple[int, ...]  # prompt + completion
    n_prompt: int
    generated: tuple[bool, ...] = ()  # per prompt position: an earlier reply's own token

    def ops(self, directions: Sequence[Direction], scale: float = 1.0) -> Hooks:
        """The row's hook functions with only ``directions``, at ``scale`` times its
        multiplier (position-aware: prompt positions as generation steered them, and a
        gated entry only where its recorded gate was on, ``gates.recorded``)."""
        if not directions or self.multiplier is None:
            return {}
        request = self.result.request.with_(
            strength_multiplier=self.multiplier * scale, sweep=(), types=("STEERED",)
        )
        gates = self.completion.gates
        gated = None if gates is None else recorded(gates)  # each entry where it steered
        plan = build_plan(request, directions, self.special, gated, self.generated)
        return dict(plan.outputs[0].row.ops)


def steering_key(result: SteerResult) -> str:
    """What a result's steered reads depend on besides its tokens: its request, as a digest
    of its record. A cache keyed by ``id(result)`` could serve a later result that reused a
    collected one's id (the same tokens, another steering) the earlier one's reads."""
    record = json.dumps(result.request.to_dict(), sort_keys=True, default=str)
    return hashlib.sha1(record.encode()).hexdigest()
