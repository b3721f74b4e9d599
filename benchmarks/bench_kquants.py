"""Decode throughput of a Q4_K_M file of the default model against its Q4_1 file, same run.

Where ``SW_LLAMA_CPP_PYTHON`` names an interpreter with llama-cpp-python (a throwaway venv),
the file is llama.cpp's own: the shipped GGUF dequantized to an F32 GGUF, then
``llama_model_quantize`` at ``Q4_K_M``, and llama.cpp decodes the same file
(``llama_cpp_rate.py``). Elsewhere our own block writer makes the same layout (``write_mix``:
every matrix whose rows are 576 weights, not a multiple of 256, as ``Q5_0``; the 30
``down_proj`` matrices, rows of 1536, alternately ``Q4_K`` and ``Q6_K``; the ``Q8_0``
embedding and F32 norms kept), with a plain min/max quantizer rather than llama.cpp's search
for the best scales: the same types and bytes per weight, not the same values. 64 greedy
tokens after the chat prompt, batch 1, best of 3, the decoders alternated ``SW_BENCH_ROUNDS``
(5) times; ratios are the median of each round's, with their spread.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import CHAT, best_of

N_NEW = int(os.environ.get("SW_BENCH_NEW_TOKENS", "64"))
ROUNDS = int(os.environ.get("SW_BENCH_ROUNDS", "5"))


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """[rows, K] float32 -> Q4_K rows: per 32 weights a 6-bit scale and min under the
    super-block's f16 d and dmin, codes 0..15 (min/max, no search)."""
    n = x.shape[0]
    sub = x.reshape(n, -1, 8, 32)
    lo = np.minimum(sub.min(-1), 0)
    scale, mins = (sub.max(-1) - lo) / 15, -lo
    d, dmin = _f16(scale.max(-1) / 63), _f16(mins.max(-1) / 63)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.rint(scale / d[..., None].astype(np.float32))).clip(0, 63)
        m = np.nan_to_num(np.rint(mins / dmin[..., None].astype(np.float32))).clip(0, 63)
        ds = d[..., None].astype(np.float32) * sc
        dm = dmin[..., None].astype(np.float32) * m
        q = np.nan_to_num(np.rint((sub + dm[..., None]) / ds[..., None])).clip(0, 15)
    sc, m, q = sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8)
    scales = np.concatenate(
        [sc[..., :4] | ((sc[..., 4:] >> 4) << 6), m[..., :4] | ((m[..., 4:] >> 4) << 6),
         (sc[..., 4:] & 0x0F) | ((m[..., 4:] & 0x0F) << 4)], axis=-1,
    )  # fmt: skip
    qs = (q[..., 0::2, :] | (q[..., 1::2, :] << 4)).reshape(*q.shape[:2], 128)
    halves = [d.view(np.uint8).reshape(*d.shape, 2), dmin.view(np.uint8).reshape(*d.shape, 2)]
    return np.concatenate([*halves, scales, qs], axis=-1).reshape(n, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """[rows, K] float32 -> Q6_K rows: per 16 weights an int8 scale under the super-block's
    f16 d, codes -32..31 stored plus 32."""
    n = x.shape[0]
    sub = x.reshape(n, -1, 16, 16)
    scale = np.abs(sub).max(-1) / 31
    d = _f16(scale.max(-1) / 127)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.rint(scale / d[..., None].astype(np.float32))).clip(-128, 127)
        ds = d[..., None].astype(np.float32) * sc
        q = np.nan_to_num(np.rint(sub / ds[..., None])).clip(-32, 31) + 32
    q = q.astype(np.uint8).reshape(n, -1, 2, 128)  # 256 weights: two halves of 128
    low, high = q & 0x0F, q >> 4
    ql = low[..., :64] | (low[..., 64:] << 4)  # [n, S, 2, 64]
    qh = high[..., 0:32] | (high[..., 32:64] << 2) | (high[..., 64:96] << 4)
    qh |= high[..., 96:128] << 6
    halves = d.view(np.uint8).reshape(*d.shape, 2)
    parts = [ql.reshape(n, -1, 128), qh.reshape(n, -1, 64), sc.astype(np.int8).view(np.uint8)]
    return np.concatenate([*parts, halves], axis=-1).reshape(n, -1)


