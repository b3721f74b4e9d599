"""What an analysis needs from the engine that runs it, written down as a protocol.

The evaluator and the explainer are handed the engine they serve and call its public API
(plans, steering, texts, feature values) and its decoder. Typing them against this protocol,
not against ``Engine``, keeps analysis below the engine facade: the engine imports them,
never the other way round, and a remote engine or a test double serves them the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from torch import Tensor

from ..runtime.model import LoadedModel
from ..runtime.tokens import EncodedPrompt
from ..sae.feature_index import FeatureIndex
from ..sae.store import SAEStore
from ..steering.decoder import Decoder
from ..steering.requests import Plan, SteerRequest, Vector
from ..steering.results import Completion, SteerResult
from .activations import ResidualCache, Text


class EngineView(Protocol):
    """The part of ``Engine`` that evaluation and explanation use."""

    model: LoadedModel
    saes: SAEStore
    decoder: Decoder
    stop_ids: frozenset[int]

    @property
    def tokenizer(self) -> Any: ...

    @property
    def products(self) -> str: ...

    def plan(self, request: SteerRequest) -> tuple[EncodedPrompt, Plan]: ...

    def steer(self, request: SteerRequest, cancel: Any = None) -> SteerResult: ...

    def token_logprobs(self, prompt: Any, completion: Completion | Sequence[int]) -> Tensor: ...

    def text(self, prompt: Any, completion: Completion | Sequence[int] | None = None) -> Text: ...

    def feature_values(self, text: Text, source: str, index: int | None = None) -> Tensor: ...

    def residual_cache(self) -> ResidualCache: ...

    def feature_index(self, source: str) -> FeatureIndex: ...

    def concept_vector(
        self, positive: Any, negative: Any = None, hook: str | None = None
    ) -> Vector: ...

    def default_strength(self, source: str) -> float: ...

    def default_prompt_multiplier(self) -> float: ...
