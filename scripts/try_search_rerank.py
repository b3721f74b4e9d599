"""Concept search re-ranked by a short evaluation, against cosine order (docs/steering-efficacy.md).

The top 5 cosine matches of ``search_features`` are re-ordered by successes over 2 chat + 2
completion prompts of the evaluation panel (not the benchmark's), x1, judge = the concept
word; ties keep cosine order. Both tops are then scored on the benchmark's prompts.

    python scripts/try_search_rerank.py dev|report
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_steer_efficacy as bench

import steer_widgets as sw
from steer_widgets.analysis.evaluator import panel

split = sys.argv[1]
e = sw.Engine.default()
data = json.loads(bench.DATA.read_text())
names = data["split"][split]
chats = [p for p in panel() if not isinstance(p, str)][:2]
texts = [p for p in panel() if isinstance(p, str)][:2]
short = chats + texts
bprompts = [p["prompt"] for p in data["prompts"]]
out = {"base": [], "rerank": []}
t0 = time.time()
for name in names:
    cands = e.search_features(name, n=5)
    ev = e.evaluate(
        {f"{c.source}#{c.index}": c for c in cands},
        short,
        strengths=(1.0,),
        judge=[name],
        progress=False,
    )
    wins = {k: sum(r.success for r in ev.rows if r.steering == k) for k in ev.steerings}
    order = sorted(
        range(len(cands)), key=lambda i: (-wins[f"{cands[i].source}#{cands[i].index}"], i)
    )
    top = {"base": cands[0], "rerank": cands[order[0]]}
    res = e.evaluate(
        {k: m for k, m in top.items()},
        bprompts,
        strengths=(1.0,),
        judge=data["concepts"][name],
        progress=False,
    )
    for k in top:
        rows = [r for r in res.rows if r.steering == k]
        out[k] += [(name, r.success, r.fluency_delta) for r in rows]
    print(
        name,
        wins,
        "base",
        cands[0].source,
        cands[0].index,
        "rerank",
        top["rerank"].source,
        top["rerank"].index,
        flush=True,
    )
for k, rows in out.items():
    n = len(rows)
    print(
        k,
        "success %.1f%%" % (100 * sum(r[1] for r in rows) / n),
        "fluency %+.3f" % (sum(r[2] for r in rows) / n),
        "n",
        n,
    )
print("seconds", round(time.time() - t0))
