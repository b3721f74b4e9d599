"""The success / fluency trade-off chart of an evaluation, as a self-contained SVG string.

SVG rather than a plotting library because the explorer stores it in widget state: it then
renders in JupyterLab, Colab, VS Code and a static HTML export alike, with no kernel and no
JavaScript library. Every point carries ``data-strength`` so the widget can make it a button.
"""

from __future__ import annotations

import math
from html import escape

W, H = 460, 230
LEFT, RIGHT, TOP, BOTTOM = 46, 52, 14, 40
SUCCESS_COLOUR, FLUENCY_COLOUR = "#2b6cb0", "#c05621"


def tradeoff_svg(
    points: list[tuple[float, float, float, int]],
    current: float | None = None,
    budget: float = 1.0,
) -> str:
    """``points``: (strength multiplier, success rate, mean fluency delta, rows) in ladder
    order; rows with ``n == 0`` (not finished yet) are left out of the lines."""
    done = [p for p in points if p[3] > 0 and not math.isnan(p[1])]
    xs = [p[0] for p in points] or [0.0, 1.0]
    x_lo, x_hi = min(xs + [1.0]), max(xs + [1.0])
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    pad = 0.04 * (x_hi - x_lo)  # the end points' markers stay inside the frame
    x_lo, x_hi = x_lo - pad, x_hi + pad
    flu = [p[2] for p in done]
    f_lo = min([0.0, *flu])
    f_hi = max([budget * 1.5, *flu])

    def x(m: float) -> float:
        return LEFT + (m - x_lo) / (x_hi - x_lo) * (W - LEFT - RIGHT)

    def y_s(s: float) -> float:
        return TOP + (1 - s) * (H - TOP - BOTTOM)

    def y_f(f: float) -> float:
        return TOP + (f_hi - f) / (f_hi - f_lo) * (H - TOP - BOTTOM)

    parts = _frame("success and fluency against strength")
    for s in (0, 0.5, 1):
        parts.append(_text(LEFT - 6, y_s(s) + 4, f"{100 * s:.0f}%", "end", SUCCESS_COLOUR))
    for f in _ticks(f_lo, f_hi):
        parts.append(_text(W - RIGHT + 6, y_f(f) + 4, f"{f:+.1f}", "start", FLUENCY_COLOUR))
    parts.append(
        f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y_f(budget):.1f}" y2="{y_f(budget):.1f}" '
        f'stroke="{FLUENCY_COLOUR}" stroke-dasharray="2 3" stroke-opacity="0.7"/>'
    )
    parts.append(_vline(x(1.0), "recommended x1", "currentColor", "4 3", TOP + 11))
    if current is not None and math.isfinite(current) and x_lo <= current <= x_hi:
        parts.append(_vline(x(current), f"current x{current:g}", "#2f855a", "", TOP + 25))
    parts.append(_polyline([(x(m), y_s(s)) for m, s, _, _ in done], SUCCESS_COLOUR, ""))
    parts.append(_polyline([(x(m), y_f(f)) for m, _, f, _ in done], FLUENCY_COLOUR, "5 3"))
    for m, s, f, n in done:
        tip = f"x{m:g}: success {100 * s:.0f}% of {n}, fluency {f:+.2f} nat"
        parts.append(
            f'<g class="sw-point" data-strength="{m!r}" style="cursor:pointer"><title>'
            f'{escape(tip)}</title><circle cx="{x(m):.1f}" cy="{y_s(s):.1f}" r="5" '
            f'fill="{SUCCESS_COLOUR}"/><rect x="{x(m) - 4:.1f}" y="{y_f(f) - 4:.1f}" '
            f'width="8" height="8" fill="{FLUENCY_COLOUR}"/></g>'
        )
    for m in xs:
        parts.append(_text(x(m), H - BOTTOM + 15, f"x{m:g}", "middle", "currentColor"))
    parts.append(_text(LEFT, H - 6, "● success %", "start", SUCCESS_COLOUR))
    parts.append(
        _text(W - RIGHT, H - 6, f"■ fluency delta (nat/token; budget {budget:g})", "end",
              FLUENCY_COLOUR)
    )  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def _frame(label: str) -> list[str]:
    """A chart's opening tag and plot frame (its ``aria-label`` says what it shows)."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="sw-chart" viewBox="0 0 {W} {H}" '
        f'width="{W}" height="{H}" role="img" aria-label="{escape(label)}">',
        f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
        'fill="none" stroke="currentColor" stroke-opacity="0.3"/>',
    ]


def _ticks(lo: float, hi: float) -> list[float]:
    step = 0.5 if hi - lo <= 3 else 1.0 if hi - lo <= 6 else 2.0
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _text(x: float, y: float, s: str, anchor: str, colour: str) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="11" text-anchor="{anchor}" '
        f'fill="{colour}">{escape(s)}</text>'
    )


def _vline(x: float, label: str, colour: str, dash: str, label_y: float) -> str:
    """A marked strength; its label sits left of the line in the right half (stays inside)."""
    dashes = f' stroke-dasharray="{dash}"' if dash else ""
    right_half = x > (LEFT + W - RIGHT) / 2
    anchor, dx = ("end", -3) if right_half else ("start", 3)
    return (
        f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" stroke="{colour}" '
        f'stroke-opacity="0.6"{dashes}><title>{escape(label)}</title></line>'
        + _text(x + dx, label_y, label, anchor, colour)
    )


def _polyline(pts: list[tuple[float, float]], colour: str, dash: str) -> str:
    if len(pts) < 2:
        return ""
    coords = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
    dashes = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dashes}/>'


SIDE_COLOURS = ("#4a5568", "#c05621", "#2b6cb0", "#2f855a", "#805ad5")  # DEFAULT first


def turns_svg(series: dict[str, list[float]], label: str) -> str:
    """One line per side over a chat's turns (``series``: side -> a value per turn, NaN
    where a turn has none), for ``Readout.svg``."""
    n = max((len(v) for v in series.values()), default=0)
    values = [v for vs in series.values() for v in vs if math.isfinite(v)] or [0.0]
    lo, hi = min(0.0, *values), max(values)
    hi = hi if hi > lo else lo + 1.0

    def x(t: float) -> float:
        return LEFT + (t + 0.5) / max(n, 1) * (W - LEFT - RIGHT)

    def y(v: float) -> float:
        return TOP + (hi - v) / (hi - lo) * (H - TOP - BOTTOM)

    parts = _frame(f"{label} per turn")
    for v in (lo, (lo + hi) / 2, hi):
        parts.append(_text(LEFT - 6, y(v) + 4, f"{v:.2g}", "end", "currentColor"))
    for t in range(n):
        parts.append(_text(x(t), H - BOTTOM + 15, f"{t + 1}", "middle", "currentColor"))
    for k, (side, vs) in enumerate(series.items()):
        colour = SIDE_COLOURS[k % len(SIDE_COLOURS)]
        pts = [(x(t), y(v)) for t, v in enumerate(vs) if math.isfinite(v)]
        parts.append(_polyline(pts, colour, "" if k else "4 3"))
        parts += [f'<circle class="sw-turn" cx="{a:.1f}" cy="{b:.1f}" r="3.5" fill="{colour}"/>'
                  for a, b in pts]  # fmt: skip
        parts.append(_text(LEFT + 110 * k, H - 6, f"● {side}", "start", colour))
    parts.append(_text(W - RIGHT, H - 6, f"{label} (turn)", "end", "currentColor"))
    parts.append("</svg>")
    return "".join(parts)
