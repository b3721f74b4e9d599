"""A steered chat: DEFAULT, STEERED and each sweep row continue their own conversations.

Each side keeps its own history. A history is token ids as generated, never re-tokenised
text: every earlier reply enters the next turn's prompt as the assistant message's
``token_ids`` (``runtime/tokens.py`` splices them in and marks them generated). So a turn
of side ``s`` is exactly ``engine.steer`` of ``chat.request(s)``: the user messages and the
template's tokens are prompt positions (``prompt_multiplier``, the special-token mask),
earlier replies' tokens are completion positions (the plain coefficient), every position
read under the turn's steering. The sides of a turn are decoded together as one ragged
batch (``Engine.steer_batch``), each row its solo run. ``docs/chat.md`` has the rules:
where the end-of-turn token goes, the seeds, what ``set`` changes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .. import checks
from ..checks import public_methods
from ..errors import RequestError
from .requests import SteerRequest, conditioned, output_multipliers
from .results import Completion, Frame, cut_short

CHAT_VERSION = 1
FIXED = ("sweep", "types")  # a chat's sides: fixed when it starts


@dataclass(frozen=True)
class Turn:
    """One exchange: the user's ``message``, each side's reply, the turn's ``seed`` and the
    steering it was decoded under (a request without its prompt)."""

    message: str
    replies: Mapping[str, Completion]
    seed: int
    steering: SteerRequest = field(repr=False, compare=False)


@public_methods
class Chat:
    """A conversation with every side of ``steering`` (``Engine.chat`` makes it)."""

    def __init__(
        self, engine, steering: SteerRequest, system: str | None = None, readout=None
    ) -> None:
        if system is not None:
            checks.text("system", system)
        gated = conditioned(steering)
        if gated:
            raise RequestError(gated, "conditional steering in a chat is not supported yet")
        self.engine, self.system = engine, system
        self._readout = readout  # analysis.readout, given by the engine (a layer above)
        self._steering = steering.with_(prompt="")
        self._turns: list[Turn] = []
        self._lock = threading.RLock()  # one turn at a time; state changes whole or not

    # -- what the chat holds ---------------------------------------------------------------
    @property
    def sides(self) -> list[str]:
        """The conversations: "DEFAULT", "STEERED", one per sweep row ("STEERED*2")."""
        return list(output_multipliers(self._steering))

    @property
    def turns(self) -> tuple[Turn, ...]:
        return tuple(self._turns)

    @property
    def steering(self) -> SteerRequest:
        """The steering the next turn is decoded under (its prompt unused)."""
        return self._steering

    def history(self, side: str = "STEERED") -> list[dict]:
        """``side``'s conversation so far as chat messages: the system message, then each
        user message and that side's reply, with its generated ``token_ids``."""
        self._check_side(side)
        return self._messages(side, self._turns)

    def request(self, side: str, message: str | None = None) -> SteerRequest:
        """The plain request that decodes ``side``'s reply to ``message`` after the chat so
        far (``None``: the last turn's reply again): the reference a turn is exact to."""
        self._check_side(side)
        turns, steering, seed = self._turns, self._steering, self._next_seed()
        if message is None:
            if not turns:
                raise RequestError("message", "the chat has no turn yet")
            *turns, last = turns
            message, steering, seed = last.message, last.steering, last.seed
        return _side_request(steering, side, self._messages(side, turns, message), seed)

    def readout(self, target):
        """Per turn and side, the mean and max of a feature's activation (``sw.Feature``)
        or of a direction's cosine with the residual (``sw.Vector``) over the reply's
        tokens, read by the unsteered model: ``.frame()`` and ``.svg()`` (a notebook shows
        the chart)."""
        if self._readout is None:
            raise RequestError("readout", "this engine reads no activations")
        return self._readout(self, target)

    # -- talking ---------------------------------------------------------------------------
    def say(self, text: str, cancel: threading.Event | None = None) -> dict[str, Completion]:
        """Send ``text`` to every side; returns each side's reply (the turn is kept only
        when every reply is complete)."""
        frame = None
        for frame in self._decode(self._checked(text), None, cancel, every_step=False):  # noqa: B007
            pass
        return dict(frame.outputs)

    def say_stream(self, text: str, cancel: threading.Event | None = None) -> Iterator[Frame]:
        """``say`` frame by frame, as ``steer_stream`` yields them (every side's reply so
        far); the turn is kept once the last frame is done and complete."""
        return self._decode(self._checked(text), None, cancel)

    def regenerate(self, cancel: threading.Event | None = None) -> dict[str, Completion]:
        """The last turn again on every side, with the next seed."""
        with self._lock:
            if not self._turns:
                raise RequestError("regenerate", "the chat has no turn yet")
            last = self._turns[-1]
            return self._redo(len(self._turns) - 1, [last.message], last.seed + 1, cancel)

    def undo(self) -> Turn:
        """Drop the last turn (every side's reply to it); returns it."""
        with self._lock:
            if not self._turns:
                raise RequestError("undo", "the chat has no turn yet")
            return self._turns.pop()

    def edit(self, turn: int, text: str, cancel: threading.Event | None = None) -> list:
        """Replace turn ``turn``'s message and decode that turn and every later one again
        (their messages and seeds as they were, under the current steering); each turn's
        replies, in order."""
        with self._lock:
            if not self._turns:
                raise RequestError("turn", "the chat has no turn yet")
            checks.integer("turn", turn, 0, len(self._turns) - 1)
            text = self._checked(text)
            messages = [text] + [t.message for t in self._turns[turn + 1 :]]
            return self._redo(turn, messages, self._turns[turn].seed, cancel, each=True)

    def set(self, **changes) -> None:
        """New steering from the next turn on (any request field but the prompt; ``sweep``
        and ``types``, which name the sides, are fixed). Checked before it is kept."""
        with self._lock:
            fixed = [k for k in changes if k in (*FIXED, "prompt")]
            if fixed:
                raise RequestError(fixed[0], "is fixed for a chat (it names the sides)")
            steering = self._steering.with_(**changes)
            gated = conditioned(steering)
            if gated:
                raise RequestError(gated, "conditional steering in a chat is not supported yet")
            self.engine.plan(steering.with_(prompt=[{"role": "user", "content": "hi"}]))
            self._steering = steering

    def replay_steered(self, cancel: threading.Event | None = None) -> list[dict]:
        """Every steered side again from the first turn under the current steering, turn
        by turn (DEFAULT's replies stay); each turn's new replies."""
        with self._lock:
            steered = [s for s in self.sides if s != "DEFAULT"]
            done: list[Turn] = []
            for turn in self._turns:
                base = [replace(t, steering=self._steering) for t in done]
                requests = {
                    s: _side_request(
                        self._steering, s, self._messages(s, base, turn.message), turn.seed
                    )
                    for s in steered
                }
                got = self._batch(requests, cancel)
                replies = {**turn.replies, **got}
                done.append(Turn(turn.message, replies, turn.seed, self._steering))
            self._turns = done
            return [{s: t.replies[s] for s in steered} for t in done]

    # -- records ---------------------------------------------------------------------------
    @classmethod
    def from_record(cls, engine, record, readout=None) -> Chat:
        """The chat of ``to_dict``'s record, every turn decoded again under its own steering
        and seed (the same tokens: every turn is exact). Checked before any decoding."""
        turns, steering, system = _read_record(record, engine)
        first = turns[0][2] if turns else steering
        chat = cls(engine, first, system, readout)
        for message, seed, turn_steering in turns:
            chat._steering = turn_steering
            chat._say_seeded(message, seed)
        chat._steering = steering
        return chat

    def to_dict(self) -> dict:
        """A JSON-able record: ``Engine.chat(record)`` replays every turn token for token."""
        return {
            "chat": CHAT_VERSION,
            "model": self.engine.model.name,
            "products": self.engine.products,
            "system": self.system,
            "steering": _steering_record(self._steering),
            "turns": [
                {
                    "message": t.message,
                    "seed": t.seed,
                    "steering": _steering_record(t.steering),
                    "replies": {
                        s: {"text": c.text, "token_ids": list(c.token_ids), "stop": c.stop}
                        for s, c in t.replies.items()
                    },
                }
                for t in self._turns
            ],
        }

    # -- the work ----------------------------------------------------------------------------
    def _decode(self, message: str, seed, cancel, every_step: bool = True) -> Iterator[Frame]:
        """One turn: every side's request, validated, then decoded as one ragged batch;
        the turn is kept once every reply is complete."""
        with self._lock:
            seed = self._next_seed() if seed is None else seed
            requests = {
                s: _side_request(self._steering, s, self._messages(s, self._turns, message), seed)
                for s in self.sides
            }
            frames = self.engine.steer_batch_stream(requests, cancel)  # validated here
        return self._kept(frames, message, seed, every_step)

    def _kept(self, frames, message: str, seed: int, every_step: bool) -> Iterator[Frame]:
        last = None
        for by_side in frames:
            last = _merged(by_side)
            if every_step or last.done:
                yield last
        if last is not None and not cut_short(last.outputs):
            with self._lock:
                self._turns.append(Turn(message, dict(last.outputs), seed, self._steering))

    def _redo(self, turn: int, messages: Sequence[str], seed: int, cancel, each=False):
        """Turns ``turn`` onward again: ``messages`` in order, the first with ``seed`` and
        each later one with its own recorded seed; kept only if every one completes."""
        seeds = [seed] + [t.seed for t in self._turns[turn + 1 : turn + len(messages)]]
        kept, self._turns = self._turns, self._turns[:turn]
        got = []
        try:
            for message, s in zip(messages, seeds, strict=True):
                got.append(self._say_seeded(message, s, cancel))
        except BaseException:
            self._turns = kept  # nothing the user had is lost
            raise
        if len(self._turns) != turn + len(messages):  # a turn was cut short
            self._turns = kept
        return got if each else got[-1]

    def _say_seeded(self, text: str, seed: int, cancel=None) -> dict[str, Completion]:
        """``say`` with this turn's ``seed`` (a replay's, an edit's) instead of the next."""
        checks.integer("seed", seed, *checks.SEED_RANGE)
        frame = None
        for frame in self._decode(self._checked(text), seed, cancel, every_step=False):  # noqa: B007
            pass
        return dict(frame.outputs)

    def _batch(self, requests: Mapping[str, SteerRequest], cancel) -> dict[str, Completion]:
        results = self.engine.steer_batch(requests, cancel)
        got = {s: next(iter(r.outputs.values())) for s, r in results.items()}
        if cut_short(got):
            raise RequestError("cancel", "the replay was cancelled; the chat is as it was")
        return got

    def _messages(self, side: str, turns: Sequence[Turn], message: str | None = None) -> list:
        out = [] if self.system is None else [{"role": "system", "content": self.system}]
        for t in turns:
            out.append({"role": "user", "content": t.message})
            out.append(_reply_message(t.replies[side], self.engine.decoder.stop_ids))
        if message is not None:
            out.append({"role": "user", "content": message})
        return out

    def _next_seed(self) -> int:
        """Turn ``k`` (from 0) samples with ``steering.seed + k``."""
        return self._steering.seed + len(self._turns)

    def _checked(self, text) -> str:
        if not isinstance(text, str) or not text.strip():
            raise RequestError("text", f"must be a message with some text, got {text!r:.80}")
        return text

    def _check_side(self, side) -> None:
        if side not in self.sides:
            raise RequestError("side", f"{side!r} is not one of this chat's sides {self.sides}")


