"""Why the text changed: the explanations the engine offers (``Engine.steering_effect``,
``attribute``, ``steering_features``), behind one facade, ``Explainer``.

Generation runs on the exact kernel, which has no backward. Every explanation reads a
finished result again with full forward passes over its text (no KV cache), starting from a
checked ``cases.Case``:

* the effect of steering on a token (here) is ``log p_steered - log p_unsteered``: the
  steered log-probability is the one generation recorded, the unsteered one comes from ONE
  forward of the unsteered model over the steered text (cached per text);
* attribution (``attribution``) shares a token's gain out among the steering rows and the
  SAE features the steering moved, by gradients read through a differentiable copy of the
  forward (``gradients``); ``agreement`` checks its first-order shares against measured
  removals;
* the features the steering moved over the whole completion: ``changed_features``.

A conditional result (``sw.When``) is read with each gated entry steering exactly where its
output recorded its gate (``Case.ops``, ``gates.recorded``), so a token no gate reached has
no effect from that entry and no share of its gain.

The result types are in ``explanations``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from numbers import Integral

from torch import Tensor

from ..errors import RequestError
from ..lru import LRU
from ..runtime.memory import release_freed_memory
from ..runtime.protocol import hook_layer
from ..steering.requests import conditioned, output_multipliers, resolve_directions
from ..steering.results import SteerResult
from .attribution import attribute
from .cases import Case, Hooks, steering_key
from .changed_features import changed_features
from .engine_view import EngineView
from .explanations import Attribution, ChangedFeatures, SteeringEffect
from .gradients import differentiable, local_runtime

CACHE_SIZE = 32


class Explainer:
    """The engine's explanations (``Engine.steering_effect``, ``attribute``,
    ``steering_features``); holds the caches of unsteered reads."""

    def __init__(self, engine: EngineView) -> None:
        self.engine = engine
        self._cache: LRU[tuple, object] = LRU(CACHE_SIZE)
        self._lock = threading.Lock()
        self._grad_runtime = None

    # -- public -------------------------------------------------------------------------
    def effect(self, result: SteerResult, label: str = "STEERED") -> SteeringEffect:
        case = self._case(result, label)
        comp = case.completion
        if case.multiplier is None:  # DEFAULT: the unsteered model is the steered one
            unsteered = steered = self._recorded(case)
        else:
            unsteered = self.cached(("effect", case.ids), lambda: self._unsteered_logprobs(case))
            steered = self._recorded(case)
        return SteeringEffect(
            label,
            tuple(self.engine.tokenizer.token_strings(list(comp.token_ids))),
            comp.token_ids,
            steered,
            unsteered,
            comp.gated_tokens(),
        )

    def attribute(
        self,
        result: SteerResult,
        label: str = "STEERED",
        position: int = 0,
        source: str | Sequence[str] | None = None,
        n: int = 10,
        ablate: bool = False,
        steps: int = 3,
    ) -> Attribution:
        case = self._case(result, label)
        _check_position(position, len(case.completion.token_ids))
        if isinstance(n, bool) or not isinstance(n, Integral) or n < 0:
            raise RequestError("n", f"must be an integer >= 0, got {n!r}")
        if isinstance(steps, bool) or not isinstance(steps, Integral) or not 1 <= steps <= 32:
            raise RequestError("steps", f"must be an integer from 1 to 32, got {steps!r}")
        if case.multiplier is None:
            raise RequestError("label", f"{label} is not steered: there is nothing to attribute")
        sources = self._sources(case, source)
        try:
            return attribute(
                self.engine, self.grad_forward, case, position, sources, int(n), ablate, int(steps)
            )
        finally:
            release_freed_memory()  # the backward's temporaries, back to the system

    def changed_features(
        self, result: SteerResult, source: str, n: int = 10, label: str = "STEERED"
    ) -> ChangedFeatures:
        case = self._case(result, label)
        if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
            raise RequestError("n", f"must be an integer >= 1, got {n!r}")
        if case.multiplier is None:
            raise RequestError("label", f"{label} is not steered: nothing changed")
        self.engine.saes.config(source)  # SourceError for an unknown one
        if "DEFAULT" not in result.outputs:
            raise RequestError("result", "has no DEFAULT output to compare with")
        default = self._case(result, "DEFAULT")
        return changed_features(self.engine, self.cached, case, default, source, int(n))

    # -- checks and small reads ---------------------------------------------------------
    def _case(self, result: SteerResult, label: str) -> Case:
        engine = self.engine
        if not local_runtime(engine.model.runtime):
            kind = type(engine.model.runtime).__name__
            raise RequestError("engine", f"explaining steering needs a local model, not {kind}")
        if not isinstance(result, SteerResult):
            raise RequestError("result", f"must be a SteerResult, got {type(result).__name__}")
        if result.model != engine.model.name:
            raise RequestError(
                "result", f"comes from model {result.model!r}; this engine runs "
                f"{engine.model.name!r}"
            )  # fmt: skip
        if not isinstance(label, str) or label not in result.outputs:
            raise RequestError("label", f"{label!r} is not in the result {list(result.outputs)}")
        gated = conditioned(result.request)
        if gated and output_multipliers(result.request).get(label) is not None:
            if result.outputs[label].gates is None:
                raise RequestError(
                    f"result.outputs[{label!r}].gates",
                    f"is missing: {gated} gated this output, and explaining it needs the "
                    "gate it recorded at each position",
                )
        prompt, _ = engine.plan(result.request)  # the request must resolve on this engine
        if tuple(prompt.ids) != tuple(result.prompt_ids):
            raise RequestError("result", "its prompt tokens differ from this engine's")
        widths = engine.model.runtime.hook_widths()
        directions = resolve_directions(result.request, engine.saes, widths)
        comp = result.outputs[label]
        multiplier = output_multipliers(result.request).get(label)
        ids = tuple(prompt.ids) + tuple(comp.token_ids)
        return Case(result, label, comp, directions, multiplier, tuple(prompt.special), ids,
                    len(prompt.ids), prompt.generated)  # fmt: skip

    def _sources(self, case: Case, source) -> list[str]:
        saes = self.engine.saes
        if source is None:
            first = min((hook_layer(d.hook) or 0) for d in case.directions)
            return [s for s in saes.sources() if (saes.config(s).layer or 0) >= first]
        names = [source] if isinstance(source, str) else list(source)
        for s in names:
            saes.config(s)  # SourceError for an unknown one
        return names

    def _recorded(self, case: Case) -> tuple[float, ...]:
        logprobs = case.completion.logprobs
        if logprobs is not None:
            return logprobs
        return self.cached(
            ("steered", case.ids, case.label, steering_key(case.result)),
            lambda: self._logprobs(case, case.ops(case.directions)),
        )

    def _unsteered_logprobs(self, case: Case) -> tuple[float, ...]:
        return self._logprobs(case, {})

    def _logprobs(self, case: Case, ops: Hooks) -> tuple[float, ...]:
        n = len(case.completion.token_ids)
        return tuple(self.engine.decoder.logprobs(case.ids, n, ops).tolist())

    def cached(self, key: tuple, make: Callable[[], object]):
        """A read's result kept by ``key`` (computed outside the lock: reads take seconds)."""
        return self._cache.get_or_compute(key, make, self._lock)

    def grad_forward(self) -> Callable[..., Tensor]:
        """The differentiable forward of this engine's runtime (``gradients.differentiable``),
        made once on first use."""
        if self._grad_runtime is None:
            self._grad_runtime = differentiable(self.engine.model.runtime)
        return self._grad_runtime


def _check_position(position, n: int) -> None:
    if isinstance(position, bool) or not isinstance(position, Integral) or not 0 <= position < n:
        raise RequestError("position", f"must be a token position in 0..{n - 1}, got {position!r}")
