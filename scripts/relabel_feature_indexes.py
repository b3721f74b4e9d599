"""Refresh the shipped feature indexes' output tokens and labels without retraining.

The first indexes read each decoder row through the unembedding alone; skipping the final
RMSNorm's weight made most features' top tokens sub-word noise. This recomputes top and
bottom tokens through the final norm and gives every feature a short label (the words it
fires on, from its stored top contexts, the most distinctive first, and the words it writes;
only words wordfreq knows as English, so code tokens and word pieces leave the label while
the raw tokens stay in the index), in place (a few seconds; wordfreq is in the dev extra)::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/relabel_feature_indexes.py
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    import steer_widgets as sw
    from steer_widgets.sae.feature_index import (
        INDEX_FILE,
        feature_label,
        final_norm_weight,
        top_output_tokens,
    )

    engine = sw.Engine.default()
    runtime = engine.model.runtime
    for source in engine.saes.sources():
        path = engine.saes.config(source).folder / INDEX_FILE
        data = json.loads(gzip.decompress(path.read_bytes()))
        with engine.saes.using(source) as (sae,):
            tokens = top_output_tokens(
                sae.W_dec, runtime.unembed_weight.T, engine.tokenizer.hf, final_norm_weight(runtime)
            )
        for f, (top, bottom) in zip(data["features"], tokens, strict=True):
            f["top_tokens"], f["bottom_tokens"] = top, bottom
            f["label"] = feature_label(f.get("contexts", ()), top)
        data["top_tokens_method"] = "W_dec[i] * final_norm.weight @ W_U (top and bottom 10)"
        data["label_method"] = "steer_widgets.sae.feature_index.feature_label"
        path.write_bytes(gzip.compress(json.dumps(data).encode(), mtime=0))
        print(source, [data["features"][i]["label"] for i in range(8)])


if __name__ == "__main__":
    main()
