"""What the steering changed over a whole completion: the SAE features whose mean activation
moved most between DEFAULT's completion and a steered one.

Three means per feature, so a change can be told apart from a change of text: DEFAULT's
completion read by the unsteered model, the steered completion read by the unsteered model,
and the steered completion as the steered model saw it (one forward with the row's
steering, cached by the steering it had: ``cases.steering_key``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..runtime.protocol import hook_layer
from .cases import Case, steering_key
from .engine_view import EngineView
from .explanations import ChangedFeature, ChangedFeatures, feature_label


def changed_features(
    engine: EngineView,
    cached: Callable[[tuple, Callable[[], object]], object],
    case: Case,
    default: Case,
    source: str,
    n: int,
) -> ChangedFeatures:
    """The ``n`` features of ``source`` whose mean activation over the completion moved most
    between ``default`` and ``case``: the work of ``Explainer.changed_features`` once its
    arguments are checked; ``cached`` keeps the steered read (``Explainer.cached``)."""
    cfg = engine.saes.config(source)
    prompt = case.result.request.prompt
    d_text = engine.text(prompt, default.completion)
    s_text = engine.text(prompt, case.completion)
    span_d = slice(default.n_prompt, len(d_text.ids))
    span_s = slice(case.n_prompt, len(s_text.ids))
    mean_d = _mean(engine.feature_values(d_text, source), span_d)
    mean_s_text = _mean(engine.feature_values(s_text, source), span_s)
    steered_acts = cached(
        ("seen", case.ids, case.label, steering_key(case.result), source),
        lambda: _steered_features(engine, case, source, cfg.hook_name),
    )
    mean_s = _mean(steered_acts, span_s)
    change = mean_s - mean_d
    top = change.abs().topk(min(n, change.numel()))
    rows = tuple(
        ChangedFeature(i, feature_label(engine, source, i), float(mean_d[i]), float(mean_s_text[i]),
                       float(mean_s[i]))
        for i in top.indices.tolist()
    )  # fmt: skip
    return ChangedFeatures(case.label, source, rows)


def _mean(acts: Tensor, span: slice) -> Tensor:
    part = acts[span]
    return part.mean(0) if part.shape[0] else torch.zeros(acts.shape[1])


def _steered_features(engine, case: Case, source: str, hook: str) -> Tensor:
    """All features of ``source`` over the steered text as the steered model saw it."""
    runtime = engine.model.runtime
    ops = case.ops(case.directions)
    got: dict[str, Tensor] = {}
    steer = ops.get(hook)

    def grab(x: Tensor, start: int) -> Tensor:
        out = steer(x, start) if steer is not None else x
        got["x"] = out[0].reshape(out.shape[1], -1).float().cpu()
        return out

    tokens = torch.tensor([list(case.ids)], device=runtime.device)
    with engine.decoder.lock, torch.no_grad():
        runtime.forward(tokens, hooks={**ops, hook: grab}, stop_at_layer=hook_layer(hook) + 1)
    with engine.saes.using(source) as (sae,):
        acts = sae.encode(got["x"])
    if case.ids and case.ids[0] == engine.tokenizer.bos_id:
        acts[0] = 0
    return acts
