"""The one entry point for all benchmarks.

    python benchmarks/run.py [--only NAME ...] [--json PATH]

Each benchmark is a module ``benchmarks/bench_<name>.py`` with ``run() -> dict`` returning
its figures; they are printed as a table and written under the key ``<name>`` in the JSON.
Speed is reported as ratios measured in the same run, never as absolute pass/fail times.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def available() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=available(), help="benchmarks to run")
    parser.add_argument("--json", type=Path, help="write figures here")
    args = parser.parse_args(argv)
    results = {}
    for name in args.only or available():
        start = time.perf_counter()
        figures = importlib.import_module(f"bench_{name}").run()
        figures["bench_seconds"] = round(time.perf_counter() - start, 1)
        results[name] = figures
        print(f"\n== {name}")
        for key, value in _flat(figures, name):
            shown = f"{value:.4g}" if isinstance(value, float) else value
            print(f"  {key:<40} {shown}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return results


def _flat(figures: dict, prefix: str):
    """``(dotted key, value)`` pairs; nested dicts (one per architecture, say) flattened."""
    for key, value in figures.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}.{key}")
        else:
            yield f"{prefix}.{key}", value


if __name__ == "__main__":
    main()
