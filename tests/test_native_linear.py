"""The native matrix kernel (``native.py``, ``csrc/``): right answers for any
shape, and every row bit-identical to the same row computed alone, by construction."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import native_ops
import pytest
import torch
from kernel_variants import AVX2_NO_F16C, SCALAR, runs_here
from torch_threads import at_threads

from steer_widgets.runtime import native
from steer_widgets.runtime.linear import Linear

# (out, in): below one 16-column block, across block edges, odd reductions, a model-sized one
SHAPES = [(1, 1), (5, 3), (15, 17), (16, 16), (17, 33), (33, 100), (100, 7), (130, 576)]


def _weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) / k**0.5, torch.randn(n, generator=gen)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_native_equals_matmul_for_odd_shapes(n, k, with_bias):
    w, b = _weights(n, k)
    bias = b if with_bias else None
    lin = Linear(w, kernel="native", bias=bias)
    assert lin.kernel == "native"
    x = torch.randn(3, 5, k, generator=torch.Generator().manual_seed(1))
    want = x @ w.T + (0 if bias is None else bias)
    got = lin(x)
    assert got.shape == (3, 5, n)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("n", "k"), [(5, 3), (17, 33), (130, 576)])
def test_fused_bias_has_the_bits_of_a_separate_add(n, k):
    """The kernel adds the bias in its store: one rounding, as ``out + bias`` after it."""
    w, b = _weights(n, k)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(4))
    packed = native.pack(w)
    assert torch.equal(native_ops.linear(x, packed, n, b), native_ops.linear(x, packed, n) + b)
    assert torch.equal(Linear(w, kernel="native", bias=b)(x), native_ops.linear(x, packed, n) + b)


@pytest.mark.parametrize(("n", "k"), [(37, 70), (300, 1100)])
def test_any_row_count_gives_each_row_bit_for_bit_its_solo_result(n, k):
    lin = Linear(_weights(n, k)[0], kernel="native")
    gen = torch.Generator().manual_seed(2)
    for rows in range(1, 10):
        x = torch.randn(rows, 1, k, generator=gen)
        together = lin(x)
        for r in range(rows):
            assert torch.equal(together[r], lin(x[r : r + 1])[0]), (rows, r)


def test_prefill_positions_equal_each_position_alone():
    lin = Linear(_weights(70, 45)[0], kernel="native")
    x = torch.randn(3, 13, 45, generator=torch.Generator().manual_seed(3))
    together = lin(x)
    for b in range(3):
        for t in range(13):
            assert torch.equal(together[b, t], lin(x[b : b + 1, t : t + 1])[0, 0]), (b, t)


@pytest.mark.parametrize("d", [1, 7, 8, 64, 576, 1029])
def test_native_rms_norm_equals_the_torch_formula_and_rows_are_exact_alone(d):
    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(5, 3, d, generator=gen) * 3, torch.randn(d, generator=gen)
    got = native_ops.rms_norm(x, w, 1e-5)
    want = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for b in range(5):
        for t in range(3):
            alone = native_ops.rms_norm(x[b : b + 1, t : t + 1], w, 1e-5)[0, 0]
            assert torch.equal(got[b, t], alone), (b, t)


@pytest.mark.parametrize(("d", "r"), [(64, 64), (64, 16), (80, 20), (256, 256)])
def test_native_rotary_is_bit_for_bit_the_torch_ops(d, r):
    from steer_widgets.runtime.transformer import _rotate

    gen = torch.Generator().manual_seed(5)
    qk = torch.randn(2, 3, 12, d, generator=gen)[:, :, 1:7]  # a slice, as q and k heads are
    cos, sin = torch.randn(3, r, generator=gen), torch.randn(3, r, generator=gen)
    got = native_ops.rotary(qk, cos, sin)
    assert torch.equal(got, _rotate(qk, cos[:, None], sin[:, None]))


@pytest.mark.parametrize(("h", "h_kv", "length", "d"), [(9, 3, 1, 64), (9, 3, 157, 64),
                                                        (4, 4, 33, 128), (8, 1, 600, 16)])  # fmt: skip
def test_native_decode_attention_is_sdpa_and_each_row_and_thread_count_exact(h, h_kv, length, d):
    """One decode position over a KV-cache slice (read in place, as the runtime passes it):
    SDPA's result to float32 rounding, each row and each head bit for bit alone, at any
    thread count."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(length)
    q = torch.randn(5, h, 1, d, generator=gen)
    k = torch.randn(5, h_kv, length + 40, d, generator=gen)[:, :, :length]
    v = torch.randn(5, h_kv, length + 40, d, generator=gen)[:, :, :length]
    got = native_ops.decode_attention(q, k, v, d**-0.5)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    for b in range(5):
        assert torch.equal(
            native_ops.decode_attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], d**-0.5)[0],
            got[b],
        )
    for window in (0, 5):  # a key head's query heads run together: each head's bits alone
        heads = native_ops.causal_attention(q, k, v, d**-0.5, length - 1, window)
        for i in range(h):
            g = i // (h // h_kv)
            alone = native_ops.causal_attention(q[:, i : i + 1], k[:, g : g + 1],
                                                v[:, g : g + 1], d**-0.5, length - 1, window)  # fmt: skip
            assert torch.equal(alone[:, 0], heads[:, i]), (window, i)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(native_ops.decode_attention(q, k, v, d**-0.5), got)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("h", "h_kv", "t", "length", "window"),
    [
        (9, 3, 36, 36, 0),
        (9, 3, 5, 41, 0),
        (4, 4, 20, 20, 7),
        (8, 1, 9, 60, 16),
        (2, 2, 1, 30, 8),
        (2, 1, 11, 30, 2),
        (3, 3, 7, 7, 3),
    ],  # windows narrower than a tile of positions
)
def test_native_causal_attention_is_sdpa_and_each_position_is_its_decode_step(
    h, h_kv, t, length, window
):
    """A prefill (positions length - t .. length - 1 over the cache, optionally in a sliding
    window): SDPA with the causal mask to float32 rounding, and every position bit for bit
    the one-position call a decode step makes there, at one thread and at four."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(length + t)
    q = torch.randn(3, h, t, 64, generator=gen)
    k = torch.randn(3, h_kv, length + 8, 64, generator=gen)[:, :, :length]
    v = torch.randn(3, h_kv, length + 8, 64, generator=gen)[:, :, :length]
    start = length - t
    got = native_ops.causal_attention(q, k, v, 0.125, start, window)
    q_pos, k_pos = torch.arange(start, length)[:, None], torch.arange(length)[None]
    mask = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window else True)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    for n in (1, 4):
        with at_threads(n):
            assert torch.equal(native_ops.causal_attention(q, k, v, 0.125, start, window), got)
            for j in range(t):
                end = start + j + 1
                lo = max(0, end - window) if window else 0
                step = native_ops.decode_attention(
                    q[:, :, j : j + 1], k[:, :, lo:end], v[:, :, lo:end], 0.125
                )
                assert torch.equal(step[:, :, 0], got[:, :, j]), (n, j)


def test_attention_exps_are_one_algorithm_in_every_build_and_here_std_exp():
    """Attention's exps (exp_lanes.h) in lanes equal the same algorithm a float at a time,
    what builds without AVX-512 run, on every one of the 2^31 non-positive floats; and on
    this machine's C library they are std::exp's bits (which the attention called before)."""
    algorithm, libm = native.op("exp_mismatches")(1)  # one pass over them for both
    assert algorithm == 0
    if os.confstr("CS_GNU_LIBC_VERSION") == "glibc 2.36":
        assert libm == 0


def test_native_causal_attention_names_positions_outside_the_keys():
    q, kv = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 5, 16)
    with pytest.raises(RuntimeError, match="within the L keys"):
        native_ops.causal_attention(q, kv, kv, 0.25, 2, 0)  # positions 2..5 over keys 0..4


def test_native_attention_refuses_shapes_it_does_not_read():
    q, kv = torch.randn(1, 4, 1, 24), torch.randn(1, 2, 5, 24)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        native_ops.decode_attention(q, kv, kv, 0.2)
    with pytest.raises(RuntimeError, match="do not fit"):
        native_ops.decode_attention(torch.randn(1, 3, 1, 32), *(torch.randn(1, 2, 5, 32),) * 2, 0.2)


def test_thread_count_does_not_change_results():
    lin = Linear(_weights(1000, 200)[0], kernel="native")
    x = torch.randn(6, 1, 200, generator=torch.Generator().manual_seed(4))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = lin(x)
        torch.set_num_threads(2)
        two = lin(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_results_are_the_same_on_any_calling_thread_at_once_and_in_a_forked_child():
    """The kernels' own thread pool serves every calling thread (one at a time; a second caller
    meanwhile runs alone), and a child forked after the pool started gets a fresh one."""
    lin = Linear(_weights(700, 300)[0], kernel="native")
    x = torch.randn(3, 1, 300, generator=torch.Generator().manual_seed(8))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the pool works only with more than one thread (tests run one)
    try:
        _on_threads_and_in_a_child(lin, x)
    finally:
        torch.set_num_threads(threads)


def _on_threads_and_in_a_child(lin: Linear, x: torch.Tensor) -> None:
    want, got, errors = lin(x), [], []

    def call() -> None:
        try:
            got.extend(lin(x) for _ in range(50))
        except Exception as exc:  # a failure in a thread must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    call()
    for t in threads:
        t.join()
    assert not errors and len(got) == 200 and all(torch.equal(y, want) for y in got)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one product, then report whether it matched
        ok = torch.equal(lin(x), want)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    import time

    deadline = time.monotonic() + 60  # a child stuck on its parent's threads fails, not hangs
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] == pid and done[1] == 0 and os.read(read, 1) == b"1"


def test_one_openmp_thread_holds_only_this_threads_torch_ops_and_restores_them():
    """Inside it torch's ops on this thread see one thread; the kernels keep two (a forward
    pass runs inside it), other threads are untouched, and it nests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        native.extension()
        seen = []
        with native.one_openmp_thread():
            seen.append((torch.get_num_threads(), native.kernel_threads()))
            with native.one_openmp_thread():
                seen.append((torch.get_num_threads(), native.kernel_threads()))
            seen.append((torch.get_num_threads(), native.kernel_threads()))
            other = threading.Thread(target=lambda: seen.append((torch.get_num_threads(),)))
            other.start()
            other.join()
        assert seen == [(1, 2), (1, 2), (1, 2), (2,)]
        assert torch.get_num_threads() == 2 and native.kernel_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_other_dtypes_take_another_kernel():
    w = _weights(20, 30)[0].double()
    lin = Linear(w, kernel="native")
    assert lin.kernel == "rows"
    x = torch.randn(2, 1, 30, dtype=torch.float64)
    torch.testing.assert_close(lin(x), x @ w.T)


