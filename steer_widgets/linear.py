"""Matrix products whose rows do not depend on how many other rows are in the batch.

On these CPUs a plain fp32 ``x @ W`` uses a gemv path for one row and a gemm path for more,
and the two round differently; for a steering tool that means DEFAULT generated beside
STEERED is not DEFAULT generated alone. oneDNN's inner product on a weight packed once at
load time uses one kernel for every row count we decode with (measured: 1-16 rows give
bit-identical rows while the reduction is at most 1024 long), and it is faster than MKL's
gemv at one row because the packing is not redone per call. Longer reductions are split into
equal chunks summed in a fixed order. Where oneDNN is unavailable (GPU, some ARM builds) we
fall back to ``F.linear`` and the runtime decodes in row groups that ``invariance.py``
measured to be safe.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

MAX_REDUCTION = 1024  # longest K measured batch-invariant with oneDNN packed weights
PACK_ROWS = 8  # the batch size oneDNN is told to pack for; any row count runs


def _onednn_ok(w: Tensor) -> bool:
    return (
        w.device.type == "cpu" and w.dtype == torch.float32 and torch.backends.mkldnn.is_available()
    )


class Linear:
    """``y = x @ w.T (+ bias)`` for ``w`` [out, in]; the bias is added after the (chunked)
    product, an elementwise step that cannot depend on the row count."""

    def __init__(self, w: Tensor, use_onednn: bool = True, bias: Tensor | None = None) -> None:
        self.out_features, self.in_features = w.shape
        self.element_size = w.element_size()
        self.bias = None if bias is None else bias.contiguous()
        self.onednn = use_onednn and _onednn_ok(w)
        if not self.onednn:
            self.parts = [w.contiguous()]
            return
        n_chunks = -(-self.in_features // MAX_REDUCTION)
        bounds = [round(i * self.in_features / n_chunks) for i in range(n_chunks + 1)]
        self.slices = list(zip(bounds[:-1], bounds[1:], strict=True))
        self.parts = [
            torch.ops.mkldnn._reorder_linear_weight(w[:, a:b].contiguous(), PACK_ROWS)
            for a, b in self.slices
        ]

    def __call__(self, x: Tensor) -> Tensor:
        out = self._product(x)
        return out if self.bias is None else out + self.bias

    def _product(self, x: Tensor) -> Tensor:
        if not self.onednn:
            return F.linear(x, self.parts[0])
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        out = None
        for (a, b), w in zip(self.slices, self.parts, strict=True):
            y = torch.ops.mkldnn._linear_pointwise(x2[:, a:b].contiguous(), w, None, "none", [], "")
            out = y if out is None else out + y
        return out.view(*lead, self.out_features)

    def nbytes(self) -> int:
        n = self.out_features * (self.in_features + (self.bias is not None))
        return n * self.element_size
