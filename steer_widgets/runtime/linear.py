"""Matrix products for the fast runtime, and the three ways we keep batched rows exact.

BLAS libraries pick kernels by shape: on the project's CPUs an fp32 ``x @ W`` with one row
takes a matrix-vector kernel and with two or more a matrix-matrix kernel, and the two round
differently; for a steering tool that means DEFAULT generated beside STEERED is not DEFAULT
generated alone. Three kernels avoid that:

* ``"native"`` (the CPU default): our own kernel (``native.py``, ``csrc/``,
  compiled for this CPU on first use) on a weight packed once into 16-column blocks. Every
  output is one fused multiply-add chain over the reduction in a fixed order, so a row is
  exact alone by construction, for any row count, prefill included; rows share each weight
  load, so all rows cost one pass over the weights. Measured here (1 thread, matrix products
  of the default model): one row 1.3x faster than ``"rows"`` and 1.8x than ``"onednn"``; a
  decode step of 2 / 5 rows costs 1.06 / 1.09x one row.
* ``"onednn"``: oneDNN's inner product on a weight packed once at load uses one kernel for
  every row count we decode with (measured: 1-16 rows give bit-identical rows while the
  reduction is at most 1024 long; longer ones are split into equal chunks summed in a fixed
  order). One pass over the weights for all rows, but one row costs about 1.4x ``"rows"``;
  what ``"native"`` falls back to (with a warning) where no C++ compiler is found.
* ``"rows"``: ``x @ W.T`` on the transposed weight stored contiguously (a streaming
  matrix-vector kernel). With several decode rows each row still gets its own
  matrix-vector product (a ``bmm`` over the rows against the same weight), one slice of the
  weight at a time so the slice is still in cache when the next row reads it; rows cost
  nearly their sum (a pair 1.7x a row). In half precision on a CPU each row runs the very
  call it runs alone, as batched half-precision products rounded rows apart now and then.

``invariance.py`` measures at load that the chosen kernel keeps rows exact (else rows go in
smaller groups). On GPUs (and for dtypes other than float32) it is ``"rows"``, the plain
cuBLAS product, and the row groups measured at load say how many rows it may batch exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import native

SLICE_BYTES = 2**20  # weight slice that stays in L2 while every decode row reads it
MAX_REDUCTION = 1024  # longest K measured batch-invariant with oneDNN packed weights
PACK_ROWS = 8  # the batch size oneDNN is told to pack for; any row count runs
KERNELS = ("native", "onednn", "rows")
DEFAULT_KERNEL = "native"


def onednn_available(w: Tensor) -> bool:
    return (
        w.device.type == "cpu" and w.dtype == torch.float32 and torch.backends.mkldnn.is_available()
    )


class Linear:
    """``y = x @ w.T (+ bias)`` for ``w`` [out, in]; the bias is added after the (chunked)
    product, an elementwise step that cannot depend on the row count."""

    def __init__(self, w: Tensor, kernel: str = DEFAULT_KERNEL, bias: Tensor | None = None) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.out_features, self.in_features = w.shape
        self.element_size = w.element_size()
        self.bias = None if bias is None else bias.contiguous()
        if kernel == "native" and native.available(w):
            self.kernel, self.packed = "native", native.pack(w)
            self._native = native.op("rowwise_linear")  # x [..., in] as it comes, bias fused
        elif kernel != "rows" and onednn_available(w):  # also where "native" cannot be built
            self.kernel = "onednn"
            self._pack_onednn(w)
        else:
            self.kernel = "rows"
            self.wt = w.t().contiguous()  # [in, out]: the streaming single-row kernel
            cols = max(64, SLICE_BYTES // (self.in_features * self.element_size) // 64 * 64)
            self.col_slices = [
                (a, min(a + cols, self.out_features)) for a in range(0, self.out_features, cols)
            ]

    def _pack_onednn(self, w: Tensor) -> None:
        n_chunks = -(-self.in_features // MAX_REDUCTION)
        bounds = [round(i * self.in_features / n_chunks) for i in range(n_chunks + 1)]
        self.slices = list(zip(bounds[:-1], bounds[1:], strict=True))
        self.parts = [
            torch.ops.mkldnn._reorder_linear_weight(w[:, a:b].contiguous(), PACK_ROWS)
            for a, b in self.slices
        ]

    def __call__(self, x: Tensor) -> Tensor:
        if self.kernel == "native":
            return self._native(x, self.packed, self.out_features, self.bias)
        out = self._packed(x) if self.kernel == "onednn" else self._rows(x)
        return out if self.bias is None else out + self.bias

    def native_product(self) -> tuple | None:
        """``(packed, kind, qtype, out_features, bias)``, how ``decoder_block`` reads this
        product (kind 0: the native float32 blocks); None where the kernel is another."""
        if self.kernel != "native":
            return None
        return self.packed, 0, 0, self.out_features, self.bias

    def _rows(self, x: Tensor) -> Tensor:
        rows = x.shape[0]
        if rows == 1 or x.dim() != 3 or x.shape[1] != 1 or x.device.type != "cpu":
            return torch.matmul(x, self.wt)
        if x.dtype != torch.float32:
            # half precision: torch's batched product rounds a row apart from the single-row
            # one now and then (a bf16 bmm, 1 row in 300, AVX-512 BF16, 2026-12-04), too rarely
            # for the load-time calibration to see: each row gets the solo call itself
            return torch.cat([torch.matmul(x[i : i + 1].clone(), self.wt) for i in range(rows)])
        # decode rows on a CPU: a matrix-vector product each, one cached weight slice at a time
        parts = [torch.bmm(x, self.wt[:, a:b].expand(rows, -1, -1)) for a, b in self.col_slices]
        return torch.cat(parts, dim=-1)

    def _packed(self, x: Tensor) -> Tensor:
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
