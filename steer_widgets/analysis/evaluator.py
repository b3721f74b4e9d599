"""Running an evaluation: every (prompt, strength) row decoded exactly, all prompts at once.

Every prompt's DEFAULT and every strength of every steering decode in one ragged batch
(rows of different prompts side by side, each token for token its solo ``Engine.steer``
run, the engine's guarantee), in parts of at most ``batch.MAX_ROWS`` rows. Fluency needs
each steered text scored by the *unsteered* model; instead of a second forward over every
text, each steered row gets a shadow row in the same batch: an unsteered row fed the steered
row's tokens (``Row.follow``), whose token log-probabilities are exactly that score. A
shadow row costs one more row in each decode step (decode reads the weights once for all
rows), and its prompt is a copy of DEFAULT's keys and values, not another prefill.

An engine without an in-process decode loop (``Engine.remote``) runs each prompt as one
request per steering and scores fluency with ``token_logprobs``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from ..errors import RequestError, SteerWidgetsError
from ..runtime.tokens import check_prompt
from ..steering.batch import MAX_ROWS
from ..steering.decoder import Transcript
from ..steering.generation import Row, Sampling, check_sampling_keys
from ..steering.requests import Feature, SteerRequest, Vector
from ..steering.results import check_products
from .concept_features import ConceptFeatures
from .concepts import FeatureMatch
from .engine_view import EngineView
from .evaluation import EvalRow, Evaluation, PromptDefault, check_strengths, prompt_name
from .judges import JudgeError, label_words, make_judge

PANEL_FILE = Path(__file__).parents[1] / "data" / "eval_prompts.json"
LADDER = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)  # multipliers of the recommended point
# Greedy and short: an evaluation asks whether the text turns, not what a long sample says,
# and greedy rows make the success rate a property of the steering, not of a seed.
SAMPLING = {"temperature": 0.0, "freq_penalty": 1.0, "seed": 16, "n_completion_tokens": 32}
PARTIAL_EVERY_S = 0.25  # how often the texts of rows still decoding are shown


def panel() -> list:
    """The shipped prompts: six chat requests and six completion openings, neutral."""
    return [p["prompt"] for p in json.loads(PANEL_FILE.read_text())["prompts"]]


class Evaluator:
    """One validated evaluation, ready to run; everything is checked in the constructor."""

    def __init__(
        self,
        engine: EngineView,
        steering,
        prompts=None,
        strengths=None,
        judge=None,
        off_topic=None,
        **sampling,
    ) -> None:
        self.engine = engine
        record = _record(steering)
        if record is not None:
            check_products(record.products, engine.products)
            split = record.off_topic_from
            if prompts is None:
                prompts = record.prompts[:split] if split is not None else record.prompts
                if off_topic is None and split is not None:
                    off_topic = record.prompts[split:]
            strengths = record.strengths if strengths is None else strengths
            sampling = {**record.sampling, **sampling}
            steerings = {n: (r, record.judge_forms.get(n)) for n, r in record.steerings.items()}
        else:
            steerings = resolve(engine, steering)
        self.prompts = _check_prompts(panel() if prompts is None else prompts)
        self.off_from = None  # where the off-topic prompts start, if any were given
        if off_topic is not None:
            self.off_from = len(self.prompts)
            self.prompts += _check_prompts(off_topic, "off_topic")
        self.strengths = check_strengths(LADDER if strengths is None else strengths)
        self.sampling = _check_sampling(sampling)
        self.judges = {n: make_judge(judge, forms) for n, (_, forms) in steerings.items()}
        self.x1 = {n: r for n, (r, _) in steerings.items()}
        self.plans = [self._plan(i, p) for i, p in enumerate(self.prompts)]  # before any work
        self._default_scores: dict[tuple[int, str], float] = {}

    def _plan(self, i: int, prompt) -> tuple:
        """The prompt's encoding and each steering's rows (DEFAULT, then the ladder)."""
        out = {}
        enc = None
        for name, x1 in self.x1.items():
            if x1.strength_multiplier == 0:
                raise RequestError(
                    f"steering[{name!r}].strength_multiplier",
                    "is 0, so every strength of the ladder would steer alike",
                )
            req = x1.with_(
                prompt=prompt,
                types=("DEFAULT",),
                sweep=tuple(x1.strength_multiplier * m for m in self.strengths),
                **self.sampling,
            )
            try:
                enc, plan = self.engine.plan(req)
            except RequestError as err:
                raise _renamed(err, *self._where(i), name) from None
            out[name] = plan
        return enc, out

    def _where(self, i: int) -> tuple[int, str]:
        """Prompt ``i``'s index in the argument it came from, and that argument's name."""
        if self.off_from is not None and i >= self.off_from:
            return i - self.off_from, "off_topic"
        return i, "prompts"

    @property
    def _wanted(self) -> int:
        """Tokens each row asks for: a row is complete at these or at a stop token."""
        return self.sampling["n_completion_tokens"]

    def empty(self) -> Evaluation:
        return Evaluation(
            dict(self.x1),
            list(self.prompts),
            self.strengths,
            dict(self.sampling),
            {n: j.name for n, j in self.judges.items()},
            {n: j.forms for n, j in self.judges.items()},
            model=self.engine.model.name,
            off_topic_from=self.off_from,
            products=self.engine.products,
        )

    def stream(self, cancel: threading.Event | None = None) -> Iterator[Evaluation]:
        """Yield the evaluation each time rows finish; the last one has ``complete`` (or
        ``cancelled``) set. A judge that fails raises ``JudgeError`` with the rows so far."""
        with self.engine.decoder.running(cancel) as token:  # one token for every part
            yield from self._run(token)

    def _run(self, cancel: threading.Event) -> Iterator[Evaluation]:
        """``stream`` with its run's cancel token: every part, prefill and step checks it."""
        ev = self.empty()
        started = time.perf_counter()
        local = self.engine.decoder.local
        parts = self._parts() if local else [[i] for i in range(len(self.prompts))]
        for part in parts:
            if cancel.is_set():
                break
            try:
                if local:
                    yield from self._decode(ev, part, cancel)
                else:
                    yield from self._prompt_by_requests(ev, part[0], cancel)
            except JudgeError as err:
                ev.stats["seconds"] = time.perf_counter() - started
                err.evaluation = ev
                raise
        order = {
            (n, m): k for k, (n, m) in enumerate((n, m) for n in self.x1 for m in self.strengths)
        }
        ev.rows.sort(key=lambda r: (r.prompt_index, order[r.steering, r.strength]))
        ev.cancelled = cancel.is_set() and len(ev.rows) < ev.total
        ev.complete = not ev.cancelled
        ev.stats.update(seconds=time.perf_counter() - started)
        yield ev

    def _parts(self) -> list[list[int]]:
        """The prompts in consecutive groups whose rows fit one batch (``MAX_ROWS``). The
        first prompt decodes alone, so the first cells come after one prompt's prefill, not
        after a whole part's."""
        per_prompt = 1 + 2 * len(self.x1) * len(self.strengths)  # DEFAULT, rows and shadows
        size = max(1, MAX_ROWS // per_prompt)
        n = len(self.prompts)
        return [[0]] + [list(range(i, min(i + size, n))) for i in range(1, n, size)]

    def _decode(self, ev: Evaluation, prompts: list[int], cancel) -> Iterator[Evaluation]:
        """The rows of ``prompts`` as one ragged batch, each scored as soon as it finishes
        (and its prompt's DEFAULT has)."""
        decoder, sampling = self.engine.decoder, Sampling(**self.sampling)
        rows: list[Row] = []
        tracks = [
            _Track.plan(i, *self.plans[i], self.strengths, sampling, decoder, rows) for i in prompts
        ]
        got = Transcript(len(rows))
        shown = time.perf_counter()
        for step in decoder.rows(None, rows, None, cancel):
            got.add(step)
            ended = [decoder.complete(ids, sampling.n_completion_tokens) for ids in got.ids]
            if time.perf_counter() - shown >= PARTIAL_EVERY_S:
                ev.running = {
                    (name, m, t.i): decoder.tokenizer.decode(got.ids[r])
                    for t in tracks
                    for name, m, r in t.pending
                }
                shown = time.perf_counter()
                yield ev
            if any([self._advance(ev, t, got, ended, rows) for t in tracks]):
                yield ev
        ev.running = {}

    def _advance(
        self, ev: Evaluation, track: _Track, got: Transcript, ended: list[bool], rows: list[Row]
    ) -> bool:
        """Score ``track``'s rows that have ended; whether any were."""
        decoder = self.engine.decoder
        if track.default is None and ended[track.default_row]:
            ids, probs = got.ids[track.default_row], got.probs[track.default_row]
            track.default = self._default(track.i, decoder.final(ids, self._wanted, probs))
        ready = [p for p in track.pending if ended[p[2]]] if track.default else []
        if ready:
            self._finish(ev, track.i, track.default, ready, got, rows)
            track.pending = [p for p in track.pending if p not in ready]
        return bool(ready)

    def _prompt_by_requests(self, ev: Evaluation, i: int, cancel) -> Iterator[Evaluation]:
        """One prompt on an engine that decodes elsewhere (``Engine.remote``): each steering's
        DEFAULT + ladder as one request (the server decodes each output alone, so rows are
        solo runs there too), fluency from ``token_logprobs``."""
        prompt = self.prompts[i]
        for name, x1 in self.x1.items():
            sweep = tuple(x1.strength_multiplier * m for m in self.strengths)
            req = x1.with_(prompt=prompt, types=("DEFAULT",), sweep=sweep, **self.sampling)
            result = self.engine.steer(req, cancel)
            if result.cancelled:
                return
            outputs = list(result.outputs.values())
            default, rows = outputs[0], outputs[1:]
            if i not in ev.defaults:
                nll = _mean_nll(self.engine.token_logprobs(prompt, default).tolist())
                self._reference(ev, i, default, nll)
            for m, completion in zip(self.strengths, rows, strict=True):
                nll = _mean_nll(self.engine.token_logprobs(prompt, completion).tolist())
                ev.rows.append(self._row(ev, i, name, m, completion, nll))
            yield ev

    def _reference(self, ev: Evaluation, i: int, default, nll: float) -> None:
        """DEFAULT of prompt ``i`` as the reference, scored by the first steering's judge
        (for display; each row is compared with its own judge's score, ``_row``)."""
        judge = next(iter(self.judges.values()))
        score = judge.score(default.text, prompt_name(self.prompts[i]))
        ev.defaults[i] = PromptDefault(default.text, default.token_ids, nll, score)

    def _row(self, ev: Evaluation, i: int, name: str, m: float, completion, nll: float) -> EvalRow:
        """A steered completion scored against prompt ``i``'s DEFAULT, which each judge
        scores once."""
        d, text = ev.defaults[i], prompt_name(self.prompts[i])
        if (i, name) not in self._default_scores:
            self._default_scores[i, name] = self.judges[name].score(d.text, text)
        score = self.judges[name].score(completion.text, text)
        gates = completion.gates
        return EvalRow(
            name, i, m, completion.text, completion.token_ids, completion.stop, score,
            score > self._default_scores[i, name], nll, nll - d.nll,
            _shared(completion.token_ids, d.token_ids),
            tuple(completion.token_ids) == tuple(d.token_ids),
            None if gates is None else any(any(g) for g in gates.values()),
        )  # fmt: skip

    def _default(self, i: int, completion):
        enc, _ = self.plans[i]
        self.engine.decoder.remember_default(enc.ids, Sampling(**self.sampling), completion)
        return completion

    def _finish(self, ev, i, default, ready, got: Transcript, rows: list[Row]) -> None:
        """Score finished rows ``ready`` (steering, multiplier, row) and add them to ``ev``."""
        if i not in ev.defaults:
            self._reference(ev, i, default, _mean_nll(p.logprob for p in default.token_probs or ()))
        decoder = self.engine.decoder
        for name, m, r in ready:
            ev.running.pop((name, m, i), None)
            completion = decoder.final(got.ids[r], self._wanted, gates=rows[r].gates)
            nll = _mean_nll(p.logprob for p in got.probs[r + 1])  # its shadow row's scores
            ev.rows.append(self._row(ev, i, name, m, completion, nll))


class _Track:
    """One prompt's rows in a batch: its DEFAULT (row, or from the cache) and each steered
    row ``(steering, multiplier, row)`` not yet scored (its shadow row is the next one)."""

    def __init__(self, i: int, default, default_row: int | None, pending: list) -> None:
        self.i, self.default, self.default_row, self.pending = i, default, default_row, pending

    @classmethod
    def plan(cls, i, enc, plans: dict, strengths, sampling, decoder, rows: list[Row]) -> _Track:
        """Append prompt ``i``'s rows to ``rows`` (DEFAULT unless cached, then per steering and
        strength the steered row and its shadow) and track them."""
        own = {"prompt_ids": tuple(enc.ids), "sampling": sampling}
        default = decoder.cached_default(enc.ids, sampling)
        default_row = None
        if default is None:
            default_row = len(rows)
            rows.append(replace(next(iter(plans.values())).rows[0], **own))
        pending = []
        for name, plan in plans.items():
            for m, planned in zip(strengths, plan.outputs[1:], strict=True):
                pending.append((name, m, len(rows)))
                rows += [replace(planned.row, **own), Row(follow=len(rows), **own)]
        return cls(i, default, default_row, pending)


def _mean_nll(logprobs) -> float:
    """Mean negative log-likelihood per token (0 for no tokens)."""
    values = list(logprobs)
    return -sum(values) / len(values) if values else 0.0


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# -- what can be evaluated -----------------------------------------------------------------
def resolve(engine: EngineView, steering) -> dict[str, tuple[SteerRequest, list[str] | None]]:
    """Each steering as its x1 request and the words its default judge looks for."""
    if isinstance(steering, Mapping) and not isinstance(steering, SteerRequest):
        if not steering:
            raise RequestError("steering", "is an empty mapping: name at least one steering")
        out = {}
        for name, s in steering.items():
            if not isinstance(name, str) or not name:
                raise RequestError("steering", f"names must be non-empty strings, got {name!r}")
            out[name] = _one(engine, s, f"steering[{name!r}]")
        return out
    req, forms = _one(engine, steering, "steering")
    return {_name(engine, steering): (req, forms)}


def _one(engine: EngineView, s, field: str) -> tuple[SteerRequest, list[str] | None]:
    mult = {"prompt_multiplier": engine.default_prompt_multiplier()}
    if isinstance(s, ConceptFeatures):  # each keeps its own strength; the concept judges
        words = [w for f in s for w in _feature_words(engine, f, field)]
        forms = [s.concept] if s.concept else words or None
        return SteerRequest("", features=tuple(s), **mult), forms
    if isinstance(s, SteerRequest):
        forms = [w for f in s.features for w in _feature_words(engine, f, field)]
        return s.with_(prompt="", sweep=()), forms or None
    if isinstance(s, str):
        if not s.strip():
            raise RequestError(field, "is an empty concept name")
        return SteerRequest("", vectors=[engine.concept_vector(s)], **mult), [s.strip()]
    if isinstance(s, FeatureMatch):
        f = Feature(s.source, s.index, s.strength)
        _check_feature(engine, f, field)
        return SteerRequest("", features=[f], **mult), label_words(s.label) or None
    if isinstance(s, Feature):
        _check_feature(engine, s, field)
        f = Feature(s.source, s.index, engine.default_strength(s.source))
        return SteerRequest("", features=[f], **mult), _feature_words(engine, f, field) or None
    if isinstance(s, Vector):
        return SteerRequest("", vectors=[s], **mult), None
    raise RequestError(
        field,
        "must be a SteerRequest, Feature, Vector, FeatureMatch, ConceptFeatures, concept "
        f"name, or a mapping of names to those, got {type(s).__name__}",
    )


def _check_feature(engine: EngineView, f: Feature, field: str) -> None:
    try:
        engine.saes.check_index(f.source, f.index)
    except SteerWidgetsError as err:
        raise RequestError(field, str(err)) from None


def _feature_words(engine: EngineView, f: Feature, field: str) -> list[str]:
    _check_feature(engine, f, field)
    return label_words(engine.feature_index(f.source).label(int(f.index)))


def _name(engine: EngineView, s) -> str:
    if isinstance(s, str):
        return s.strip()
    if isinstance(s, (Feature, FeatureMatch)):
        return f"{s.source} #{s.index}"
    if isinstance(s, Vector):
        return f"vector at {s.hook}"
    if isinstance(s, ConceptFeatures):
        return f"features of {s.concept}" if s.concept else "concept features"
    return "steering"


def _record(steering) -> Evaluation | None:
    if isinstance(steering, Evaluation):
        return steering
    if isinstance(steering, Mapping) and "steerings" in steering and "prompts" in steering:
        return Evaluation.from_dict(steering)
    return None


def _check_prompts(prompts, field: str = "prompts") -> list:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise RequestError(field, f"must be a list of prompts and chats, got {prompts!r}")
    if not prompts:
        raise RequestError(field, "is empty: give at least one prompt (None: the panel)")
    for i, p in enumerate(prompts):
        try:
            check_prompt(p)
        except RequestError as err:
            raise _renamed(err, i, field, None) from None
        if isinstance(p, str) and not p.strip():
            raise RequestError(f"{field}[{i}]", "is an empty prompt")
    return list(prompts)


def _check_sampling(sampling: Mapping) -> dict:
    check_sampling_keys(sampling)
    merged = {**SAMPLING, **sampling}
    Sampling(**merged).validate()
    return merged


def _renamed(err: RequestError, i: int, field: str, steering: str | None) -> RequestError:
    """A request error renamed for the evaluation's own arguments (``prompts[i]`` or
    ``off_topic[i]`` for the prompt, ``steering[...]`` for the rest)."""
    if err.field.startswith("prompt"):
        return RequestError(f"{field}[{i}]" + err.field[len("prompt") :], err.problem)
    where = "steering" if steering is None else f"steering[{steering!r}]"
    return RequestError(f"{where}.{err.field}", err.problem)
