"""The controls as a request, and a control set by its request field name.

Why one module: reading the request and setting a control are the two directions of the same
mapping (prompt box and mode, the sweep's checkbox and text, the settings' table), so a field
added to one direction is seen in the other.
"""

from __future__ import annotations

from typing import Any

from .. import checks
from ..errors import RequestError
from ..steering.entries import Condition
from ..steering.requests import SteerRequest
from .arguments import check_strength
from .feature_rows import FeatureRows
from .fields import Controls
from .layout import Layout


def read_request(
    view: Layout, controls: Controls, rows: FeatureRows, when: Condition | None = None
) -> SteerRequest:
    """The request the controls describe (STEERED only when a feature is picked), steering
    only where ``when`` holds (``Explorer.set(when=...)``)."""
    text = view.prompt.value
    prompt = [{"role": "user", "content": text}] if view.mode.value == "chat" else text
    features, vectors = tuple(rows.features()), tuple(rows.vectors())
    values = controls.values()
    steered = features or vectors
    sweep = _sweep(view, values["strength_multiplier"]) if steered else ()
    return SteerRequest(
        prompt=prompt,
        features=features,
        vectors=vectors,
        types=("DEFAULT", "STEERED") if steered else ("DEFAULT",),
        sweep=sweep,
        when=when,
        **values,
    )


def _sweep(view: Layout, mult: float) -> tuple[float, ...]:
    """The sweep's multipliers when it is on; STEERED itself is the row at ``mult``."""
    if not view.sweep_on.value:
        return ()
    try:
        parsed = [float(s) for s in view.sweep_text.value.replace(",", " ").split()]
    except ValueError as err:
        raise RequestError("sweep", f"expected numbers, got {view.sweep_text.value!r}") from err
    return tuple(dict.fromkeys(m for m in parsed if m != mult))  # each row once


def set_control(view: Layout, controls: Controls, name: str, value: Any) -> None:
    """Set one control by request field name (or ``prompt``, ``chat``, ``sweep``); a bad
    value raises ``RequestError`` and leaves the control unchanged."""
    if name == "prompt":
        if not isinstance(value, str):
            raise RequestError("prompt", f"must be text, got {value!r}")
        view.prompt.value = value
    elif name == "chat":
        view.mode.value = "chat" if checks.flag("chat", value) else "completion"
    elif name == "sweep":
        values = () if value is None else tuple(checks.sequence("sweep", value))
        for m in values:
            check_strength(m, "sweep")
        view.sweep_on.value = bool(values)
        if values:
            view.sweep_text.value = ", ".join(f"{m:g}" for m in values)
    else:
        controls.set(name, value)
