"""Does steering turn the text toward a concept, and does the text stay fluent?

Modelled on AxBench's steering evaluation, with a keyword judge instead of an LLM judge.
Concepts, word forms, prompts and the dev/report split are in
``benchmarks/data/steer_concepts.json`` (split drawn once, before any tuning; only the
report half's figures count). For every (concept, prompt), greedy, 32 new tokens:

* concept: one of the concept's word forms (or it with a plain inflection: -s, -es, -ing,
  -ed, -er, -ers) appears in STEERED and none in DEFAULT;
* fluency delta: mean NLL of STEERED's tokens under the unsteered model, minus DEFAULT's.

Methods: (a) ``search``: the top hit of the feature index's text search (what the picker
searched before concept search) at the picker's old default strength (the feature's max
activation, else 40, every position alike); (b) ``feature``: the top feature of
``engine.search_features`` at its recommended strength; (c) ``vector``:
``engine.concept_vector`` at its recommended strength ((b) and (c) with the engine's
recommended ``prompt_multiplier``); (d) ``prompt``: the unsteered model asked to talk about
the concept (chat: a sentence appended to the user's message; completion: a lead-in
sentence), scored against the DEFAULT of the original prompt; (e) ``concept``: the set
``engine.concept_features`` returns, each feature at its fitted strength. Success comes with
a 95% bootstrap interval over concepts, and (e) minus (b) and (e) minus (c) are paired on
the same (concept, prompt) cells (``stats.py``). (a) and (b) are reported per
SAE as well; the headline (b) is ``engine.search_features``' top match over its default
sources (the SAEs nearest the concept layer). (a)-(c) run through ``engine.evaluate`` (the
concept's word forms as judge, one strength: x1): all steered rows of one prompt decode in one
batch (each row is exactly its solo run) and fluency comes from its shadow rows.

    python benchmarks/run.py --only steer_efficacy --json out.json
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

DATA = Path(__file__).parent / "data" / "steer_concepts.json"
N_TOKENS = 32
OLD_PICKER_STRENGTH = 40.0


SUFFIXES = "(?:s|es|ing|ed|er|ers)?"  # "creatures" counts for "creature", "cooked" for "cook"


def mentions(text: str, forms: list[str]) -> bool:
    """A word form (or it with a plain inflection) as a whole word, case-insensitive."""
    return any(re.search(rf"\b{re.escape(f)}{SUFFIXES}\b", text, re.IGNORECASE) for f in forms)


def prompted(prompt, concept: str):
    """(d): the same prompt, asking the model to talk about the concept."""
    if isinstance(prompt, str):
        return f"This text is about {concept}. {prompt}"
    *rest, last = prompt
    content = f"{last['content']} Please talk about {concept}."
    return [*rest, {"role": last["role"], "content": content}]


def mean_nll(engine, prompt, ids) -> float:
    lp = engine.token_logprobs(prompt, ids)
    return float(-lp.mean()) if len(lp) else 0.0


def steered_rows(engine, prompt, configs: dict) -> dict:
    """Greedy completions of ``prompt`` under each steering config, in one batched decode."""
    import steer_widgets as sw

    requests = {
        name: sw.SteerRequest(
            prompt, types=("STEERED",), temperature=0.0, n_completion_tokens=N_TOKENS, **cfg
        )
        for name, cfg in configs.items()
    }
    return {name: r.outputs["STEERED"] for name, r in engine.steer_batch(requests).items()}


METHODS = ("search", "feature", "vector", "prompt", "concept")


def evaluate(
    engine, concepts: dict, names: list[str], prompts: list, sources: list, methods=METHODS
) -> dict:
    """Per (concept, prompt) scores of the ``methods`` asked for; returns the raw rows.

    Methods (a)-(c) are one ``engine.evaluate`` per concept at x1 with the concept's word
    forms as judge: every steered row of one prompt (each method, each SAE) decodes in one
    batch beside DEFAULT and is exactly its solo run, so a subset of methods reproduces the
    full run's figures for those methods. (d) is the prompted model's own generation."""
    rows = []
    prompts = [{**p, "index": i} for i, p in enumerate(prompts)]
    for name in names:
        forms = concepts[name]
        configs, best = steerings(engine, name, sources, methods)
        texts = [p["prompt"] for p in prompts]
        by_cell = {}
        if configs:
            ev = engine.evaluate(
                configs, texts, strengths=(1.0,), judge=forms, progress=False,
                temperature=0.0, n_completion_tokens=N_TOKENS,
            )  # fmt: skip
            by_cell = {(r.steering, r.prompt_index): r for r in ev.rows}
        for i, p in enumerate(prompts):
            for method in configs:
                r = by_cell[method, i]
                rows.append(_row(name, p, method, r.success, r.fluency_delta, r.text))
            if best is not None:
                r = by_cell[f"feature:{best}", i]
                rows.append(_row(name, p, "feature", r.success, r.fluency_delta, r.text))
            if "prompt" in methods:
                rows.append(_prompted_row(engine, name, p, forms))
        print(f"steer_efficacy: {name} done", flush=True)
        for s in sources if "search" in methods else []:  # no text-search hit: a miss
            if f"search:{s}" not in configs:
                rows += [_row(name, p, f"search:{s}", False, 0.0, "") for p in prompts]
    return {"rows": rows}


def steerings(engine, name: str, sources: list, methods) -> tuple[dict, str | None]:
    """The x1 request of every steered method for concept ``name``, and the SAE whose
    feature is ``search_features``' own top match over its default sources."""
    import steer_widgets as sw

    recommended = {"prompt_multiplier": engine.default_prompt_multiplier()}
    configs: dict = {}
    best = None
    if "vector" in methods:
        configs["vector"] = sw.SteerRequest(
            "", vectors=[engine.concept_vector(name)], **recommended
        )
    if "concept" in methods:
        configs["concept"] = sw.SteerRequest(
            "", features=engine.concept_features(name), **recommended
        )
    if "feature" in methods:
        for s in sources:
            m = engine.search_features(name, sources=[s], n=1)[0]
            configs[f"feature:{s}"] = sw.SteerRequest(
                "", features=[sw.Feature(s, m.index, m.strength)], **recommended
            )
        top = engine.search_features(name, n=1)[0]  # over its default sources
        assert configs[f"feature:{top.source}"].features[0].index == top.index
        best = top.source
    for s in sources if "search" in methods else []:
        found = engine.feature_index(s).search(name, limit=1)
        if found:
            strength = found[0].max_act or OLD_PICKER_STRENGTH
            configs[f"search:{s}"] = sw.SteerRequest(
                "", features=[sw.Feature(s, found[0].index, strength)]
            )
    return configs, best