def _side_request(steering: SteerRequest, side: str, messages: list, seed: int) -> SteerRequest:
    """The plain request for one side: DEFAULT, STEERED, or a sweep row as STEERED at its
    multiplier (its label says which)."""
    if side == "DEFAULT":
        return steering.with_(prompt=messages, types=("DEFAULT",), sweep=(), seed=seed)
    multiplier = output_multipliers(steering)[side]
    return steering.with_(
        prompt=messages, types=("STEERED",), sweep=(), seed=seed, strength_multiplier=multiplier
    )


def _reply_message(reply: Completion, stop_ids) -> dict:
    """A reply as the assistant message of the next turn's prompt: its ids as generated,
    less a final stop token, which the chat template writes as its end of turn (a prompt
    position of the next turn, where the model reads it first)."""
    ids = list(reply.token_ids)
    if ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    return {"role": "assistant", "content": reply.text, "token_ids": ids}


def _merged(by_side: Mapping[str, Frame]) -> Frame:
    """The sides' frames as one frame: each side's single output under its side's name."""
    outputs = {s: next(iter(f.outputs.values())) for s, f in by_side.items()}
    step = max((f.step for f in by_side.values()), default=0)
    return Frame(outputs, step, all(f.done for f in by_side.values()))


def _steering_record(steering: SteerRequest) -> dict:
    record = steering.to_dict()
    record.pop("prompt", None)
    return record


