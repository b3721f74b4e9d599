"""Concepts: difference-in-means steering vectors, and SAE features ranked for steering.

Why this exists: a feature found by matching its top tokens or contexts to a word is a
feature that *reads* the word, and adding a reading feature rarely makes the model *write*
about it. What steers is a direction along which text about the concept differs from
text about other things. So a concept is measured, not looked up:

1. examples. For a concept *name*: requests about it ("Write a few sentences about
   chocolate.", as the model sees them before it answers) against the same requests about
   47 other everyday subjects (one-vs-rest, shipped in ``data/contrast.json``), read at every
   position but the attention sink. Where the model has just been asked about a subject is
   where it represents "the topic is X" with least of the answers' style; on the dev half of
   the steering benchmark it steered more often than the mean over the model's own answers
   (46% against 33%, at +0.89 against +0.71 nat; on the report half as often, 35%, at +0.88
   against +0.71), it ranks features that steer better on both halves, and it needs no
   sampling. Given *texts or chats* (or a name with the
   caller's own negatives), the examples are those texts (or the model's own answers,
   several samples decoded in one batch) and the contrast set's answers, read over their
   content tokens;
2. the concept direction at a hook: the difference of the two means (each example weighs
   the same);
3. features ranked by the cosine of their decoder row with that direction (what adding the
   row does), and a strength recommended in units of the hook's typical residual norm.

Strengths are residual-stream lengths: a strength of ``s`` adds a vector of norm ``s``
(decoder rows and concept vectors are unit length), and ``typical_norm(hook)`` is the median
norm of the residual over the neutral set's content tokens, so ``s / typical_norm`` says how
hard a push is whatever the model or layer.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from .. import checks
from ..errors import Cancelled, RequestError
from ..lru import LRU
from ..runtime.protocol import hook_layer

NEUTRAL_FILE = Path(__file__).parents[1] / "data" / "neutral.json"
CONTRAST_FILE = Path(__file__).parents[1] / "data" / "contrast.json"
CACHED_SETS = 64  # example sets whose per-hook means are kept (a few concepts' worth)
EXAMPLE_TEMPLATES = (
    "Write a few sentences about {c}.",
    "Tell me something interesting about {c}.",
    "Describe {c} in a short paragraph.",
)
SAMPLES_PER_TEMPLATE = 3
EXAMPLE_TOKENS = 40
EXAMPLE_TEMPERATURE = 0.8
# Measured on the dev half of benchmarks/data/steer_concepts.json with scripts/tune_steering.py
# (docs/steering-efficacy.md): with contrast-set negatives, the layer where concept vectors
# steered best at a fluency cost under 1 nat (layer 12 of SmolLM2's 30, 40% success at +0.70
# nat on 12 dev concepts; layers 6-14, several layers at once, 8 samples per request and
# chat+plain examples tried and no better), as a fraction of depth, and the strengths in
# typical residual norms (0.25-0.5 tried; 0.3 gave 44% at +1.02; 1.0 wrecks the text).
CONCEPT_DEPTH = 0.41
# The recommended ``prompt_multiplier``: the prompt's positions pushed twice as hard as the
# generated tokens (2026-12-01, 3fea35f; same dev half, concept vectors at layer 12): 0.6 on the
# prompt and 0.3 on generated tokens steered 55% at +0.93 nat, against 46% at +0.89 at 0.35
# everywhere. In chat the pushed request sets the topic (the prompt alone at 0.5: 65% of chat
# pairs at +0.77), while a completion prompt is a few tokens and needs the push on what is
# generated (the prompt alone: 2%).
PROMPT_MULTIPLIER = 2.0


@dataclass(frozen=True)
class Shares:
    """Recommended strengths in typical norms at one ``prompt_multiplier``: each the strongest
    that stayed under the 1-nat fluency budget on the dev half of the steering benchmark."""

    request: float  # a concept name's request direction
    texts: float  # a vector from texts (the mean over their content tokens)
    feature: float  # a concept-search feature


# Keyed by the prompt multiplier they were measured with: an engine that can only steer every
# position alike (a remote server) recommends the x1 strengths, the local engine the x2 ones.
# x1 (2026-11-30, every position alike): request 0.35 steered 46% at +0.89 nat
# (0.3: 39% at +1.01; 0.4: 53% at +1.08, over budget; layers 9 and 15 did worse); texts 0.25:
# 33% at +0.71; features 0.4 (best match over the five SAEs): 32.3% at +1.01; with the
# layer-12 search (2026-12-01, df1b88f) 0.3 / 0.35 / 0.4 / 0.45: 21.9 / 25.0 / 31.2 / 29.2% at
# +0.73 / +0.89 / +1.04 / +1.31 (kept at 0.4 by the rule fixed before: no step 8 points better).
# x2 (2026-12-01, 3fea35f): request 0.3 (55.2% at +0.93); texts 0.2 / 0.25: 36% / 44% at +0.81 /
# +1.03; features 0.2 / 0.225 / 0.25 / 0.275 / 0.3: 22.9% / 28.1% / 26.0% / 40.6% / 39.6% at
# +0.60 / +0.69 / +0.97 / +1.08 / +1.19 (success moves +-7 points between ladder steps).
SHARES = {
    1.0: Shares(request=0.35, texts=0.25, feature=0.4),
    PROMPT_MULTIPLIER: Shares(request=0.3, texts=0.2, feature=0.25),
}

Prompt = str | Sequence[dict]


@dataclass(frozen=True)
class FeatureMatch:
    """An SAE feature suggested for a concept: ``score`` ranks it, ``strength`` is where to
    start the slider (residual units)."""

    source: str
    index: int
    score: float
    label: str
    strength: float


class FeatureMatches(list):
    """A ranked list of ``FeatureMatch`` with a pandas view."""

    def to_frame(self):
        import pandas as pd

        cols = ["source", "index", "score", "label", "strength"]
        return pd.DataFrame([[getattr(m, c) for c in cols] for m in self], columns=cols)


@lru_cache(maxsize=1)
def neutral_examples() -> tuple[Prompt, ...]:
    """The shipped neutral set: the default model's answers to topic-free requests."""
    data = json.loads(NEUTRAL_FILE.read_text())
    return tuple(data["chats"])


