"""What every phase shares: paths, names, logging, and the phase timings kept across resumed
runs."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
D_MODEL = 576


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def source_name(layer: int, d_sae: int = 4096, variant: str = "") -> str:
    """``12-smollm2-res-8k``; a ``variant`` tells apart SAEs of one layer and width trained on
    other data (``12-smollm2-chat-res-8k``)."""
    return f"{layer}-smollm2-{variant + '-' if variant else ''}res-{d_sae // 1024}k"


def sae_name(args, layer: int) -> str:
    return source_name(layer, args.d_sae, args.variant)


def hook_name(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_post"


class Timings:
    """Seconds per phase, accumulated across resumed runs (``timings.json``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}

    def add(self, key: str, seconds: float) -> None:
        self.data[key] = round(self.data.get(key, 0.0) + seconds, 1)
        self.path.write_text(json.dumps(self.data, indent=1))

    def set(self, key: str, seconds: float) -> None:
        self.data[key] = round(seconds, 1)
        self.path.write_text(json.dumps(self.data, indent=1))