def _steering_from_record(d, field: str) -> SteerRequest:
    """A chat record's steering (``_steering_record``) as a request with an empty prompt."""
    if not isinstance(d, Mapping):
        raise RequestError(field, f"must be a dict of request fields, got {d!r:.80}")
    return SteerRequest.from_dict({**d, "prompt": ""})


def _read_record(record, engine) -> tuple[list, SteerRequest, str | None]:
    """A chat record's turns ``(message, seed, steering)``, current steering and system
    message, every key checked (a record of another model or product setting named)."""
    if not isinstance(record, Mapping) or record.get("chat") != CHAT_VERSION:
        raise RequestError("record", f"is not a chat record (Chat.to_dict), got {record!r:.80}")
    if record.get("model") != engine.model.name:
        raise RequestError(
            "record.model", f"is {record.get('model')!r}; this engine runs {engine.model.name!r}"
        )
    if record.get("products", "float32") != engine.products:
        raise RequestError(
            "record.products",
            f"is {record.get('products')!r}: its tokens replay only on an engine with "
            f"products={record.get('products')!r}, this one multiplies {engine.products!r}",
        )
    steering = _steering_from_record(record.get("steering"), "record.steering")
    turns = []
    for i, t in enumerate(checks.sequence("record.turns", record.get("turns", ()))):
        where = f"record.turns[{i}]"
        if not isinstance(t, Mapping):
            raise RequestError(where, f"must be a dict, got {t!r:.80}")
        seed = checks.integer(f"{where}.seed", t.get("seed"), *checks.SEED_RANGE)
        message = t.get("message")
        if not isinstance(message, str) or not message.strip():
            raise RequestError(f"{where}.message", f"must be a message, got {message!r:.80}")
        turns.append((message, seed, _steering_from_record(t.get("steering"), f"{where}.steering")))
    system = record.get("system")
    return turns, steering, system