def copy_gguf(src: Path, out: Path, convert) -> dict[str, int]:
    """The GGUF ``src`` rewritten to ``out``, its metadata as it is and each tensor through
    ``convert(name, qtype, data) -> (qtype, data)``; the count of tensors per type written."""
    import gguf
    from gguf import GGMLQuantizationType as T

    reader = gguf.GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    counts: dict[str, int] = {}
    for t in reader.tensors:
        qtype, data = convert(t.name, T(t.tensor_type), np.array(t.data))
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
        w.add_tensor(t.name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts


def write_mix(src: Path, out: Path) -> dict[str, int]:
    """The default GGUF as a Q4_K_M-layout mix written by our own quantizers."""
    import gguf
    from gguf import GGMLQuantizationType as T

    downs = []

    def convert(name: str, qtype, data: np.ndarray):
        if qtype not in (T.Q4_0, T.Q4_1, T.Q8_0) or name.startswith("token_embd"):
            return qtype, data
        x = gguf.quants.dequantize(data, qtype)
        if x.shape[1] % 256:
            return T.Q5_0, gguf.quants.quantize(x, T.Q5_0)
        qtype = T.Q4_K if len(downs) % 2 == 0 else T.Q6_K
        downs.append(name)
        data = (quantize_q4_k if qtype == T.Q4_K else quantize_q6_k)(x)
        error = np.abs(gguf.quants.dequantize(data, qtype) - x).max() / np.abs(x).max()
        assert error < 0.1, (name, qtype.name, error)  # the writer's own check
        return qtype, data

    return copy_gguf(src, out, convert)


QUANTIZE = """
import ctypes, sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(),
                                        ctypes.byref(params)))
"""


def llama_cpp_q4_k_m(python: str, src: Path, out: Path) -> dict[str, int]:
    """A real Q4_K_M file: ``src`` dequantized to an F32 GGUF, then llama.cpp's quantizer
    (run by ``python``, an interpreter with llama-cpp-python)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    def to_f32(name: str, qtype, data: np.ndarray):
        if qtype == T.F32:
            return qtype, data
        return T.F32, gguf.quants.dequantize(data, qtype)

    f32 = out.with_suffix(".f32.gguf")
    copy_gguf(src, f32, to_f32)
    subprocess.run([python, "-c", QUANTIZE, str(f32), str(out)], check=True, capture_output=True)
    f32.unlink()
    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(out).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def _has_llama_cpp() -> str | None:
    python = os.environ.get("SW_LLAMA_CPP_PYTHON", sys.executable)
    found = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode
    return None if found else python


def _decode(engine, ids: list[int]) -> list[int]:
    from steer_widgets.steering.generation import Row, Sampling, decode

    sampling = Sampling(temperature=0.0, freq_penalty=0.0, seed=0, n_completion_tokens=N_NEW)
    return [s.tokens[0] for s in decode(engine.model.runtime, ids, [Row()], sampling, frozenset())]


def _shared_prefix(a: list[int], b: list[int]) -> int:
    """How many first greedy tokens two models agree on (the mix is a requantization)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _llama_cpp(python: str, path: Path, ids: list[int], threads: int) -> dict:
    settings = {"ids": ids, "threads": threads, "new_tokens": N_NEW, "repeats": 3}
    script = str(Path(__file__).with_name("llama_cpp_rate.py"))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([python, script, str(path), json.dumps(settings)],
                         capture_output=True, text=True, check=True, env=env)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> dict:
    from unittest import mock

    import steer_widgets as sw
    from steer_widgets.runtime import gguf_model
    from steer_widgets.runtime.model import gguf_path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "SmolLM2-135M-Instruct.Q4_K_M.gguf"
        python = _has_llama_cpp()
        if python is None:
            counts = write_mix(gguf_path(), path)
        else:
            counts = llama_cpp_q4_k_m(python, gguf_path(), path)
        q41 = sw.Engine(sw.load_model(str(gguf_path())), saes=[])
        # the mix's converted metadata in the scratch folder, not the user cache
        with mock.patch.object(gguf_model, "cache_dir", lambda: Path(tmp) / "cache"):
            mix = sw.Engine(sw.load_model(str(path)), saes=[])
            mix8 = sw.Engine(sw.load_model(str(path), products="int8"), saes=[])
        ids = list(q41.tokenizer.encode(CHAT).ids)
        q41_ids, mix_ids, mix8_ids = _decode(q41, ids), _decode(mix, ids), _decode(mix8, ids)
        rounds = _rounds({"q4_1": q41, "mix": mix, "mix_int8": mix8}, ids, python, path)
        q41_s, mix_s = (statistics.median(r[k] for r in rounds) for k in ("q4_1", "mix"))
        figures = {
            "file_written_by": "our block writer" if python is None else "llama.cpp quantizer",
            "tensors_by_type": counts,
            "file_mb_mix": path.stat().st_size / 1e6,
            "file_mb_q4_1": gguf_path().stat().st_size / 1e6,
            "weight_mb_per_step_mix": mix.model.runtime.weight_bytes() / 1e6,
            "weight_mb_per_step_q4_1": q41.model.runtime.weight_bytes() / 1e6,
            "tokens_per_s_mix": N_NEW / mix_s,
            "tokens_per_s_q4_1": N_NEW / q41_s,
            "mix_vs_q4_1": q41_s / mix_s,
            "mix_vs_q4_1_spread": _spread(r["q4_1"] / r["mix"] for r in rounds),
            "greedy_tokens_shared_with_q4_1": _shared_prefix(q41_ids, mix_ids),
            "tokens_per_s_mix_int8": N_NEW / statistics.median(r["mix_int8"] for r in rounds),
            "mix_int8_vs_mix": statistics.median(r["mix"] / r["mix_int8"] for r in rounds),
            "greedy_tokens_int8_shared_with_mix": _shared_prefix(mix_ids, mix8_ids),
            "threads": torch.get_num_threads(),
            "rounds": len(rounds),
        }
        if python is not None:
            llama_s = statistics.median(r["llama_cpp"] for r in rounds)
            figures["llama_cpp_tokens_per_s_mix"] = N_NEW / llama_s
            figures["mix_vs_llama_cpp"] = statistics.median(
                r["llama_cpp"] / r["mix"] for r in rounds
            )
            figures["mix_vs_llama_cpp_spread"] = _spread(r["llama_cpp"] / r["mix"] for r in rounds)
            figures["mix_int8_vs_llama_cpp"] = statistics.median(
                r["llama_cpp"] / r["mix_int8"] for r in rounds
            )
            figures["mix_int8_vs_llama_cpp_spread"] = _spread(
                r["llama_cpp"] / r["mix_int8"] for r in rounds
            )
        return figures


def _rounds(engines: dict, ids: list[int], python: str | None, path: Path) -> list[dict]:
    """Seconds for N_NEW tokens (best of 3) of each decoder, alternated ROUNDS times: this
    machine's speed drifts by a third from minute to minute, so ratios are taken within a
    round and their median reported."""
    rounds = []
    for _ in range(ROUNDS):
        times = {name: best_of(lambda e=e: _decode(e, ids)) for name, e in engines.items()}
        if python is not None:
            rate = _llama_cpp(python, path, ids, torch.get_num_threads())["tokens_per_s"]
            times["llama_cpp"] = N_NEW / rate
        rounds.append(times)
    return rounds


def _spread(ratios) -> list[float]:
    ratios = list(ratios)
    return [min(ratios), max(ratios)]
