"""Exactness and speed of the fast runtime on a GPU against transformers, with no network.

    python benchmarks/gpu_check.py OUT.json [--device cuda] [--dtypes float32 bfloat16]
                                            [--archs gpt2 gemma2 ...] [--tiny] [--no-engine]

For every architecture of ``bench_architectures`` (random weights built with transformers'
config classes at a realistic width; ``--tiny`` runs the same code paths in seconds) and every
dtype: the row groups our runtime measured at load on the device, our greedy tokens against
transformers' ``generate`` (and how many agree), the prompt logits' largest difference,
``rows_identical`` (three rows sampled together, two of them steered, equal each row sampled
alone) and decode tokens/s of ours and of transformers at batch 1. Then, per dtype, the
engine end to end (``gpu_engine.engine_case``): ``steer`` with a sweep, a ragged
``steer_batch`` and ``evaluate``, every row against its solo run.

Prints one line per case, writes every figure to OUT.json and exits 1 when a guarantee fails:
rows not identical (in any case, the engine's too), or (float32 only: bf16 and fp16 round
differently along different but equally valid kernel paths) greedy tokens unlike
transformers'.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_architectures import N_NEW, check, configs  # noqa: E402
from gpu_engine import engine_case  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON file for the figures")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=None)
    parser.add_argument("--archs", nargs="+", choices=sorted(configs()), default=None)
    parser.add_argument("--tiny", action="store_true", help="tiny models, a few tokens")
    parser.add_argument("--no-engine", action="store_true", help="skip the engine case")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here (run with --device cpu --tiny for a dry run)")
    dtypes = args.dtypes or (["float32", "bfloat16"] if args.device != "cpu" else ["float32"])
    n_new = 8 if args.tiny else N_NEW
    report: dict = {"environment": _environment(args.device), "cases": {}}
    failures = []
    start = time.perf_counter()
    for dtype in dtypes:
        for name in args.archs or list(configs()):
            figures = check(name, args.device, DTYPES[dtype], args.tiny, n_new, repeats=2)
            report["cases"][f"{name}/{dtype}"] = figures
            ok = figures["rows_identical"] and (figures["greedy_equal_hf"] or dtype != "float32")
            if not ok:
                failures.append(f"{name}/{dtype}")
            print(_line(name, dtype, figures, ok), flush=True)
        if not args.no_engine:
            figures = _engine(args.device, dtype, args.tiny)
            report["cases"][f"engine/{dtype}"] = figures
            if not figures.get("exact"):
                failures.append(f"engine/{dtype}")
            print(f"{'ok  ' if figures.get('exact') else 'FAIL'} engine    {dtype:9s} {figures}")
    report["failures"] = failures
    report["seconds"] = round(time.perf_counter() - start, 1)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"{len(failures)} failing case(s){': ' + ', '.join(failures) if failures else ''}")
    return 1 if failures else 0


def _engine(device: str, dtype: str, tiny: bool) -> dict:
    """``engine_case``, its error recorded rather than raised: the other dtype still runs."""
    start, figures = time.perf_counter(), {}
    try:
        engine_case(device, DTYPES[dtype], tiny, n_new=8 if tiny else 24, figures=figures)
    except Exception as err:  # a device run is scarce: keep every other figure
        import traceback

        figures |= {"exact": False, "error": repr(err), "traceback": traceback.format_exc()}
    return figures | {"seconds": round(time.perf_counter() - start, 1)}


def _line(name: str, dtype: str, f: dict, ok: bool) -> str:
    return (
        f"{'ok  ' if ok else 'FAIL'} {name:9s} {dtype:9s} "
        f"ours {f['ours_tokens_per_s']:7.1f} tok/s  hf {f['hf_tokens_per_s']:7.1f} tok/s  "
        f"ours_vs_hf {f['ours_vs_hf']:5.2f}  greedy_equal {f['greedy_equal_hf']!s:5} "
        f"({f['greedy_tokens_equal']} tokens)  logits_diff {f['logits_max_abs_diff']:.2e}  "
        f"rows_identical {f['rows_identical']}  row_groups {f['row_groups']}"
    )


def _environment(device: str) -> dict:
    import transformers

    env = {
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
    }
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
    return env


if __name__ == "__main__":
    sys.exit(main())
