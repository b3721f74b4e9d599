"""The ``"native"`` matrix kernel: a small C++ extension compiled for this machine on first use.

``csrc/`` computes ``x @ W.T`` on a weight packed once as [N/16, K, 16], one fused
multiply-add chain per output element in a fixed order, so a row's result cannot depend on
the other rows: batch invariance by construction, with one pass over the weights for every
row. Its files, one idea each: ``pool`` (the thread pool every kernel splits its work over),
``noise_queue`` (sampling noise the pool's idle workers draw), ``mt_uniform`` (its float64
draws: torch's Mersenne Twister, many words at a time), ``simd.h`` and
``float_tiles.h`` (the 16-float line and the float32 tiles), ``float_linear``,
``quant_linear`` (GGUF blocks), ``attention_norms`` (RMSNorm, rotary, causal attention),
``exp_lanes`` (attention's exps in lanes, with one ``std::exp``'s bits each),
``decoder_block`` (a whole pre-norm block on pointers, its intermediates in one workspace), all
torch-free behind ``kernels.h``; ``vocab_pass`` (a decode step's sampling and log-probabilities,
every row at once, on ATen's softmax); ``ops.cpp`` binds them to tensors as
``torch.ops.steer_widgets.*``. It is built with ``-O3 -march=native``
(``torch.utils.cpp_extension.load``, ninja and a C++ compiler needed) into the user cache,
in a folder named after this CPU's instruction-set flags, so a home folder shared between
machines never runs another CPU's build. When it cannot be built, ``extension()`` returns
None after one warning and callers fall back to oneDNN.

The same extension holds RMSNorm, rotary embedding and causal attention as one op each
(``op("rms_norm")``, ``op("rotary")``, ``op("causal_attention")``, ``op("ragged_attention")``):
outside the matrix products a decode step is a few hundred small torch ops.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from .paths import cache_dir

CSRC = Path(__file__).parent / "csrc"
SOURCES = sorted(CSRC.glob("*.cpp"))  # compiled together into one extension
HEADERS = sorted(CSRC.glob("*.h"))
BLOCK = 16  # output columns per packed block (the C++ kBlock)
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]


def build_dir() -> Path:
    """``<cache_dir>/ext/kernels-<cpu>`` (``~/.cache/steer_widgets``), never the tree."""
    return cache_dir() / "ext" / f"kernels-{build_tag()}"


def cpu_features() -> str:
    """This CPU's architecture and instruction-set flags (``/proc/cpuinfo``'s ``flags`` or
    ``Features`` line; the architecture alone where there is none): what a build with
    ``-march=native``, and anything kept for this CPU, is valid for."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {flags}"


def build_tag() -> str:
    """A short hash of this CPU's flags (the build is -march=native), the torch it links and
    the sources and headers (checkouts with different sources never share, or fight over,
    one build): what names this machine's build of the kernel."""
    key = f"{cpu_features()} {torch.__version__} {Path(torch.__file__).parent}"
    for path in (*SOURCES, *HEADERS):
        key += f" {path.name} " + hashlib.sha1(path.read_bytes()).hexdigest()
    return hashlib.sha1(key.encode()).hexdigest()[:12]


FAILED = "build-failed.txt"  # in the build folder: the toolchain a build failed with, and why


class BuildFailed(RuntimeError):
    """The kernel could not be built here (remembered: later starts do not retry it)."""