@lru_cache(maxsize=1)
def contrast_examples() -> tuple[tuple[Prompt, ...], tuple[str, ...]]:
    """The shipped one-vs-rest baseline: (chats, the subject of each chat)."""
    data = json.loads(CONTRAST_FILE.read_text())
    return tuple(data["chats"]), tuple(data["chat_subjects"])


def baseline(concept: str | None = None) -> list[Prompt]:
    """The default negatives: the contrast set, less any subject that names ``concept``
    (so "fruit" is not contrasted with answers about fruit)."""
    chats, subjects = contrast_examples()
    return [e for e, s in zip(chats, subjects, strict=True) if not _names(concept or "", s)]


@lru_cache(maxsize=2)
def contrast_requests(chat: bool) -> tuple[tuple[Prompt, ...], tuple[str, ...]]:
    """The contrast set's requests, once each: (prompts, the subject of each)."""
    _, subjects = contrast_examples()
    unique = list(dict.fromkeys(subjects))
    prompts = [(p, s) for s in unique for p in example_prompts(s, chat)]
    return tuple(p for p, _ in prompts), tuple(s for _, s in prompts)


def request_baseline(concept: str, chat: bool) -> list[Prompt]:
    """The requests about every contrast subject that does not name ``concept``."""
    prompts, subjects = contrast_requests(chat)
    return [p for p, s in zip(prompts, subjects, strict=True) if not _names(concept, s)]


def _names(concept: str, subject: str) -> bool:
    c, s = concept.strip().lower(), subject.lower()
    return bool(c) and (c in s or s in c)