FALLBACK = """
import torch
from steer_widgets.runtime import native
from steer_widgets.runtime.linear import Linear
w = torch.randn(40, 24)
lin = Linear(w, kernel="native")
x = torch.randn(2, 1, 24)
torch.testing.assert_close(lin(x), x @ w.T, atol=1e-5, rtol=1e-5)
print(lin.kernel, Linear(w, kernel="native").kernel)
"""


def test_a_failed_build_warns_once_falls_back_to_onednn_and_is_remembered(tmp_path):
    """No working compiler (CXX points at nothing), in fresh processes and a fresh build folder:
    the first start tries the build, later ones remember it failed (no retry, the same one
    warning), and another toolchain tries again."""

    def start(cxx: str) -> subprocess.CompletedProcess:
        env = os.environ | {"STEER_WIDGETS_CACHE": str(tmp_path), "CXX": str(tmp_path / cxx)}
        return subprocess.run(
            [sys.executable, "-c", FALLBACK], env=env, capture_output=True, text=True, check=True
        )

    runs = [start("no-cxx"), start("no-cxx"), start("other-cxx")]
    for out in runs:
        assert out.stdout.split() == ["onednn", "onednn"]
        warned = [ln for ln in out.stderr.splitlines() if "RuntimeWarning" in ln]
        assert len(warned) == 1 and 'kernel="native" unavailable' in warned[0], out.stderr
    tried = ["compiling the native matrix kernel" in out.stderr for out in runs]
    assert tried == [True, False, True]
    assert "an earlier build with this toolchain" in runs[1].stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "ext"]  # it built nowhere else
    (folder,) = (tmp_path / "ext").iterdir()
    assert [p.name for p in folder.glob("build-failed*")] == [native.FAILED]


