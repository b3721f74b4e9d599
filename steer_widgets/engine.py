"""The engine: model, SAE store and steering behind a small public API.

It knows nothing of widgets. A widget (or a notebook, or a test) builds a ``SteerRequest``
and calls ``steer`` or ``steer_stream``; everything is validated before any work starts, so a
bad request raises a ``RequestError``/``SourceError`` and leaves the engine as it was.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from .activations import (
    FeatureActivations,
    ResidualCache,
    Text,
    TopFeatures,
    TopPerToken,
    max_outside_special,
    residuals,
)
from .errors import RequestError, SourceError
from .feature_index import FeatureIndex, top_output_tokens
from .generation import Row, Sampling, decode
from .model import DEFAULT_MODEL, LoadedModel, load_model
from .results import Completion, Frame, SteerResult
from .sae_store import DEFAULT_BUDGET, SAEStore
from .steering import (
    Direction,
    Plan,
    SteerRequest,
    check_combinable,
    row_op,
    sweep_label,
    unit,
    validate_shape,
)
from .tokens import EncodedPrompt

DEFAULT_CACHE_SIZE = 32
TEXT_CACHE_SIZE = 64
_default_engine: Engine | None = None
_default_lock = threading.Lock()


class Engine:
    """A model plus SAEs, ready to steer.

    ``model``: a ``LoadedModel``, a model name (the offline default unless you have network),
    or a local folder. ``saes``: SAE folders or SAE Lens ``release/sae_id`` strings, or a
    mapping from the source name to show to one of those; ``None`` registers the SAEs shipped
    for the model (the default model has them).
    """

    def __init__(
        self,
        model: LoadedModel | str = DEFAULT_MODEL,
        saes: Sequence[str | Path] | Mapping[str, str | Path] | None = None,
        sae_budget_bytes: int = DEFAULT_BUDGET,
        device: str | Sequence[str] = "cpu",
        dtype: torch.dtype = torch.float32,
        backend: str = "auto",
    ) -> None:
        self.model = (
            model if isinstance(model, LoadedModel) else load_model(model, device, dtype, backend)
        )
        self.saes = SAEStore(self.model.runtime.hook_widths(), sae_budget_bytes)
        if saes is None:
            self.saes.add_packaged(self.model.name)
        elif isinstance(saes, Mapping):
            for name, location in saes.items():
                self.saes.add(location, name)
        else:
            for location in saes:
                self.saes.add(location)
        self._defaults: OrderedDict[tuple, Completion] = OrderedDict()
        self.residual_cache = ResidualCache()
        self._indexes: dict[str, FeatureIndex] = {}
        self._texts: OrderedDict[tuple, Text] = OrderedDict()
        self._lock_index = threading.Lock()
        self._lock = threading.Lock()  # one decode at a time: the CPU is the bottleneck
        self._active: set[threading.Event] = set()
        self.stop_ids = frozenset({self.tokenizer.eos_id} - {None})

    @classmethod
    def default(cls) -> Engine:
        """The shared engine on the offline default model and its SAEs (loaded once)."""
        global _default_engine
        with _default_lock:
            if _default_engine is None:
                _default_engine = cls()
            return _default_engine

    @classmethod
    def remote(cls, url: str, token: str | None = None, saes=None, **options) -> Engine:
        """The same API over an interp-engine server (a model bigger than this machine);
        ``token`` defaults to $INTERP_ENGINE_SERVER_TOKEN. See ``remote.py``."""
        from .remote import RemoteEngine

        return RemoteEngine(url, token, saes, **options)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def hook_names(self) -> list[str]:
        return self.model.runtime.hook_names

    # -- public API ------------------------------------------------------------------------
    def steer(
        self, request: SteerRequest | Mapping, cancel: threading.Event | None = None
    ) -> SteerResult:
        """Run a request (or replay a record from ``SteerResult.to_dict()``) to the end."""
        request = _as_request(request)
        started = time.perf_counter()
        prompt, plan = self.plan(request)  # raises before any work
        frame = None
        for frame in self._stream(request, prompt, plan, cancel or threading.Event()):  # noqa: B007
            pass
        elapsed = time.perf_counter() - started
        stats = {"seconds": elapsed, "steps": frame.step if frame else 0}
        return SteerResult(request, dict(frame.outputs), prompt.ids, self.model.name, stats)

    def steer_stream(
        self, request: SteerRequest | Mapping, cancel: threading.Event | None = None
    ) -> Iterator[Frame]:
        """Yield a ``Frame`` after every decode step: each output's text and ids so far.

        Every output is decoded in one batch and is token for token what it would be if
        requested alone with the same seed. A DEFAULT already computed for this prompt and
        these sampling settings is reused, not regenerated.
        """
        request = _as_request(request)
        prompt, plan = self.plan(request)  # raises before any work
        return self._stream(request, prompt, plan, cancel or threading.Event())

    def generate(self, prompt, **sampling) -> Completion:
        """The model's own completion (no steering), e.g. ``engine.generate("Hi", seed=1)``."""
        request = SteerRequest(prompt=prompt, types=("DEFAULT",), **sampling)
        return self.steer(request).outputs["DEFAULT"]

    def result(self, request: SteerRequest, outputs: Mapping[str, Completion]) -> SteerResult:
        """Wrap outputs gathered from ``steer_stream`` as a ``SteerResult`` (for records)."""
        prompt = self._encode(request)
        return SteerResult(request, dict(outputs), prompt.ids, self.model.name)

    def clear_caches(self) -> None:
        """Forget cached DEFAULT completions and residuals (SAEs stay loaded)."""
        self._defaults.clear()
        self._texts.clear()
        self.residual_cache = ResidualCache(self.residual_cache.budget_bytes)

    def cancel_all(self) -> None:
        """Stop every running generation within one decode step."""
        for event in list(self._active):
            event.set()

    def plan(self, request: SteerRequest) -> tuple[EncodedPrompt, Plan]:
        """Validate ``request`` against the model and SAEs and build its rows."""
        validate_shape(request)
        prompt = self._encode(request)
        sampling = request.sampling
        sampling.validate(self.model.runtime.cfg.max_context - len(prompt.ids))
        directions = self._directions(request)
        check_combinable(request.steer_method, directions)
        mask = None
        if not request.steer_special_tokens:
            mask = torch.tensor(prompt.special, dtype=torch.bool)
        plan = Plan()
        if "DEFAULT" in request.types:
            plan.labels.append("DEFAULT")
            plan.rows.append(Row())
        multipliers = []
        if "STEERED" in request.types:
            multipliers.append(("STEERED", request.strength_multiplier))
        multipliers += [(sweep_label(m), m) for m in request.sweep]
        by_hook: dict[str, list[Direction]] = {}
        for d in directions:
            by_hook.setdefault(d.hook, []).append(d)
        for label, mult in multipliers:
            ops = {h: row_op(request.steer_method, ds, mult, mask) for h, ds in by_hook.items()}
            plan.labels.append(label)
            plan.rows.append(Row(ops))
        return prompt, plan

    # -- activations -----------------------------------------------------------------------
    def text(self, prompt, completion: Completion | Sequence[int] | None = None) -> Text:
        """Tokens to analyse: a prompt (str or chat), optionally followed by a completion."""
        if isinstance(prompt, Text):
            return prompt
        extra = completion.token_ids if isinstance(completion, Completion) else completion
        key = (json.dumps(prompt, sort_keys=True), tuple(extra or ()))
        cached = self._texts.get(key)
        if cached is not None:
            return cached
        enc = self.tokenizer.encode(prompt, self.model.runtime.cfg.max_context)
        ids, special = list(enc.ids), list(enc.special)
        if extra:
            ids += list(extra)
            special += [i in self.tokenizer.special_ids for i in extra]
        if len(ids) > self.model.runtime.cfg.max_context:
            raise RequestError("prompt", f"is {len(ids)} tokens; the context allows fewer")
        tokens = self.tokenizer.token_strings(ids)
        text = Text(tuple(ids), tuple(tokens), tuple(special))
        self._texts[key] = text
        while len(self._texts) > TEXT_CACHE_SIZE:
            self._texts.popitem(last=False)
        return text

    def feature_values(self, text: Text, source: str, index: int | None = None) -> Tensor:
        """Activations [T] of one feature (or [T, d_sae] of all) over ``text``; BOS zeroed."""
        cfg = self.saes.config(source)
        if index is not None and not 0 <= index < cfg.d_sae:
            raise SourceError(source, f"feature index {index} out of range 0..{cfg.d_sae - 1}")
        also = [self.saes.config(s).hook_name for s in self.saes.sources()]
        resid = residuals(self.model.runtime, self.residual_cache, text.ids, [cfg.hook_name], also)
        if index is not None and not cfg.k:  # one encoder column is enough without TopK
            with self.saes.using(source) as (sae,):
                acts = sae.encode_one(resid[cfg.hook_name], index)
        else:  # all features, kept beside the residuals: another feature is a lookup
            acts = self.residual_cache.get(text.ids, f"{source}:acts")
            if acts is None:
                with self.saes.using(source) as (sae,):
                    acts = sae.encode(resid[cfg.hook_name])
                self.residual_cache.put(text.ids, f"{source}:acts", acts)
            acts = acts if index is None else acts[:, index]
        if text.ids and text.ids[0] == self.tokenizer.bos_id:
            acts = acts.clone()
            acts[0] = 0
        return acts

    def activations(self, prompt, source: str, index: int, completion=None) -> FeatureActivations:
        """One feature over a prompt (and optional completion): per-token values and max."""
        text = self.text(prompt, completion)
        values = self.feature_values(text, source, index)
        top, pos = max_outside_special(values, text.special)
        vals = tuple(float(v) for v in values)
        return FeatureActivations(source, index, text.tokens, text.special, vals, top, pos)

    def top_features_per_token(
        self, prompt, source: str, k: int = 5, completion=None
    ) -> TopPerToken:
        """The ``k`` strongest features at every position."""
        if k < 1:
            raise RequestError("k", f"must be >= 1, got {k}")
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
        if rank_by not in ("max", "sum"):
            raise RequestError("rank_by", f"must be 'max' or 'sum', got {rank_by!r}")
        text = self.text(prompt, completion)
        acts = self.feature_values(text, source)
        if positions is None:
            chosen = [i for i, s in enumerate(text.special) if not s] or list(range(len(text.ids)))
        else:
            bad = [p for p in positions if not -len(text.ids) <= p < len(text.ids)]
            if bad or not positions:
                raise RequestError("positions", f"must be non-empty and within the text: {bad}")
            chosen = list(positions)
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
        cfg = self.saes.config(source)
        if not 0 <= index < cfg.d_sae:
            raise SourceError(source, f"feature index {index} out of range 0..{cfg.d_sae - 1}")
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
                    with self.saes.using(source) as (sae,):
                        unembed = self.model.runtime.unembed_weight.T
                        return top_output_tokens(sae.W_dec, unembed, self.tokenizer.hf)

                index = FeatureIndex.load(source, cfg.folder, tokens)
                self._indexes[source] = index
            return index

    # -- internals -------------------------------------------------------------------------
    def _encode(self, request: SteerRequest) -> EncodedPrompt:
        return self.tokenizer.encode(request.prompt, self.model.runtime.cfg.max_context - 1)

    def _directions(self, request: SteerRequest) -> list[Direction]:
        out = []
        for i, f in enumerate(request.features):
            try:
                cfg = self.saes.config(f.source)
                vec = self.saes.decoder_row(f.source, f.index)
            except SourceError as err:
                raise RequestError(f"features[{i}]", str(err)) from err
            if request.normalize_steering:
                vec = unit(vec, f"features[{i}]")
            out.append(Direction(cfg.hook_name, vec, float(f.strength)))
        widths = self.model.runtime.hook_widths()
        for i, v in enumerate(request.vectors):
            if v.hook not in widths:
                raise RequestError(f"vectors[{i}].hook", f"the model has no hook {v.hook!r}")
            vec = torch.as_tensor(v.vector, dtype=torch.float32).flatten()
            if vec.numel() != widths[v.hook]:
                raise RequestError(
                    f"vectors[{i}].vector",
                    f"has width {vec.numel()}, but {v.hook} is {widths[v.hook]} wide",
                )
            if not torch.isfinite(vec).all():
                raise RequestError(f"vectors[{i}].vector", "contains NaN or infinite values")
            if request.normalize_steering:
                vec = unit(vec, f"vectors[{i}].vector")
            out.append(Direction(v.hook, vec, float(v.strength)))
        return out

    def _stream(self, request, prompt, plan, cancel) -> Iterator[Frame]:
        key = (prompt.ids, request.sampling)
        outputs: dict[str, Completion] = {}
        cached = self._defaults.get(key) if "DEFAULT" in plan.labels else None
        labels, rows = plan.labels, plan.rows
        if cached is not None:
            outputs["DEFAULT"] = cached
            labels, rows = labels[1:], rows[1:]
        for label in labels:
            outputs[label] = Completion("", ())
        if not rows:
            yield Frame(_ordered(outputs, plan.labels), 0, done=True)
            return
        ids: list[list[int]] = [[] for _ in rows]
        self._active.add(cancel)
        step = 0
        try:
            with self._lock:
                for step_out in decode(
                    self.model.runtime, prompt.ids, rows, request.sampling, self.stop_ids, cancel
                ):
                    step += 1
                    for r, token in enumerate(step_out.tokens):
                        if token is not None:
                            ids[r].append(token)
                    for r, label in enumerate(labels):
                        outputs[label] = self._completion(ids[r], "eos" if step_out.done[r] else "")
                    yield Frame(_ordered(outputs, plan.labels), step)
        finally:
            self._active.discard(cancel)
        stop = "cancelled" if cancel.is_set() else "length"
        for r, label in enumerate(labels):
            if outputs[label].stop != "eos":
                outputs[label] = self._completion(ids[r], stop)
        if "DEFAULT" in labels and outputs["DEFAULT"].stop != "cancelled":
            self._remember_default(key, outputs["DEFAULT"])
        yield Frame(_ordered(outputs, plan.labels), step, done=True)

    def _completion(self, ids: list[int], stop: str) -> Completion:
        text_ids = [i for i in ids if i not in self.stop_ids]
        return Completion(self.tokenizer.decode(text_ids), tuple(ids), stop)

    def _remember_default(self, key: tuple, completion: Completion) -> None:
        self._defaults[key] = completion
        self._defaults.move_to_end(key)
        while len(self._defaults) > DEFAULT_CACHE_SIZE:
            self._defaults.popitem(last=False)


def _ordered(outputs: dict[str, Completion], labels: list[str]) -> dict[str, Completion]:
    return {label: outputs[label] for label in labels}


def _as_request(request: SteerRequest | Mapping) -> SteerRequest:
    if isinstance(request, SteerRequest):
        return request
    if isinstance(request, Mapping):
        return SteerRequest.from_dict(request.get("request", request))
    raise RequestError("request", f"must be a SteerRequest or a record dict, got {type(request)}")


__all__ = ["Engine", "Sampling"]