def example_prompts(concept: str, chat: bool) -> list[Prompt]:
    """The requests about ``concept``: read as they are for a concept name's direction, and
    answered by the model for its own examples (``Concepts.examples``)."""
    if chat:
        return [[{"role": "user", "content": t.format(c=concept)}] for t in EXAMPLE_TEMPLATES]
    return [f"Here is a short text about {concept}:\n"]


def check_examples(examples, field: str) -> list[Prompt]:
    """A non-empty list of texts or chats, or a clear error naming ``field``."""
    if isinstance(examples, str) or not isinstance(examples, Sequence) or not examples:
        raise RequestError(field, "must be a concept name or a non-empty list of texts or chats")
    for i, e in enumerate(examples):
        ok = isinstance(e, str) or (isinstance(e, Sequence) and all(isinstance(m, dict) for m in e))
        if not ok:
            raise RequestError(f"{field}[{i}]", "must be a text or a list of {role, content}")
    return list(examples)


def plain_if_no_template(example: Prompt, has_chat_template: bool) -> Prompt:
    """A base model without a chat template (GPT-2, Pythia, Llama and Qwen base models)
    reads a chat example as its messages' text, one paragraph each: the shipped neutral and
    contrast sets are chats, and refusing them refused every feature such a model's
    explorer was given (its strength is read in the typical norm they measure)."""
    if isinstance(example, str) or has_chat_template:
        return example
    return "\n\n".join(m["content"] for m in example)


def content_rows(resid: Tensor, special: Sequence[bool]) -> Tensor:
    """The residual rows of an example's content tokens (the last row if it has none)."""
    keep = ~torch.tensor(special, dtype=torch.bool)
    keep[0] = False
    return resid[keep] if keep.any() else resid[-1:]


def request_rows(resid: Tensor, special: Sequence[bool]) -> Tensor:
    """Every row of a request but position 0 (the attention sink): the chat scaffolding after
    the request, special tokens included, is where the model has read it and will answer."""
    return resid[1:] if resid.shape[0] > 1 else resid


ROWS = {"content": content_rows, "request": request_rows}  # which positions an example gives


def direction(pos_means: Tensor, neg_means: Tensor) -> Tensor:
    """Difference in means [d] of per-example means [n, d]."""
    return pos_means.mean(0) - neg_means.mean(0)


def rank_by_direction(w_dec: Tensor, d: Tensor) -> Tensor:
    """Cosine of every decoder row with direction ``d``: what adding the row moves along."""
    rows = torch.nn.functional.normalize(w_dec.float(), dim=1)
    return rows @ (d / d.norm().clamp_min(1e-12))


def matching_pursuit(w_dec: Tensor, v: Tensor, n: int) -> list[tuple[int, float]]:
    """Greedy sparse explanation of ``v`` by decoder rows: (index, share of ``|v|``) pairs.

    Each step takes the row most aligned with what is still unexplained and removes its
    projection, so two features planted in a vector are both named (plain cosine ranking
    would name one and then its near neighbours).
    """
    rows = torch.nn.functional.normalize(w_dec.float(), dim=1)
    residual = v.float().clone()
    total = float(v.norm().clamp_min(1e-12))
    picked: list[tuple[int, float]] = []
    for _ in range(min(n, rows.shape[0])):
        coef = rows @ residual
        if picked:
            coef[[i for i, _ in picked]] = 0.0
        i = int(coef.abs().argmax())
        c = float(coef[i])
        picked.append((i, c / total))
        residual = residual - c * rows[i]
    return picked


Stats = LRU[str, dict[str, tuple[Tensor, Tensor]]]
# Per loaded model: the per-hook statistics of example sets, which depend on the weights and
# the tokenizer alone, so every Engine over one model (other SAEs, say) shares them and a
# baseline set runs through the model once per process, not once per Engine.
_STATS: weakref.WeakKeyDictionary[object, dict[int, Stats]] = weakref.WeakKeyDictionary()
_STATS_LOCK = threading.Lock()  # engines on other threads share these maps


