"""What ``Engine.evaluate`` returns: one steering over a panel of prompts and a strength ladder.

One completion says little about whether a steering works: it depends on the prompt, the
kind of prompt (chat or completion) and the strength. An ``Evaluation`` holds every row of
that grid with the two numbers researchers judge a steering by (AxBench: a concept score
and fluency over many prompts and a strength ladder):

* ``success``: the judge scores the steered text above the unsteered text of the same
  prompt (for a keyword judge: the steered text mentions the concept and DEFAULT does not);
* ``fluency_delta``: the mean negative log-likelihood of the steered tokens under the
  unsteered model, minus that of DEFAULT's own tokens (nats per token; 0 = as fluent as the
  model unsteered).

It knows no model: tables, the best strength and the chart are computed from the stored
rows, and ``to_dict`` / ``from_dict`` round-trip it as JSON (``Engine.evaluate`` takes the
record back and replays it token for token).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from .. import checks
from ..errors import RequestError
from ..steering.requests import SteerRequest

FLUENCY_BUDGET = 1.0  # nats per token: where AxBench-style ladders stop counting a success


@dataclass(frozen=True)
class PromptDefault:
    """A prompt's unsteered completion, the reference every steered row is compared with."""

    text: str
    token_ids: tuple[int, ...]
    nll: float
    score: float


@dataclass(frozen=True)
class EvalRow:
    """One steered completion: prompt ``prompt_index`` at ladder multiplier ``strength``."""

    steering: str
    prompt_index: int
    strength: float
    text: str
    token_ids: tuple[int, ...]
    stop: str
    score: float
    success: bool
    nll: float
    fluency_delta: float
    shared: int  # leading tokens equal to DEFAULT's
    untouched: bool = False  # every token DEFAULT's (what a condition that held nowhere gives)
    gate_opened: bool | None = None  # a conditional steering's gate was on somewhere


def prompt_name(prompt) -> str:
    """A prompt as one line: the text, or the last message's content for a chat."""
    return prompt if isinstance(prompt, str) else str(prompt[-1]["content"])


def prompt_kind(prompt) -> str:
    return "completion" if isinstance(prompt, str) else "chat"


