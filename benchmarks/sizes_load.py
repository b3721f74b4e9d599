"""One timed ``load_model`` in a fresh process, for ``bench_sizes``.

    python benchmarks/sizes_load.py MODEL.gguf '{"products": "int8", "cold": false}'

Prints one JSON line: ``load_s`` (the call, imports of torch and steer_widgets before it not
counted), ``first_forward_s`` (a short prompt's forward right after), ``parts_s`` (seconds
converting the metadata, packing blocks, measuring row groups, reading the cached copy,
writing it: ``close``), ``row_groups`` and
``digest`` (of that forward's logits: the same bits whichever way the model was loaded).
``cold``: the file and everything under the user cache's ``gguf`` folder dropped from the
page cache first (``posix_fadvise(DONTNEED)``, those files alone).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import steer_widgets as sw
from steer_widgets.runtime import gguf_model, invariance, load_cache, quant
from steer_widgets.runtime.paths import cache_dir


def drop_from_page_cache(path: Path) -> None:
    """The file's pages out of the page cache (clean pages: a file written and synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(module, name: str, parts: dict) -> None:
    """``module.name`` replaced by a wrapper adding its seconds to ``parts[name]``."""
    inner = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            parts[name] = parts.get(name, 0.0) + time.perf_counter() - start

    setattr(module, name, wrapper)


def main() -> None:
    path, settings = Path(sys.argv[1]), json.loads(sys.argv[2])
    if settings["cold"]:
        for f in [path, *(cache_dir() / "gguf").rglob("*")]:
            if f.is_file():
                drop_from_page_cache(f)
    parts: dict[str, float] = {}
    timed(quant, "_packed", parts)
    timed(invariance, "invariant_group_sizes", parts)
    timed(load_cache.LoadCache, "read", parts)
    timed(load_cache.LoadCache, "close", parts)
    timed(gguf_model, "_convert_metadata", parts)
    start = time.perf_counter()
    model = sw.load_model(str(path), products=settings["products"])
    load_s = time.perf_counter() - start
    ids = torch.tensor([model.tokenizer.encode("The ocean is deep and").ids])
    start = time.perf_counter()
    logits = model.runtime.forward(ids)
    first_forward_s = time.perf_counter() - start
    print(
        json.dumps(
            {
                "load_s": load_s,
                "first_forward_s": first_forward_s,
                "parts_s": {k: round(v, 3) for k, v in parts.items()},
                "row_groups": model.runtime.row_groups,
                "digest": hashlib.sha1(logits.numpy().tobytes()).hexdigest(),
            }
        )
    )


if __name__ == "__main__":
    main()
