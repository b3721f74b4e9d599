"""Side-by-side completions (DEFAULT, STEERED, sweep rows) with the split from DEFAULT marked.

An anywidget: panes are typed traitlets drawn in the browser, so they stream live in a
kernel session and still render in a static HTML export. ``build_panes`` turns a streaming
frame into panes; the widget only draws them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import anywidget
import traitlets

from ..analysis.explanations import effect_line
from ..steering.results import Completion
from . import assets
from .token_probs import hover_rows

TokenOf = Callable[[int], tuple[str, bool]]  # token id -> (text, is special)


class Completions(anywidget.AnyWidget):
    """``panes``: ``[{label, tokens, special, diverge, stop, streaming, note, probs, gated}]``.

    ``gated`` marks, for a conditionally steered pane (``sw.When``), each token written
    while a gate was on (the position that predicted it was steered); ``None`` for panes
    without a condition.

    ``probs`` holds, per token, ``[probability, [[alternative, probability], ...]]`` (shown
    when hovering the token; ``None``: the backend supplied none, and the hover says so).

    ``diverge`` is, for a steered pane, the first token position where it departs from
    DEFAULT (-1 while they agree); DEFAULT's own is always -1. ``stale`` says why the panes
    no longer match the controls ("" while they do).

    Why the text changed (filled by ``explain_panel``): ``effects`` maps a label to its
    tokens' ``p_steered``, ``p_unsteered`` and ``effect`` (nats), drawn as colours while
    ``effect_on``; clicking a token sets ``selected`` (``{label, position}``) and the
    attribution table of that token arrives in ``attribution``; each of its features has a
    "card" and a "steer" button (``feature_action``).
    """

    _esm = traitlets.Unicode(assets.esm("completions")).tag(sync=True)
    _css = traitlets.Unicode(assets.css("completions")).tag(sync=True)
    prompt = traitlets.Unicode("").tag(sync=True)
    panes = traitlets.List(traitlets.Dict()).tag(sync=True)
    stale = traitlets.Unicode("").tag(sync=True)
    effect_on = traitlets.Bool(False).tag(sync=True)
    effects = traitlets.Dict({}).tag(sync=True)
    selected = traitlets.Dict({}).tag(sync=True)
    attribution = traitlets.Dict({}).tag(sync=True)
    feature_action = traitlets.Dict({}).tag(sync=True)  # {action: card | steer, source, index}

    def select(self, label: str, position: int) -> None:
        """Click token ``position`` of pane ``label`` (its attribution table opens)."""
        self.selected = {"label": label, "position": int(position)}

    def act(self, action: str, source: str, index: int) -> None:
        """Press a feature's "card" or "steer" button in the attribution table."""
        self._presses = getattr(self, "_presses", 0) + 1  # the same button twice fires twice
        self.feature_action = {"action": action, "source": source, "index": int(index),
                               "at": self._presses}  # fmt: skip

    def effect_text(self, label: str, position: int) -> str:
        """The hover line of a token while effects are shown, as the browser writes it."""
        e = self.effects.get(label)
        if not e:
            return ""
        return effect_line(e["p_unsteered"][position], e["p_steered"][position])

    def text(self, label: str) -> str:
        """The text a pane shows (its tokens joined), e.g. ``text("STEERED")``."""
        return "".join(self.pane(label)["tokens"])

    def token_info(self, label: str, position: int) -> dict:
        """What hovering a pane's token shows: its text, probability and the alternatives
        (``probability`` None: not available from this backend)."""
        p = self.pane(label)
        probs = p.get("probs")
        prob, top = probs[position] if probs is not None else (None, [])
        return {"token": p["tokens"][position], "probability": prob, "top": [tuple(t) for t in top]}

    def pane(self, label: str) -> dict:
        for p in self.panes:
            if p["label"] == label:
                return p
        raise KeyError(label)


def effect_state(effect) -> dict:
    """A ``SteeringEffect`` as the JSON the panes colour by (rounded: small saved state)."""
    import math

    return {
        "p_steered": [round(math.exp(x), 6) for x in effect.logprob_steered],
        "p_unsteered": [round(math.exp(x), 6) for x in effect.logprob_unsteered],
        "effect": [round(x, 4) for x in effect.effect],
    }


def divergence(ids: Sequence[int], reference: Sequence[int], reference_done: bool) -> int:
    """First position where ``ids`` departs from ``reference``; -1 while none is known.

    A sequence that is still a prefix of an unfinished reference has not departed yet; one
    that runs past a finished reference departs where the reference ended.
    """
    for i, (a, b) in enumerate(zip(ids, reference, strict=False)):
        if a != b:
            return i
    if reference_done and len(ids) > len(reference):
        return len(reference)
    return -1


def build_panes(outputs: Mapping[str, Completion], token_of: TokenOf, streaming: bool) -> list:
    """One pane per output; steered panes carry their split from DEFAULT."""
    default = outputs.get("DEFAULT")
    panes = []
    for label, comp in outputs.items():
        tokens = [token_of(i) for i in comp.token_ids]
        diverge = -1
        if label != "DEFAULT" and default is not None:
            diverge = divergence(comp.token_ids, default.token_ids, default.stop != "")
        panes.append(_pane(label, [t for t, _ in tokens], [s for _, s in tokens], diverge))
        probs = hover_rows(comp, lambda i: token_of(i)[0])
        panes[-1].update(
            stop=comp.stop, streaming=streaming, probs=probs, gated=_listed(comp.gated_tokens())
        )
    if "STEERED" not in outputs:
        panes.append(_pane("STEERED", [], [], -1, note="pick a feature to steer"))
    return panes


def _listed(marks: tuple[bool, ...] | None) -> list[bool] | None:
    return None if marks is None else list(marks)


def _pane(label: str, tokens: list, special: list, diverge: int, note: str = "") -> dict:
    return {
        "label": label,
        "tokens": tokens,
        "special": special,
        "diverge": diverge,
        "stop": "",
        "streaming": False,
        "note": note,
        "probs": None,
        "gated": None,
    }
