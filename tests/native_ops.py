"""The compiled ops under the names the kernel tests use: thin calls of ``native.op`` (the
runtime looks each op up once and calls it directly, so these belong to the tests)."""

from __future__ import annotations

from torch import Tensor

from steer_widgets.runtime import native


def linear(x: Tensor, packed: Tensor, n_out: int, bias: Tensor | None = None) -> Tensor:
    return native.op("rowwise_linear")(x, packed, n_out, bias)


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return native.op("rms_norm")(x, w, eps)


def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return native.op("rotary")(x, cos, sin)


def causal_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, start: int = 0, window: int = 0
) -> Tensor:
    return native.op("causal_attention")(q, k, v, scale, start, window)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """One position (q [B, H, 1, D]) over all L keys: the call a decode step makes."""
    return causal_attention(q, k, v, scale, k.shape[2] - 1, 0)
