"""Choose how ``engine.concept_features`` builds a set, on the dev half only.

For each dev concept of ``benchmarks/data/steer_concepts.json`` and each of its prompts,
greedy, 32 tokens, the keyword judge and the recommended ``prompt_multiplier``, every variant
below is one steered row of one ``engine.evaluate`` (all rows of a prompt in one batch, each
exactly its solo run), beside (b) the top ``search_features`` match and (c) the concept
vector. Prints success and fluency delta per variant and the paired difference against (b)
with a bootstrap interval over concepts. The rule for adopting a variant was written before
the first run: the highest success within 1.0 nat of fluency cost; among variants within 3
points of it, the smaller set.

    python scripts/tune_concept_features.py --out /tmp/tune.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_steer_efficacy import DATA, N_TOKENS  # noqa: E402
from stats import paired_bootstrap  # noqa: E402


def probe_set(engine, vector, source: str, n: int):
    """The plain baseline of the probe: matching-pursuit picks of one SAE, strengths by
    signed least squares, rescaled so that the set's projection on the vector is its
    strength."""
    import steer_widgets as sw

    picks = engine.decompose(vector, source, n=n)
    with engine.saes.using(source) as (sae,):
        rows = sae.W_dec.detach().float()[[m.index for m in picks]]
    v = torch.as_tensor(vector.vector, dtype=torch.float32)
    v = v / v.norm()
    coefs = torch.linalg.lstsq(rows.T, (vector.strength * v).unsqueeze(1)).solution.squeeze(1)
    along = float((coefs @ rows) @ v)
    coefs = coefs * vector.strength / along
    return [sw.Feature(source, m.index, float(c)) for m, c in zip(picks, coefs, strict=True)]


def scaled(features, factor: float):
    import steer_widgets as sw

    return [sw.Feature(f.source, f.index, f.strength * factor) for f in features]


def variants(engine, name: str) -> dict:
    """Every variant's features for concept ``name``."""
    vector = engine.concept_vector(name)
    big = "12-smollm2-res-8k"
    out = {
        "probe16": probe_set(engine, vector, big, 16),
        "nn8k16": list(engine.concept_features(name, k=16, sources=[big])),
    }
    for k in (8, 16, 32):
        out[f"nn{k}"] = list(engine.concept_features(name, k=k))
    for push in (0.75, 1.25):
        out[f"nn16x{push}"] = scaled(out["nn16"], push)
    return out


def main() -> None:
    import steer_widgets as sw

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--split", default="dev")
    a = ap.parse_args()
    data = json.loads(DATA.read_text())
    engine = sw.Engine.default()
    pm = engine.default_prompt_multiplier()
    prompts = [p["prompt"] for p in data["prompts"]]
    rows = []
    for name in data["split"][a.split]:
        forms = data["concepts"][name]
        top = engine.search_features(name, n=1)[0]
        configs = {
            "b": sw.SteerRequest("", features=[sw.Feature(top.source, top.index, top.strength)]),
            "c": sw.SteerRequest("", vectors=[engine.concept_vector(name)]),
        }
        for v, feats in variants(engine, name).items():
            configs[v] = sw.SteerRequest("", features=feats)
        configs = {k: r.with_(prompt_multiplier=pm) for k, r in configs.items()}
        ev = engine.evaluate(
            configs, prompts, strengths=(1.0,), judge=forms, progress=False,
            temperature=0.0, n_completion_tokens=N_TOKENS,
        )  # fmt: skip
        for r in ev.rows:
            rows.append(
                {"concept": name, "method": r.steering, "prompt": r.prompt_index,
                 "success": bool(r.success), "fluency_delta": r.fluency_delta}
            )  # fmt: skip
        print(name, "done", flush=True)
        a.out.write_text(json.dumps(rows))
    report(rows)


def report(rows: list[dict]) -> None:
    methods = sorted({r["method"] for r in rows})
    for m in methods:
        rs = [r for r in rows if r["method"] == m]
        succ = sum(r["success"] for r in rs) / len(rs)
        flu = sum(r["fluency_delta"] for r in rs) / len(rs)
        diff = paired_bootstrap(rows, m, "b") if m != "b" else None
        extra = f"  vs (b) {diff[0]:+.3f} [{diff[1]:+.3f}, {diff[2]:+.3f}]" if diff else ""
        print(f"{m:10s} success {succ:.3f}  fluency {flu:+.2f}  n {len(rs)}{extra}")


if __name__ == "__main__":
    main()
