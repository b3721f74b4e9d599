"""Choose the concept layer and the recommended strengths on the dev half only.

For each dev concept of ``benchmarks/data/steer_concepts.json`` and each prompt, greedy, 32
tokens: concept vectors at several layers and strengths, and the top concept-search feature
of each SAE at several strengths, all decoded in one batch per prompt. Prints success rate
and fluency delta (the steer_efficacy scoring) per configuration; the constants in
``steer_widgets/analysis/concepts.py`` come from this table. The report half is never read here.
``--negatives neutral`` contrasts with the topic-free neutral set (the first baseline) instead
of the contrast set::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/tune_steering.py --out /tmp/tune.json --limit 12
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

LAYERS = (9, 10, 12, 14)
VECTOR_MULTS = (0.25, 0.3, 0.35, 0.4)
FEATURE_MULTS = (0.25, 0.5)


def main(argv=None) -> None:
    import bench_steer_efficacy as bench

    import steer_widgets as sw
    from steer_widgets.analysis.concepts import baseline, neutral_examples

    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--limit", type=int, default=None, help="first N dev concepts")
    p.add_argument("--negatives", choices=("contrast", "neutral"), default="contrast")
    args = p.parse_args(argv)
    data = json.loads(bench.DATA.read_text())
    names = data["split"]["dev"][: args.limit]
    engine = sw.Engine.default()
    sources = list(engine.saes.sources())
    rows = json.loads(args.out.read_text()) if args.out.exists() else []
    done = {r["concept"] for r in rows}
    for name in names:
        if name in done:
            continue
        forms = data["concepts"][name]
        hooks = [f"blocks.{x}.hook_resid_post" for x in LAYERS]
        hooks += [engine.saes.config(s).hook_name for s in sources]
        engine.concepts.means(engine.concepts.examples(name), hooks)  # one pass for all hooks
        negatives = baseline(name) if args.negatives == "contrast" else list(neutral_examples())
        engine.concepts.means(negatives, hooks)
        reqs = {}
        for layer in LAYERS:
            hook = f"blocks.{layer}.hook_resid_post"
            vec = engine.concept_vector(name, negatives, hook=hook)
            norm = engine.typical_norm(hook)
            reqs[f"vector:L{layer}"] = {
                "vectors": [sw.Vector(vec.vector, hook, norm)],
                "mults": VECTOR_MULTS,
            }
        for s in sources:
            m = engine.search_features(name, sources=[s], n=1)[0]  # contrast set only
            norm = engine.typical_norm(engine.saes.config(s).hook_name)
            reqs[f"feature:{s}"] = {
                "features": [sw.Feature(s, m.index, norm)],
                "cos": m.score,
                "mults": FEATURE_MULTS,
            }
        for pr in data["prompts"]:
            default = engine.generate(pr["prompt"], temperature=0.0, n_completion_tokens=32)
            d_nll = bench.mean_nll(engine, pr["prompt"], default.token_ids)
            base_hit = bench.mentions(default.text, forms)
            batch = {}
            for key, cfg in reqs.items():
                mults = cfg["mults"]
                cfg = {k: v for k, v in cfg.items() if k not in ("cos", "mults")}
                batch[key] = sw.SteerRequest(
                    pr["prompt"],
                    types=("STEERED",),
                    strength_multiplier=mults[0],
                    sweep=mults[1:],
                    temperature=0.0,
                    n_completion_tokens=32,
                    **cfg,
                )
            results = engine.steer_batch(batch)
            for key, res in results.items():
                for label, out in res.outputs.items():
                    rows.append(
                        {
                            "concept": name,
                            "prompt": pr["kind"],
                            "config": key,
                            "mult": res.request.strength_multiplier
                            if label == "STEERED"
                            else float(label.split("*")[1]),
                            "cos": reqs[key].get("cos"),
                            "success": (not base_hit) and bench.mentions(out.text, forms),
                            "fluency_delta": bench.mean_nll(engine, pr["prompt"], out.token_ids)
                            - d_nll,
                            "text": out.text,
                        }
                    )
        args.out.write_text(json.dumps(rows))
        print(f"{name}: done", flush=True)
    table = defaultdict(list)
    for r in rows:
        table[(r["config"], r["mult"])].append(r)
    for (cfg, mult), rs in sorted(table.items()):
        succ = sum(r["success"] for r in rs) / len(rs)
        flu = sum(r["fluency_delta"] for r in rs) / len(rs)
        print(f"{cfg:28s} x{mult:<4g} success {succ:.2f}  fluency {flu:+.2f}  n={len(rs)}")


if __name__ == "__main__":
    main()
