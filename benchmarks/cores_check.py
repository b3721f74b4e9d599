"""The native kernels on a many-core machine: exact at every thread count, and how decode
speed grows with cores, with no network and without the shipped model.

    python benchmarks/cores_check.py OUT.json [--threads 1 4 8 16] [--rounds 400]
                                             [--tokenizer FIELDS.json.gz] [--tiny]

1. ``tests/kernel_stress.py`` (every quant type, ragged attention, queued noise) at each
   thread count, bit for bit against one thread, each in its own process.
2. Decode tokens/s at each thread count of two random-weight GGUFs of the default model's
   shapes (d_model 576, 30 layers, vocabulary 49,152): ``mix``, the types of llama.cpp's
   Q4_K_M of that model (rows of 576 as Q5_0, ``down_proj`` alternately Q4_K and Q6_K, a Q8_0
   embedding), and ``q4_1``, the shipped file's types. With the bytes a step reads and this
   machine's read bandwidth at each count: the kernel reads Q5_0 as Q8_0 and Q6_K codes as
   bytes (24% more bytes than the file), a trade a memory-bound machine judges.
3. Rows equal solo rows (``tests/test_kquants.py``'s check: 2, 5 and 13 rows, the wide, tile
   and panel paths) on its tiny Llama GGUF of every K-quant type, and on a random-weight GGUF
   of the default model's shapes, each thread count in its own process, digests compared.

``--tokenizer``: the default GGUF's tokenizer fields as gzipped JSON (``--write-tokenizer``
writes them here, where the default model is installed), for a machine without it.
Prints one line per figure, writes them to OUT.json after each part (a run cut short keeps
the parts before); exits 1 when a result differs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))

from steer_widgets.runtime import gguf_model, native  # noqa: E402

D, LAYERS, FF, HEADS, KV, N_NEW = 576, 30, 1536, 9, 3, 32
SCALE = {"Q4_0": 4e-3, "Q4_1": 4e-3, "Q8_0": 5e-4, "Q5_0": 2e-3}  # f16 factors: weights ~0.05
SCALE |= {"Q4_K": 1e-4, "Q5_K": 5e-5, "Q6_K": 5e-5}

DECODE = """
import json, sys, time, torch
from steer_widgets.runtime.model import load_model
runtime = load_model(sys.argv[1]).runtime
n_new = int(sys.argv[3])
ids = torch.randint(0, 49152, (1, 24), generator=torch.Generator().manual_seed(0))
x = torch.ones(256 * 2**20 // 4)  # the read bandwidth: a reduction over 256 MB
def run():
    cache = runtime.new_cache(1, 24 + n_new)
    step = runtime.forward(ids, cache, last_only=True)[:, -1].argmax(-1, keepdim=True)
    start = time.perf_counter()
    for _ in range(n_new):
        step = runtime.forward(step, cache, last_only=True)[:, -1].argmax(-1, keepdim=True)
    return time.perf_counter() - start
def read():
    start = time.perf_counter()
    x.sum()
    return time.perf_counter() - start
out = {}
for n in map(int, sys.argv[2].split(",")):  # one load, every count: loads cost more than runs
    torch.set_num_threads(n)
    best = min(run() for _ in range(4))
    out[str(n)] = {"tokens_per_s": n_new / best, "mb_per_step": runtime.weight_bytes() / 1e6,
                   "read_gb_s": x.numel() * 4 / min(read() for _ in range(6)) / 1e9}
print(json.dumps(out))
"""


def environment() -> dict:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    lines = text.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "isa": [f for f in wanted if f in flags],
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def write_model(out: Path, tok: dict, types: str, layers: int = LAYERS) -> None:
    """A Llama GGUF of the default model's shapes; ``types`` "mix" or "q4_1" (see above)."""
    from gguf import GGMLQuantizationType as T
    from test_kquants import k_blocks, llama_writer

    rng = np.random.default_rng(0)
    hd, vocab = D // HEADS, len(tok["tokens"])
    w = llama_writer(out, tok, layers, D, FF, HEADS, KV)

    def matrix(name: str, shape: tuple[int, int], qtype: str) -> None:
        w.add_tensor(name, k_blocks(rng, shape, qtype, SCALE[qtype]), raw_dtype=T[qtype])

    def floats(name: str) -> None:
        w.add_tensor(name, (1.0 + rng.standard_normal(D) * 0.1).astype(np.float32))

    matrix("token_embd.weight", (vocab, D), "Q8_0")
    floats("output_norm.weight")
    rows_576 = "Q5_0" if types == "mix" else "Q4_1"
    for i in range(layers):
        p = f"blk.{i}."
        floats(p + "attn_norm.weight")
        floats(p + "ffn_norm.weight")
        for part, rows in zip("qkv", (HEADS * hd, KV * hd, KV * hd), strict=True):
            matrix(p + f"attn_{part}.weight", (rows, D), rows_576)
        matrix(p + "attn_output.weight", (D, HEADS * hd), rows_576)
        matrix(p + "ffn_gate.weight", (FF, D), rows_576)
        matrix(p + "ffn_up.weight", (FF, D), rows_576)
        down = ("Q4_K" if i % 2 == 0 else "Q6_K") if types == "mix" else "Q4_1"
        matrix(p + "ffn_down.weight", (D, FF), down)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _python(code_or_script: list[str], timeout: int = 900) -> dict:
    path = os.pathsep.join(filter(None, (str(ROOT), str(TESTS), os.environ.get("PYTHONPATH"))))
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")  # keeps a carried gguf
    proc = subprocess.run(
        [sys.executable, *code_or_script], env=env, capture_output=True, text=True,
        timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    if proc.returncode != 0:
        return {"error": f"rc {proc.returncode}: {proc.stderr[-1500:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stress(threads: list[int], rounds: int) -> dict:
    script = str(TESTS / "kernel_stress.py")
    out = {}
    for n in threads:
        r = _python([script, "--threads", str(n), "--rounds", str(rounds)])
        out[str(n)] = {k: r.get(k) for k in ("calls", "wrong", "seconds", "kernel_threads")}
        out[str(n)] |= {"wrong_by_op": r.get("wrong_by_op"), "error": r.get("error")}
        print(f"stress   {n:2d} threads: {out[str(n)]}", flush=True)
    return out


def rows(paths: dict[str, Path], threads: list[int]) -> dict:
    from test_kquants import ROWS

    out = {}
    for name, path in paths.items():
        gguf_model.metadata_dir(path)  # converted once, before the processes
        runs = {str(n): _python(["-c", ROWS, str(path), str(n)]) for n in threads}
        # one digest per products setting (test_kquants.ROWS): every count must give the same
        digests = {json.dumps(r.get("digest"), sort_keys=True) for r in runs.values()}
        exact = all(r.get("exact") for r in runs.values()) and len(digests) == 1
        out[name] = {"exact": exact, "runs": runs}
        print(f"rows     {name}: exact {exact} at {threads} threads", flush=True)
    return out


def decode(paths: dict[str, Path], threads: list[int], n_new: int) -> dict:
    out: dict = {}
    counts = ",".join(map(str, threads))
    for name, path in paths.items():
        r = _python(["-c", DECODE, str(path), counts, str(n_new)])
        out[name] = {n: r.get(n, r) for n in map(str, threads)}
        print(f"decode   {name:5s}: {r}", flush=True)
    for n in map(str, threads):
        mix, q41 = out.get("mix", {}).get(n, {}), out.get("q4_1", {}).get(n, {})
        if "tokens_per_s" in mix and "tokens_per_s" in q41:
            out.setdefault("mix_vs_q4_1", {})[n] = mix["tokens_per_s"] / q41["tokens_per_s"]
    for name in ("mix", "q4_1"):
        one = out.get(name, {}).get("1", {}).get("tokens_per_s")
        if one:
            out.setdefault(f"{name}_scaling", {}).update(
                {n: r["tokens_per_s"] / one for n, r in out[name].items() if "tokens_per_s" in r}
            )
    return out


def tokenizer(path: Path | None) -> dict:
    if path is not None:
        return json.loads(gzip.decompress(path.read_bytes()))
    from test_quantized import tokenizer_fields

    return tokenizer_fields()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--write-tokenizer", action="store_true", help="write FIELDS to OUT")
    parser.add_argument("--tiny", action="store_true", help="a dry run: one model, 2 layers")
    args = parser.parse_args(argv)
    if args.write_tokenizer:
        args.out.write_bytes(gzip.compress(json.dumps(tokenizer(None)).encode()))
        return 0
    start = time.perf_counter()
    report: dict = {"environment": environment()}
    built = time.perf_counter()
    report["environment"]["kernel_built"] = native.extension() is not None
    report["environment"]["build_s"] = round(time.perf_counter() - built, 1)
    print(report["environment"], flush=True)
    report["stress"] = stress(args.threads, args.rounds)
    args.out.write_text(json.dumps(report, indent=2))
    tok = tokenizer(args.tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        from test_kquants import write_tiny_llama

        paths = {"kquants": Path(tmp) / "tiny-kquants.gguf"}
        if not args.tiny:
            write_tiny_llama(paths["kquants"], tok)
        for types in ("mix",) if args.tiny else ("mix", "q4_1"):
            paths[types] = Path(tmp) / f"{types}.gguf"
            write_model(paths[types], tok, types, 2 if args.tiny else LAYERS)
        # --tiny (the test's dry run) takes one model each: every GGUF costs a tokenizer
        # conversion of 49,152 tokens, and the tiny K-quant Llama is test_kquants' own
        timed, checked = (["mix"], ["mix"]) if args.tiny else (["mix", "q4_1"], ["kquants", "mix"])
        n_new = 4 if args.tiny else N_NEW
        report["decode"] = decode({k: paths[k] for k in timed}, args.threads, n_new)
        args.out.write_text(json.dumps(report, indent=2))  # kept if the rows run out of time
        report["rows"] = rows({k: paths[k] for k in checked}, args.threads)
    wrong = [f"stress {n}" for n, r in report["stress"].items() if r["wrong"] != 0]
    wrong += [f"rows {name}" for name, r in report["rows"].items() if not r["exact"]]
    report["failures"], report["seconds"] = wrong, round(time.perf_counter() - start, 1)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"{len(wrong)} failing: {wrong}  ({report['seconds']} s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
