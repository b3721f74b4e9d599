"""Searchable descriptions of an SAE's features: top output tokens and top activating contexts.

The default SAEs ship a ``feature_index.json.gz`` made by ``scripts/train_default_saes.py``.
For any other SAE the top output tokens are computed on the spot (decoder row through the
unembedding), so text search works everywhere; contexts exist only where an index shipped.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..runtime.memory import release_freed_memory

INDEX_FILE = "feature_index.json.gz"


class Contexts(Sequence):
    """A feature's top activating contexts (``{"tokens", "acts", "max_pos"}`` dicts), kept
    as their compact JSON text and parsed when read. Why: parsed, the contexts of a shipped
    4k-feature index are about 30 MB of small Python objects, and a card opened on each of
    the five default SAEs kept 150 MB of them resident for the few ever shown."""

    __slots__ = ("_n", "_text")

    def __init__(self, contexts: Iterable[dict] = ()) -> None:
        items = list(contexts)
        self._n = len(items)
        self._text = json.dumps(items, separators=(",", ":"))

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        items = tuple(json.loads(self._text))
        return items[i]

    def __iter__(self):
        return iter(json.loads(self._text))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(self._text)

    def __repr__(self) -> str:
        return f"Contexts({list(self)!r})"


@dataclass(frozen=True)
class FeatureInfo:
    index: int
    top_tokens: tuple[str, ...]
    max_act: float | None = None
    frac_active: float | None = None
    contexts: Sequence[dict] = field(default_factory=Contexts)
    label: str = ""
    bottom_tokens: tuple[str, ...] = ()

    @property
    def example(self) -> str:
        """One activating context as plain text with the max token in [brackets]."""
        if not self.contexts:
            return ""
        c = self.contexts[0]
        toks = list(c["tokens"])
        toks[c["max_pos"]] = f"[{toks[c['max_pos']]}]"
        return "".join(toks).replace("\n", " ")


class FeatureIndex:
    """``neuronpedia_id``: the SAE's Neuronpedia id, when it has one; its explanations
    already on disk are the labels, and ``fetch_labels`` asks for more."""

    def __init__(
        self, source: str, infos: list[FeatureInfo], neuronpedia_id: str | None = None
    ) -> None:
        self.source = source
        self.infos = infos
        self.neuronpedia_id = neuronpedia_id
        self._haystack = [_hay(i) for i in infos]
        if neuronpedia_id:
            from .neuronpedia import Explanations

            self.set_labels(Explanations(neuronpedia_id).cached())

    def set_labels(self, labels: Mapping[int, str]) -> None:
        """Give features labels (Neuronpedia's explanations): shown and searched as labels."""
        for i, text in labels.items():
            if text and 0 <= i < len(self.infos):
                self.infos[i] = replace(self.infos[i], label=text)
                self._haystack[i] = _hay(self.infos[i])

    def fetch_labels(self, indices: Iterable[int]) -> dict[int, str]:
        """Neuronpedia's explanations of ``indices`` (fetched once, then read from disk) as
        labels. Offline or without a Neuronpedia id: ``NeuronpediaUnavailable``."""
        from .neuronpedia import Explanations, NeuronpediaUnavailable

        if not self.neuronpedia_id:
            raise NeuronpediaUnavailable(f"SAE source {self.source!r} has no Neuronpedia id")
        labels = Explanations(self.neuronpedia_id).fetch(indices)
        self.set_labels(labels)
        return labels

    def explanation_cached(self, index: int) -> bool:
        """Whether Neuronpedia's explanation of ``index`` is on disk (an empty one counts:
        asked, none written), so ``fetch_labels([index])`` needs no network: a caller that
        must not block (the feature card, on the kernel's message thread) asks first."""
        from .neuronpedia import Explanations

        if not self.neuronpedia_id:
            return False
        return int(index) in Explanations(self.neuronpedia_id).cached()

    def url(self, index: int) -> str | None:
        """The feature's Neuronpedia page, when the SAE has one."""
        from .neuronpedia import feature_url

        return feature_url(self.neuronpedia_id, index) if self.neuronpedia_id else None

    def __len__(self) -> int:
        return len(self.infos)

    def __getitem__(self, index: int) -> FeatureInfo:
        return self.infos[index]

    def label(self, index: int) -> str:
        """A short readable name: the shipped label, else the top output tokens."""
        info = self.infos[index]
        return info.label or feature_label(info.contexts, info.top_tokens) or f"#{index}"

    @classmethod
    def load(cls, source: str, folder: Path, top_tokens_fn) -> FeatureIndex:
        """Read the shipped index, or build a token-only one with ``top_tokens_fn()``."""
        np_id = _neuronpedia_id(folder)
        path = folder / INDEX_FILE
        if path.exists():
            data = json.loads(gzip.decompress(path.read_bytes()))
            infos = [
                FeatureInfo(
                    f["index"],
                    tuple(f.get("top_tokens", ())),
                    f.get("max_act"),
                    f.get("frac_active"),
                    Contexts(f.get("contexts", ())),
                    f.get("label", ""),
                    tuple(f.get("bottom_tokens", ())),
                )
                for f in data["features"]
            ]
            del data
            release_freed_memory()  # the parsed JSON, back to the system
            return cls(source, infos, np_id)
        return cls(
            source,
            [
                FeatureInfo(i, tuple(top), bottom_tokens=tuple(bottom))
                for i, (top, bottom) in enumerate(top_tokens_fn())
            ],
            np_id,
        )

    def search(self, query: str, limit: int = 20) -> list[FeatureInfo]:
        """Features whose top tokens or contexts mention ``query`` (case-insensitive);
        a number finds that feature index. Top-token matches rank first."""
        q = query.strip().lower()
        if not q:
            return []
        if q.isdigit():
            i = int(q)
            return [self.infos[i]] if i < len(self.infos) else []
        token_hits, context_hits = [], []
        for info, hay in zip(self.infos, self._haystack, strict=True):
            if q in hay:
                in_tokens = any(q in t.lower() for t in info.top_tokens)
                (token_hits if in_tokens else context_hits).append(info)
        by_act = lambda i: -(i.max_act or 0.0)  # noqa: E731
        return (sorted(token_hits, key=by_act) + sorted(context_hits, key=by_act))[:limit]


def _hay(info: FeatureInfo) -> str:
    """What ``search`` reads of a feature: label, top tokens, contexts."""
    contexts = " ".join("".join(c["tokens"]).lower() for c in info.contexts)
    return f"{info.label.lower()} {' '.join(info.top_tokens).lower()} {contexts}"


def _neuronpedia_id(folder: Path) -> str | None:
    """``metadata.neuronpedia_id`` of an SAE Lens folder's ``cfg.json`` (releases have one)."""
    try:
        raw = json.loads((folder / "cfg.json").read_text())
    except (OSError, ValueError):
        return None
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else raw
    return meta.get("neuronpedia_id") or None


def final_norm_weight(runtime) -> torch.Tensor | None:
    """The final norm's weight of a runtime (ours keep (weight, bias); TransformerLens folds
    it into the unembedding, so it has none)."""
    norm = getattr(runtime, "final_norm", None)
    return norm[0] if isinstance(norm, tuple) else norm


def logit_lens(
    w_dec: torch.Tensor,
    unembed: torch.Tensor,
    norm_weight: torch.Tensor | None,
    k: int = 10,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [d_sae, k] each decoder row promotes most and least, read through the final
    norm's weight (an RMSNorm's scale does not change the ranking; its weight does: without
    it the top tokens of most features are sub-word noise). Computed on the unembedding's
    device: on a GPU the SAE stays in CPU memory and the model does not."""
    device = unembed.device
    scale = 1.0 if norm_weight is None else norm_weight.float().to(device)
    weight = unembed.float()
    top, bottom = [], []
    for chunk in w_dec.float().split(512):
        logits = (chunk.to(device) * scale) @ weight
        top.append(logits.topk(k, dim=-1).indices)
        bottom.append((-logits).topk(k, dim=-1).indices)
    return torch.cat(top), torch.cat(bottom)


def top_output_tokens(
    w_dec: torch.Tensor, unembed: torch.Tensor, tokenizer, norm_weight=None, k: int = 10
) -> list[tuple[list[str], list[str]]]:
    """Each feature's ``k`` top and bottom output tokens as strings. Rows narrower than the
    residual stream (a per-head SAE's) have none."""
    if w_dec.shape[1] != unembed.shape[0]:
        return [([], []) for _ in range(w_dec.shape[0])]
    top, bottom = (ids.cpu() for ids in logit_lens(w_dec, unembed, norm_weight, k))
    cache: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in cache:
            cache[i] = tokenizer.decode([i])
        return cache[i]

    return [
        ([text(int(t)) for t in t_row], [text(int(b)) for b in b_row])
        for t_row, b_row in zip(top, bottom, strict=True)
    ]


STOPWORDS = frozenset(
    "the a an and or but of to in on at for with by from as is are was were be been it its "
    "this that these those he she they we you i his her their our your my me him them not no "
    "so if then than there here what which who whom when where why how all any some can "
    "will would could should may might must do does did have has had also just very more "
    "most such into about over after before up down out off only own same too".split()
)


def _word(text: str) -> str | None:
    w = text.strip().lower()
    return w if len(w) >= 3 and w.isalpha() and w not in STOPWORDS else None


def _whole_word(tokens, pos: int) -> str:
    """The word around ``tokens[pos]``: sub-word pieces joined until a space or punctuation."""
    start = pos
    while start > 0 and tokens[start][:1].isalpha() and tokens[start - 1][-1:].isalpha():
        start -= 1
    end = pos + 1
    while end < len(tokens) and tokens[end][:1].isalpha() and tokens[end - 1][-1:].isalpha():
        end += 1
    return "".join(tokens[start:end])


MIN_ZIPF = 3.0  # wordfreq's Zipf scale: about once per 10 million English words, or more
COMMON_ZIPF = 8.0  # the distinctiveness of a word is how far below this it sits


@functools.cache
def zipf(word: str) -> float | None:
    """How common ``word`` is in English (wordfreq's Zipf scale, 0 = unknown); ``None``
    where wordfreq is not installed (then every word counts as known and equally common)."""
    try:
        from wordfreq import zipf_frequency
    except ImportError:
        return None
    return zipf_frequency(word, "en")


def _readable(word: str | None) -> bool:
    """A word a reader recognises: logit-lens noise from code ("indexerror", "shutil") and
    word pieces ("auton", "miscon") are rare or unknown as English words."""
    if word is None:
        return False
    z = zipf(word)
    return z is None or z >= MIN_ZIPF


def _distinctive(words: list[str]) -> list[str]:
    """Distinct words, those repeated in the feature's contexts and rare in English first
    (each occurrence weighs ``COMMON_ZIPF - zipf``); ties keep the contexts' order."""
    score: dict[str, float] = {}
    for w in words:
        z = zipf(w)
        score[w] = score.get(w, 0.0) + max(0.1, COMMON_ZIPF - (4.0 if z is None else z))
    first = {w: i for i, w in reversed(list(enumerate(words)))}
    return sorted(score, key=lambda w: (-score[w], first[w]))


def feature_label(contexts, top_tokens, n: int = 2) -> str:
    """A short readable name: the words the feature fires on (its top contexts' max tokens,
    as whole words, the most distinctive first) and the whole words it writes (logit-lens
    top tokens that start a word), e.g. ``music, song → melody, songs``; only words a reader
    recognises (``MIN_ZIPF``, with wordfreq installed). The raw tokens stay in the index."""
    words = [_word(_whole_word(c["tokens"], c["max_pos"])) for c in contexts]
    reads = _distinctive([w for w in words if _readable(w)])
    writes: list[str] = []
    for t in top_tokens:
        w = _word(t) if t[:1] == " " else None  # a piece without a leading space is a fragment
        if _readable(w) and w not in writes and w not in reads[:n]:
            writes.append(w)
    left, right = ", ".join(reads[:n]), ", ".join(writes[:n])
    if left and right:
        return f"{left} → {right}"
    return left or (f"→ {right}" if right else "")
