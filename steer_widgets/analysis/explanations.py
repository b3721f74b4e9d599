"""What an explanation of steering returns: the per-token steering effect, a token's
attribution (steering rows and SAE features sharing out its gain) and the features the
steering moved over a completion.

Plain frozen records with ``frame()`` (pandas) and JSON-able views for the widgets; the
work that fills them lives in ``explain`` (effect), ``attribution`` and
``changed_features``. ``feature_label`` is the label their feature rows carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def effect_line(p_unsteered: float, p_steered: float) -> str:
    """ "steering raised this token from 0.2% to 41%" (completions.js writes the same)."""
    if abs(p_steered - p_unsteered) < 5e-4 * max(p_steered, p_unsteered, 1e-12):
        return f"steering left this token at {_pct(p_steered)}"
    verb = "raised" if p_steered > p_unsteered else "lowered"
    return f"steering {verb} this token from {_pct(p_unsteered)} to {_pct(p_steered)}"


def _pct(q: float) -> str:
    return f"{100 * q:.1f}%" if q >= 0.001 else f"{100 * q:.1e}%"


@dataclass(frozen=True)
class SteeringEffect:
    """Per token of one output: its log-probability as generated (steered) and under the
    unsteered model given the same prefix; ``effect`` is their difference (nats).

    ``gated`` (conditional steering only): whether some gate was on at the position that
    predicted the token (``Completion.gated_tokens``). Where no gate was on up to that
    position and nothing else steers, the effect is exactly 0."""

    label: str
    tokens: tuple[str, ...]
    token_ids: tuple[int, ...]
    logprob_steered: tuple[float, ...]
    logprob_unsteered: tuple[float, ...]
    gated: tuple[bool, ...] | None = None

    @property
    def effect(self) -> tuple[float, ...]:
        return tuple(
            s - u for s, u in zip(self.logprob_steered, self.logprob_unsteered, strict=True)
        )

    def describe(self, position: int) -> str:
        """One line for a token, e.g. "steering raised this token from 0.2% to 41%"."""
        s, u = self.logprob_steered[position], self.logprob_unsteered[position]
        return effect_line(math.exp(u), math.exp(s))

    def frame(self):
        import pandas as pd

        columns = {
            "position": range(len(self.tokens)),
            "token": self.tokens,
            "p_steered": [math.exp(x) for x in self.logprob_steered],
            "p_unsteered": [math.exp(x) for x in self.logprob_unsteered],
            "effect": self.effect,
        }
        if self.gated is not None:
            columns["gated"] = self.gated
        return pd.DataFrame(columns)


@dataclass(frozen=True)
class RowShare:
    """One steering row (a feature or vector of the request): its first-order share of the
    token's gain and the measured change when the row is removed (both in nats)."""

    name: str
    field: str
    hook: str
    attribution: float
    removed: float


@dataclass(frozen=True)
class FeatureShare:
    """An SAE feature the steering moved at the position that predicts the token: its
    activation before (unsteered run) and after (steered run), and its attribution to the
    token (gradient times the change it wrote, over all positions); ``ablated`` is the
    measured drop when its activation is set back (``None`` unless asked for)."""

    source: str
    index: int
    label: str
    before: float
    after: float
    attribution: float
    ablated: float | None = None

    @property
    def change(self) -> float:
        return self.after - self.before


@dataclass(frozen=True)
class Attribution:
    """Why one steered token became more (or less) likely: ``gain`` is its log-probability
    steered minus unsteered (measured, nats); ``rows`` and ``features`` share it out.
    ``gated`` (conditional steering only): whether some gate was on at the position that
    predicted the token (``Completion.gated_tokens``)."""

    label: str
    position: int
    token: str
    gain: float
    rows: tuple[RowShare, ...]
    features: tuple[FeatureShare, ...]
    method: str = "gradient"
    gated: bool | None = None
    engine_id: int = field(default=0, repr=False, compare=False)

    def frame(self):
        """Rows then features, one line each (``kind`` says which)."""
        import pandas as pd

        rows = [
            {"kind": "row", "name": r.name, "hook": r.hook, "attribution": r.attribution,
             "measured": r.removed, "before": None, "after": None}
            for r in self.rows
        ]  # fmt: skip
        rows += [
            {"kind": "feature", "name": f"{f.source} #{f.index} {f.label}", "hook": f.source,
             "attribution": f.attribution, "measured": f.ablated, "before": f.before,
             "after": f.after}
            for f in self.features
        ]  # fmt: skip
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """JSON-able (what the widget shows)."""
        return {
            "label": self.label,
            "position": self.position,
            "token": self.token,
            "gain": self.gain,
            "method": self.method,
            "gated": self.gated,
            "rows": [vars(r) | {} for r in self.rows],
            "features": [vars(f) | {"change": f.change} for f in self.features],
        }


@dataclass(frozen=True)
class ChangedFeature:
    index: int
    label: str
    default: float  # mean over DEFAULT's completion, read by the unsteered model
    steered_text: float  # mean over the steered completion, read by the unsteered model
    steered: float  # mean over the steered completion as the steered model saw it

    @property
    def change(self) -> float:
        return self.steered - self.default


@dataclass(frozen=True)
class ChangedFeatures:
    """The features of ``source`` whose mean activation over the completion moved most
    between DEFAULT and a steered output, largest absolute change first."""

    label: str
    source: str
    features: tuple[ChangedFeature, ...]

    def frame(self):
        import pandas as pd

        return pd.DataFrame(
            [
                {"source": self.source, "index": f.index, "label": f.label,
                 "default": f.default, "steered_text": f.steered_text, "steered": f.steered,
                 "change": f.change}
                for f in self.features
            ],
            columns=["source", "index", "label", "default", "steered_text", "steered", "change"],
        )  # fmt: skip

    def to_list(self) -> list[dict]:
        return [vars(f) | {"source": self.source, "change": f.change} for f in self.features]


def feature_label(engine, source: str, index: int) -> str:
    """A feature's label as the result rows carry it (``#index`` where none can be read)."""
    try:
        return engine.feature_index(source).label(index)
    except Exception:  # an index that cannot be built is no reason to fail the table
        return f"#{index}"
