"""The engine on a device, end to end: ``steer``, ``steer_batch`` and ``evaluate`` against
their solo runs, on a random-weight Llama-layout model with a random SAE in SAE Lens format.

Nothing here needs the shipped model, network, SAE Lens or TransformerLens: the tokenizer is
a small byte-level BPE trained here (``tests/hub_cache.py``), the model a transformers
``LlamaConfig`` at a realistic width (d_model 768, 12 layers, as ``bench_architectures``), the
SAE ``cfg.json`` + ``sae_weights.safetensors`` as SAE Lens 6 writes them. ``gpu_check.py``
runs ``engine_case`` per dtype; ``--tiny`` runs the same code in seconds on a CPU.

Figures per case: whether each output of one request (DEFAULT, STEERED, a sweep of 4) equals
the same output generated alone, the same for a ragged ``steer_batch`` of 8 requests on
different prompts (and the batch's time against the 8 solo ``steer`` calls), and for
``evaluate`` of 6 prompts x 4 strengths (every row against its solo ``steer``); then
``analysis``: every reading the explorer offers, each "ok" or its error.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from hub_cache import write_tokenizer  # noqa: E402
from test_evaluate import solo as solo_row  # noqa: E402
from test_ragged import solo  # noqa: E402

import steer_widgets as sw  # noqa: E402

PROMPTS = [
    "The",
    "The lighthouse keeper wrote",
    "My favourite food is",
    "Once upon a time, in a small village by the sea, there lived",
    "The weather today is",
    "In the beginning the ships",
    " ".join(["The keeper of the lighthouse wrote down the ships."] * 6),
    "I think that",
]


def build(folder: Path, tiny: bool) -> tuple[Path, Path]:
    """A random Llama-layout model folder and a random standard SAE at its middle layer."""
    import transformers as tf
    from safetensors.torch import save_file

    model = folder / "model"
    vocab = write_tokenizer(model, "llama3")
    d, layers, mlp, heads, kv = (64, 2, 128, 4, 2) if tiny else (768, 12, 2048, 12, 4)
    config = tf.LlamaConfig(
        hidden_size=d, num_hidden_layers=layers, intermediate_size=mlp,
        num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
        initializer_range=0.1, bos_token_id=0, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(model)
    sae = folder / "sae"
    sae.mkdir()
    d_sae = 256 if tiny else 4096
    g = torch.Generator().manual_seed(1)
    w_dec = torch.randn(d_sae, d, generator=g)
    w_dec /= w_dec.norm(dim=1, keepdim=True)
    weights = {
        "W_enc": w_dec.T.contiguous(),
        "b_enc": torch.randn(d_sae, generator=g) * 0.1,
        "W_dec": w_dec,
        "b_dec": torch.zeros(d),
    }
    save_file(weights, sae / "sae_weights.safetensors")
    hook = f"blocks.{layers // 2}.hook_resid_post"
    meta = {"model_name": "random-llama", "hook_name": hook, "sae_lens_version": "6.54.12"}
    cfg = {"architecture": "standard", "d_in": d, "d_sae": d_sae, "dtype": "float32"}
    (sae / "cfg.json").write_text(json.dumps(cfg | {"metadata": meta}))
    return model, sae


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _same(a: sw.Completion, b: sw.Completion) -> bool:
    """Tokens, stop and every token probability, bit for bit."""
    return a == b and a.token_probs == b.token_probs


def _where(a: sw.Completion, b: sw.Completion) -> str:
    """Where two completions part: the first token that differs, or the first probability."""
    pairs = enumerate(zip(a.token_ids, b.token_ids, strict=False))
    n = next((i for i, (x, y) in pairs if x != y), None)
    if n is not None or len(a.token_ids) != len(b.token_ids):
        return f"token {n if n is not None else min(len(a.token_ids), len(b.token_ids))}"
    probs = zip(a.token_probs or (), b.token_probs or (), strict=False)
    return f"probability {next((i for i, (x, y) in enumerate(probs) if x != y), None)}"


def engine_case(
    device: str, dtype: torch.dtype, tiny: bool, n_new: int = 24, figures: dict | None = None
) -> dict:
    """One dtype's figures (see the module docstring), filled into ``figures`` as they come:
    a failure part way keeps the figures before it."""
    figures = {} if figures is None else figures
    with tempfile.TemporaryDirectory() as tmp:
        model, sae = build(Path(tmp), tiny)
        engine = sw.Engine(model=str(model), saes={"sae": str(sae)}, device=device, dtype=dtype)
        feature = sw.Feature("sae", 7, 6.0 if tiny else 300.0)  # residual norms: ~10, ~1800
        figures["row_groups"] = dict(getattr(engine.model.runtime, "row_groups", {}))
        figures.update(_one_request(engine, feature, n_new))
        figures.update(_ragged_batch(engine, feature, n_new, device))
        figures.update(_evaluate(engine, feature, n_new))
        figures["analysis"] = analysis(engine, feature, n_new)
    failed = [name for name, r in figures["analysis"].items() if r != "ok"]
    exact = all(figures[k] for k in ("steer_exact", "batch_exact", "evaluate_exact"))
    figures["exact"] = exact and not failed
    return figures


def analysis(engine: sw.Engine, feature: sw.Feature, n_new: int) -> dict[str, str]:
    """Every reading the explorer offers, on this device: "ok" or the error, each call on
    its own (one device run finds every misplaced tensor, not the first)."""
    prompt, hook = PROMPTS[2], feature_hook(engine, feature)
    result = engine.steer(
        sw.SteerRequest(prompt, features=[feature], n_completion_tokens=n_new, temperature=0.0)
    )
    completion = result.outputs["STEERED"]
    when = sw.When(sw.Feature(feature.source, feature.index), above=0.0)
    calls = {
        "token_logprobs": lambda: engine.token_logprobs(prompt, completion),
        "feature_values": lambda: engine.feature_values(engine.text(prompt), feature.source),
        "activations": lambda: engine.activations(prompt, feature.source, feature.index),
        "top_features": lambda: engine.top_features(prompt, feature.source, n=5),
        "top_features_per_token": lambda: engine.top_features_per_token(prompt, feature.source),
        "neighbours": lambda: engine.neighbours(feature.source, feature.index),
        "concept_vector": lambda: engine.concept_vector(["ships", "the sea"], ["food"], hook),
        "decompose": lambda: engine.decompose(
            engine.vectors(sw.SteerRequest(prompt, features=[feature]))[0], feature.source
        ),
        "conditional_steer": lambda: engine.steer(
            sw.SteerRequest(prompt, features=[feature], when=when, n_completion_tokens=n_new)
        ),
        "condition_scores": lambda: engine.condition_scores(when, prompt, completion),
        "steering_effect": lambda: engine.steering_effect(result),
        "attribute": lambda: engine.attribute(result, position=1, n=3),
        "steering_features": lambda: engine.steering_features(result, feature.source, n=5),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "ok"
        except Exception as err:  # recorded: the next call still runs
            out[name] = f"{type(err).__name__}: {err}"[:500]
    return out


def feature_hook(engine: sw.Engine, feature: sw.Feature) -> str:
    return engine.saes.config(feature.source).hook_name


def _one_request(engine: sw.Engine, feature: sw.Feature, n_new: int) -> dict:
    req = sw.SteerRequest(
        PROMPTS[1], features=[feature], sweep=(-1.0, 0.5, 2.0, 3.0),
        n_completion_tokens=n_new, temperature=0.8, seed=3,
    )  # fmt: skip
    engine.clear_caches()
    together = engine.steer(req).outputs
    alone = solo(engine, req)
    differ = {k: _where(together[k], alone[k]) for k in alone if not _same(together[k], alone[k])}
    return {
        "steer_outputs": len(together),
        "steer_exact": set(together) == set(alone) and not differ,
        "steer_differs": differ,
        "steered_differs": together["STEERED"] != together["DEFAULT"],
    }


def _ragged_batch(engine: sw.Engine, feature: sw.Feature, n_new: int, device: str) -> dict:
    requests = {
        f"r{i}": sw.SteerRequest(
            p,
            features=[sw.Feature(feature.source, feature.index, feature.strength * (1 + i % 3))],
            n_completion_tokens=n_new - 2 * (i % 4),
            temperature=0.0 if i % 2 else 0.9,
            seed=i,
            types=("STEERED",),
        )  # fmt: skip
        for i, p in enumerate(PROMPTS)
    }
    engine.steer_batch(requests)  # warm-up: both timings below start warm
    _sync(device)
    start = time.perf_counter()
    together = engine.steer_batch(requests)
    _sync(device)
    batch_s = time.perf_counter() - start
    alone, solo_s = {}, 0.0
    for name, req in requests.items():
        start = time.perf_counter()
        alone[name] = engine.steer(req).outputs["STEERED"]
        _sync(device)
        solo_s += time.perf_counter() - start
    differ = {
        n: _where(together[n].outputs["STEERED"], alone[n])
        for n in requests
        if not _same(together[n].outputs["STEERED"], alone[n])
    }
    return {
        "batch_requests": len(requests),
        "batch_exact": not differ,
        "batch_differs": differ,  # request -> where it parts from its solo run
        "batch_s": round(batch_s, 3),
        "solo_s": round(solo_s, 3),
        "batch_vs_solo": round(batch_s / solo_s, 3),
    }


def _evaluate(engine: sw.Engine, feature: sw.Feature, n_new: int) -> dict:
    ev = engine.evaluate(
        feature, prompts=PROMPTS[:6], strengths=[0.0, 1.0, 2.0, 3.0],
        judge=lambda text: "the" in text, progress=False, n_completion_tokens=n_new,
    )  # fmt: skip
    exact = ev.complete and len(ev.rows) == 6 * 4
    for row in ev.rows:
        alone = solo_row(engine, ev, row)
        exact = exact and alone.token_ids == row.token_ids and alone.text == row.text
    return {"evaluate_rows": len(ev.rows), "evaluate_exact": bool(exact)}
