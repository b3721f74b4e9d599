"""A feature card: what one feature is, before steering with it.

Label, the tokens it promotes and suppresses (the feature index's logit lens through the
final norm, where the engine computes it), activation density, the top
activating contexts with each context's strongest token highlighted, decoder neighbours
(``engine.neighbours``) that open their own card, and a "steer with this" button. Works
for any SAE the engine knows: where no index shipped, the engine computes top tokens on
demand and the card says that contexts are unavailable. A Neuronpedia explanation not on
disk yet comes from the card's worker thread, never from the click's own thread.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable

import ipywidgets as widgets

from ..errors import SteerWidgetsError
from .worker import Worker

N_CONTEXTS = 3
N_NEIGHBOURS = 6
FETCHING = " · fetching the Neuronpedia explanation…"


def context_html(context: dict) -> str:
    """One activating context, tokens shaded by activation, the max token outlined."""
    acts = context.get("acts") or [0.0] * len(context["tokens"])
    peak = max(acts) or 1.0
    spans = []
    for i, (tok, a) in enumerate(zip(context["tokens"], acts, strict=False)):
        style = f"background: rgba(255,110,0,{0.8 * max(0.0, a) / peak:.2f})"
        if i == context["max_pos"]:
            style += "; outline: 2px solid var(--jp-brand-color1, #1976d2)"
        spans.append(f"<span style='{style}'>{html.escape(tok)}</span>")
    return f"<div class='sw-context'>{''.join(spans)}</div>"


def card_html(source: str, info, label: str = "", url: str | None = None, note: str = "") -> str:
    """The card's text: title (linked to the feature's Neuronpedia page where it has one),
    top tokens, density, contexts."""
    lines = [f"<b>{html.escape(source)} #{info.index}</b> {html.escape(label)}"]
    if url:
        link = f"<a href='{html.escape(url)}' target='_blank' rel='noopener'>Neuronpedia</a>"
        lines.append(f"<div class='sw-hint'>{link}{html.escape(note)}</div>")
    for name, toks in (
        ("promotes", info.top_tokens),
        ("suppresses", getattr(info, "bottom_tokens", ())),
    ):
        if toks:
            text = html.escape(", ".join(repr(t) for t in toks[:10]))
            lines.append(f"<div>{name} (logit lens): <code>{text}</code></div>")
    stats = []
    if info.max_act is not None:
        stats.append(f"max activation {info.max_act:.1f}")
    if info.frac_active is not None:
        stats.append(f"active on {100 * info.frac_active:.2f}% of tokens")
    if stats:
        lines.append(f"<div class='sw-hint'>{' · '.join(stats)}</div>")
    if info.contexts:
        lines.append("<div>top activating contexts:</div>")
        lines += [context_html(c) for c in info.contexts[:N_CONTEXTS]]
    else:
        lines.append("<div class='sw-hint'>no activating contexts: no index shipped</div>")
    return "".join(lines)


class FeatureCard:
    """``show(source, index)`` fills ``ui``; ``on_steer(source, index)`` picks the feature.

    ``show`` runs on the kernel's message thread (a click), so it renders only what is
    local; a Neuronpedia explanation not on disk yet is fetched on the card's own worker
    thread (a hanging network, DNS included, must not freeze the kernel) and shown when it
    comes, if the card still shows that feature. ``close`` lets the worker go."""

    def __init__(
        self,
        engine,
        on_steer: Callable[[str, int, float | None], None],
        on_error: Callable[[str], None],
    ) -> None:
        self.engine = engine
        self.on_steer = on_steer
        self.on_error = on_error
        self.shown: tuple[str, int] | None = None
        self._lock = threading.Lock()  # ``shown`` and the body change together
        self._worker = Worker("sw-card")
        self.body = widgets.HTML("", layout={"width": "100%"})
        self.steer = widgets.Button(
            description="steer with this", button_style="primary", layout={"width": "auto"}
        )
        self.close_button = widgets.Button(description="close", layout={"width": "auto"})
        self.neighbours = widgets.HBox([], layout={"flex_flow": "row wrap"})
        self.steer.on_click(lambda _: self.shown and self.on_steer(*self.shown, None))
        self.close_button.on_click(lambda _: self.hide())
        self.ui = widgets.VBox(
            [self.body, self.neighbours, widgets.HBox([self.steer, self.close_button])],
            layout={"display": "none", "border": "1px solid var(--jp-border-color1, #999)"},
        )
        self.ui.add_class("sw-card")

    def show(self, source: str, index: int) -> None:
        """Shows the feature's card at once; its Neuronpedia explanation follows when the
        worker has it (a hint says it is coming)."""
        try:
            fi = self.engine.feature_index(source)
            info = fi[index]
            near = self.engine.neighbours(source, index, n=N_NEIGHBOURS)
            fetch = _needs_fetch(fi, index)
            note = FETCHING if fetch else _neuronpedia_label(fi, index)
        except (SteerWidgetsError, IndexError) as err:
            self.on_error(str(err))
            return
        with self._lock:
            self.shown = (source, index)
            self.body.value = _body(fi, source, info, note)
        self._show_neighbours(source, near)
        self.ui.layout.display = None
        if fetch:
            self._worker.submit(self._fetched, fi, source, index)  # closed: local label stays

    def hide(self) -> None:
        """Hides the card; a fetch still running for it is then not shown."""
        with self._lock:
            self.shown = None
        self.ui.layout.display = "none"

    def close(self) -> None:
        """Hides the card and lets its worker end without waiting for a fetch in flight (a
        hanging one must not hang the explorer's ``close``); its result is not shown."""
        self.hide()
        self._worker.close()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the last fetch asked for is over (and shown, if still current)."""
        return self._worker.wait(timeout)

    def _show_neighbours(self, source: str, near: list[tuple[int, float]]) -> None:
        buttons = [widgets.HTML("decoder neighbours:")]
        for i, cos in near:
            b = widgets.Button(
                description=f"#{i} ({cos:.2f})",
                tooltip=f"open the card of #{i}",
                layout={"width": "auto"},
            )
            b.on_click(lambda _, i=i: self.show(source, i))
            buttons.append(b)
        self.neighbours.children = tuple(buttons)

    def _fetched(self, fi, source: str, index: int) -> None:
        """On the worker: fetch, then re-render if the card still shows this feature (a
        stale explanation is not shown; ``fi`` keeps it as the label for later)."""
        try:
            note = _neuronpedia_label(fi, index)
        except Exception as err:  # keep the card alive; say what failed
            note = f" · Neuronpedia fetch failed: {type(err).__name__}: {err}"
        with self._lock:
            if self.shown == (source, index):
                self.body.value = _body(fi, source, fi[index], note)


def _body(fi, source: str, info, note: str) -> str:
    url = fi.url(info.index) if hasattr(fi, "url") else None
    return card_html(source, info, fi.label(info.index), url, note)


def _needs_fetch(fi, index: int) -> bool:
    """Whether the card must ask Neuronpedia over the network: the SAE has an id, the
    feature exists, its explanation is not on disk, and we are online (offline,
    ``fetch_labels`` says so at once, with no request)."""
    from ..sae.neuronpedia import offline

    if not getattr(fi, "neuronpedia_id", None) or not 0 <= index < len(fi):
        return False
    return not offline() and not fi.explanation_cached(index)


def _neuronpedia_label(fi, index: int) -> str:
    """Fetch the feature's Neuronpedia explanation as its label (once; then from disk);
    offline, a note saying the local label is shown. Blocks on the network unless
    ``_needs_fetch`` is false: the card calls it there or on its worker."""
    from ..sae.neuronpedia import NeuronpediaUnavailable

    if not getattr(fi, "neuronpedia_id", None) or not 0 <= index < len(fi):
        return ""
    try:
        fi.fetch_labels([index])
    except NeuronpediaUnavailable as err:
        return f" · {err}"
    return ""
