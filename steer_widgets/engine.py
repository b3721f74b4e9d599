"""The engine: model, SAE store and steering behind a small public API.

It knows nothing of widgets. A widget (or a notebook, or a test) builds a ``SteerRequest``
and calls ``steer`` or ``steer_stream``; everything is validated before any work starts, so a
bad request raises a ``RequestError``/``SourceError`` and leaves the engine as it was.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from . import checks
from .analysis.activations import FeatureActivations, ResidualCache, Text, TopFeatures, TopPerToken
from .analysis.concept_features import ConceptFeatures
from .analysis.concepts import PROMPT_MULTIPLIER, Concepts, FeatureMatches
from .analysis.condition_scores import ConditionScores
from .analysis.evaluation import Evaluation
from .analysis.readout import Readout, readout
from .analysis.text import Analysis
from .checks import public_methods
from .errors import RequestError
from .runtime.model import DEFAULT_MODEL, LoadedModel, load_model, products_name
from .runtime.tokens import EncodedPrompt
from .sae.feature_index import FeatureIndex
from .sae.hook_view import centres_writes
from .sae.store import DEFAULT_BUDGET, SAEStore, check_locations
from .steering.batch import plan_batch
from .steering.chat import Chat
from .steering.conditions import When
from .steering.decoder import Decoder, Transcript
from .steering.gates import Resolved
from .steering.gates import resolve as resolve_gates
from .steering.generation import Row, Sampling
from .steering.requests import (
    Plan,
    SteerRequest,
    Vector,
    build_plan,
    conditioned,
    output_multipliers,
    resolve_directions,
    sample_seeds,
    unsteered,
    validate_shape,
)
from .steering.results import Completion, Frame, SteerResult, as_request, check_outputs, ordered
from .steering.vectors import request_vectors

_default_engine: Engine | None = None
_default_lock = threading.Lock()
_KINDS: dict[str, type[Engine]] = {}  # filled by subclasses declared with kind= (remote/engine.py)


def check_products_of(model: LoadedModel, products: str | None) -> None:
    """``products`` names how a model multiplies, fixed when it was loaded: an Engine over a
    loaded model takes the model's (None) or refuses another by name."""
    have = model.runtime.products
    if products is not None and products != have:
        raise RequestError(
            "products",
            f"the model was loaded with products={have!r}, not {products!r}: "
            f"load_model(..., products={products!r}) loads it so",
        )


