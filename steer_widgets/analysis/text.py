"""Text analysis: which features fire where, over a prompt and an optional completion.

The engine's ``text``, ``activations``, ``top_features*``, ``neighbours`` and
``feature_index`` delegate here, so ``engine.py`` keeps to steering. Residuals and the SAE
activations computed from them live in one ``ResidualCache`` (``activations.py``); a second
question about the same text (another feature, another k) is a lookup, not a forward pass.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from numbers import Integral

import torch
from torch import Tensor

from .. import checks
from ..errors import RequestError
from ..lru import LRU
from ..runtime.model import LoadedModel
from ..runtime.tokens import check_prompt
from ..sae.feature_index import FeatureIndex, final_norm_weight, top_output_tokens
from ..sae.store import SAEStore
from ..steering.results import Completion
from .activations import (
    FeatureActivations,
    ResidualCache,
    Text,
    TopFeatures,
    TopPerToken,
    max_outside_special,
    residuals,
)

TEXT_CACHE_SIZE = 64


class Analysis:
    """Feature activations over texts for one model and its SAE store."""

    def __init__(self, model: LoadedModel, saes: SAEStore) -> None:
        self.model, self.saes = model, saes
        self.residual_cache = ResidualCache()
        self._texts: LRU[tuple, Text] = LRU(TEXT_CACHE_SIZE)  # guarded by _lock_texts
        self._indexes: dict[str, FeatureIndex] = {}
        self._lock_texts = threading.Lock()
        self._lock_index = threading.Lock()

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def clear(self) -> None:
        """Forget cached texts, residuals and activations (feature indexes stay)."""
        with self._lock_texts:
            self._texts.clear()
        self.residual_cache.clear()

    def text(self, prompt, completion: Completion | Sequence[int] | None = None) -> Text:
        """Tokens to analyse: a prompt (str or chat), optionally followed by a completion."""
        if isinstance(prompt, Text):
            return prompt
        check_prompt(prompt)  # before it is a cache key
        extra = completion.token_ids if isinstance(completion, Completion) else completion
        if extra is not None:
            extra = checks.token_ids("completion", extra, self.model.runtime.cfg.vocab_size)
        key = (json.dumps(prompt, sort_keys=True), tuple(extra or ()))
        with self._lock_texts:
            cached = self._texts.get(key, touch=False)
        if cached is not None:
            return cached
        text = self._tokenize(prompt, list(extra or ()))
        with self._lock_texts:
            self._texts.put(key, text, touch=False)
        return text

    def _tokenize(self, prompt, extra: list[int]) -> Text:
        max_context = self.model.runtime.cfg.max_context
        enc = self.tokenizer.encode(prompt, max_context)
        ids, special = list(enc.ids) + extra, list(enc.special)
        special += [i in self.tokenizer.special_ids for i in extra]
        if len(ids) > max_context:
            raise RequestError("prompt", f"is {len(ids)} tokens; the context allows fewer")
        return Text(tuple(ids), tuple(self.tokenizer.token_strings(ids)), tuple(special))

    def feature_values(self, text: Text, source: str, index: int | None = None) -> Tensor:
        """Activations [T] of one feature (or [T, d_sae] of all) over ``text``; BOS zeroed."""
        if not isinstance(text, Text):
            raise RequestError("text", f"must be a Text (engine.text(prompt)), got {text!r}")
        cfg = self.saes.config(source) if index is None else self.saes.check_index(source, index)
        also = [self.saes.config(s).hook_name for s in self.saes.sources()]
        runtime = self.model.runtime
        resid = residuals(runtime, self.residual_cache, text.ids, [cfg.hook_name], also)
        if index is not None and not cfg.k:  # one encoder column is enough without TopK
            with self.saes.using(source) as (sae,):
                acts = sae.encode_one(resid[cfg.hook_name], index)
        else:  # all features, kept beside the residuals: another feature is a lookup
            acts = self.residual_cache.get_features(text.ids, source)
            if acts is None:
                with self.saes.using(source) as (sae,):
                    acts = sae.encode(resid[cfg.hook_name])
                self.residual_cache.put_features(text.ids, source, acts)
            acts = acts if index is None else acts[:, index]
        if text.ids and text.ids[0] == self.tokenizer.bos_id:
            acts = acts.clone()
            acts[0] = 0
        return acts

    def activations(self, prompt, source: str, index: int, completion=None) -> FeatureActivations:
        """One feature over a prompt (and optional completion): per-token values and max."""
        self.saes.check_index(source, index)  # None would mean "all"
        text = self.text(prompt, completion)
        values = self.feature_values(text, source, index)
        top, pos = max_outside_special(values, text.special)
        vals = tuple(float(v) for v in values)
        return FeatureActivations(source, index, text.tokens, text.special, vals, top, pos)

    def top_features_per_token(
        self, prompt, source: str, k: int = 5, completion=None
    ) -> TopPerToken:
        """The ``k`` strongest features at every position."""
        _check_count("k", k)
        text = self.text(prompt, completion)
        acts = self.feature_values(text, source)
        top = acts.topk(min(k, acts.shape[1]), dim=-1)
        return TopPerToken(
            source,
            text.tokens,
            text.special,
            tuple(tuple(map(int, r)) for r in top.indices),
            tuple(tuple(map(float, r)) for r in top.values),
        )

    def top_features(
        self,
        prompt,
        source: str,
        n: int = 10,
        positions: Sequence[int] | None = None,
        rank_by: str = "max",
        completion=None,
    ) -> TopFeatures:
        """The ``n`` features firing most over the text (non-special tokens) or ``positions``."""
        _check_count("n", n)
        if rank_by not in ("max", "sum"):
            raise RequestError("rank_by", f"must be 'max' or 'sum', got {rank_by!r}")
        text = self.text(prompt, completion)
        acts = self.feature_values(text, source)
        chosen = _positions(text, positions)
        span = acts[chosen]
        scores = span.max(0).values if rank_by == "max" else span.sum(0)
        top = scores.topk(min(n, scores.numel()))
        return TopFeatures(
            source,
            text.tokens,
            tuple(map(int, top.indices)),
            tuple(map(float, top.values)),
            tuple(tuple(map(float, acts[:, i])) for i in top.indices),
            rank_by,
        )

    def neighbours(self, source: str, index: int, n: int = 10) -> list[tuple[int, float]]:
        """Features whose decoder rows point most nearly the same way (cosine similarity)."""
        cfg = self.saes.check_index(source, index)
        _check_count("n", n)
        with self.saes.using(source) as (sae,):
            unit_rows = torch.nn.functional.normalize(sae.W_dec, dim=1)
            cos = unit_rows @ unit_rows[index]
        cos[index] = -2.0
        top = cos.topk(min(n, cfg.d_sae - 1))
        return [(int(i), float(c)) for i, c in zip(top.indices, top.values, strict=True)]

    def feature_index(self, source: str) -> FeatureIndex:
        """Searchable top tokens (and, for shipped SAEs, top contexts) of every feature."""
        cfg = self.saes.config(source)
        with self._lock_index:
            index = self._indexes.get(source)
            if index is None:

                def tokens():
                    runtime = self.model.runtime
                    with self.saes.using(source) as (sae,):
                        return top_output_tokens(
                            sae.W_dec,
                            runtime.unembed_weight.T,
                            self.tokenizer.hf,
                            final_norm_weight(runtime),
                        )

                index = FeatureIndex.load(source, cfg.folder, tokens)
                self._indexes[source] = index
            return index


def _check_count(name: str, value) -> None:
    checks.integer(name, value, lo=1)


def _positions(text: Text, positions: Sequence[int] | None) -> list[int]:
    """Non-special positions by default (all of them if every token is special)."""
    if positions is None:
        return [i for i, s in enumerate(text.special) if not s] or list(range(len(text.ids)))
    n = len(text.ids)
    try:
        chosen = list(positions)
    except TypeError:
        raise RequestError("positions", f"must be a list of integers, got {positions!r}") from None
    bad = [
        p for p in chosen if isinstance(p, bool) or not isinstance(p, Integral) or not -n <= p < n
    ]
    if bad or not chosen:
        raise RequestError("positions", f"must be non-empty and within the text: {bad}")
    return chosen
