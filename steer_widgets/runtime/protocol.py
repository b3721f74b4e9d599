"""What the engine needs from a model runtime, written down once.

Two runtimes implement it: our fast transformer (``transformer.Transformer``) and the
TransformerLens wrapper (``tl_runtime.TransformerLensRuntime``). The engine, the decode loop
and the activation code are typed against ``Runtime`` so either can sit behind them.

Hook points use TransformerLens names, ``blocks.{L}.{kind}`` for ``kind`` in ``HOOK_KINDS``.
A hook is ``fn(x, start) -> Tensor | None`` where ``start`` is the sequence position of
``x[:, 0]`` (so position-dependent steering works with a KV cache), or in a ragged decode
step (rows at positions of their own) a tuple of each row's position; returning ``None``
leaves ``x`` unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import torch
from torch import Tensor

Start = int | tuple[int, ...]  # the position of x[:, 0]; per row in a ragged step
Hook = Callable[[Tensor, Start], "Tensor | None"]
HOOK_KINDS = (
    "hook_resid_pre",
    "attn.hook_z",
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_out",
    "hook_resid_post",
)


def hook_layer(hook: str) -> int | None:
    """The layer ``L`` of a ``blocks.L.…`` hook name; ``None`` for any other name."""
    parts = hook.split(".")
    if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1])
    return None


class RuntimeConfig(Protocol):
    """The sizes every runtime's ``cfg`` reports."""

    n_layers: int
    d_model: int
    vocab_size: int
    max_context: int


class Cache(Protocol):
    """A KV cache for several rows. ``view(row)`` is one row's cache (prefill writes through
    it); ``lengths`` counts the positions filled in each row, ``length`` where they agree."""

    length: int
    lengths: list[int]

    @property
    def capacity(self) -> int: ...

    def view(self, row: int) -> Cache: ...


class RowLengths:
    """``length`` over a cache's per-row ``lengths``: the one number where the rows agree
    (every row of one prompt), an error where they do not (a ragged batch)."""

    lengths: list[int]

    @property
    def length(self) -> int:
        """Positions filled where every row has the same number (a ragged cache has none)."""
        if any(n != self.lengths[0] for n in self.lengths):
            raise ValueError(f"the rows hold different lengths ({self.lengths}): read lengths")
        return self.lengths[0]

    @length.setter
    def length(self, n: int) -> None:
        self.lengths = [n] * len(self.lengths)


class Runtime(Protocol):
    """A decoder-only language model addressed by TransformerLens hook names."""

    cfg: RuntimeConfig
    device: torch.device
    layer_devices: list[torch.device]
    row_groups: dict[str, int]  # batch-invariant decode row groups, measured at load
    # whether ``forward`` takes ``start_at_layer`` and ``resid`` (a prefill that continues
    # from another row's identical first blocks; ``generation`` shares them where it can)
    resumes: bool
    # whether ``forward`` takes ``rows``: cache rows at positions of their own, one token
    # each (a ragged batch); ``generation.decode`` needs it, since finished rows leave the batch
    ragged: bool
    products: str  # how quantized matrices multiply: "float32" or "int8" (quant.PRODUCTS)
    unembed_weight: Tensor  # [vocab, d_model]

    @property
    def hook_names(self) -> list[str]: ...

    def hook_widths(self) -> dict[str, int]:
        """Width of the flattened activation at every hook point (an SAE's ``d_in``)."""
        ...

    def weight_bytes(self) -> int: ...

    def new_cache(self, rows: int, length: int) -> Cache: ...

    def forward(
        self,
        tokens: Tensor,
        cache: Cache | None = None,
        hooks: Mapping[str, Hook] | None = None,
        stop_at_layer: int | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Logits [B, T, V] for ``tokens`` [B, T] (the last position only with
        ``last_only``), or the residual after block ``stop_at_layer - 1``. With a cache the
        tokens continue the cached positions and the cache is extended."""
        ...