@dataclass
class Evaluation:
    """Rows of steered completions over ``prompts`` x ``strengths`` for each steering.

    ``steerings`` maps a name to the x1 request (its prompt unused); a strength ``m`` steers
    with every coefficient of that request multiplied by ``m``. ``prompts`` from
    ``off_topic_from`` on are off-topic prompts for a conditional steering: they count
    toward ``untouched`` and ``false_triggers``, not toward success. ``complete`` is False while
    rows are still coming, after a cancel (``cancelled``), or after a judge failed.
    """

    steerings: dict[str, SteerRequest]
    prompts: list
    strengths: tuple[float, ...]
    sampling: dict
    judges: dict[str, str]  # each steering's judge, by name
    judge_forms: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    defaults: dict[int, PromptDefault] = field(default_factory=dict)
    rows: list[EvalRow] = field(default_factory=list)
    model: str = ""
    complete: bool = False
    cancelled: bool = False
    stats: dict = field(default_factory=dict)
    off_topic_from: int | None = None  # prompts from here on are off-topic for a condition
    products: str = "float32"  # how the model multiplied (runtime.quant.PRODUCTS)
    # texts so far of rows still decoding, by (steering, strength, prompt index); not recorded
    running: dict[tuple[str, float, int], str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Rows the full grid has (the progress bar's length)."""
        return len(self.steerings) * len(self.prompts) * len(self.strengths)

    def frame(self):
        """One row per steered completion (pandas): steering, prompt, kind, strength, text,
        score, hit, fluency delta, tokens shared with DEFAULT before the split."""
        import pandas as pd

        cols = [
            "steering", "prompt", "kind", "strength", "text", "score", "hit",
            "fluency_delta", "shared", "n_tokens", "default_text", "off_topic", "untouched",
            "gate_opened",
        ]  # fmt: skip
        data = []
        for r in self.rows:
            p = self.prompts[r.prompt_index]
            default = self.defaults[r.prompt_index]
            data.append(
                [
                    r.steering,
                    prompt_name(p),
                    prompt_kind(p),
                    r.strength,
                    r.text,
                    r.score,
                    r.success,
                    r.fluency_delta,
                    r.shared,
                    len(r.token_ids),
                    default.text,
                    self.off_topic(r.prompt_index),
                    r.untouched,
                    r.gate_opened,
                ]  # fmt: skip
            )
        return pd.DataFrame(data, columns=cols)

    def off_topic(self, prompt_index: int) -> bool:
        """Whether prompt ``prompt_index`` is one of the off-topic prompts (``off_topic=``)."""
        return self.off_topic_from is not None and prompt_index >= self.off_topic_from

    def summary(self):
        """Per steering and strength: success rate, mean judge score, mean fluency delta and
        the number of rows (pandas), in ladder order, over the on-topic prompts. With
        off-topic prompts (a condition's), also the share of them left exactly as DEFAULT
        (``untouched``), the share where the gate opened anywhere (``false_triggers``) and
        their number (``n_off``)."""
        import pandas as pd

        out = []
        for name in self.steerings:
            for m in self.strengths:
                rows = [r for r in self.rows if r.steering == name and r.strength == m]
                on = [r for r in rows if not self.off_topic(r.prompt_index)]
                line = {
                    "steering": name,
                    "strength": m,
                    "success": _mean(r.success for r in on),
                    "score": _mean(r.score for r in on),
                    "fluency_delta": _mean(r.fluency_delta for r in on),
                    "n": len(on),
                }
                if self.off_topic_from is not None:
                    off = [r for r in rows if self.off_topic(r.prompt_index)]
                    line["untouched"] = _mean(r.untouched for r in off)
                    line["false_triggers"] = _mean(bool(r.gate_opened) for r in off)
                    line["n_off"] = len(off)
                out.append(line)
        return pd.DataFrame(out)

    def best(self, budget: float = FLUENCY_BUDGET, steering: str | None = None) -> float | None:
        """The ladder multiplier with the highest success rate whose mean fluency delta is
        within ``budget`` nats (ties: the gentlest, nearest 0); ``None`` if none is, or if no
        strength within it succeeded at all."""
        checks.number("budget", budget)
        table = self._summary_of(steering)
        table = table[(table["n"] > 0) & (table["fluency_delta"] <= budget)]
        if table.empty:
            return None
        top = table["success"].max()
        if top == 0:  # nothing turned: no strength is "best"
            return None
        candidates = table[table["success"] == top]["strength"]
        return float(min(candidates, key=lambda m: (abs(m), m)))

    def _summary_of(self, steering: str | None):
        """``summary()``'s rows of one steering (the only one when ``None``)."""
        table = self.summary()
        return table[table["steering"] == self._one_steering(steering)]

    def _one_steering(self, steering: str | None) -> str:
        if steering is None:
            if len(self.steerings) != 1:
                raise RequestError("steering", f"name one of {list(self.steerings)}")
            return next(iter(self.steerings))
        if steering not in self.steerings:
            raise RequestError("steering", f"{steering!r} is not one of {list(self.steerings)}")
        return steering

    def svg(self, current: float | None = None, steering: str | None = None) -> str:
        """The trade-off chart (success % and fluency delta against strength) as SVG; the
        x1 point and ``current`` (a multiplier) are marked. What the explorer shows."""
        from .chart import tradeoff_svg

        table = self._summary_of(steering)
        points = [
            (float(m), s, f, int(n))
            for m, s, f, n in zip(
                table["strength"],
                table["success"],
                table["fluency_delta"],
                table["n"],
                strict=True,
            )  # fmt: skip
        ]
        return tradeoff_svg(points, current=current, budget=FLUENCY_BUDGET)

    def plot(self, steering: str | None = None):
        """The trade-off chart: a matplotlib figure where matplotlib is installed, else the
        same chart as an SVG that notebooks display."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            from IPython.display import SVG

            return SVG(self.svg(steering=steering))
        name = self._one_steering(steering)
        table = self._summary_of(name)
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot(table["strength"], 100 * table["success"], "o-", color="#1f77b4")
        ax.set_xlabel("strength (x the recommended point)")
        ax.set_ylabel("success %", color="#1f77b4")
        ax.set_ylim(0, 100)
        ax2 = ax.twinx()
        ax2.plot(table["strength"], table["fluency_delta"], "s--", color="#d62728")
        ax2.axhline(FLUENCY_BUDGET, color="#d62728", lw=0.6, ls=":")
        ax2.set_ylabel("fluency delta (nat/token)", color="#d62728")
        ax.axvline(1.0, color="grey", lw=0.6, ls=":")
        ax.set_title(f"{name}: {len(self.prompts)} prompts, judge {self.judges[name]}", fontsize=9)
        fig.tight_layout()
        return fig

    def to_dict(self) -> dict:
        """A JSON-able record; ``Evaluation.from_dict`` reads it and ``Engine.evaluate`` of
        that (or of this object) replays every row token for token."""
        return {
            "steerings": {n: r.to_dict() for n, r in self.steerings.items()},
            "prompts": [p if isinstance(p, str) else [dict(m) for m in p] for p in self.prompts],
            "strengths": list(self.strengths),
            "sampling": dict(self.sampling),
            "judges": dict(self.judges),
            "judge_forms": {n: None if f is None else list(f) for n, f in self.judge_forms.items()},
            "defaults": {str(i): _plain(asdict(d)) for i, d in self.defaults.items()},
            "rows": [_plain(asdict(r)) for r in self.rows],
            "model": self.model,
            "complete": self.complete,
            "cancelled": self.cancelled,
            "off_topic_from": self.off_topic_from,
            "products": self.products,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Evaluation:
        """The evaluation of a ``to_dict`` record; a malformed record is a ``RequestError``."""
        if not isinstance(d, Mapping):
            raise RequestError("record", f"must be a dict from Evaluation.to_dict, got {d!r}")
        missing = [k for k in ("steerings", "prompts", "strengths", "sampling") if k not in d]
        if missing:
            raise RequestError(f"record.{missing[0]}", "is missing")
        try:
            steerings = {n: SteerRequest.from_dict(r) for n, r in d["steerings"].items()}
            defaults = {
                int(i): PromptDefault(**{**v, "token_ids": tuple(v["token_ids"])})
                for i, v in d.get("defaults", {}).items()
            }
            rows = [EvalRow(**{**r, "token_ids": tuple(r["token_ids"])}) for r in d.get("rows", [])]
            forms = {
                n: None if f is None else tuple(f) for n, f in d.get("judge_forms", {}).items()
            }
            return cls(
                steerings,
                [p if isinstance(p, str) else [dict(m) for m in p] for p in d["prompts"]],
                tuple(float(m) for m in d["strengths"]),
                dict(d["sampling"]),
                {n: str(j) for n, j in d.get("judges", {}).items()},
                forms,
                defaults,
                rows,
                str(d.get("model", "")),
                bool(d.get("complete", False)),
                bool(d.get("cancelled", False)),
                off_topic_from=_index_or_none(d.get("off_topic_from")),
                products=str(d.get("products", "float32")),
            )
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            if isinstance(err, RequestError):
                raise
            raise RequestError("record", f"is not an Evaluation record: {err!r}") from None


def _mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else float("nan")


def _index_or_none(value) -> int | None:
    return None if value is None else int(value)


def _plain(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def grid(evaluation: Evaluation, steering: str | None = None) -> list[dict]:
    """Prompts x strengths as plain dicts (what the explorer's grid draws): per prompt its
    name, kind, DEFAULT text and one cell per finished strength."""
    name = evaluation._one_steering(steering)
    out = []
    for i, p in enumerate(evaluation.prompts):
        cells = {
            r.strength: {
                "strength": r.strength,
                "text": r.text,
                "success": bool(r.success),
                "score": r.score,
                "fluency_delta": round(r.fluency_delta, 3),
                "shared": r.shared,
            }
            for r in evaluation.rows
            if r.prompt_index == i and r.steering == name
        }
        for (steer, m, j), text in evaluation.running.items():
            if j == i and steer == name and m not in cells:
                cells[m] = {"strength": m, "text": text, "running": True}
        default = evaluation.defaults.get(i)
        out.append(
            {
                "prompt": prompt_name(p),
                "kind": prompt_kind(p),
                "default": default.text if default else "",
                "cells": [cells.get(m) for m in evaluation.strengths],
            }
        )
    return out


def check_strengths(strengths: Sequence) -> tuple[float, ...]:
    """A non-empty ladder of distinct finite multipliers."""
    values = checks.sequence("strengths", strengths)
    if not values:
        raise RequestError("strengths", "is empty: give at least one multiplier")
    seen: dict[float, int] = {}
    for i, m in enumerate(values):
        v = checks.number(f"strengths[{i}]", m)
        if v in seen:
            raise RequestError(f"strengths[{i}]", f"repeats strengths[{seen[v]}] ({m!r})")
        seen[v] = i
    return tuple(seen)
