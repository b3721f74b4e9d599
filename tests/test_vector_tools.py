"""Vectors against the tools that made them: repeng 0.4.0 and steering-vectors 0.12.2 on a
tiny random-weight Llama (transformers), and our engine on the same weights.

Parity: the logits of a tool's own hooks applying a vector in transformers equal our
engine's logits steering with ``load_vectors`` of that vector (or of the file the tool
exported) to ``TOL``, and the greedy tokens are equal. Round trips are exact. repeng runs in
a subprocess (``repeng_run.py``): it needs a numpy alias that must not reach other tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers as tf

import steer_widgets as sw
from steer_widgets.runtime.model import default_model_dir, load_model

steering_vectors = pytest.importorskip("steering_vectors")

TOL = 1e-4  # float32 logits of two implementations of one forward (measured: ~1e-6)
N = 8  # greedy tokens compared
PROMPT = "The quick brown fox jumps over the lazy dog because"
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4)
LAYERS = (1, 2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, transformers model, our engine on the same weights, prompt ids)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = tf.AutoTokenizer.from_pretrained(default_model_dir())
    config = tf.LlamaConfig(**SIZES, num_key_value_heads=2, vocab_size=len(tokenizer))
    config.initializer_range = 0.1
    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    engine = sw.Engine(load_model(str(folder)), saes=[])
    ids = engine.plan(request([]))[0].ids
    return folder, hf, engine, list(ids)


def directions() -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {k: 2.0 * torch.randn(SIZES["hidden_size"], generator=g) for k in LAYERS}


def request(vectors) -> sw.SteerRequest:
    types = ("STEERED",) if vectors else ("DEFAULT",)
    return sw.SteerRequest(
        PROMPT, vectors=vectors, types=types, temperature=0.0, freq_penalty=0.0,
        n_completion_tokens=N,
    )  # fmt: skip


def ours(engine, vectors) -> tuple[torch.Tensor, list[int]]:
    """Our engine's prompt logits and greedy tokens, steered with ``vectors``."""
    req = request(vectors)
    prompt, plan = engine.plan(req)
    logits = engine.model.runtime.forward(torch.tensor([prompt.ids]), hooks=plan.rows[0].ops)
    label = plan.labels[0]
    return logits[0], list(engine.steer(req).outputs[label].token_ids)


def hf_greedy(hf, ids) -> tuple[torch.Tensor, list[int]]:
    t = torch.tensor([ids])
    with torch.no_grad():
        logits = hf(t).logits[0]
        out = hf.generate(
            t, attention_mask=torch.ones_like(t), max_new_tokens=N, do_sample=False, pad_token_id=0
        )[0, len(ids) :]
    return logits, out.tolist()


def record(name: str, diff: float) -> None:
    """Parity figures for docs/vectors.md, where SW_VECTOR_PARITY names a file."""
    if os.environ.get("SW_VECTOR_PARITY"):
        with open(os.environ["SW_VECTOR_PARITY"], "a") as f:
            f.write(f"{name}\t{diff:.3g}\n")


@pytest.mark.parametrize("layer_type", ["decoder_block", "self_attn", "mlp"])
def test_steering_vectors_apply_equals_our_engine(tiny, layer_type):
    _, hf, engine, ids = tiny
    sv = steering_vectors.SteeringVector(directions(), layer_type)
    with sv.apply(hf):
        ref_logits, ref_tokens = hf_greedy(hf, ids)
    loaded = sw.load_vectors(sv, model=engine)
    logits, tokens = ours(engine, loaded)
    diff = float((logits - ref_logits).abs().max())
    record(f"steering-vectors {layer_type}", diff)
    assert diff < TOL
    assert tokens == ref_tokens and len(tokens) == N
    plain, _ = ours(engine, [])
    assert float((plain - logits).abs().max()) > 100 * TOL  # the vector did steer


