"""What a chat's replies are about, turn by turn: a feature's activation or a direction's
cosine with the residual over each side's reply (``Chat.readout``).

Each reply is read by the unsteered model over its own side's history (the residual cache's
pass, as ``condition_scores`` reads a condition): the readout then says what the text is
about, not what the steering added to the residual while writing it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RequestError
from ..steering.entries import Feature, Vector, When
from .chart import turns_svg


@dataclass(frozen=True)
class Readout:
    """Per turn and side: ``mean`` and ``max`` of the score over the reply's tokens (its
    final stop token left out), and ``n`` tokens; ``what`` names the score."""

    what: str
    rows: tuple[tuple[int, str, float, float, int], ...]  # (turn, side, mean, max, n)

    def frame(self):
        import pandas as pd

        return pd.DataFrame(list(self.rows), columns=["turn", "side", "mean", "max", "n"])

    def svg(self) -> str:
        """The mean per turn, one line per side (DEFAULT dashed)."""
        series: dict[str, list[float]] = {}
        for _turn, side, mean, _, _ in self.rows:  # in turn order
            series.setdefault(side, []).append(mean)
        return turns_svg(series, f"mean {self.what}")

    def _repr_svg_(self) -> str:  # a notebook shows the chart
        return self.svg()


def readout(engine, chat, target: Feature | Vector) -> Readout:
    """``target``'s score over every reply of ``chat``, per turn and side."""
    if not isinstance(target, (Feature, Vector)):
        raise RequestError("target", f"must be a sw.Feature or a sw.Vector, got {target!r:.80}")
    when = When(target, above=0.0)
    what = (f"{target.source} #{target.index}" if isinstance(target, Feature)
            else f"cosine with a direction at {target.hook}")  # fmt: skip
    first = 1 if chat.system is not None else 0
    stops = engine.decoder.stop_ids
    rows = []
    for side in chat.sides:
        history = chat.history(side)
        for t, turn in enumerate(chat.turns):
            reply = turn.replies[side]
            ids = list(reply.token_ids)
            while ids and ids[-1] in stops:
                ids.pop()
            prompt = history[: first + 2 * t + 1]
            _, values, _ = engine.condition_scores(when, prompt, ids)
            read = values[len(values) - len(ids) :] if ids else []
            mean = sum(read) / len(read) if read else float("nan")
            rows.append((t, side, mean, max(read, default=float("nan")), len(read)))
    rows.sort(key=lambda r: (r[0], chat.sides.index(r[1])))
    return Readout(what, tuple(rows))