VARIANT = """
import sys, torch
from steer_widgets.runtime import native
native.FLAGS[:] = sys.argv[1].split()
assert native.extension() is not None, "the variant did not build"
op = torch.ops.steer_widgets.rowwise_linear
for n, k in [(1, 1), (17, 33), (130, 576), (49, 1100)]:
    w, x = torch.randn(n, k), torch.randn(9, k)
    y = op(x, native.pack(w), n)
    torch.testing.assert_close(y, x @ w.T, atol=1e-4, rtol=1e-4)
    assert all(torch.equal(op(x[i : i + 1].contiguous(), native.pack(w), n)[0], y[i]) for i in range(9))
    b = torch.randn(n)
    assert torch.equal(op(x, native.pack(w), n, b), y + b)
def attend(q, k, v, scale):  # one decode position over all the keys
    return torch.ops.steer_widgets.causal_attention(q, k, v, scale, k.shape[2] - 1, 0)
q, k, v = torch.randn(3, 6, 1, 64), torch.randn(3, 2, 90, 64), torch.randn(3, 2, 90, 64)
z = attend(q, k, v, 0.125)
ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.testing.assert_close(z, ref, atol=2e-6, rtol=1e-5)
assert all(torch.equal(attend(q[i : i + 1], k[i : i + 1], v[i : i + 1], 0.125)[0], z[i]) for i in range(3))
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("variant", [AVX2_NO_F16C, SCALAR], ids=["avx2", "scalar"])
def test_the_avx2_and_scalar_builds_are_right_and_exact(variant, kernel_variants):
    """The paths a CPU without AVX-512 (or without AVX2) compiles, in a fresh process (each
    build compiled once per session: ``kernel_variants.py``)."""
    if not runs_here("avx2", "fma"):
        pytest.skip("needs an x86-64 CPU with AVX2 and FMA to run both builds")
    out = subprocess.run(
        [sys.executable, "-c", VARIANT, kernel_variants.flags(variant)],
        capture_output=True, text=True, env=kernel_variants.env(variant),
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
