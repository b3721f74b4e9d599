"""GGUF quantized matrices read as they ship, by the native kernel.

Types read: ``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q8_0`` (32-weight blocks) and the
K-quants ``Q4_K``, ``Q5_K``, ``Q6_K`` (256-weight super-blocks): with ``Q8_0``, every tensor
of a ``Q4_K_M``, ``Q5_K_M`` or ``Q6_K`` file, the ``Q5_0`` fallbacks llama.cpp writes for rows
that are not a multiple of 256 included. Any other type is refused by name
(``QuantizationUnsupported``), saying that ``load_model(path, quantized=False)`` reads it
dequantized by gguf, at float32's size.

A 135M model's GGUF holds its matrices as 4-bit (``Q4_1``) and 8-bit (``Q8_0``) blocks: 97 MB,
against 538 MB once dequantized to float32. A decode step reads every weight once, so
reading the blocks instead of their float32 copy reads 5x fewer bytes per token. The kernel
(``csrc/quant_linear.cpp``) dequantizes each weight in registers with
the float32 operations gguf's own dequantization uses (``gguf.quants``, which transformers'
GGUF loader calls), then runs the float32 kernel's fused multiply-add chain: its logits are
the float32 native path's on the dequantized weights, bit for bit, and rows stay exact.

Blocks are repacked once at load (``pack``): per 16 output columns and 32 k, the 16 scales,
the 16 mins (``Q4_1``) and the 16 columns' codes, 16 bytes per load (one k of 8-bit codes,
two k of 4-bit ones), so the inner loop streams them in order as the float32 kernel streams
its [N/16, K, 16] lines.

``Q5_1`` and the K-quants are packed "wide": their sub-block scales and offsets are computed
at load with gguf's float32 operations (``d * sc``, ``dmin * m``: exact products) and stored
as float32 lines, so the kernel's inner loop does the one multiply (and add) that remains per
weight; then the codes: ``Q4_K``'s as the 4-bit types' nibbles, the five- and six-bit types'
as whole signed bytes (``Q6_K``'s ``q - 32``), one k per 16-byte load. K-quant scales are per
32 k (``Q6_K``: per 16 k, two lines per group), so every type streams the same 16-column,
32-k groups.

Whole bytes, since putting a weight's high bits back cost more instructions than its byte
costs to read (on a few cores a decode step is bound by instructions, not bytes): ``Q6_K``
one 4x1536 by 576 product took 103 us instead of 230 (2026-12-03, 2 threads). A ``Q5_0``
weight ``d * (q - 16)`` is the ``Q8_0`` weight of code ``q - 16`` under the same f16 ``d``,
bit for bit, so ``Q5_0`` is read as ``Q8_0`` (34 bytes per 32 weights instead of 22; the
wide five- and six-bit types 20 bytes per 16 weights). ``kernel_type`` names what the kernel
reads.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from ..errors import QuantizationUnsupported
from . import native

BLOCK = native.BLOCK  # output columns per packed group
QK = 32  # weights per packed group along k (and per GGUF block of the 32-weight types)
QK_K = 256  # weights per K-quant super-block
# ggml type name -> (type id, bytes per GGUF block of WEIGHTS[name] weights)
TYPES = {
    "Q4_0": (2, 18),
    "Q4_1": (3, 20),
    "Q5_0": (6, 22),
    "Q5_1": (7, 24),
    "Q8_0": (8, 34),
    "Q4_K": (12, 144),
    "Q5_K": (13, 176),
    "Q6_K": (14, 210),
}
WEIGHTS = {name: QK_K if name.endswith("_K") else QK for name in TYPES}
SUPPORTED = tuple(TYPES)
WIDE = ("Q5_1", "Q4_K", "Q5_K", "Q6_K")  # packed with float32 scales
READ_AS = {"Q5_0": "Q8_0"}  # file type -> the kernel's type, the same weights bit for bit
# byte offsets of each block's f16 factors (scale d, then min or dmin): what a test varies
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
          "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # fmt: skip
# The packed layouts' version: raise it whenever ``pack`` or ``pack_int8`` write other bytes
# (``layout_version`` adds this file's own digest, so a packed copy kept in the user cache,
# ``load_cache.py``, is never read by a packer that would write it differently)
LAYOUT = 1


def type_name(qtype: int | str) -> str:
    """``"Q4_1"`` for 3 or "Q4_1"; otherwise a named error listing the supported types and
    the way to read the file anyway (gguf dequantizes every type it knows)."""
    for name, (tid, _) in TYPES.items():
        if qtype in (name, tid):
            return name
    supported = ", ".join(SUPPORTED)
    raise QuantizationUnsupported(
        str(qtype),
        f"not read here; supported: {supported}, F32, F16. "
        "sw.Engine(sw.load_model(path, quantized=False)) reads it dequantized to float32 "
        "(4-8x the memory)",
    )


@functools.cache
def layout_version() -> str:
    """What the packed bytes depend on besides the file: ``LAYOUT``, this module's source and
    the gguf and numpy versions whose operations compute the wide types' scales."""
    from importlib.metadata import version

    source = hashlib.sha1(Path(__file__).read_bytes()).hexdigest()[:12]
    return f"{LAYOUT} {source} gguf {version('gguf')} numpy {np.__version__}"


