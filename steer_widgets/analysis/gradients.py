"""The differentiable forward attribution reads gradients through.

Generation runs on the exact kernel, which has no backward. Attribution needs gradients, so
it runs a differentiable copy of the same forward: the fast runtime with its torch norm and
rotary ops instead of the compiled ones, and the compiled matrix kernel kept for the forward
values but given a backward (``g @ W``, with ``W`` unpacked ``BACKWARD_ROWS`` rows at a time
and dropped after each product: see ``input_gradient``). A reading costs one forward with
autograd plus one backward from the token down to the earliest hook asked about (weights
never get gradients); ``steps=3`` takes four readings, about 1 s for a 70-token text steered
at layer 12 of the default model on two loaded cores. A TransformerLens runtime is plain
torch and runs as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import RequestError

BACKWARD_ROWS = 4096  # rows of ``W`` dequantized at a time in a backward product


def dense_weight(lin, start: int = 0, stop: int | None = None) -> Tensor:
    """Rows ``start:stop`` of ``W`` [N, K] of a native-kernel ``Linear``, unpacked from its
    [N/16, K, 16] blocks (or dequantized from GGUF blocks): float32, made for one product."""
    stop = lin.out_features if stop is None else stop
    if hasattr(lin, "rows"):  # GGUF blocks (quant.QuantLinear, QuantParts): dequantized
        return lin.dense(start, stop)
    blocks = lin.packed[start // 16 : -(-stop // 16)]
    w = blocks.transpose(1, 2).reshape(-1, lin.in_features)
    return w[start % 16 : start % 16 + stop - start]


def input_gradient(g: Tensor, lin) -> Tensor:
    """``g @ W`` with ``W`` remade ``BACKWARD_ROWS`` rows at a time and dropped after each.
    Memory wins over speed: kept for the model's lifetime the float32 copies took the
    quantized default engine from 415 to 1,073 MB resident; kept for one attribution, its
    peak to 1,015 MB; whole per product, the unembedding alone is 113 MB."""
    n = lin.out_features
    out = None
    for a in range(0, n, BACKWARD_ROWS):
        part = g[..., a : a + BACKWARD_ROWS] @ dense_weight(lin, a, min(a + BACKWARD_ROWS, n))
        out = part if out is None else out + part
    return out


class _NativeLinear(torch.autograd.Function):
    """The compiled kernel's forward (the same values generation computes) with a backward
    for the input only: ``g @ W`` (``input_gradient``)."""

    @staticmethod
    def forward(ctx, x: Tensor, lin) -> Tensor:
        ctx.lin = lin
        return lin(x)

    @staticmethod
    def backward(ctx, g: Tensor):
        return input_gradient(g, ctx.lin), None


class _DenseLinear(_NativeLinear):
    """Any other packed kernel (oneDNN): forward as it is, backward ``g @ W`` with ``W``
    read back once per call as the product with an identity (slow; the fallback kernel)."""

    @staticmethod
    def backward(ctx, g: Tensor):
        lin = ctx.lin
        eye = torch.eye(lin.in_features, dtype=g.dtype, device=g.device)
        wt = lin(eye) if lin.bias is None else lin(eye) - lin.bias  # [in, out]
        return g @ wt.T, None


def _grad_mm(x: Tensor, lin) -> Tensor:
    if lin.kernel == "native":
        return _NativeLinear.apply(x, lin)
    if lin.kernel == "rows":
        return lin(x)  # torch matmul: differentiable as it is
    return _DenseLinear.apply(x, lin)


def local_runtime(runtime) -> bool:
    """Whether explanations can run here: our fast runtime or TransformerLens in-process."""
    from ..runtime.tl_runtime import TransformerLensRuntime
    from ..runtime.transformer import Transformer

    return isinstance(runtime, (Transformer, TransformerLensRuntime))


def differentiable(runtime) -> Callable[..., Tensor]:
    """``forward(tokens, hooks=..., last_only=...)`` of ``runtime`` with autograd on."""
    from ..runtime.tl_runtime import TransformerLensRuntime
    from ..runtime.transformer import Transformer

    if isinstance(runtime, Transformer):
        return runtime.differentiable(_grad_mm)
    if isinstance(runtime, TransformerLensRuntime):
        raw = TransformerLensRuntime.forward.__wrapped__
        return lambda *args, **kw: raw(runtime, *args, **kw)
    raise RequestError("engine", f"attribution needs a local runtime, not {type(runtime).__name__}")
