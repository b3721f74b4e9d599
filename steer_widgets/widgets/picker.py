"""Feature picker: choose an SAE source, then find features by text, ``#index`` or neighbours.

Search runs over the engine's feature index (top output tokens and, for shipped SAEs, top
activating contexts) at once; where the engine ranks features by what steering with them
does (``search_features``), those matches follow on a background thread, so the kernel
never waits for them. Each result shows its top tokens and one activating context, with a
button that hands the feature to ``on_pick``. A search that finds nothing says why (an
index out of range, a word no feature mentions) instead of showing an empty list. The
"add concept" row turns words into a steering vector where the engine can
(``engine.concept_vector``) and hands it to ``on_concept``; its "add as features" button
hands the words to ``on_concept_features``, which adds the concept as the few SAE features
that steer together (``engine.concept_features``).
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Callable

import ipywidgets as widgets

from ..errors import SteerWidgetsError
from ..steering.cancel import worker_thread
from .card import FeatureCard

PickCallback = Callable[[str, int, float | None], None]  # (source, index, strength or None)
ErrorCallback = Callable[[str], None]
ConceptCallback = Callable[[str, object], None]  # (name, sw.Vector)
ConceptFeaturesCallback = Callable[[str], None]  # (name): the explorer finds and adds them
INDEX = re.compile(r"^#?\s*(\d+)$")


def describe(info, cosine: float | None = None, label: str = "") -> str:
    """One result line as HTML: index, label, top tokens, typical max activation, a context."""
    tokens = ", ".join(repr(t) for t in info.top_tokens[:6])
    bits = [f"<b>#{info.index}</b>"]
    if label:
        bits.append(html.escape(label))
    if cosine is not None:
        bits.append(f"cos {cosine:.2f}")
    if info.max_act is not None:
        bits.append(f"max {info.max_act:.1f}")
    bits.append(f"<code>{html.escape(tokens)}</code>")
    line = " · ".join(bits)
    if info.example:
        line += f"<br><span class='sw-hint'>{html.escape(info.example[:160])}</span>"
    return line


# -- adapter: the engine's concept API -----------------------------------------------------
# ``engine.search_features(query, sources, n)`` ranks features by what adding them does
# (each match with a label and a recommended strength); ``engine.concept_vector(concept)``
# turns a concept into a steering vector. An engine without them gets the feature index's
# text search only and no "add concept" row. Hooking the API up is this block only.
Found = tuple[int, str, float | None]  # (feature index, label, recommended strength)


def has_steering_search(engine) -> bool:
    return hasattr(engine, "search_features")


def steering_matches(engine, source: str, query: str, limit: int) -> list[Found]:
    """Features of ``source`` whose decoder rows push toward ``query``, best first."""
    matches = engine.search_features(query, sources=[source], n=limit)
    return [(int(m.index), str(m.label or ""), float(m.strength)) for m in matches]


def has_concepts(engine) -> bool:
    return hasattr(engine, "concept_vector")


def has_concept_features(engine) -> bool:
    return hasattr(engine, "concept_features")


# -------------------------------------------------------------------------------------------


def no_result_hint(query: str, size: int) -> str:
    """Why a search found nothing, and what to try instead."""
    m = INDEX.match(query.strip())
    if m:
        return f"feature #{m.group(1)} does not exist: this SAE has features #0..#{size - 1}"
    return (
        f"no feature mentions {query.strip()!r} in its top tokens or contexts; "
        f"try a shorter word, another SAE, or a feature index such as #12"
    )


def _text_and_button(placeholder: str, label: str) -> tuple[widgets.Text, widgets.Button]:
    """A text box that grows and its button, which never shrinks below its label."""
    text = widgets.Text(
        placeholder=placeholder,
        continuous_update=False,
        layout={"width": "auto", "flex": "1 1 14em", "min_width": "12em"},
    )
    button = widgets.Button(description=label, layout={"width": "auto", "min_width": "6em"})
    return text, button


class FeaturePicker:
    """Source dropdown, search box, result list and the concept row; ``ui`` is the widget."""

    def __init__(
        self,
        engine,
        on_pick: PickCallback,
        on_error: ErrorCallback,
        limit: int = 8,
        on_concept: ConceptCallback | None = None,
        on_concept_features: ConceptFeaturesCallback | None = None,
    ):
        self.engine = engine
        self.on_pick = on_pick
        self.on_error = on_error
        self.on_concept = on_concept
        self.on_concept_features = on_concept_features
        self.limit = limit
        sources = engine.saes.sources()
        self.source = widgets.Dropdown(
            options=sources,
            value=sources[0] if sources else None,
            description="SAE",
            style={"description_width": "3em"},
            layout={"width": "auto", "min_width": "16em", "flex": "0 1 auto"},
        )
        self.query, self.search_button = _text_and_button(
            "search words in top tokens / contexts, or #index", "Search"
        )
        self.concept, self.concept_button = _text_and_button(
            "a concept to steer toward, e.g. music", "add concept"
        )
        self.features_button = widgets.Button(
            description="add as features",
            tooltip="the concept as a few SAE features that steer together, one slider each",
            layout={"width": "auto", "min_width": "9em"},
        )
        self.concept_message = widgets.HTML("")  # what "add as features" found, and how fast
        self.results = widgets.VBox([])
        self.message = widgets.HTML("")
        self.steering_results = widgets.VBox([])
        self.steering_message = widgets.HTML("")
        self.steering_thread: threading.Thread | None = None
        self.card = FeatureCard(engine, on_pick, on_error)
        self.query.observe(lambda _: self.search(self.query.value), names="value")
        self.search_button.on_click(lambda _: self.search(self.query.value))
        self._quiet = False  # set while neighbours() switches the source itself
        self.source.observe(self._source_changed, names="value")
        self.concept_button.on_click(lambda _: self.add_concept(self.concept.value))
        self.features_button.on_click(lambda _: self.add_concept_features(self.concept.value))
        wrap = {"flex_flow": "row wrap", "width": "100%"}
        rows = [widgets.HBox([self.source, self.query, self.search_button], layout=wrap)]
        if has_concepts(engine) and on_concept is not None:
            concept_row = [self.concept, self.concept_button]
            if has_concept_features(engine) and on_concept_features is not None:
                concept_row.append(self.features_button)
            rows.append(widgets.HBox(concept_row, layout=wrap))
            rows.append(self.concept_message)
        for r in rows:
            r.add_class("sw-wrap")
        self.ui = widgets.VBox(
            [
                *rows,
                self.message,
                self.results,
                self.steering_message,
                self.steering_results,
                self.card.ui,
            ]
        )

    def _source_changed(self, _change) -> None:
        """Another SAE: run the same query there (Enter keeps working on the same text)."""
        if not self._quiet:
            self.search(self.query.value)

    def _clear(self) -> None:
        for box, message in (
            (self.results, self.message),
            (self.steering_results, self.steering_message),
        ):
            box.children = ()
            message.value = ""

    def search(self, query: str) -> list:
        """Text or ``#index`` search over the current source; shows and returns FeatureInfos.

        Where the engine can, features that steer toward ``query`` follow below (computed on
        ``steering_thread``).
        """
        source = self.source.value
        self._clear()
        if not source or not query.strip():
            return []
        m = INDEX.match(query.strip())
        try:
            index = self.engine.feature_index(source)
            if m:
                i = int(m.group(1))
                infos = [index[i]] if i < len(index) else []
            else:
                infos = index.search(query, limit=self.limit)
        except SteerWidgetsError as err:
            self.on_error(str(err))
            return []
        if infos:
            caption = f"{len(infos)} feature(s) mentioning {query!r} in {source}"
            self._show(self.results, self.message, infos, caption)
        else:
            self.message.value = hint(no_result_hint(query, len(index)))
        if not m and has_steering_search(self.engine):
            self._search_steering(source, query, index)
        return infos

    def _search_steering(self, source: str, query: str, index) -> None:
        self.steering_message.value = hint(f"finding features that steer toward {query!r}…")

        def work() -> None:
            try:
                found = steering_matches(self.engine, source, query, self.limit)
            except SteerWidgetsError as err:
                self.steering_message.value = ""
                self.on_error(str(err))
                return
            if (self.source.value, self.query.value.strip()) != (source, query.strip()):
                return  # superseded by another search
            caption = f"features that steer toward {query!r} (ranked by decoder direction)"
            infos = [index[i] for i, _, _ in found]
            extra = [(label, strength) for _, label, strength in found]
            self._show(self.steering_results, self.steering_message, infos, caption, found=extra)

        self.steering_thread = worker_thread("search", work)
        self.steering_thread.start()

    def neighbours(self, source: str, index: int) -> list:
        """Features whose decoder rows point the same way as ``index`` (cosine)."""
        try:
            pairs = self.engine.neighbours(source, index, n=self.limit)
            fi = self.engine.feature_index(source)
        except SteerWidgetsError as err:
            self.on_error(str(err))
            return []
        if self.source.value != source:
            self._quiet = True
            try:
                self.source.value = source
            finally:
                self._quiet = False
        infos = [fi[i] for i, _ in pairs]
        self._clear()
        caption = f"decoder neighbours of {source} #{index}"
        self._show(self.results, self.message, infos, caption, [c for _, c in pairs])
        return infos

    def add_concept(self, words: str) -> None:
        """Steer toward a concept named by ``words`` through ``engine.concept_vector``."""
        concept = words.strip()
        if not concept or self.on_concept is None:
            return
        try:
            vector = self.engine.concept_vector(concept)
        except SteerWidgetsError as err:
            self.on_error(str(err))
            return
        self.on_concept(concept, vector)

    def add_concept_features(self, words: str) -> None:
        """Hand ``words`` to ``on_concept_features`` (the explorer finds the set)."""
        concept = words.strip()
        if concept and self.on_concept_features is not None:
            self.on_concept_features(concept)

    def _show(self, box, message, infos, caption: str, cosines=None, found=None) -> None:
        """Result rows into ``box``; ``found`` holds each row's (label, strength or None)."""
        source = self.source.value
        rows = []
        for k, info in enumerate(infos):
            add = widgets.Button(
                description=f"+ #{info.index}",
                tooltip=f"steer with {source} #{info.index}",
                layout={"width": "auto", "min_width": "6.5em", "flex": "0 0 auto"},
            )
            label, strength = found[k] if found else ("", None)
            add.on_click(lambda _, i=info.index, s=strength: self.on_pick(source, i, s))
            near = widgets.Button(
                description="≈",
                tooltip="decoder neighbours",
                layout={"width": "2.5em", "flex": "0 0 auto"},
            )
            near.on_click(lambda _, i=info.index: self.neighbours(source, i))
            card = widgets.Button(
                description="card",
                tooltip="what this feature is: tokens, contexts, neighbours",
                layout={"width": "auto", "flex": "0 0 auto"},
            )
            card.on_click(lambda _, i=info.index: self.card.show(source, i))
            text = widgets.HTML(
                describe(info, None if cosines is None else cosines[k], label),
                layout={"flex": "1 1 16em", "min_width": "0"},
            )
            rows.append(widgets.HBox([add, near, card, text], layout={"flex_flow": "row wrap"}))
        message.value = hint(caption)
        box.children = tuple(rows)


def hint(text: str) -> str:
    """A hint under a search box (the picker's and the concept box's): escaped, in italics."""
    return f"<i class='sw-hint'>{html.escape(text)}</i>"