def kernel_type(qtype: int | str) -> str:
    """The type whose packed layout the kernel reads for a file's ``qtype``."""
    name = type_name(qtype)
    return READ_AS.get(name, name)


def _halves(a: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 little-endian f16 -> [...] float32 (exact)."""
    return np.ascontiguousarray(a).view("<f2")[..., 0].astype(np.float32)


def _low_high(ql: np.ndarray, hbits: np.ndarray, bits: int) -> np.ndarray:
    return (ql & 0x0F) | ((hbits & ((1 << bits) - 1)) << 4)


def _decode_32(blocks: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Q5_0 / Q5_1 blocks [n, G, bytes] -> scales [n, G, 1], offsets [n, G] or None, codes
    [n, G, 32] (unsigned 5-bit), as gguf's ``Q5_0``/``Q5_1.dequantize_blocks`` read them."""
    at = 4 if name == "Q5_1" else 2
    d = _halves(blocks[..., 0:2])
    m = _halves(blocks[..., 2:4]) if name == "Q5_1" else None
    qh = np.ascontiguousarray(blocks[..., at : at + 4]).view("<u4")
    qs = blocks[..., at + 4 :]
    ql = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    high = (qh >> np.arange(32, dtype=np.uint32)).astype(np.uint8)
    return d[..., None], m, _low_high(ql, high, 1)


def _decode_k(blocks: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """K-quant super-blocks [n, S, bytes] -> per 32-k group scales [n, 8S, subs], offsets
    [n, 8S] or None, codes [n, 8S, 32] (unsigned), with gguf's float32 products."""
    from gguf.quants import Q4_K

    n, sb = blocks.shape[:2]
    if name == "Q6_K":
        ql, qh = blocks[..., :128], blocks[..., 128:192]
        scales = blocks[..., 192:208].view(np.int8).astype(np.float32)
        d = _halves(blocks[..., 208:210])
        s = (d[..., None] * scales).reshape(n, sb * 8, 2)
        low = (ql.reshape(n, sb, 2, 1, 64) >> np.array([0, 4], np.uint8)[:, None]) & 0x0F
        high = qh.reshape(n, sb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]
        codes = _low_high(low.reshape(n, sb * 8, 32), high.reshape(n, sb * 8, 32), 2)
        return s, None, codes
    d, dmin = _halves(blocks[..., 0:2]), _halves(blocks[..., 2:4])
    sc, mn = (a.reshape(n, sb, 8) for a in Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12)))
    s = d[..., None] * sc.astype(np.float32)
    o = -(dmin[..., None] * mn.astype(np.float32))
    qs = blocks[..., -128:].reshape(n, sb, 4, 1, 32) >> np.array([0, 4], np.uint8)[:, None]
    codes = (qs & 0x0F).reshape(n, sb, 8, 32)
    if name == "Q5_K":
        qh = blocks[..., 16:48].reshape(n, sb, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]
        codes = _low_high(codes, qh, 1)
    return s.reshape(n, sb * 8, 1), o.reshape(n, sb * 8), codes.reshape(n, sb * 8, 32)