def test_steering_vectors_round_trip_exactly(tiny):
    *_, engine, _ = tiny
    for layer_type in ("decoder_block", "self_attn", "mlp"):
        sv = steering_vectors.SteeringVector(directions(), layer_type)
        back = sw.to_steering_vector(sw.load_vectors(sv, model=engine))
        assert isinstance(back, steering_vectors.SteeringVector)
        assert back.layer_type == layer_type
        assert back.layer_activations.keys() == sv.layer_activations.keys()
        for k, v in sv.layer_activations.items():
            assert torch.equal(back.layer_activations[k], v)


def test_our_vectors_steer_transformers_through_steering_vectors(tiny):
    _, hf, engine, ids = tiny
    mine = [
        sw.Vector(directions()[1], "blocks.2.hook_resid_pre", 1.5),  # = block 1's output
        sw.Vector(directions()[2], "blocks.2.hook_resid_post", -0.75),
    ]
    with sw.to_steering_vector(mine).apply(hf):
        ref_logits, ref_tokens = hf_greedy(hf, ids)
    logits, tokens = ours(engine, mine)
    assert float((logits - ref_logits).abs().max()) < TOL
    assert tokens == ref_tokens


def run_repeng(tmp_path: Path, folder: Path, ids, import_from: Path) -> dict:
    torch.save(directions(), tmp_path / "directions.pt")
    spec = {
        "folder": str(folder), "ids": ids, "n": N, "coeff": 1.0,
        "directions": str(tmp_path / "directions.pt"), "export_to": str(tmp_path / "repeng.gguf"),
        "import_from": str(import_from), "out": str(tmp_path / "out.pt"),
    }  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    script = Path(__file__).with_name("repeng_run.py")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "spec.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(tmp_path / "out.pt")


@pytest.mark.skipif(importlib.util.find_spec("repeng") is None, reason="repeng not installed")
def test_repeng_both_ways(tiny, tmp_path):
    folder, _, engine, ids = tiny
    mine = [
        sw.Vector(directions()[1], "blocks.1.hook_resid_post", 3.0),
        sw.Vector(directions()[2], "blocks.3.hook_resid_pre", -1.25),  # = block 2's output
    ]
    ours_file = sw.save_vectors(mine, tmp_path / "ours.gguf", model=engine)
    got = run_repeng(tmp_path, folder, ids, ours_file)
    # ours -> repeng import_gguf -> ours: the same directions, exactly
    assert got["model_hint"] == "llama"
    assert sorted(got["imported"]) == [1, 2]
    assert torch.equal(got["imported"][1], 3.0 * directions()[1])
    assert torch.equal(got["imported"][2], -1.25 * directions()[2])
    imported = SimpleNamespace(model_type=got["model_hint"], directions=got["imported"])
    again = sw.load_vectors(imported, model=engine)
    assert [v.hook for v in again] == ["blocks.1.hook_resid_post", "blocks.2.hook_resid_post"]
    for v, want in zip(again, mine, strict=True):
        assert torch.equal(float(v.strength) * v.vector, float(want.strength) * want.vector)
    # a file repeng wrote (export_gguf) steers our engine as ControlModel steers transformers
    theirs = sw.load_vectors(tmp_path / "repeng.gguf", model=engine)
    assert [v.hook for v in theirs] == ["blocks.1.hook_resid_post", "blocks.2.hook_resid_post"]
    logits, tokens = ours(engine, theirs)
    diff = float((logits - got["logits"]).abs().max())
    record("repeng ControlModel", diff)
    assert diff < TOL
    assert tokens == got["tokens"] and len(tokens) == N
    # and the hand-built vectors steer token for token as the loaded ones
    by_hand = [sw.Vector(d, f"blocks.{k}.hook_resid_post") for k, d in directions().items()]
    assert ours(engine, by_hand)[1] == tokens


