"""Searchable descriptions of an SAE's features: top output tokens and top activating contexts.

The default SAEs ship a ``feature_index.json.gz`` made by ``scripts/train_default_saes.py``.
For any other SAE the top output tokens are computed on the spot (decoder row through the
unembedding), so text search works everywhere; contexts exist only where an index shipped.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

INDEX_FILE = "feature_index.json.gz"


@dataclass(frozen=True)
class FeatureInfo:
    index: int
    top_tokens: tuple[str, ...]
    max_act: float | None = None
    frac_active: float | None = None
    contexts: tuple[dict, ...] = field(default_factory=tuple)

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
    def __init__(self, source: str, infos: list[FeatureInfo]) -> None:
        self.source = source
        self.infos = infos
        self._haystack = [
            " ".join(i.top_tokens).lower()
            + " "
            + " ".join("".join(c["tokens"]).lower() for c in i.contexts)
            for i in infos
        ]

    def __len__(self) -> int:
        return len(self.infos)

    def __getitem__(self, index: int) -> FeatureInfo:
        return self.infos[index]

    @classmethod
    def load(cls, source: str, folder: Path, top_tokens_fn) -> FeatureIndex:
        """Read the shipped index, or build a token-only one with ``top_tokens_fn()``."""
        path = folder / INDEX_FILE
        if path.exists():
            data = json.loads(gzip.decompress(path.read_bytes()))
            infos = [
                FeatureInfo(
                    f["index"],
                    tuple(f.get("top_tokens", ())),
                    f.get("max_act"),
                    f.get("frac_active"),
                    tuple(f.get("contexts", ())),
                )
                for f in data["features"]
            ]
            return cls(source, infos)
        return cls(source, [FeatureInfo(i, tuple(t)) for i, t in enumerate(top_tokens_fn())])

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


def top_output_tokens(w_dec: torch.Tensor, unembed: torch.Tensor, tokenizer, k: int = 10):
    """Each feature's ``k`` top positive output tokens: ``W_dec @ W_U``, in chunks. Rows
    narrower than the residual stream (a per-head SAE's) have none."""
    if w_dec.shape[1] != unembed.shape[0]:
        return [[] for _ in range(w_dec.shape[0])]
    out = []
    for chunk in w_dec.split(512):
        top = (chunk @ unembed).topk(k, dim=-1).indices
        out += [[tokenizer.decode([int(t)]) for t in row] for row in top]
    return out