def _factors_and_codes(raw: np.ndarray, name: str) -> tuple[list[np.ndarray], np.ndarray]:
    """Rows of GGUF blocks -> each group's stored factors ([nb, G, bytes] parts: the f16
    scales and mins of the 32-weight types, the wide types' float32 scales and offsets) and
    the codes [N, G, 32] as both layouts store them (unsigned; Q8_0's int8 bits; Q6_K's
    q - 32 as int8 bits). The bytes before the codes are the same in both layouts."""
    if name not in WIDE:
        d, m, codes = _split(raw, name)
        _check_scales(d, name, "scale")
        parts = [_group_bytes_of(_per_group(d))]  # f16 bits: 32 bytes a group
        if m is not None:
            _check_scales(m, name, "min")
            parts.append(_group_bytes_of(_per_group(m)))
        return parts, codes
    _, size = TYPES[name]
    blocks = raw.reshape(raw.shape[0], -1, size)
    decode = _decode_k if name.endswith("_K") else _decode_32
    s, o, codes = decode(blocks, name)
    for what, a in (("scale", s), ("min", o)):  # d*sc, dmin*m: inf or NaN only from the halves
        if a is not None and not np.isfinite(a).all():
            raise _undefined(name, what)
    parts = [_group_bytes_of(np.swapaxes(_per_group(s), 2, 3))]  # [nb, G, subs, 16] float32
    if o is not None:
        parts.append(_group_bytes_of(_per_group(o)))
    if name == "Q6_K":
        codes = (codes.astype(np.int8) - np.int8(32)).view(np.uint8)
    return parts, codes


NIBBLES = ("Q4_0", "Q4_1", "Q4_K")  # 4-bit codes, stored two to a byte


def _float_codes(codes: np.ndarray, name: str) -> np.ndarray:
    """Codes [nb, G, 16 (column), 32 (k)] -> the float32 kernel's [nb, G, bytes]: one k per
    16-byte line (column i in byte i), or for the 4-bit types two k per line (even k in the
    low nibble)."""
    lines = np.swapaxes(codes, 2, 3)  # [nb, G, 32 (k), 16 (column)]
    if name in NIBBLES:
        lines = lines[..., 0::2, :] | (lines[..., 1::2, :] << 4)
    return _group_bytes_of(lines)


def _per_group(a: np.ndarray) -> np.ndarray:
    """[N, G, ...] -> [nb, G, 16, ...]: rows grouped 16 columns at a time, zero rows padding
    N up to a multiple of 16 (columns past N are never stored)."""
    pad = -a.shape[0] % BLOCK
    a = np.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
    return np.swapaxes(a.reshape(-1, BLOCK, *a.shape[1:]), 1, 2)


def _group_bytes_of(a: np.ndarray) -> np.ndarray:
    """[nb, G, ...] of any dtype -> [nb, G, bytes]: each group's part, as stored."""
    return np.ascontiguousarray(a).view(np.uint8).reshape(*a.shape[:2], -1)


def _q5_0_as_q8_0(raw: np.ndarray) -> np.ndarray:
    """Q5_0 rows -> the Q8_0 rows of the same weights: d kept, codes q - 16 as signed bytes."""
    blocks = raw.reshape(raw.shape[0], -1, TYPES["Q5_0"][1])
    _check_scales(blocks[..., 0:2].copy().view(np.uint16)[..., 0], "Q5_0", "scale")
    _, _, codes = _decode_32(blocks, "Q5_0")
    q = (codes.astype(np.int8) - np.int8(16)).view(np.uint8)
    return np.concatenate([blocks[..., 0:2], q], axis=-1).reshape(raw.shape[0], -1)


def _split(raw: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """GGUF rows [N, K/32 * bytes] -> scales d [N, G] (f16 bits), mins m or None, codes
    [N, G, 32] (uint8, as stored: Q4 unsigned nibbles, Q8_0 int8 bits)."""
    _, size = TYPES[name]
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, size)
    d = blocks[..., 0:2].copy().view(np.uint16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.uint16)[..., 0] if name == "Q4_1" else None
    qs = blocks[..., 4:] if name == "Q4_1" else blocks[..., 2:]
    if name == "Q8_0":
        codes = qs
    else:  # element j < 16: low nibble of byte j; j >= 16: high nibble of byte j - 16
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return d, m, codes


def _checked(raw: np.ndarray, qtype: str, in_features: int) -> np.ndarray:
    """``raw`` once its rows are seen to hold ``in_features`` weights of ``qtype``."""
    name = type_name(qtype)
    _, size = TYPES[name]
    if in_features % WEIGHTS[name] or raw.shape[1] != in_features // WEIGHTS[name] * size:
        raise _rows_unlike(name, in_features, f"rows of {raw.shape[1]} bytes")
    return raw


