"""The concept heatmap's values: where a text carries a concept, read as each token's
residual projected on the concept vector's direction. It reads the unsteered model over any
text (one cached residual read, no gradients).
"""

from __future__ import annotations

import torch

from ..errors import RequestError
from .activations import residuals


def projection(engine, prompt, completion, vector) -> tuple:
    """Per token of ``prompt`` (+ ``completion``), the residual at ``vector.hook`` projected
    on the vector's unit direction (what a concept heatmap shows; BOS zeroed): ``(Text,
    values)``. Difference-in-means directions are good concept detectors (AxBench)."""
    direction = torch.as_tensor(vector.vector, dtype=torch.float32).flatten()
    norm = direction.norm()
    if not torch.isfinite(norm) or norm == 0:
        raise RequestError("vector", "has zero or non-finite norm: no direction to project on")
    text = engine.text(prompt, completion)
    runtime = engine.model.runtime
    resid = residuals(runtime, engine.residual_cache, text.ids, [vector.hook])[vector.hook]
    values = resid @ (direction / norm)
    if text.ids and text.ids[0] == engine.tokenizer.bos_id:
        values[0] = 0.0
    return text, [float(v) for v in values]