@functools.cache
def extension() -> Callable[[Tensor, Tensor, int], Tensor] | None:
    """The compiled op (built once per machine and cached), or None with one warning."""
    try:
        if not loaded("rowwise_linear"):  # a process loads it once
            _build()
        return torch.ops.steer_widgets.rowwise_linear
    except Exception as exc:  # no compiler, no ninja, a failed build: oneDNN still works
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        warnings.warn(
            f'kernel="native" unavailable ({type(exc).__name__}: {first[:200]}); using "onednn"',
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _toolchain() -> str:
    """What a build needs besides the sources (the compiler torch calls, ninja): a failed build
    is retried once this changes, say when a compiler is installed."""
    cxx = os.environ.get("CXX", "c++")
    ninja = shutil.which("ninja") or importlib.util.find_spec("ninja") is not None
    return f"cxx={shutil.which(cxx) or cxx!r} ninja={bool(ninja)}"


def _build() -> None:
    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    marker, built = folder / FAILED, any(folder.glob("*.so"))
    if marker.exists() and not built:
        toolchain, _, reason = marker.read_text().partition("\n")
        if toolchain == _toolchain():
            raise BuildFailed(
                f"an earlier build with this toolchain failed, remove {marker} to retry: {reason}"
            )
    if not built:
        print(
            "steer_widgets: compiling the native matrix kernel for this CPU (once)", file=sys.stderr
        )
    try:
        build("steer_widgets_kernels", folder, FLAGS)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        scratch = folder / f"{FAILED}.{os.getpid()}"
        scratch.write_text(f"{_toolchain()}\n{first[:300]}")
        scratch.replace(marker)  # whole, whichever process writes last
        raise
    marker.unlink(missing_ok=True)


def build(name: str, folder: Path, flags: list[str]) -> None:
    """Compiles ``csrc/`` with ``flags`` into ``folder`` and loads it (registering
    ``torch.ops.steer_widgets.*``): the one build recipe, for this CPU's build and for the
    tests that build the other instruction-set paths."""
    from torch.utils import cpp_extension

    path = os.environ.get("PATH", "")
    if shutil.which("ninja") is None:  # the ninja wheel puts it beside the interpreter
        try:
            import ninja

            os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{path}"
        except ImportError:
            pass
    try:
        cpp_extension.load(
            name,
            [str(path) for path in SOURCES],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
            extra_include_paths=[str(CSRC)],
            build_directory=str(folder),
            is_python_module=False,  # registers torch.ops.steer_widgets.*
        )
    finally:
        os.environ["PATH"] = path


def available(w: Tensor) -> bool:
    """True when ``w`` can use the native kernel here (a float32 CPU weight, a built module)."""
    return w.device.type == "cpu" and w.dtype == torch.float32 and extension() is not None


def pack(w: Tensor) -> Tensor:
    """[N, K] -> [ceil(N/16), K, 16]: column blocks, each one contiguous stream over k (the
    columns past N are zeros and never stored)."""
    n, k = w.shape
    blocks = -(-n // BLOCK)
    padded = torch.zeros(blocks * BLOCK, k, dtype=w.dtype)
    padded[:n] = w
    return padded.view(blocks, BLOCK, k).transpose(1, 2).contiguous()


def op(name: str) -> Callable[..., Tensor]:
    """The compiled op ``name`` ("rowwise_linear", "rms_norm", "rotary",
    "causal_attention", "ragged_attention", "quant_linear", "quant_rows", "openmp_threads",
    "noise_*"), looked up once for a caller that runs it in every layer of every step; only
    where ``extension()`` is not None."""
    extension()  # loads the module on first use
    return getattr(torch.ops.steer_widgets, name).default


def loaded(name: str) -> bool:
    """Whether a runtime of this process loaded the kernel, whose op ``name`` is then at hand
    (a process that never needed the kernel does not build it for this)."""
    return hasattr(torch.ops.steer_widgets, name)


@contextlib.contextmanager
def one_openmp_thread() -> Iterator[None]:
    """torch's own ops on the calling thread run on one OpenMP thread meanwhile; the native
    kernels keep torch's thread count. They split their work over a thread pool of their own
    (OpenMP gives every calling thread its own team, and decoding on a worker thread, as the
    explorer does, ran 2.3x slower), and torch's ops between their calls would otherwise
    wake an OpenMP team whose threads spin for milliseconds on the cores that pool needs
    next (a sampled decode ran 1.4x slower, a 42-token prefill 1.4x). A no-op where no
    runtime of this process loaded the kernel (it is never built for this)."""
    if not loaded("openmp_threads"):
        yield
        return
    before = op("openmp_threads")(1)
    try:
        yield
    finally:
        op("openmp_threads")(before)


def kernel_threads() -> int:
    """Threads the kernels split a call from this thread over: torch's count, kept inside
    ``one_openmp_thread``."""
    return op("kernel_threads")()


def pool_workers() -> int:
    """Worker threads the kernels' pool has started in this process (one fewer than the
    largest thread count a call has used)."""
    return op("pool_workers")()


def noise_start(out: Tensor, gen: torch.Generator) -> int | None:
    """Start filling ``out`` with ``gen``'s next draws on the kernels' pool threads while they
    are idle (a sampled decode step's noise, drawn while the model runs): float32 [n],
    ``out.exponential_(1, generator=gen)``'s values; float64 [n], the uniform draws those are
    made of (``exponential_of`` gives the values; ``vocab_pass`` takes the logarithm only
    where a token can win). A ticket for ``noise_finish``, or None where no runtime of this
    process loaded the kernel (it is never built for this). ``gen`` is the draw's until
    then."""
    if not loaded("noise_start") or not queue_is_exact():
        return None
    return op("noise_start")(out, gen)


def exponential_of(uniforms: Tensor) -> Tensor:
    """The Exp(1) values (float32) ``exponential_`` makes of the uniform draws ``uniforms``
    (float64, ``noise_start``'s): its bits, the queue's check says."""
    return op("exponential_of")(uniforms)


@functools.cache
def queue_is_exact() -> bool:
    """Whether the queue's draws (512 a chunk, in order) have the bits of one
    ``exponential_`` over the whole tensor, both as float32 values and as the float64
    uniform draws through ``exponential_of``, checked once per process where the kernel is
    loaded. It holds for torch 2.13 (``exponential_`` and ``uniform_`` take one 64-bit draw
    an element, and -log1p(-u) is ATen's expression); where it does not, ``noise_start``
    returns None (rows draw inline) and one warning says so."""
    ok = True
    for seed, size in ((0, 4099), (1, 49152)):  # a partial last chunk; a vocabulary
        once = torch.empty(size).exponential_(1, generator=torch.Generator().manual_seed(seed))
        for dtype in (torch.float32, torch.float64):
            queued = torch.empty(size, dtype=dtype)
            op("noise_finish")(op("noise_start")(queued, torch.Generator().manual_seed(seed)))
            values = queued if dtype == torch.float32 else op("exponential_of")(queued)
            ok &= torch.equal(values, once)
    if not ok:
        warnings.warn(
            f"torch {torch.__version__}: the queued draws differ from one exponential_; "
            "sampling noise is drawn inline",
            RuntimeWarning,
            stacklevel=3,
        )
    return bool(ok)


def noise_finish(ticket: int) -> None:
    """The draw of ``noise_start`` completed on the calling thread (most of it, usually,
    drawn already)."""
    op("noise_finish")(ticket)


def noise_cancel(ticket: int) -> None:
    """The draw of ``noise_start`` dropped, wherever it stood."""
    op("noise_cancel")(ticket)


def vocab_pass(
    logits: Tensor,
    temperature: list[float],
    penalty: list[float],
    counts: list[Tensor | None],
    noise: list[Tensor | None],
    follow: list[int],
    k: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The end of a decode step for every row of ``logits`` [rows, vocab] at once, rows on the
    kernels' pool (``csrc/vocab_pass.h``): (tokens, their log-probabilities, top ids, top
    values), with torch's softmax and log_softmax bits. Only where ``loaded("vocab_pass")``."""
    return op("vocab_pass")(logits.contiguous(), temperature, penalty, counts, noise, follow, k)


MAX_HEAD = 256  # the largest head the attention kernels read (the C++ kMaxLines * kBlock)


def reads_heads_of(d_head: int) -> bool:
    """Whether the attention kernels take heads of ``d_head`` floats: whole 16-float lines,
    at most ``MAX_HEAD``."""
    return d_head % BLOCK == 0 and d_head <= MAX_HEAD