def test_our_gguf_reads_back_with_the_gguf_reader(tiny, tmp_path):
    from gguf import GGUFReader

    *_, engine, _ = tiny
    mine = [sw.Vector(directions()[1], "blocks.1.hook_resid_post", 3.0)]
    path = sw.save_vectors(mine, tmp_path / "v.gguf", model=engine)
    (t,) = GGUFReader(path).tensors
    assert t.name == "direction.1" and np.array_equal(t.data, (3.0 * directions()[1]).numpy())
    (back,) = sw.load_vectors(path, model=engine)
    assert torch.equal(float(back.strength) * back.vector, 3.0 * directions()[1])


def test_a_vector_for_another_model_is_a_named_error(tiny, tmp_path):
    *_, engine, _ = tiny
    wide = [sw.Vector(torch.ones(32), "blocks.1.hook_resid_post")]
    path = sw.save_vectors(wide, tmp_path / "wide.gguf", model="llama")
    with pytest.raises(sw.VectorModelMismatch, match="32 wide.*64") as err:
        sw.load_vectors(path, model=engine)
    assert err.value.source == str(path)
    with pytest.raises(sw.VectorModelMismatch, match="32 wide"):  # checked before writing
        sw.save_vectors(wide, tmp_path / "not.gguf", model=engine)
    assert not (tmp_path / "not.gguf").exists()
    deep = sw.save_vectors(
        [sw.Vector(torch.ones(64), "blocks.9.hook_resid_post")], tmp_path / "d.gguf"
    )
    with pytest.raises(sw.VectorModelMismatch, match="4 layers"):
        sw.load_vectors(deep, model=engine)
    other = sw.save_vectors([sw.Vector(torch.ones(64), "blocks.1.hook_resid_post")], tmp_path / "g.gguf", model="gpt2")  # fmt: skip
    with pytest.raises(sw.VectorModelMismatch, match="'gpt2'.*'llama'"):
        sw.load_vectors(other, model=engine)
    # repeng writes a Mistral model's own model_type; llama.cpp converts Mistral as "llama"
    mistral = sw.save_vectors([sw.Vector(torch.ones(64), "blocks.1.hook_resid_post")], tmp_path / "m.gguf", model="mistral")  # fmt: skip
    assert len(sw.load_vectors(mistral, model=engine)) == 1
    # a Neuronpedia modelId: ours names this model (its folder), another model's is refused
    one = [sw.Vector(torch.ones(64), "blocks.1.hook_resid_post")]
    mine = sw.save_vectors(one, tmp_path / "n.json", format="neuronpedia", model=engine)
    assert len(sw.load_vectors(mine, model=engine)) == 1
    theirs = {**json.loads(mine.read_text()), "modelId": "gemma-2-2b"}
    with pytest.raises(sw.VectorModelMismatch, match="'gemma-2-2b'"):
        sw.load_vectors(theirs, model=engine)


def test_engine_vectors_steer_as_the_request(tiny, tmp_path):
    *_, engine, _ = tiny
    v = sw.Vector(directions()[1], "blocks.1.hook_resid_post", 3.0)
    req = request([v]).with_(strength_multiplier=2.5, normalize_steering=True, sweep=(7.0,))
    plain = engine.vectors(req)
    assert plain[0].strength == 7.5
    assert torch.equal(plain[0].vector, directions()[1] / directions()[1].norm())
    want = engine.steer(req).outputs["STEERED"].token_ids
    assert ours(engine, plain)[1] == list(want)
    back = sw.load_vectors(sw.save_vectors(plain, tmp_path / "r.gguf", model=engine), model=engine)
    assert ours(engine, back)[1] == list(want)
    with pytest.raises(sw.VectorUnsupported, match="steer_method"):
        engine.vectors(req.with_(steer_method="PROJECTION_CAP"))
    with pytest.warns(sw.VectorWarning, match="prompt_multiplier=2.0"):
        sw.save_vectors(engine.vectors(req.with_(prompt_multiplier=2.0)), tmp_path / "p.gguf")