def _model_stats(model) -> Stats:
    """The statistics cache of ``model`` (its runtime and tokenizer), made on first use."""
    with _STATS_LOCK:
        per_tokenizer = _STATS.setdefault(model.runtime, {})
        return per_tokenizer.setdefault(id(model.tokenizer), LRU(CACHED_SETS))


class Concepts:
    """The engine's concept tools, with their caches (examples per concept, typical norms).

    Kept apart from ``Engine`` so the engine stays a thin public surface; it reads the model
    only through the engine's public pieces (``text``, the residual cache, the SAE store).
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        # The run, the concept-sets worker and an evaluation share one engine: the LRU's
        # owner locks it (lru.py), and one lock per concept lets a second asker wait for
        # the first one's examples instead of sampling the same set again.
        self._lock = threading.Lock()
        self._examples: LRU[str, list[Prompt]] = LRU(CACHED_SETS)
        self._writing: dict[str, threading.Lock] = {}

    def clear(self) -> None:
        """Forget the examples the model wrote (``Engine.clear_caches``)."""
        with self._lock:
            self._examples.clear()
            self._writing.clear()

    # -- examples and means --------------------------------------------------------------
    def examples(self, concept: str) -> list[Prompt]:
        """Texts about ``concept`` written by the model itself (cached per concept)."""
        concept = concept.strip()
        if not concept:
            raise RequestError("query", "is empty")
        with self._lock:
            writing = self._writing.setdefault(concept, threading.Lock())
        with writing:
            return self._examples.get_or_compute(concept, lambda: self._sample(concept), self._lock)

    def _sample(self, concept: str) -> list[Prompt]:
        eng = self.engine
        chat = eng.tokenizer.has_chat_template
        out: list[Prompt] = []
        for prompt in example_prompts(concept, chat):
            samples = eng.samples(
                prompt,
                SAMPLES_PER_TEMPLATE,
                temperature=EXAMPLE_TEMPERATURE,
                freq_penalty=0.0,
                seed=0,
                n_completion_tokens=EXAMPLE_TOKENS,
            )
            if not all(s.complete for s in samples):  # cut off by cancel_all: keep none
                raise Cancelled(f"the model's examples about {concept!r}")
            for s in samples:
                if chat:
                    out.append([*prompt, {"role": "assistant", "content": s.text}])
                else:
                    out.append(prompt + s.text)
        return out

    def means(
        self, examples: Sequence[Prompt], hooks: Sequence[str], rows: str = "content"
    ) -> dict[str, Tensor]:
        """Per hook, the per-example means [n, d] over ``ROWS[rows]`` (cached per set)."""
        return {h: m for h, (m, _) in self._stats(examples, hooks, rows).items()}

    def typical_norm(self, hook: str) -> float:
        """Median residual norm at ``hook`` over the neutral set's content tokens."""
        self._check_hook(hook, "hook")
        return float(self._stats(neutral_examples(), [hook])[hook][1].median())

    def _stats(
        self, examples: Sequence[Prompt], hooks: Sequence[str], rows: str = "content"
    ) -> dict[str, tuple]:
        """Per hook: (per-example means [n, d] over ``ROWS[rows]``, every such row's norm).

        One forward per example captures every hook asked for, and with them every concept
        hook (the default layer, each SAE's) that the same truncated pass reaches anyway, so
        a later search or vector on the same examples is a cache hit. The results of the
        last ``CACHED_SETS`` example sets are kept: the baselines run through the model once.
        """
        from .activations import residuals

        key = json.dumps([rows, list(examples)], sort_keys=True)
        pick = ROWS[rows]
        cache = _model_stats(self.engine.model)
        with _STATS_LOCK:
            have = cache.get(key) or {}
        missing = [h for h in dict.fromkeys(hooks) if h not in have]
        if missing:
            deepest = max(hook_layer(h) or 0 for h in missing)
            extra = [
                h
                for h in self._concept_hooks()
                if h not in have and h not in missing and (hook_layer(h) or 0) <= deepest
            ]
            grab = missing + extra
            eng = self.engine
            means: dict[str, list[Tensor]] = {h: [] for h in grab}
            norms: dict[str, list[Tensor]] = {h: [] for h in grab}
            for e in examples:
                text = eng.text(plain_if_no_template(e, eng.tokenizer.has_chat_template))
                res = residuals(eng.model.runtime, eng.residual_cache, text.ids, grab)
                for h in grab:
                    picked = pick(res[h], text.special)
                    means[h].append(picked.mean(0))
                    norms[h].append(picked.norm(dim=-1))
            for h in grab:
                have[h] = (torch.stack(means[h]), torch.cat(norms[h]))
            with _STATS_LOCK:
                cache.put(key, have)
        return {h: have[h] for h in hooks}

    def _concept_hooks(self) -> list[str]:
        """The hooks concept tools read, each once: the default layer and every whole-hook
        SAE's (several SAEs may read one hook; listed once per SAE, a hook read on the way
        to a deeper one was captured once per SAE, and its per-example means had a row per
        SAE for every example)."""
        saes = self.engine.saes
        hooks = [
            self.default_hook(),
            *(saes.config(s).hook_name for s in self._whole_hook_sources()),
        ]
        return list(dict.fromkeys(hooks))

    def default_sources(self) -> list[str]:
        """The whole-hook SAEs nearest the concept layer, where steering works. Cosines are not
        comparable across layers: on the dev half (2026-12-01, 0a2c579) the best match over all
        five shipped SAEs took layer 5 for 5 of 24 concepts (its rows align better and steer
        worse) and steered 26.0% at +0.97 nat, the best over the two layer-12 SAEs 34.4% at
        +0.87. SAEs at hooks without a layer number count only when no other is registered."""
        whole = self._whole_hook_sources()
        layers = {s: self.engine.saes.config(s).layer for s in whole}
        placed = [s for s in whole if layers[s] is not None]
        if not placed:
            return whole
        target = hook_layer(self.default_hook())
        nearest = min(abs(layers[s] - target) for s in placed)
        return [s for s in placed if abs(layers[s] - target) == nearest]

    def _given_sources(self, sources) -> list[str]:
        """``sources`` as a caller gave them (``search`` and ``features`` alike): at least one
        registered SAE (a SourceError names an unknown one), each reading its whole hook, as
        a concept direction there can only be compared with such an SAE's rows."""
        chosen = list(checks.sequence("sources", sources))
        if not chosen:
            raise RequestError("sources", "must name at least one SAE")
        for i, s in enumerate(chosen):
            checks.text(f"sources[{i}]", s)
            if not self._reads_whole_hook(s):
                hook = self.engine.saes.config(s).hook_name
                raise RequestError(
                    f"sources[{i}]",
                    f"{s} reads one head's slice of {hook}: no concept direction to compare "
                    "its rows with",
                )
        return chosen

    def _whole_hook_sources(self) -> list[str]:
        """The SAEs that read their whole hook (not one head's slice): the ones a concept
        direction at the hook can be compared with."""
        return [s for s in self.engine.saes.sources() if self._reads_whole_hook(s)]

    def _reads_whole_hook(self, source: str) -> bool:
        """Whether ``source`` reads its whole hook (a SourceError names an unknown one)."""
        cfg = self.engine.saes.config(source)
        return cfg.d_in == self.engine.model.runtime.hook_widths().get(cfg.hook_name)

    # -- the public tools ------------------------------------------------------------------
    def shares(self) -> Shares:
        """The recommended strengths measured with the engine's recommended prompt multiplier
        (the nearest one measured, for an engine that recommends another)."""
        pm = self.engine.default_prompt_multiplier()
        return SHARES[min(SHARES, key=lambda m: abs(m - pm))]

    def feature_strength(self, hook: str) -> float:
        return round(self.shares().feature * self.typical_norm(hook), 2)

    def default_hook(self) -> str:
        n = self.engine.model.runtime.cfg.n_layers
        return f"blocks.{round(CONCEPT_DEPTH * (n - 1))}.hook_resid_post"

    def vector(self, positive, negative=None, hook: str | None = None):
        """A difference-in-means ``Vector`` (unit direction, recommended strength)."""
        from ..steering.requests import Vector

        hook = self.default_hook() if hook is None else self._check_hook(hook, "hook")
        pos, neg, rows = self._sets(positive, negative, "positive")
        d = direction(self.means(pos, [hook], rows)[hook], self.means(neg, [hook], rows)[hook])
        if not torch.isfinite(d).all() or float(d.norm()) == 0.0:
            raise RequestError("positive", "does not differ from the negative examples")
        share = self.shares().request if rows == "request" else self.shares().texts
        return Vector(d / d.norm(), hook, round(share * self.typical_norm(hook), 2))

    def search(self, query: str, sources=None, n: int = 10, examples=None) -> FeatureMatches:
        """SAE features ranked by how well adding them pushes toward ``query``."""
        if not isinstance(query, str) or not query.strip():
            raise RequestError("query", "must be a non-empty string")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RequestError("n", f"must be a positive integer, got {n!r}")
        saes = self.engine.saes
        sources = self.default_sources() if sources is None else self._given_sources(sources)
        if not sources:
            raise RequestError("sources", "no SAE that reads a whole hook is registered")
        hooks = {s: saes.config(s).hook_name for s in sources}
        given = query if examples is None else examples
        pos, neg, rows = self._sets(given, None, "examples", query)
        wanted = sorted(set(hooks.values()))
        pm, nm = self.means(pos, wanted, rows), self.means(neg, wanted, rows)
        found = []
        for source, hook in hooks.items():
            d = direction(pm[hook], nm[hook])
            with saes.using(source) as (sae,):
                cos = rank_by_direction(sae.W_dec, d)
            top = cos.topk(min(n, cos.numel()))
            strength = self.feature_strength(hook)
            labels = self.engine.feature_index(source)
            for score, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                found.append(FeatureMatch(source, i, score, labels.label(i), strength))
        found.sort(key=lambda m: -m.score)
        return FeatureMatches(found[:n])

    def decompose(self, vector, source: str, n: int = 10) -> FeatureMatches:
        """The features of ``source`` that best explain ``vector`` (matching pursuit)."""
        from ..steering.requests import Vector

        v = vector.vector if isinstance(vector, Vector) else vector
        cfg = self.engine.saes.config(source)
        try:
            v = torch.as_tensor(v, dtype=torch.float32).flatten()
        except (TypeError, ValueError, RuntimeError):
            raise RequestError("vector", f"must be a vector of width {cfg.d_in}") from None
        if v.numel() != cfg.d_in or not torch.isfinite(v).all() or float(v.norm()) == 0:
            raise RequestError("vector", f"must be a finite, non-zero vector of width {cfg.d_in}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RequestError("n", f"must be a positive integer, got {n!r}")
        with self.engine.saes.using(source) as (sae,):
            picked = matching_pursuit(sae.W_dec, v, n)
        labels = self.engine.feature_index(source)
        strength = self.feature_strength(cfg.hook_name)
        return FeatureMatches(
            FeatureMatch(source, i, share, labels.label(i), strength) for i, share in picked
        )

    def features(self, concept, k=None, sources=None, examples=None):
        """``concept`` as at most ``k`` SAE features that steer together (a
        ``ConceptFeatures``): the concept vector (of a name, texts or chats, ``examples``
        about a name, or a ``Vector`` as given) written as a non-negative sum of the decoder
        rows of ``sources`` (default: the SAEs at the vector's hook nearest the concept
        layer), strengths scaled to the vector's recommended push (concept_features.py)."""
        from ..steering.requests import Vector
        from . import concept_features as cf

        cf.check_concept(concept)
        k = cf.check_k(k)
        name = concept.strip() if isinstance(concept, str) else None
        if examples is not None and name is None:
            raise RequestError("examples", "is for a concept name; pass texts as the concept")
        if isinstance(concept, Vector):
            hook = self._check_hook(concept.hook, "concept.hook")
            checks.number("concept.strength", concept.strength, minimum=1e-9)
            v = checks.floats("concept.vector", concept.vector).flatten()
            width = self.engine.model.runtime.hook_widths()[hook]
            if v.numel() != width or float(v.norm()) == 0.0:
                raise RequestError("concept.vector", f"must be a non-zero vector of width {width}")
        else:
            hook = self.default_hook()
        chosen = self._feature_sources(sources, hook)  # every check before any work
        vector = concept if isinstance(concept, Vector) else self.vector(examples or concept)
        direction = torch.as_tensor(vector.vector, dtype=torch.float32).flatten()
        direction = direction / direction.norm().clamp_min(1e-12)
        with self.engine.saes.using(*chosen) as saes:
            rows = torch.cat([sae.W_dec.detach().float() for sae in saes])
            sizes = [sae.W_dec.shape[0] for sae in saes]
        owners = [(s, i) for s, n in zip(chosen, sizes, strict=True) for i in range(n)]
        fit = cf.fit_rows(rows, direction * vector.strength, k)
        labels = [self.engine.feature_index(owners[i][0]).label(owners[i][1]) for i in fit.indices]
        return cf.set_from_fit(fit, owners, rows, direction, vector.strength, labels, name)

    def _feature_sources(self, sources, hook: str) -> list[str]:
        """The SAEs a set is drawn from: ``sources`` as given (each must read ``hook``
        whole), or the default sources when they read ``hook``, else every whole-hook SAE
        there."""
        saes = self.engine.saes
        if sources is not None:
            chosen = self._given_sources(sources)
            for i, s in enumerate(chosen):
                if saes.config(s).hook_name != hook:
                    raise RequestError(
                        f"sources[{i}]", f"{s} does not read the concept's hook {hook}"
                    )
            return chosen
        chosen = [s for s in self.default_sources() if saes.config(s).hook_name == hook]
        chosen = chosen or [
            s for s in self._whole_hook_sources() if saes.config(s).hook_name == hook
        ]
        if not chosen:
            raise RequestError("concept.hook", f"no SAE that reads the whole of {hook} is loaded")
        return chosen

    # -- helpers -----------------------------------------------------------------------------
    def _sets(
        self, positive, negative, field: str, concept: str | None = None
    ) -> tuple[list[Prompt], list[Prompt], str]:
        """(positive examples, negative examples, which rows to read): a concept name alone
        gives requests against the contrast requests; texts, chats, or a name with the
        caller's negatives give content means against the caller's or the contrast answers."""
        if isinstance(positive, str):
            name = positive.strip()
            if not name:
                raise RequestError(field, "is empty")
            if negative is None:
                chat = self.engine.tokenizer.has_chat_template
                return example_prompts(name, chat), request_baseline(name, chat), "request"
            return self.examples(name), check_examples(negative, "negative"), "content"
        pos = check_examples(positive, field)
        if negative is not None:
            return pos, check_examples(negative, "negative"), "content"
        return pos, baseline(concept), "content"

    def _check_hook(self, hook: str, field: str) -> str:
        if not isinstance(hook, str) or hook not in self.engine.model.runtime.hook_widths():
            raise RequestError(field, f"the model has no hook {hook!r}")
        return hook