@public_methods
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
        products: str | None = None,
    ) -> None:
        check_locations(saes)
        checks.integer("sae_budget_bytes", sae_budget_bytes, lo=0)
        if products is not None:  # None alone means the default: "" or False is a mistake
            products_name(products)
        if isinstance(model, LoadedModel):
            check_products_of(model, products)
            self.model = model
        else:
            products = "float32" if products is None else products
            self.model = load_model(model, device, dtype, backend, products=products)
        runtime = self.model.runtime
        self.saes = SAEStore(
            runtime.hook_widths(),
            sae_budget_bytes,
            centres_writes(runtime),
            model_id=getattr(self.model, "hub_id", None),
        )
        if saes is None:
            self.saes.add_packaged(self.model.name)
        elif isinstance(saes, Mapping):
            for name, location in saes.items():
                self.saes.add(location, name)
        else:
            for location in saes:
                self.saes.add(location)
        self._analysis = Analysis(self.model, self.saes)
        self._condition_scores = ConditionScores(self._analysis)
        stops = {self.tokenizer.eos_id, *getattr(self.model, "stop_ids", ())}
        self.stop_ids = frozenset(stops - {None})
        self.decoder = Decoder(runtime, self.tokenizer, self.stop_ids)
        self.concepts = Concepts(self)

    @classmethod
    def default(cls) -> Engine:
        """The shared engine on the offline default model and its SAEs (loaded once)."""
        global _default_engine
        with _default_lock:
            if _default_engine is None:
                _default_engine = cls()
            return _default_engine

    def __init_subclass__(cls, kind: str | None = None, **options) -> None:
        """A subclass declared with ``kind=`` is what ``Engine.<kind>(...)`` builds: the
        remote engine subclasses this one, so this module may not import it back."""
        super().__init_subclass__(**options)
        if kind is not None:
            _KINDS[kind] = cls

    @classmethod
    def remote(cls, url: str, token: str | None = None, saes=None, **options) -> Engine:
        """The same API over an interp-engine server (a model bigger than this machine);
        ``token`` defaults to $INTERP_ENGINE_SERVER_TOKEN. See ``remote/engine.py``."""
        if "remote" not in _KINDS:
            raise RequestError(
                "url", "a remote engine needs the remote extra: pip install 'steer_widgets[remote]'"
            )
        return _KINDS["remote"](url, token, saes, **options)

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
        request = as_request(request, self.products)
        started = time.perf_counter()
        prompt, plan = self.plan(request)  # raises before any work
        frame = None
        for frame in self._stream(request, prompt, plan, cancel, every_step=False):  # noqa: B007
            pass
        elapsed = time.perf_counter() - started
        stats = {"seconds": elapsed, "steps": frame.step if frame else 0}
        return self._result(request, dict(frame.outputs), prompt.ids, stats)

    def steer_stream(
        self, request: SteerRequest | Mapping, cancel: threading.Event | None = None
    ) -> Iterator[Frame]:
        """Yield a ``Frame`` after every decode step: each output's text and ids so far.

        Every output is decoded in one batch and is token for token what it would be if
        requested alone with the same seed. A DEFAULT already computed for this prompt and
        these sampling settings is reused, not regenerated.
        """
        request = as_request(request, self.products)
        prompt, plan = self.plan(request)  # raises before any work
        return self._stream(request, prompt, plan, cancel)

    def chat(self, record: Mapping | None = None, *, system: str | None = None, **steering) -> Chat:
        """A steered chat (``sw.Chat``): DEFAULT, STEERED and each sweep row keep their own
        conversation, and ``chat.say(text)`` decodes every side's reply as one exact ragged
        batch. ``steering`` takes what a ``SteerRequest`` takes but the prompt; ``system``
        is an optional system message. ``engine.chat(chat.to_dict())`` replays every turn
        token for token. See docs/chat.md."""
        if record is not None:
            if steering or system is not None:
                raise RequestError("record", "replays as recorded: give nothing beside it")
            return Chat.from_record(self, record, self._read_out)
        fields = set(SteerRequest.__dataclass_fields__) - {"prompt"}
        unknown = sorted(k for k in steering if k not in fields)
        if unknown:
            raise RequestError(
                unknown[0], "is not a chat setting (a chat's prompts are its messages)"
            )
        if not self.tokenizer.has_chat_template:
            raise RequestError("engine", f"{self.model.name} has no chat template to chat with")
        request = SteerRequest(prompt="", **steering)
        self.plan(request.with_(prompt=[{"role": "user", "content": "Hi"}]))  # checked now
        return Chat(self, request, system, self._read_out)

    def _read_out(self, chat: Chat, target) -> Readout:
        """How a chat of this engine reads its replies (``Chat.readout``)."""
        return readout(self, chat, target)

    def generate(self, prompt, **sampling) -> Completion:
        """The model's own completion (no steering), e.g. ``engine.generate("Hi", seed=1)``."""
        return self.steer(unsteered(prompt, sampling)).outputs["DEFAULT"]

    def samples(self, prompt, n: int, **sampling) -> list[Completion]:
        """``n`` samples of the model's own completion, decoded in one batch.

        Sample ``i`` uses seed ``seed + i`` and equals ``generate(prompt, seed=seed + i)``
        token for token (each row has its own random stream), so writing several examples
        costs about one generation.
        """
        request = unsteered(prompt, sampling)
        prompt_enc, _ = self.plan(request)  # raises before any work
        rows = [Row(seed=seed) for seed in sample_seeds(request, n)]
        return self.decoder.decode_all(prompt_enc.ids, rows, request.sampling)

    def steer_batch(
        self, requests: Mapping[str, SteerRequest], cancel: threading.Event | None = None
    ) -> dict[str, SteerResult]:
        """Several requests decoded together as one ragged batch: different prompts, sampling
        settings, lengths and steerings, each output token for token its solo ``steer``.
        Requests on one prompt and sampling share a DEFAULT row (or the DEFAULT cache).
        Every request is validated before any decoding; a bad one is named by its key."""
        reqs, plans = self._batch_plans(requests)
        started = time.perf_counter()
        frames, rows = {}, 0
        for frames, rows in self._batch_frames(reqs, plans, cancel, every_step=False):  # noqa: B007
            pass
        stats = {"seconds": time.perf_counter() - started, "batch": rows}
        return {  # each result its own stats
            n: self._result(reqs[n], dict(frames[n].outputs), plans[n][0].ids, dict(stats))
            for n in reqs
        }

    def steer_batch_stream(
        self, requests: Mapping[str, SteerRequest], cancel: threading.Event | None = None
    ) -> Iterator[dict[str, Frame]]:
        """``steer_batch`` step by step: after every decode step, each request's ``Frame``
        (every output's text and ids so far); in the last one every frame is ``done``. The
        same rows as ``steer_batch``, so the same tokens. Validated before any decoding."""
        reqs, plans = self._batch_plans(requests)
        return (frames for frames, _ in self._batch_frames(reqs, plans, cancel))

    def _batch_frames(self, reqs, plans, cancel, every_step: bool = True):
        """The ragged batch of ``steer_batch``: ``({name: Frame}, rows decoded)`` after every
        step (``every_step``) and once at the end, every frame then ``done``."""
        decoder = self.decoder
        batch = plan_batch(
            {n: (p.ids, reqs[n].sampling, plan) for n, (p, plan) in plans.items()},
            decoder.cached_default,
        )
        outputs = {n: {label: Completion("", ()) for label in plans[n][1].labels} for n in reqs}
        for (name, label), completion in batch.cached.items():
            outputs[name][label] = completion
        done: list[Completion] = []
        step = 0

        def frames(finished: bool) -> dict[str, Frame]:
            return {n: Frame(ordered(outputs[n], plans[n][1].labels), step, finished) for n in reqs}

        with decoder.running(cancel) as token:  # one token for every part
            for rows, slots in batch.parts():
                got = Transcript(len(rows))
                for step_out in decoder.rows(None, rows, None, token):
                    got.add(step_out)
                    step += 1
                    if every_step:
                        for r, answers in enumerate(slots):
                            stop = "eos" if step_out.done[r] else ""
                            c = decoder.completion(got.ids[r], stop, got.probs[r], rows[r].gates)
                            for name, label in answers:
                                outputs[name][label] = c
                        yield frames(False), len(batch.rows)
                for r, (row, answers) in enumerate(zip(rows, slots, strict=True)):
                    wanted = row.sampling.n_completion_tokens  # complete or "cancelled"
                    done.append(decoder.final(got.ids[r], wanted, got.probs[r], row.gates))
                    for name, label in answers:
                        outputs[name][label] = done[-1]
        for r, (name, _) in batch.defaults():  # kept only if complete
            decoder.remember_default(plans[name][0].ids, reqs[name].sampling, done[r])
        yield frames(True), len(batch.rows)

    def token_logprobs(self, prompt, completion: Completion | Sequence[int]) -> Tensor:
        """Log-probability under the unsteered model of each completion token, given the
        prompt and the tokens before it (fluency of a steered text; token probabilities)."""
        text = self.text(prompt, completion)
        return self.decoder.logprobs(text.ids, len(text.ids) - len(self.text(prompt).ids))

    def result(self, request: SteerRequest, outputs: Mapping[str, Completion]) -> SteerResult:
        """Wrap outputs gathered from ``steer_stream`` as a ``SteerResult`` (for records)."""
        request = as_request(request, self.products)
        check_outputs(outputs)
        prompt = self._encode(request)
        return self._result(request, dict(outputs), prompt.ids)

    def _result(self, request, outputs, prompt_ids, stats=None) -> SteerResult:
        """A result recording this engine's model and how it multiplies."""
        return SteerResult(
            request, outputs, prompt_ids, self.model.name, stats or {}, products=self.products
        )

    @property
    def products(self) -> str:
        """How the model multiplies its quantized matrices ("float32" or "int8"), fixed at
        load (``load_model(products=...)``); every record names it."""
        return self.model.runtime.products

    def clear_caches(self) -> None:
        """Forget cached DEFAULT completions, residuals and the examples the model wrote for
        concepts (SAEs stay loaded)."""
        self.decoder.clear()
        self._analysis.clear()
        self.concepts.clear()

    def cancel_all(self) -> None:
        """Stop every running generation before its next prefill or decode step, every later
        part of a split batch included: each run's one cancel token is set (the caller's
        ``cancel`` event where one was given; ``decoder.runs``)."""
        self.decoder.cancel_all()

    def plan(self, request: SteerRequest) -> tuple[EncodedPrompt, Plan]:
        """Validate ``request`` against the model and SAEs and build its rows."""
        runtime = self.model.runtime
        validate_shape(request)
        prompt = self._encode(request)
        request.sampling.validate(runtime.cfg.max_context - len(prompt.ids))
        directions = resolve_directions(request, self.saes, runtime.hook_widths())
        gated = self._gates(request, directions, prompt)
        plan = build_plan(request, directions, prompt.special, gated, prompt.generated)
        return prompt, plan

    def vectors(self, request: SteerRequest | Mapping) -> list[Vector]:
        """What the STEERED output of ``request`` adds, as plain ``Vector``s at their hooks:
        each feature's decoder row (unit length under ``normalize_steering``) and each custom
        vector at strength ``strength_multiplier * strength``, exactly what SIMPLE_ADDITIVE
        adds on generated tokens (a sweep's rows are not included). For ``save_vectors`` and
        other tools; a non-additive ``steer_method`` is a ``VectorUnsupported``. Settings no
        vector file applies (``prompt_multiplier``, ``steer_special_tokens``) ride along as
        the list's ``notes``."""
        request = as_request(request)
        validate_shape(request)
        directions = resolve_directions(request, self.saes, self.model.runtime.hook_widths())
        return request_vectors(request, directions)

    # -- activations (see analysis/text.py) ------------------------------------------------
    @property
    def residual_cache(self) -> ResidualCache:
        """Residuals and SAE activations of recent texts (``.stats()``)."""
        return self._analysis.residual_cache

    def text(self, prompt, completion: Completion | Sequence[int] | None = None) -> Text:
        """Tokens to analyse: a prompt (str or chat), optionally followed by a completion."""
        return self._analysis.text(prompt, completion)

    def feature_values(self, text: Text, source: str, index: int | None = None) -> Tensor:
        """Activations [T] of one feature (or [T, d_sae] of all) over ``text``; BOS zeroed."""
        return self._analysis.feature_values(text, source, index)

    def activations(self, prompt, source: str, index: int, completion=None) -> FeatureActivations:
        """One feature over a prompt (and optional completion): per-token values and max."""
        return self._analysis.activations(prompt, source, index, completion)

    def top_features_per_token(
        self, prompt, source: str, k: int = 5, completion=None
    ) -> TopPerToken:
        """The ``k`` strongest features at every position."""
        return self._analysis.top_features_per_token(prompt, source, k, completion)

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
        return self._analysis.top_features(prompt, source, n, positions, rank_by, completion)

    def neighbours(self, source: str, index: int, n: int = 10) -> list[tuple[int, float]]:
        """Features whose decoder rows point most nearly the same way (cosine similarity)."""
        return self._analysis.neighbours(source, index, n)

    def feature_index(self, source: str) -> FeatureIndex:
        """Searchable top tokens (and, for shipped SAEs, top contexts) of every feature."""
        return self._analysis.feature_index(source)

    # -- evaluation (see analysis/evaluator.py) --------------------------------------------
    def evaluate(
        self,
        steering,
        prompts: Sequence | None = None,
        strengths: Sequence[float] | None = None,
        judge=None,
        *,
        off_topic: Sequence | None = None,
        progress: bool = True,
        cancel: threading.Event | None = None,
        **sampling,
    ) -> Evaluation:
        """Does it steer? ``steering`` over a panel of prompts and a ladder of strengths.

        ``steering``: a ``SteerRequest`` (its strengths, method and multipliers are the x1
        point; its prompt and sampling are not used), a ``Feature`` (at its source's
        recommended strength), a ``Vector``, a ``FeatureMatch``, a concept name (its concept
        vector), a mapping of names to those (compared on the same rows), or an
        ``Evaluation`` / its record (replayed token for token). Features, vectors and
        concepts steer with ``default_prompt_multiplier()``.
        ``prompts``: prompts and chats (``None``: the shipped panel of 12, half chat).
        ``strengths``: multipliers of the x1 point (``None``: 0, 0.5, 1, 1.5, 2, 3).
        ``judge``: word forms, a callable ``text -> bool | float``, or ``None``: the
        concept's word (or a feature label's words), plain inflections included.
        ``sampling``: greedy and 32 tokens unless given. Every row equals its solo
        ``steer`` run; ``cancel`` (or ``cancel_all``) stops within one decode step and
        keeps the finished rows. Everything is checked before any decoding.
        ``off_topic``: prompts a conditional steering (``sw.When``) should leave alone; the
        summary adds, per strength, the share of them exactly as DEFAULT (``untouched``) and
        the share where the gate opened (``false_triggers``), success staying on ``prompts``.
        """
        from tqdm.auto import tqdm

        stream = self.evaluate_stream(
            steering, prompts, strengths, judge, cancel, off_topic=off_topic, **sampling
        )
        evaluation = None
        with tqdm(total=stream.total, desc="evaluate", unit="row", disable=not progress) as bar:
            for evaluation in stream:
                bar.update(len(evaluation.rows) - bar.n)
        return evaluation

    def evaluate_stream(
        self,
        steering,
        prompts=None,
        strengths=None,
        judge=None,
        cancel=None,
        off_topic=None,
        **sampling,
    ) -> EvaluationStream:
        """``evaluate`` as a stream: the evaluation so far each time rows finish (what the
        explorer's panel draws). Validates at once, before the first row decodes."""
        from .analysis.evaluator import Evaluator

        evaluator = Evaluator(self, steering, prompts, strengths, judge, off_topic, **sampling)
        return EvaluationStream(evaluator.empty().total, evaluator.stream(cancel))

    # -- concepts ---------------------------------------------------------------------------
    def concept_vector(self, positive, negative=None, hook: str | None = None) -> Vector:
        """A steering ``Vector`` toward a concept: difference in means of the residual.

        ``positive``: a concept name (requests about it, read where the model has just been
        asked, against the same requests about 47 other subjects: no sampling) or a list of
        texts or chats (their content tokens against the shipped contrast set's answers);
        ``negative``: your own texts or chats instead (with a name, the model then writes its
        own examples to contrast with them).
        ``hook=None`` takes the layer where concept vectors steered best in our measurements.
        The vector is unit length and its ``strength`` is the recommended one (residual units).
        """
        return self.concepts.vector(positive, negative, hook)

    def search_features(
        self, query: str, sources: Sequence[str] | None = None, n: int = 10, examples=None
    ) -> FeatureMatches:
        """SAE features ranked by what steering with them does: the cosine of each decoder
        row with the concept's direction at its SAE's hook. Each match carries a label and a
        recommended strength. ``sources=None`` searches the SAEs nearest the concept layer
        (``concepts.default_sources()``: cosines are not comparable across layers).
        ``examples`` (texts or chats about ``query``) replaces the requests the direction is
        read from by default."""
        return self.concepts.search(query, sources, n, examples)

    def concept_features(
        self,
        concept: str | Sequence | Vector,
        k: int | None = None,
        sources: Sequence[str] | None = None,
        examples: Sequence | None = None,
    ) -> ConceptFeatures:
        """A concept as at most ``k`` SAE features that steer together: a list of plain
        ``Feature``s, each with its own fitted strength, so that
        ``SteerRequest(prompt, features=engine.concept_features("horse"),
        prompt_multiplier=engine.default_prompt_multiplier())`` steers toward the concept and
        its record replays unchanged. ``.concept``, ``.labels``, ``.weights`` and ``.cosine``
        read the set as an explanation; ``.to_frame()`` shows it.

        ``concept``: a name (its concept vector), texts or chats, or any ``Vector`` (its
        strength is the push the set matches). ``k=None`` is the recommended size.
        ``sources``: SAEs reading the concept's hook (``None``: those nearest the concept
        layer). ``examples``: texts about the named concept to read it from instead."""
        return self.concepts.features(concept, k, sources, examples)

    def condition_scores(
        self, when: When, prompt, completion=None
    ) -> tuple[Text, list[float], float]:
        """A score condition's value at every token of ``prompt`` (+ ``completion``) under
        the unsteered model, and its threshold in the same units: where a token-scope gate
        would be on for that text (the explorer's heatmap of the condition)."""
        return self._condition_scores.scores(when, prompt, completion)

    def condition_threshold(self, when: When, positive: Sequence, negative: Sequence):
        """``when`` with the threshold that best tells ``positive`` texts (or chats) from
        ``negative`` ones, by F1, as a ``ThresholdFit`` (``.when``, ``.threshold``,
        ``.precision``, ``.recall``): a prompt-scope condition decides once per text, a
        token-scope one counts a text where its gate would turn on anywhere. ``when`` gives
        the direction (``above=`` or ``below=``, any value) and everything else."""
        return self._condition_scores.fit_threshold(when, positive, negative)

    def decompose(self, vector: Vector | Tensor, source: str, n: int = 10) -> FeatureMatches:
        """The features of ``source`` that best explain ``vector`` (greedy matching pursuit;
        ``score`` is each feature's share of the vector's length)."""
        return self.concepts.decompose(vector, source, n)

    def default_strength(self, source: str) -> float:
        """The recommended strength for any feature of ``source``: a fixed fraction of its
        hook's typical norm (measured on the dev half of the steering benchmark)."""
        return self.concepts.feature_strength(self.saes.config(source).hook_name)

    def default_prompt_multiplier(self) -> float:
        """The recommended ``SteerRequest.prompt_multiplier``, the one the recommended
        strengths (``default_strength``, ``concept_vector``, ``search_features``) were measured
        with: the prompt pushed harder than the generated tokens sets the topic at less cost
        to fluency (docs/concepts.md, "Strength units")."""
        return PROMPT_MULTIPLIER

    def typical_norm(self, hook: str) -> float:
        """Median residual norm at ``hook`` on neutral text: the unit strengths are read in."""
        return self.concepts.typical_norm(hook)

    # -- why the text changed (see analysis/explain.py) ------------------------------------
    def steering_effect(self, result: SteerResult, label: str = "STEERED"):
        """Per token of ``label``: its probability as generated and under the unsteered model
        given the same prefix (one cached forward); ``.effect`` in nats, ``.frame()``."""
        return self._explainer().effect(result, label)

    def attribute(
        self,
        result: SteerResult,
        label: str = "STEERED",
        position: int = 0,
        source: str | Sequence[str] | None = None,
        n: int = 10,
        ablate: bool = False,
        steps: int = 3,
    ):
        """Why token ``position`` of ``label`` gained: each steering row's first-order share
        (and its measured removal), and the ``n`` SAE features (of ``source``, default the
        SAEs at or after the steering) the steering moved most there, with their share."""
        return self._explainer().attribute(result, label, position, source, n, ablate, steps)

    def steering_features(self, result: SteerResult, source: str, n: int = 10, label="STEERED"):
        """The features of ``source`` whose mean activation over the completion moved most
        between DEFAULT and ``label`` (``.frame()``)."""
        return self._explainer().changed_features(result, source, n, label)

    def _explainer(self):
        from .analysis.explain import Explainer

        if "_explain" not in self.__dict__:
            self._explain = Explainer(self)
        return self._explain

    # -- internals -------------------------------------------------------------------------
    def _batch_plans(self, requests) -> tuple[dict, dict]:
        """Each request of a batch and its plan, all validated first; an invalid one raises
        naming its key (``requests['b'].seed``) before anything runs."""
        if not isinstance(requests, Mapping) or not requests:
            raise RequestError("requests", "must be a non-empty mapping of name to request")
        reqs, plans = {}, {}
        for name, request in requests.items():
            try:
                reqs[name] = as_request(request, self.products)
                plans[name] = self.plan(reqs[name])
            except RequestError as err:  # its own class: RemoteUnsupported stays one
                raise err.under(f"requests[{name!r}]") from None
        return reqs, plans

    def _gates(self, request: SteerRequest, directions, prompt: EncodedPrompt) -> Resolved | None:
        """The request's conditions resolved on this model (``None`` without any): every
        check before any decoding, prompt-scope decisions taken from unsteered passes."""
        if all(m is None for m in output_multipliers(request).values()):
            return None  # nothing steers
        gated = conditioned(request)
        if gated and prompt.generated:
            raise RequestError(
                gated,
                "conditional steering over a chat's earlier replies is not supported yet: "
                "a condition's windows and decisions would have to follow each turn "
                "(docs/chat.md)",
            )
        own = {f"features[{i}]": f.when for i, f in enumerate(request.features)}
        own |= {f"vectors[{i}]": v.when for i, v in enumerate(request.vectors)}
        scores = self._condition_scores
        return resolve_gates(
            request.when,
            {d.entry: (own[d.entry], d.hook) for d in directions},
            scores.measure,
            lambda when, field: scores.decide(when, field, prompt.ids, prompt.special),
            zero_first=bool(prompt.ids) and prompt.ids[0] == self.tokenizer.bos_id,
        )

    def _encode(self, request: SteerRequest) -> EncodedPrompt:
        cfg = self.model.runtime.cfg
        prompt = self.tokenizer.encode(request.prompt, cfg.max_context - 1)
        for n, message in enumerate(request.prompt if prompt.generated else ()):
            if "token_ids" in message:  # an earlier reply's ids must be this model's
                checks.token_ids(f"prompt[{n}].token_ids", message["token_ids"], cfg.vocab_size)
        return prompt

    def _stream(self, request, prompt, plan, cancel, every_step: bool = True) -> Iterator[Frame]:
        """A ``Frame`` after every decode step (``every_step``), else only the last one: a
        caller that waits for the end skips re-decoding every row's text at every token."""
        decoder = self.decoder
        cached = None
        if "DEFAULT" in plan.labels:
            cached = decoder.cached_default(prompt.ids, request.sampling)
        outputs: dict[str, Completion] = {}
        labels, rows = plan.labels, plan.rows
        if cached is not None:
            outputs["DEFAULT"] = cached
            labels, rows = labels[1:], rows[1:]
        for label in labels:
            outputs[label] = Completion("", ())
        if not rows:
            yield Frame(ordered(outputs, plan.labels), 0, done=True)
            return
        got, step = Transcript(len(rows)), 0
        for step_out in decoder.rows(prompt.ids, rows, request.sampling, cancel):
            step += 1
            got.add(step_out)
            if not every_step:
                continue
            for r, label in enumerate(labels):
                stop = "eos" if step_out.done[r] else ""
                outputs[label] = decoder.completion(got.ids[r], stop, got.probs[r], rows[r].gates)
            yield Frame(ordered(outputs, plan.labels), step)
        wanted = request.sampling.n_completion_tokens
        for r, label in enumerate(labels):  # complete or "cancelled": decoder.final's rule
            outputs[label] = decoder.final(got.ids[r], wanted, got.probs[r], rows[r].gates)
        if "DEFAULT" in labels:  # kept only if complete
            decoder.remember_default(prompt.ids, request.sampling, outputs["DEFAULT"])
        yield Frame(ordered(outputs, plan.labels), step, done=True)


class EvaluationStream:
    """An iterator of ``Evaluation`` snapshots that knows its number of rows up front."""

    def __init__(self, total: int, it: Iterator[Evaluation]) -> None:
        self.total, self._it = total, it

    def __iter__(self) -> Iterator[Evaluation]:
        return self._it


__all__ = ["Engine", "Sampling"]