def _row(concept: str, p: dict, method: str, success: bool, fluency: float, text: str) -> dict:
    return {
        "concept": concept,
        "prompt": p["kind"],
        "prompt_index": p["index"],
        "method": method,
        "success": bool(success),
        "fluency_delta": fluency,
        "text": text,
    }


def _prompted_row(engine, name: str, p: dict, forms: list[str]) -> dict:
    """(d): the unsteered model asked about the concept, against the original DEFAULT."""
    default = engine.generate(p["prompt"], temperature=0.0, n_completion_tokens=N_TOKENS)
    out = engine.generate(
        prompted(p["prompt"], name), temperature=0.0, n_completion_tokens=N_TOKENS
    )
    success = (not mentions(default.text, forms)) and mentions(out.text, forms)
    fluency = mean_nll(engine, p["prompt"], out.token_ids) - mean_nll(
        engine, p["prompt"], default.token_ids
    )
    return _row(name, p, "prompt", success, fluency, out.text)


def summarise(rows: list[dict]) -> dict:
    """Success rate and mean fluency delta per method; ``search`` pools all SAEs."""
    out: dict[str, dict] = {}
    methods = sorted({r["method"] for r in rows})
    pooled = {"search": [r for r in rows if r["method"].startswith("search:")]}
    for m in methods:
        pooled[m] = [r for r in rows if r["method"] == m]
    for m, rs in pooled.items():
        if rs:
            out[m] = {
                "success": sum(r["success"] for r in rs) / len(rs),
                "fluency_delta": sum(r["fluency_delta"] for r in rs) / len(rs),
                "n": len(rs),
            }
    return out


def intervals(rows: list[dict], prefix: str) -> dict:
    """Bootstrap intervals over concepts: each method's success, and (e) paired against
    (b) and (c) on the same (concept, prompt) cells."""
    from stats import paired_bootstrap, success_interval

    cells = [{**r, "prompt": r["prompt_index"]} for r in rows]
    out = {}
    present = {r["method"] for r in cells}
    for m in ("feature", "vector", "prompt", "concept"):
        if m in present:
            _, lo, hi = success_interval(cells, m)
            out[f"{prefix}{m}_success_ci95"] = [round(lo, 3), round(hi, 3)]
    for other in ("feature", "vector"):
        if {"concept", other} <= present:
            d, lo, hi = paired_bootstrap(cells, "concept", other)
            out[f"{prefix}concept_minus_{other}"] = round(d, 3)
            out[f"{prefix}concept_minus_{other}_ci95"] = [round(lo, 3), round(hi, 3)]
    return out


def run(splits=("dev", "report"), save_rows: Path | None = None, methods=METHODS) -> dict:
    import steer_widgets as sw

    data = json.loads(DATA.read_text())
    engine = sw.Engine.default()
    started = time.perf_counter()
    sources = list(engine.saes.sources())
    figures: dict = {}
    all_rows = {}
    for split in splits:
        rows = evaluate(
            engine, data["concepts"], data["split"][split], data["prompts"], sources, methods
        )
        all_rows[split] = rows["rows"]
        summary = summarise(rows["rows"])
        prefix = "" if split == "report" else "dev."
        for method in METHODS:
            if method in summary:
                figures[f"{prefix}{method}_success"] = round(summary[method]["success"], 3)
                figures[f"{prefix}{method}_fluency_delta"] = round(
                    summary[method]["fluency_delta"], 3
                )
        figures.update(intervals(rows["rows"], prefix))
        for m, s in summary.items():
            if ":" in m:
                figures[f"{prefix}per_sae.{m}.success"] = round(s["success"], 3)
                figures[f"{prefix}per_sae.{m}.fluency_delta"] = round(s["fluency_delta"], 3)
        figures[f"{prefix}n_concepts"] = len(data["split"][split])
    figures["n_prompts"] = len(data["prompts"])
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    if save_rows is not None:
        save_rows.write_text(json.dumps(all_rows, indent=1))
    return figures


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--split", nargs="+", default=["dev", "report"])
    ap.add_argument("--rows", type=Path, default=None)
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    a = ap.parse_args()
    print(json.dumps(run(tuple(a.split), a.rows, tuple(a.methods)), indent=1))
