"""repeng 0.4.0 in a process of its own, for tests/test_vector_tools.py.

    python tests/repeng_run.py SPEC.json

SPEC: ``folder`` (a transformers model), ``ids`` (prompt token ids), ``n`` (greedy tokens),
``directions`` (a .pt of {layer: tensor}), ``coeff``, ``export_to`` (where repeng's
``export_gguf`` writes those directions), ``import_from`` (a .gguf for repeng's
``import_gguf``) and ``out`` (a .pt for the results: logits and greedy tokens under
``ControlModel.set_control``, and the directions and model hint repeng imported).
"""

from __future__ import annotations

import json
import sys

import numpy as np

# repeng 0.4.0 names ``np.float_`` in its annotations, which numpy 2 removed, so it fails at
# import. The alias exists only in this process: no other test sees a patched numpy.
np.float_ = np.float64

import torch  # noqa: E402
from repeng import ControlModel, ControlVector  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def main(spec: dict) -> None:
    hf = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=torch.float32).eval()
    directions = {int(k): v.numpy() for k, v in torch.load(spec["directions"]).items()}
    vector = ControlVector(model_type=hf.config.model_type, directions=directions)
    vector.export_gguf(spec["export_to"])
    imported = ControlVector.import_gguf(spec["import_from"])
    model = ControlModel(hf, sorted(directions))
    model.set_control(vector, spec["coeff"])
    ids = torch.tensor([spec["ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0]
        tokens = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=spec["n"],
            do_sample=False,
            pad_token_id=0,
        )[0, ids.shape[1] :]
    torch.save(
        {
            "logits": logits,
            "tokens": tokens.tolist(),
            "imported": {k: torch.from_numpy(np.array(v)) for k, v in imported.directions.items()},
            "model_hint": imported.model_type,
        },
        spec["out"],
    )


if __name__ == "__main__":
    main(json.loads(open(sys.argv[1]).read()))
