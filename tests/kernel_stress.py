"""Stress of the native kernels at one thread count, bit for bit against one thread.

``python tests/kernel_stress.py --threads 4 --rounds 400`` builds a fixed set of calls on the
default model's widths (float32 and GGUF-quantized products of 1 to 13 rows and 16 to 4,096
columns, int8 products of a 150-row prefill, whole blocks in one ``decoder_block`` call, causal attention of 1 to 9 positions over 1 to 300 keys, ragged decode steps of 1 to 16
cache rows at positions of their own, RMSNorm, rotary, queued sampling noise, a decode step's
sampling and log-probabilities over the vocabulary (``vocab_pass``), and slices of
quantized rows dequantized as a backward reads them),
computes every call's result at one thread (a ragged step's: its rows decoded one at a
time, so it is checked against the solo runs, not against itself), then makes every call once
at ``--threads`` and ``--rounds`` rounds of 64 calls in a random order, and prints one JSON
line: calls and wrong results per op. The work is counted, not timed, so a slower machine
runs the same calls longer rather than fewer of them (every op is always drawn: the first round is every call once).
Calls of few and of many column blocks alternate, so the pool's workers keep meeting calls
they take no part in, the window where a pool can race. A crash is the process dying: run
it in a subprocess (``tests/test_kernel_threads.py`` does, at 1-16 threads).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable

import native_ops
import numpy as np
import torch

from steer_widgets.runtime import native, quant

Call = Callable[[], torch.Tensor]


def _blocks(name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """GGUF rows of random codes with finite, modest f16 scales (and mins)."""
    _, size = quant.TYPES[name]
    blocks = rng.integers(0, 256, (n, k // quant.WEIGHTS[name], size), dtype=np.uint8)
    for off in quant.HALVES[name]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[..., off : off + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n, -1)


def float_calls(gen: torch.Generator, rng: random.Random) -> dict[str, Call]:
    calls: dict[str, Call] = {}
    for k in (64, 576, 1536):
        for n in (16, 40, 192, 576, 1536, 4096):
            if k == 1536 and n == 4096:
                continue
            packed = native.pack(torch.randn(n, k, generator=gen) / k**0.5)
            bias = torch.randn(n, generator=gen) if rng.random() < 0.5 else None
            for m in sorted({1, 2, 3, rng.randint(4, 13)}):
                x = torch.randn(m, k, generator=gen)
                calls[f"linear {m}x{k}->{n}"] = lambda x=x, p=packed, n=n, b=bias: (
                    native_ops.linear(x, p, n, b)
                )
    return calls


def quant_calls(gen: torch.Generator, rng: random.Random) -> dict[str, Call]:
    calls: dict[str, Call] = {}
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    for name in quant.SUPPORTED:
        for k, n in ((576, 48), (576, 576), (576, 1536), (1536, 576), (576, 4096)):
            if k % quant.WEIGHTS[name]:  # K-quants: rows of whole 256-weight super-blocks
                continue
            raw = _blocks(name, n, k, nrng)
            lin = quant.QuantLinear(raw, name, k)
            int8 = quant.pack_int8(raw, name)
            for m in sorted({1, 2, rng.randint(3, 12), 13}):  # wide, tile and panel paths
                x = torch.randn(m, k, generator=gen)
                calls[f"{name} {m}x{k}->{n}"] = lambda x=x, lin=lin: lin(x)
                # products="int8" on the same blocks
                calls[f"int8 {name} {m}x{k}->{n}"] = lambda x=x, p=int8, n=n, t=lin.qtype: (
                    native.op("int8_linear")(x, p, n, t, None)
                )
            if n == 48:  # a prefill's rows: their int8 codes are made on the pool too
                x = torch.randn(150, k, generator=gen)
                calls[f"int8 {name} 150x{k}->{n}"] = lambda x=x, p=int8, n=n, t=lin.qtype: (
                    native.op("int8_linear")(x, p, n, t, None)
                )
            a = rng.randrange(n // 2)  # a backward's slice of rows: any start, any stop
            calls[f"dense {name} {a}:{n} of {n}x{k}"] = lambda lin=lin, a=a: lin.dense(a)
    return calls


def other_calls(gen: torch.Generator, rng: random.Random) -> dict[str, Call]:
    calls: dict[str, Call] = {}
    for b in (1, 2, 5, 8):
        for length in (1, 17, 300):
            for t, window in {(1, 0), (min(length, 9), 0), (min(length, 9), 8)}:
                q = torch.randn(b, 9, t, 64, generator=gen)
                kv = torch.randn(2, b, 3, length + 4, 64, generator=gen)[..., :length, :]
                calls[f"attention b{b} L{length} T{t} w{window}"] = (
                    lambda q=q, k=kv[0], v=kv[1], s=length - t, w=window: (
                        native_ops.causal_attention(q, k, v, 0.125, s, w)
                    )
                )
    calls.update(ragged_calls(gen, rng))
    calls.update(block_calls(gen))
    for m in (1, 7):
        x, w = torch.randn(m, 576, generator=gen), torch.randn(576, generator=gen)
        calls[f"rms_norm {m}"] = lambda x=x, w=w: native_ops.rms_norm(x, w, 1e-5)
        xr = torch.randn(m, 3, 9, 64, generator=gen)
        cos, sin = torch.randn(2, 3, 64, generator=gen)
        calls[f"rotary {m}"] = lambda x=xr, c=cos, s=sin: native_ops.rotary(x, c, s)
        rows_cs = torch.randn(2, m, 1, 64, generator=gen)  # a ragged step: each row's own table
        xs = torch.randn(m, 1, 9, 64, generator=gen)
        calls[f"rotary rows{m}"] = lambda x=xs, c=rows_cs[0], s=rows_cs[1]: native_ops.rotary(
            x, c, s
        )
    for size in (1, 513, 49152):
        seed = rng.randrange(1 << 30)
        calls[f"noise {size}"] = lambda size=size, seed=seed: _noise(size, seed)
    for b, vocab in ((1, 4099), (3, 4099), (8, 4099), (5, 49152)):
        logits = torch.randn(b, vocab, generator=gen) * 4
        noise = torch.empty(b, vocab).exponential_(1, generator=gen)
        temps = [rng.choice([0.0, 0.5, 1.0]) for _ in range(b)]
        calls[f"vocab_pass b{b} v{vocab}"] = lambda x=logits, n=noise, t=temps: _vocab_pass(x, n, t)
        uniform = torch.rand(b, vocab, generator=gen, dtype=torch.float64)  # what decoding queues
        calls[f"vocab_pass uniform b{b} v{vocab}"] = lambda x=logits, n=uniform, t=temps: (
            _vocab_pass(x, n, t)
        )
    return calls


def _vocab_pass(logits: torch.Tensor, noise: torch.Tensor, temps: list[float]) -> torch.Tensor:
    """One decode step's end for every row (fresh counts each call), as one tensor: tokens,
    their log-probabilities, top ids and values, and the counts after."""
    rows, vocab = logits.shape
    counts = [(torch.arange(vocab) % (r + 2)).float() for r in range(rows)]
    follow = [-1] * rows
    if rows > 2:  # the last row copies the first's token, as a sweep's rows do
        counts[-1], follow[-1] = None, 0
    passed = native.vocab_pass(logits, temps, [1.0] * rows, counts, list(noise), follow, 5)
    parts = (*passed, *(c for c in counts if c is not None))
    return torch.cat([p.double().flatten() for p in parts])


F32, F16 = torch.float32, torch.float16  # a float32 cache, and products="int8"'s half one


def ragged_calls(gen: torch.Generator, rng: random.Random) -> dict[str, Call]:
    """Ragged decode steps: some rows of a cache, in any order, each at its own position."""
    calls: dict[str, Call] = {}
    for cache_rows, dtype in ((1, F32), (3, F32), (8, F32), (16, F32), (8, F16), (16, F16)):
        kv = torch.randn(2, cache_rows, 3, 320, 64, generator=gen).to(dtype)
        for window in (0, 8):
            b = rng.randint(1, cache_rows)
            rows = torch.tensor(rng.sample(range(cache_rows), b), dtype=torch.long)
            positions = torch.tensor([rng.randrange(300) for _ in range(b)], dtype=torch.long)
            q = torch.randn(b, 9, 1, 64, generator=gen)
            calls[f"ragged_attention c{cache_rows} b{b} w{window} {dtype}"] = Ragged(
                q, kv, rows, positions, window
            )
    return calls


def block_calls(gen: torch.Generator) -> dict[str, Call]:
    """``decoder_block`` (a whole block in one call) with float32 and int8 products: a
    5-position prefill, a decode step of 3 rows, a ragged step of 2 of 4 cache rows."""
    calls: dict[str, Call] = {}
    for kind in (0, 2):
        block = Block(gen, kind)
        calls[f"decoder_block kind{kind} prefill"] = lambda b=block: b(3, 5, 3, ragged=False)
        calls[f"decoder_block kind{kind} decode"] = lambda b=block: b(3, 1, 7, ragged=False)
        calls[f"decoder_block kind{kind} ragged"] = lambda b=block: b(2, 1, 0, ragged=True)
    return calls


class Block:
    """A random pre-norm block (d 128, 4 query and 2 key-value heads of 32, MLP 256) whose
    products are float32 blocks (kind 0) or Q4_1 blocks times int8 codes (kind 2, with a half
    cache as products="int8" keeps); each call writes a fresh copy of one cache, so every call
    computes the same thing."""

    def __init__(self, gen: torch.Generator, kind: int) -> None:
        d, heads, kv, dh, ff = 128, 4, 2, 32, 256
        nrng = np.random.default_rng(kind)
        shapes = ((heads + 2 * kv) * dh, d), (d, heads * dh), (2 * ff, d), (d, ff)
        self.products: list[list] = [[], [], [], [], []]
        for n, k in shapes:
            if kind == 0:
                packed, qtype = native.pack(torch.randn(n, k, generator=gen) / k**0.5), 0
            else:
                packed, qtype = quant.pack_int8(_blocks("Q4_1", n, k, nrng), "Q4_1"), 3
            for column, value in zip(self.products, (packed, kind, qtype, n, None), strict=True):
                column.append(value)
        self.norms = torch.rand(2, d, generator=gen) + 0.5
        self.cache = torch.randn(2, 4, kv, 16, dh, generator=gen).to(F16 if kind else F32)
        self.x = torch.randn(4, 8, d, generator=gen)
        self.rope = torch.randn(2, 8, dh, generator=gen)
        self.heads = heads, kv

    def __call__(self, b: int, t: int, start: int, ragged: bool) -> torch.Tensor:
        k, v = (c[:b].clone() for c in self.cache) if not ragged else self.cache.clone()
        rows = torch.tensor([2, 0]) if ragged else None
        starts = torch.tensor([9, 4]) if ragged else None
        cos, sin = (r[:t] if not ragged else r[:b, None] for r in self.rope)
        out = native.op("decoder_block")(
            self.x[:b, :t], self.norms[0], self.norms[1], *self.products, cos.contiguous(),
            sin.contiguous(), k, v, start, 0, 1e-5, *self.heads, 32**-0.5, rows, starts,
        )  # fmt: skip
        return torch.cat([out.flatten(), k.flatten().float(), v.flatten().float()])


class Ragged:
    """One ragged step; its reference (``alone``) is each row decoded by itself, the
    ``causal_attention`` call of a solo decode step, so a ragged result that drifted from the
    solo runs (a window ignored, another row's keys read) counts as wrong."""

    def __init__(self, q: torch.Tensor, kv: torch.Tensor, rows: torch.Tensor,
                 positions: torch.Tensor, window: int) -> None:  # fmt: skip
        self.q, self.kv, self.rows, self.positions, self.window = q, kv, rows, positions, window
        # the step's own keys and values: what the cache holds there (the write is checked in
        # test_ragged.py), so every call reads the same cache
        self.new = [c[rows, :, positions].unsqueeze(2).float() for c in kv]  # [b, Hkv, 1, D]

    def __call__(self) -> torch.Tensor:
        k, v = self.kv
        ragged = native.op("ragged_attention")
        return ragged(self.q, k, v, *self.new, 0.125, self.rows, self.positions, self.window)

    def alone(self) -> torch.Tensor:
        k, v = self.kv
        return torch.cat([
            native_ops.causal_attention(self.q[i : i + 1], k[r : r + 1], v[r : r + 1], 0.125,
                                        int(p), self.window)
            for i, (r, p) in enumerate(zip(self.rows.tolist(), self.positions.tolist(), strict=True))
        ])  # fmt: skip


def _noise(size: int, seed: int) -> torch.Tensor:
    out = torch.empty(size)
    native.noise_finish(native.noise_start(out, torch.Generator().manual_seed(seed)))
    return out


def build(seed: int) -> dict[str, Call]:
    gen, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    return {**float_calls(gen, rng), **quant_calls(gen, rng), **other_calls(gen, rng)}


def run(threads: int, rounds: int, seed: int) -> dict:
    """Every call's result at one thread, then every call once and ``rounds`` rounds of random
    calls at ``threads``, with noise draws queued between them (as a sampled decode step queues
    them)."""
    assert native.extension() is not None, "the native kernel did not build"
    torch.set_num_threads(1)
    calls = build(seed)
    want, cost = {}, {}
    for name, call in calls.items():
        start = time.perf_counter()
        want[name] = getattr(call, "alone", call)()  # ragged steps: the solo steps' bits
        cost[name] = time.perf_counter() - start
    torch.set_num_threads(threads)
    names, rng = sorted(calls), random.Random(seed + threads)
    # cheap calls more often: more calls, and more of them with fewer chunks than threads
    weights = [1 / max(cost[n], 1e-6) ** 0.5 for n in names]
    tally = Tally()
    started = time.perf_counter()
    tally.round(calls, want, rng.sample(names, len(names)), rng, least_noise=1)
    for _ in range(rounds):
        tally.round(calls, want, rng.choices(names, weights, k=64), rng)
    return {
        "threads": threads,
        "kernel_threads": native.kernel_threads(),
        "rounds": rounds,
        "seconds": round(time.perf_counter() - started, 2),  # for reading only: never a limit
        "calls": sum(tally.done.values()),
        "wrong": sum(tally.wrong.values()),
        "calls_by_op": dict(tally.done),
        "wrong_by_op": dict(tally.wrong),
        "examples": tally.examples[:10],
    }


class Tally:
    """Calls made and results that differ from one thread's, per op."""

    def __init__(self) -> None:
        self.done: Counter[str] = Counter()
        self.wrong: Counter[str] = Counter()
        self.examples: list[str] = []

    def round(
        self, calls: dict[str, Call], want: dict[str, torch.Tensor], picks: list[str],
        rng: random.Random, least_noise: int = 0,
    ) -> None:  # fmt: skip
        """``picks`` in order, with 0-3 noise draws (at least ``least_noise``) queued before
        them and finished after them."""
        seeds = [rng.randrange(1 << 30) for _ in range(rng.randint(least_noise, 3))]
        # Exp(1) values, or the uniform draws decoding queues (odd seeds)
        outs = [torch.empty(4096, dtype=(torch.float32, torch.float64)[s % 2]) for s in seeds]
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        tickets = [native.noise_start(o, g) for o, g in zip(outs, gens, strict=True)]
        for name in picks:
            got = calls[name]()
            self.count(name.split()[0], got, want[name], name)
        for out, s, ticket in zip(outs, seeds, tickets, strict=True):
            native.noise_finish(ticket)
            got = out if out.dtype == torch.float32 else native.exponential_of(out)
            ref = torch.empty(4096).exponential_(1, generator=torch.Generator().manual_seed(s))
            self.count("queued noise", got, ref, f"queued noise seed {s}")

    def count(self, op: str, got: torch.Tensor, want: torch.Tensor, name: str) -> None:
        self.done[op] += 1
        if not torch.equal(got, want):
            self.wrong[op] += 1
            err = (got - want).abs().max().item()
            self.examples.append(f"{name}: max error {err:.3g}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=400, help="rounds of 64 random calls")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.threads, args.rounds, args.seed)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