def _rows_unlike(name: str, in_features: int, rows: str) -> QuantizationUnsupported:
    return QuantizationUnsupported(name, f"{rows} do not hold {in_features} weights")


def _undefined(name: str, what: str) -> QuantizationUnsupported:
    return QuantizationUnsupported(name, f"a block's {what} is inf or NaN (weights undefined)")


def _check_scales(scales: np.ndarray, name: str, what: str) -> None:
    if (((scales >> 10) & 0x1F) == 0x1F).any():
        raise _undefined(name, what)


CHUNK = 64  # column blocks packed at a time: a vocabulary-sized matrix needs no 3x copy


def pack(raw: np.ndarray, qtype: int | str) -> Tensor:
    """GGUF blocks of an [N, K] matrix (uint8 rows of ``K / 32`` blocks each, as
    ``GGUFReader`` gives them) -> the kernel's [ceil(N/16), K/32, bytes] uint8 layout."""
    return _packed(raw, type_name(qtype), _float_codes)


def pack_int8(raw: np.ndarray, qtype: int | str) -> Tensor:
    """GGUF blocks of an [N, K] matrix -> the int8 kernel's [ceil(N/16), K/32, bytes] layout
    (csrc/int8_linear.cpp): per 16 columns and 32 k, ``pack``'s factors, then the codes in two
    halves of 8 columns whose 32-bit lanes hold one column's 4 consecutive k. Each group has
    ``pack``'s size in bytes; every type ``pack`` reads (Q5_0 as Q8_0)."""
    return _packed(raw, type_name(qtype), _int8_codes)


