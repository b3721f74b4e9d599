"""Choose ``PROMPT_MULTIPLIER`` and the strengths that go with it, on the dev half only.

The ``multiplier`` ladders of 2026-12-01 (3fea35f; ``steer_widgets/analysis/concepts.py`` cites
their figures): for each dev concept of ``benchmarks/data/steer_concepts.json`` and each
prompt, greedy, 32 tokens, the concept's request direction (``engine.concept_vector(name)``),
a vector from the model's own answers (``engine.concept_vector(engine.concepts.examples(name))``)
and the best concept-search feature over every SAE (``engine.search_features``), each at
several (strength on generated tokens, ``prompt_multiplier``) pairs, all decoded in one batch
per prompt. Prints success rate and fluency delta per configuration and prompt kind (the
steer_efficacy scoring). The report half is never read here::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/tune_prompt_multiplier.py --out /tmp/pm.json

``--ladders directions`` runs the later ladders of 2026-12-01 instead (3419e7d; see
``docs/steering-efficacy.md``): request-direction pairs that would suit one prompt kind, the
request direction read in plain-text format, and the request and answers' directions summed,
against the default.
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

# (strength on generated tokens in typical norms, prompt_multiplier) per kind of direction
MULTIPLIER = {
    "request": [(0.35, 1.0), (0.4, 1.0), (0.25, 2.0), (0.3, 2.0), (0.35, 2.0), (0.5, 0.0)],
    "answers": [(0.25, 1.0), (0.3, 1.0), (0.2, 2.0), (0.25, 2.0)],
    "feature": [(0.4, 1.0), (0.2, 2.0), (0.225, 2.0), (0.25, 2.0), (0.275, 2.0), (0.3, 2.0)],
}
DIRECTIONS = {  # the prompt's push is share * multiplier: 0.6 typical norms unless stated
    "request": [(0.3, 2.0), (0.1, 6.0), (0.2, 3.0), (0.4, 1.5), (0.4, 2.0), (0.5, 1.2)],
    "plain": [(0.3, 2.0), (0.4, 1.5), (0.5, 1.2)],
    "sum": [(0.2, 2.0), (0.225, 2.0), (0.25, 2.0), (0.275, 2.0), (0.3, 2.0)],
}
LADDERS = {"multiplier": MULTIPLIER, "directions": DIRECTIONS}


def directions(engine, name: str, kinds) -> dict:
    """Each kind's unit direction and hook for one concept."""
    from steer_widgets.analysis.concepts import example_prompts, request_baseline

    req = engine.concept_vector(name)
    out = {"request": ("vectors", req.vector, req.hook)}
    if "answers" in kinds or "sum" in kinds:
        ans = engine.concept_vector(engine.concepts.examples(name))
        out["answers"] = ("vectors", ans.vector, ans.hook)
        both = req.vector + ans.vector
        out["sum"] = ("vectors", both / both.norm(), req.hook)
    if "plain" in kinds:  # plain text has no special tokens: content rows are request rows
        plain = engine.concept_vector(
            example_prompts(name, chat=False), request_baseline(name, chat=False), req.hook
        )
        out["plain"] = ("vectors", plain.vector, req.hook)
    if "feature" in kinds:
        best = engine.search_features(name, sources=engine.saes.sources(), n=1)[0]  # all five
        out["feature"] = ("features", best, engine.saes.config(best.source).hook_name)
    return {k: out[k] for k in kinds}


def configs(engine, name: str, ladders: dict) -> dict:
    import steer_widgets as sw

    out = {}
    for kind, (field, what, hook) in directions(engine, name, list(ladders)).items():
        norm = engine.typical_norm(hook)
        for share, pm in ladders[kind]:
            s = round(share * norm, 4)
            if field == "features":
                item = sw.Feature(what.source, what.index, s)
            else:
                item = sw.Vector(what, hook, s)
            out[f"{kind} {share:g} x{pm:g}"] = {field: [item], "prompt_multiplier": pm}
    return out


def main(argv=None) -> None:
    import bench_steer_efficacy as bench

    import steer_widgets as sw

    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--limit", type=int, default=None, help="first N dev concepts")
    p.add_argument("--ladders", choices=sorted(LADDERS), default="multiplier")
    args = p.parse_args(argv)
    data = json.loads(bench.DATA.read_text())
    engine = sw.Engine.default()
    rows = json.loads(args.out.read_text()) if args.out.exists() else []
    done = {r["concept"] for r in rows}
    for name in data["split"]["dev"][: args.limit]:
        if name in done:
            continue
        forms, batch = data["concepts"][name], configs(engine, name, LADDERS[args.ladders])
        for pr in data["prompts"]:
            default = engine.generate(pr["prompt"], temperature=0.0, n_completion_tokens=32)
            d_nll = bench.mean_nll(engine, pr["prompt"], default.token_ids)
            base_hit = bench.mentions(default.text, forms)
            for key, out in bench.steered_rows(engine, pr["prompt"], batch).items():
                nll = bench.mean_nll(engine, pr["prompt"], out.token_ids)
                hit = (not base_hit) and bench.mentions(out.text, forms)
                rows.append(
                    {"concept": name, "kind": pr["kind"], "config": key, "success": hit,
                     "fluency_delta": nll - d_nll, "text": out.text}
                )  # fmt: skip
        args.out.write_text(json.dumps(rows))
        print(f"{name}: done", flush=True)
    table = defaultdict(list)
    for r in rows:
        table[r["config"]].append(r)
        table[f"{r['config']} [{r['kind']}]"].append(r)
    for key, rs in sorted(table.items()):
        succ = sum(r["success"] for r in rs) / len(rs)
        flu = sum(r["fluency_delta"] for r in rs) / len(rs)
        print(f"{key:36s} success {succ:.3f}  fluency {flu:+.2f}  n={len(rs)}")


if __name__ == "__main__":
    main()