def _packed(raw: np.ndarray, name: str, arrange) -> Tensor:
    """Either layout (``arrange``: how the codes lie), written CHUNK blocks at a time into the
    one output (a load's peak memory is the packed model plus a few MB a thread). The chunks
    after the first run on torch's thread count: numpy releases the GIL in its array
    operations, and each chunk's bytes are its own whichever thread makes them."""
    _, size = TYPES[name]
    nb, groups = -(-raw.shape[0] // BLOCK), raw.shape[1] // size * WEIGHTS[name] // QK
    first = _chunk(raw, name, arrange, 0)  # sizes the output: its bytes per group
    out = torch.empty(nb, groups, first.shape[-1], dtype=torch.uint8)
    view = out.numpy()
    view[:CHUNK] = first

    def fill(b: int) -> None:
        view[b : b + CHUNK] = _chunk(raw, name, arrange, b)

    rest = range(CHUNK, nb, CHUNK)
    if len(rest) > 1 and torch.get_num_threads() > 1:
        with ThreadPoolExecutor(min(torch.get_num_threads(), len(rest))) as pool:
            list(pool.map(fill, rest))
    else:
        for b in rest:
            fill(b)
    return out


def _chunk(raw: np.ndarray, name: str, arrange, b: int) -> np.ndarray:
    """Column blocks ``b`` to ``b + CHUNK`` in ``arrange``'s layout."""
    rows = np.ascontiguousarray(raw[b * BLOCK : (b + CHUNK) * BLOCK], dtype=np.uint8)
    if name == "Q5_0":  # the same weights as Q8_0 blocks
        rows, name = _q5_0_as_q8_0(rows), "Q8_0"
    parts, codes = _factors_and_codes(rows, name)
    return np.concatenate([*parts, arrange(_per_group(codes), name)], axis=-1)


def _int8_codes(codes: np.ndarray, name: str) -> np.ndarray:
    """Codes [nb, G, 16 (column), 32 (k)] -> the int8 kernel's [nb, G, bytes]: two halves of
    8 columns, each k-quad a 32-byte line of 8 columns x 4 k (the 4-bit types: quad 2l in the
    low nibbles of line l, quad 2l + 1 in the high ones)."""
    c = codes.reshape(*codes.shape[:2], 2, 8, 8, 4).transpose(0, 1, 2, 4, 3, 5)  # half, q, col, k
    if name in NIBBLES:
        c = c[:, :, :, 0::2] | (c[:, :, :, 1::2] << 4)
    return _group_bytes_of(c)


def float_layout(packed: Tensor, name: str) -> Tensor:
    """``pack_int8``'s layout -> ``pack``'s, the same factors and codes rearranged (``name``:
    the type read, Q8_0 for a Q5_0 file): an int8 model's lookups and backward read it, so
    nothing keeps a second copy of a matrix until something reads it that way. Once made it
    is kept beside the integer layout (``QuantLinear.resident_bytes`` counts both): for the
    tied embedding, whose rows every forward reads, and for a matrix whose ``dense`` ran (an
    explanation's backward reads it slice by slice, and reads it again for the next token)."""
    p = packed.numpy()
    nb, groups, size = p.shape
    at = size - (8 if name in NIBBLES else 16) * QK  # the factors' bytes: the same in both
    codes = p[..., at:].reshape(nb, groups, 2, -1, 8, 4)  # half, line, col, k
    if name in NIBBLES:  # line l: quads 2l (low nibbles) and 2l + 1 (high)
        codes = np.stack([codes & 0x0F, codes >> 4], axis=4)  # half, line, nibble, col, k
    codes = codes.reshape(nb, groups, 2, 8, 8, 4).transpose(0, 1, 2, 4, 3, 5)  # half, col, q, k
    codes = codes.reshape(nb, groups, 16, 32)
    return torch.from_numpy(np.concatenate([p[..., :at], _float_codes(codes, name)], axis=-1))


class Packs(Protocol):
    """Where packed matrices are kept between loads (``load_cache.PackCache``)."""

    def get(self, name: str, make: Callable[[], Tensor], nbytes: int) -> Tensor:
        """The tensor kept under ``name``, or ``make()``'s (``nbytes``: the file's bytes it
        packs, for progress), kept from now on."""
        ...


@dataclass
class QuantWeight:
    """An [out, in] matrix as GGUF blocks, read when it is packed: ``read()`` returns its
    [out, in / 32 * bytes] uint8 rows (from the file, each time), so a load holds one
    matrix's raw blocks at a time rather than a second copy of the model. ``packs``: where
    its packed layouts are kept between loads, under ``name`` (the file's tensor names)."""

    read: Callable[[], np.ndarray]
    qtype: str
    in_features: int
    out_features: int
    name: str = ""
    packs: Packs | None = field(default=None, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def nbytes(self) -> int:
        """The blocks' bytes in the file."""
        _, size = TYPES[type_name(self.qtype)]
        return self.out_features * self.in_features // WEIGHTS[type_name(self.qtype)] * size

    def packed(self, products: str = "float32") -> Tensor:
        """The layout the kernel reads for ``products`` (``pack`` or ``pack_int8``), from
        ``packs`` where it was kept (the same bytes: the cache's key says so), else packed
        from the file's blocks."""
        arrange = pack_int8 if products == "int8" else pack

        def make() -> Tensor:
            return arrange(_checked(self.read(), self.qtype, self.in_features), self.qtype)

        if self.packs is None or not self.name:
            return make()
        return self.packs.get(f"{products}/{self.name}", make, self.nbytes())

    def dequantize(self) -> Tensor:
        """gguf's float32 values (what transformers' loader holds)."""
        return torch.from_numpy(dequantize(self.read(), self.qtype))

    def as_read(self) -> QuantWeight:
        """The same weights in the type the kernel reads (Q5_0 as Q8_0), bit for bit."""
        kind = kernel_type(self.qtype)
        if kind == self.qtype:
            return self
        return QuantWeight(
            lambda: _q5_0_as_q8_0(self.read()),
            kind,
            self.in_features,
            self.out_features,
            f"{self.name}>{kind}" if self.name else "",
            self.packs,
        )

    @staticmethod
    def cat(parts: list[QuantWeight]) -> QuantWeight | None:
        """The parts fused along the output (q, k, v), or None where the kernel reads them as
        different types (a Q5_0 q and k fuse with a Q8_0 v: both are read as Q8_0)."""
        if len({(kernel_type(p.qtype), p.in_features) for p in parts}) != 1:
            return None
        if len({p.qtype for p in parts}) > 1:
            parts = [p.as_read() for p in parts]
        if len(parts) == 1:
            return parts[0]
        rows = sum(p.out_features for p in parts)
        named = all(p.name for p in parts)
        return QuantWeight(
            lambda: np.concatenate([p.read() for p in parts]),
            parts[0].qtype,
            parts[0].in_features,
            rows,
            "+".join(p.name for p in parts) if named else "",
            parts[0].packs,
        )


PRODUCTS = ("float32", "int8")  # how a quantized matrix multiplies (QuantLinear)


class QuantLinear:
    """``y = x @ W.T (+ bias)`` with ``W`` [out, in] held as GGUF blocks (``Linear``'s
    interface, kernel "native"). ``products="float32"``: the bits of the float32 native kernel
    on ``W`` dequantized as gguf does it. ``products="int8"`` (every type read): each row of
    x quantized to int8 per 32 k and integer block sums (csrc/int8_linear.cpp), still exact
    per row; ``rows`` and ``dense`` (embedding lookups, a backward) then read the float32
    layout, rearranged from the int8 one on first use (``float_layout``)."""

    kernel = "native"
    element_size = 4  # the float32 a weight becomes (what the float32 path would read)

    def __init__(
        self,
        raw: np.ndarray,
        qtype: int | str,
        in_features: int,
        bias: Tensor | None = None,
        products: str = "float32",
    ) -> None:
        weight = QuantWeight(lambda: raw, type_name(qtype), in_features, raw.shape[0])
        self._setup(weight, bias, products)

    @classmethod
    def of(
        cls, weight: QuantWeight, bias: Tensor | None = None, products: str = "float32"
    ) -> QuantLinear:
        """The product of ``weight``'s blocks, packed from its ``packs`` where they were kept
        (``QuantWeight.packed``)."""
        lin = cls.__new__(cls)
        lin._setup(weight, bias, products)
        return lin

    def _setup(self, weight: QuantWeight, bias: Tensor | None, products: str) -> None:
        self.qtype_name = type_name(weight.qtype)  # the file's type
        self.qtype = TYPES[kernel_type(weight.qtype)][0]  # the packed layout's
        if weight.in_features % WEIGHTS[self.qtype_name]:
            raise _rows_unlike(self.qtype_name, weight.in_features, "rows")
        self.out_features, self.in_features = weight.out_features, weight.in_features
        self.products = products
        self.bias = None if bias is None else bias.contiguous()
        self.packed = weight.packed(products)
        self._weight = weight  # where prepare_rows keeps the float layout
        want = (-(-self.out_features // BLOCK), self.in_features // QK)
        if tuple(self.packed.shape[:2]) != want:
            raise ValueError(f"packed blocks {tuple(self.packed.shape)}, not {want} groups")
        if products == "int8":
            self._float_packed = None
            self._op = native.op("int8_linear")
        else:
            self._float_packed = self.packed
            self._op = native.op("quant_linear")
        self._rows = native.op("quant_rows")
        self._dense = native.op("quant_dense")

    def __call__(self, x: Tensor) -> Tensor:
        return self._op(x, self.packed, self.out_features, self.qtype, self.bias)

    def native_product(self) -> tuple:
        """``(packed, kind, qtype, out_features, bias)``, how ``decoder_block`` reads this
        product (kind 1: ``quant_linear``, 2: ``int8_linear``)."""
        kind = 2 if self.products == "int8" else 1
        return self.packed, kind, self.qtype, self.out_features, self.bias

    def _float_layout(self) -> Tensor:
        """The float32 kernel's packing, which ``rows`` and ``dense`` read."""
        if self._float_packed is None:
            self._float_packed = float_layout(self.packed, kernel_type(self.qtype_name))
        return self._float_packed

    def prepare_rows(self) -> None:
        """Make the layout ``rows`` reads now, through the weight's pack cache (int8 products
        rearrange it from their own): for the embedding, whose rows every forward reads, so
        that a load with the cache leaves no rearranging to the first forward."""
        weight = self._weight
        if self._float_packed is not None or weight.packs is None or not weight.name:
            return
        self._float_packed = weight.packs.get(
            f"float-layout/{weight.name}",
            lambda: float_layout(self.packed, kernel_type(self.qtype_name)),
            weight.nbytes(),
        )

    def rows(self, ids: Tensor) -> Tensor:
        """Rows ``ids`` of ``W``, dequantized (an embedding lookup): [..., in] float32. An id
        outside ``[0, out_features)`` is an ``IndexError``, as ``F.embedding`` raises (the
        packed blocks' padding to 16 rows is no row)."""
        packed = self._float_layout()
        return self._rows(packed, ids, self.out_features, self.in_features, self.qtype)

    def dense(self, start: int = 0, stop: int | None = None) -> Tensor:
        """Rows ``start:stop`` of ``W`` [out, in] float32, dequantized with ``rows``' values
        (for a backward pass; 4-8x the blocks' size, so made a slice at a time there). The
        transpose of a contiguous ``[in, rows]``: the kernel writes that layout fastest, and
        ``g @ W`` reads it as it is."""
        stop = self.out_features if stop is None else stop
        packed = self._float_layout()
        wt = self._dense(packed, start, stop, self.out_features, self.in_features, self.qtype)
        return wt.T

    def nbytes(self) -> int:
        """Bytes one product reads: the blocks (scales included) and the bias."""
        bias = 0 if self.bias is None else self.bias.numel() * 4
        return self.packed.numel() + bias

    def resident_bytes(self) -> int:
        """Bytes this matrix keeps in memory: ``nbytes`` plus, under int8 products, the
        float layout once its rows or ``dense`` were read (``float_layout``)."""
        extra = self._float_packed is not None and self._float_packed is not self.packed
        return self.nbytes() + (self._float_packed.numel() if extra else 0)


class QuantParts:
    """Products of GGUF matrices of different types fused along the output, each part on its
    own blocks, the outputs joined: a ``Q4_K_M`` file keeps q and k in one type and v in
    another in half its layers (llama.cpp gives ``attn_v`` more bits), and dequantizing such a
    fused matrix to float32 read 4x the bytes. Every output column is computed whole by its
    part's kernel in the float32 kernel's order, so the join has the bits of one fused
    product on the dequantized weights. ``QuantLinear``'s interface."""

    kernel = "native"
    element_size = 4

    def __init__(
        self, parts: list[QuantWeight], bias: Tensor | None = None, products: str = "float32"
    ) -> None:
        runs: list[list[QuantWeight]] = []  # neighbours of one type fuse: q and k, then v
        for p in parts:
            if runs and kernel_type(runs[-1][0].qtype) == kernel_type(p.qtype):
                runs[-1].append(p)
            else:
                runs.append([p])
        fused = [QuantWeight.cat(run) for run in runs]
        sizes = [w.out_features for w in fused]
        biases = [None] * len(fused) if bias is None else list(torch.split(bias, sizes))
        self.parts = [
            QuantLinear.of(w, bias=b, products=products) for w, b in zip(fused, biases, strict=True)
        ]
        self.in_features, self.out_features = parts[0].in_features, sum(sizes)

    def __call__(self, x: Tensor) -> Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)

    def native_product(self) -> None:
        """None: ``decoder_block`` reads one packed matrix a product (its block takes the ops)."""
        return None

    def rows(self, ids: Tensor) -> Tensor:
        """Rows ``ids`` of the fused ``W``, each from its part, dequantized: [..., in]. An id
        outside every part is an ``IndexError`` before any row is read (each part fills only
        its own ids of an unfilled output)."""
        outside = (ids < 0) | (ids >= self.out_features)
        if bool(outside.any()):
            first = int(ids[outside].reshape(-1)[0])
            raise IndexError(f"row id {first} out of range for {self.out_features} rows")
        out = torch.empty(*ids.shape, self.in_features)
        start = 0
        for part in self.parts:
            mine = (ids >= start) & (ids < start + part.out_features)
            if bool(mine.any()):
                out[mine] = part.rows(ids[mine] - start)
            start += part.out_features
        return out

    def dense(self, start: int = 0, stop: int | None = None) -> Tensor:
        """Rows ``start:stop`` of the fused ``W`` [out, in] float32, each from its part."""
        stop = self.out_features if stop is None else stop
        if not 0 <= start <= stop <= self.out_features:
            raise IndexError(f"rows {start}:{stop} out of range for {self.out_features} rows")
        pieces, first = [], 0
        for part in self.parts:
            lo, hi = max(start - first, 0), min(stop - first, part.out_features)
            if lo < hi:
                pieces.append(part.dense(lo, hi))
            first += part.out_features
        return torch.cat(pieces) if pieces else torch.empty(0, self.in_features)

    def nbytes(self) -> int:
        return sum(part.nbytes() for part in self.parts)

    def resident_bytes(self) -> int:
        return sum(part.resident_bytes() for part in self.parts)


def dequantize(raw: np.ndarray, qtype: int | str) -> np.ndarray:
    """gguf's own float32 dequantization of ``raw`` (what transformers' loader returns)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    return gguf_dequantize(raw, GGMLQuantizationType[type_name(qtype)])
