"""SAEs see at their hook what they would see under TransformerLens with their settings.

SAE Lens trains on ``HookedTransformer.from_pretrained_no_processing(model,
**model_from_pretrained_kwargs)``. A tiny random GPT-2-style model (LayerNorm, learned
positions, every bias random) is built twice offline: raw, and processed the way SAE Lens
loads it for ``gpt2-small-res-jb`` (``center_writing_weights=True``). Our store reads the raw
model through our TransformerLens runtime and must give each SAE the processed model's hook
values, so its features equal SAE Lens' on the processed model. An RMSNorm model, where
TransformerLens does not centre, must be left alone.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import steer_widgets as sw
from steer_widgets.analysis.activations import ResidualCache, residuals
from steer_widgets.runtime.tl_runtime import TransformerLensRuntime
from steer_widgets.sae.hook_view import HookView, centres_writes
from steer_widgets.sae.store import SAEStore
from steer_widgets.steering.requests import METHODS, Direction, row_op

D_MODEL, N_HEADS, D_SAE = 32, 4, 96
HOOKS = [
    "blocks.0.hook_resid_pre",
    "blocks.1.hook_resid_mid",
    "blocks.1.hook_resid_post",
    "blocks.1.hook_attn_out",
    "blocks.0.hook_mlp_out",
    "blocks.1.attn.hook_z",
]
CENTRED = {"center_writing_weights": True}
TOKENS = [[3, 17, 5, 42, 8, 8, 29, 1, 11]]


def tiny_pair(normalization_type: str):
    """The same random weights, raw and processed with ``center_writing_weights``."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, d_model=D_MODEL, d_head=D_MODEL // N_HEADS, n_heads=N_HEADS, d_mlp=64,
        d_vocab=50, n_ctx=16, act_fn="gelu_new", normalization_type=normalization_type,
        positional_embedding_type="standard", original_architecture="GPT2LMHeadModel",
        device="cpu", seed=0,
    )  # fmt: skip
    raw = HookedTransformer(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in raw.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.3
            p.copy_(1 + noise if name.endswith(("ln1.w", "ln2.w", "ln_final.w")) else noise)
    processed = HookedTransformer(cfg)
    processed.load_and_process_state_dict(
        {k: v.clone() for k, v in raw.state_dict().items()},
        fold_ln=False, center_writing_weights=True, center_unembed=False,
        fold_value_biases=False, refactor_factored_attn_matrices=False,
    )  # fmt: skip
    return raw.eval(), processed.eval()


@pytest.fixture(scope="module")
def gpt2_like():
    return tiny_pair("LN")


@pytest.fixture(scope="module")
def lens_sae():
    from sae_lens import SAE as LensSAE

    return LensSAE


def write_sae(folder, hook: str, kwargs: dict, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True)
    weights = {
        "W_enc": torch.randn(D_MODEL, D_SAE, generator=g) / D_MODEL**0.5,
        "b_enc": torch.randn(D_SAE, generator=g) * 0.2,
        "W_dec": torch.randn(D_SAE, D_MODEL, generator=g),
        "b_dec": torch.randn(D_MODEL, generator=g) * 0.1,
    }
    save_file(weights, folder / "sae_weights.safetensors")
    meta = {"model_name": "tiny", "hook_name": hook, "model_from_pretrained_kwargs": kwargs}
    cfg = {"architecture": "standard", "d_in": D_MODEL, "d_sae": D_SAE, "dtype": "float32"}
    meta["sae_lens_version"] = "6.54.12"
    (folder / "cfg.json").write_text(json.dumps(cfg | {"metadata": meta}))


def tl_values(model, hook: str) -> torch.Tensor:
    _, cache = model.run_with_cache(torch.tensor(TOKENS))
    return cache[hook][0].reshape(len(TOKENS[0]), -1)


def our_values(runtime, hook: str) -> torch.Tensor:
    return residuals(runtime, ResidualCache(), tuple(TOKENS[0]), [hook])[hook]


@pytest.mark.parametrize("hook", HOOKS)
def test_centred_sae_sees_transformer_lens_values(gpt2_like, lens_sae, hook, tmp_path):
    raw, processed = gpt2_like
    runtime = TransformerLensRuntime(raw)
    assert centres_writes(runtime)
    store = SAEStore(runtime.hook_widths(), centres_writes=centres_writes(runtime))
    write_sae(tmp_path / "c", hook, CENTRED, seed=1)
    name = store.add(tmp_path / "c", "centred")
    ours_raw, theirs = our_values(runtime, hook), tl_values(processed, hook)
    writes = not hook.endswith("hook_z")
    # Not vacuous: centring moves every write hook's values, and leaves hook_z alone.
    assert ((ours_raw - theirs).abs().max() > 0.05) == writes

    sae = store.get(name)
    torch.testing.assert_close(sae.cfg.view.to_sae(ours_raw), theirs, atol=1e-5, rtol=1e-5)
    lens = lens_sae.load_from_disk(tmp_path / "c", device="cpu", dtype="float32")
    torch.testing.assert_close(sae.encode(ours_raw), lens.encode(theirs), atol=1e-5, rtol=1e-5)

    # An SAE trained on the unprocessed model reads our values as they are.
    write_sae(tmp_path / "u", hook, {}, seed=2)
    plain = store.get(store.add(tmp_path / "u", "plain"))
    lens_plain = lens_sae.load_from_disk(tmp_path / "u", device="cpu", dtype="float32")
    torch.testing.assert_close(
        plain.encode(ours_raw), lens_plain.encode(tl_values(raw, hook)), atol=1e-5, rtol=1e-5
    )


def test_rms_norm_models_are_not_centred(lens_sae, tmp_path):
    raw, processed = tiny_pair("RMS")
    runtime = TransformerLensRuntime(raw)
    assert not centres_writes(runtime)
    hook = "blocks.1.hook_resid_post"
    theirs = tl_values(processed, hook)
    torch.testing.assert_close(theirs, tl_values(raw, hook))  # TransformerLens skips it too
    store = SAEStore(runtime.hook_widths(), centres_writes=False)
    write_sae(tmp_path / "c", hook, CENTRED, seed=3)
    sae = store.get(store.add(tmp_path / "c", "c"))
    lens = lens_sae.load_from_disk(tmp_path / "c", device="cpu", dtype="float32")
    ours = sae.encode(our_values(runtime, hook))
    torch.testing.assert_close(ours, lens.encode(theirs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_steering_at_a_centred_sae_hook_acts_as_in_transformer_lens(gpt2_like, method):
    """Steering our raw stream with a centred SAE's direction moves the model exactly as the
    same request on TransformerLens' centred stream: an added row's mean component is removed
    by every LayerNorm, and projections are taken of the centred value."""
    raw, processed = gpt2_like
    hook, tokens = "blocks.0.hook_resid_post", torch.tensor(TOKENS)
    v = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(4)) * 2 + 0.5
    strength = 0.2 if method == "PROJECTION_CAP" else 3.0

    def run(model, centred: bool) -> torch.Tensor:
        op = row_op(method, [Direction(hook, v, strength, centred=centred)], 1.0, None)
        return model.run_with_hooks(tokens, fwd_hooks=[(hook, lambda x, hook: op(x, 0))])

    theirs = run(processed, centred=False)
    torch.testing.assert_close(run(raw, centred=True), theirs, atol=1e-4, rtol=1e-4)
    assert (theirs - processed(tokens)).abs().max() > 0.1  # the steering does something
    if method != "SIMPLE_ADDITIVE":  # and projecting the raw value would not be the same
        assert (run(raw, centred=False) - theirs).abs().max() > 1e-2


def test_settings_we_cannot_reproduce_are_refused(tmp_path):
    store = SAEStore({"blocks.1.attn.hook_z": D_MODEL}, centres_writes=True)
    write_sae(tmp_path / "z", "blocks.1.attn.hook_z", {"fold_value_biases": True}, seed=5)
    with pytest.raises(sw.SourceError, match="fold_value_biases"):
        store.add(tmp_path / "z", "z")
    assert store.sources() == []


def test_prepend_bos_puts_bos_first_once():
    """Completion prompts get BOS where TransformerLens would add it, and never twice."""
    from transformers import AutoTokenizer

    from steer_widgets.runtime.model import default_model_dir
    from steer_widgets.runtime.tokens import Tokenizer

    hf = AutoTokenizer.from_pretrained(default_model_dir())
    plain, with_bos = Tokenizer(hf), Tokenizer(hf, prepend_bos=True)
    ids = plain.encode("The cat sat").ids
    assert ids[0] != plain.bos_id
    assert with_bos.encode("The cat sat").ids == (plain.bos_id, *ids)
    assert with_bos.encode("The cat sat").special[0]
    again = with_bos.encode(hf.bos_token + "The cat sat").ids
    assert again.count(plain.bos_id) == 1


def test_engine_reads_and_steers_one_head_of_the_default_model(engine, lens_sae, tmp_path):
    """End to end on SmolLM2 (9 heads of 64 on ``attn.hook_z``): a per-head SAE's feature
    values are SAE Lens' on that head's slice, and steering with it runs and changes text."""
    hook, d_head, head = "blocks.4.attn.hook_z", 64, 7
    g = torch.Generator().manual_seed(6)
    folder = tmp_path / "head7"
    folder.mkdir()
    weights = {
        "W_enc": torch.randn(d_head, D_SAE, generator=g) / d_head**0.5,
        "b_enc": torch.randn(D_SAE, generator=g) * 0.1,
        "W_dec": torch.nn.functional.normalize(torch.randn(D_SAE, d_head, generator=g), dim=1),
        "b_dec": torch.zeros(d_head),
    }
    save_file(weights, folder / "sae_weights.safetensors")
    meta = {"model_name": "m", "hook_name": hook, "hook_head_index": head, **CENTRED}
    meta["sae_lens_version"] = "6.54.12"
    cfg = {"architecture": "standard", "d_in": d_head, "d_sae": D_SAE, "metadata": meta}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    heads = sw.Engine(engine.model, saes={"head7": folder})
    assert not heads.saes.centres_writes  # RMSNorm model: centring never applies
    assert heads.saes.config("head7").view == HookView(False, head, d_head)

    text = heads.text("The cat sat on the mat because")
    z = residuals(engine.model.runtime, ResidualCache(), text.ids, [hook])[hook]
    lens = lens_sae.load_from_disk(folder, device="cpu", dtype="float32")
    want = lens.encode(z[:, head * d_head : (head + 1) * d_head])
    feature = int(want[1:].sum(0).argmax())
    got = heads.activations(text, "head7", feature)
    torch.testing.assert_close(torch.tensor(got.values[1:]), want[1:, feature], atol=1e-5, rtol=0)
    assert got.max_value > 0

    request = sw.SteerRequest(
        "The cat sat", features=[sw.Feature("head7", feature, 400.0)], n_completion_tokens=6,
        temperature=0.0,
    )  # fmt: skip
    out = heads.steer(request).outputs
    assert out["STEERED"].token_ids != out["DEFAULT"].token_ids
    # a head's slice has no concept direction to compare with: both finders refuse it by name
    for find in (heads.search_features, heads.concept_features):
        with pytest.raises(sw.RequestError, match="one head's slice") as err:
            find("cats", sources=["head7"])
        assert err.value.field == "sources[0]", find


def test_fast_runtime_gpt2_gives_a_centred_sae_transformer_lens_values(engine, lens_sae, tmp_path):
    """A GPT-2 folder on our fast runtime (LayerNorm: writes are centred for SAEs trained
    with ``center_writing_weights``) against HookedTransformer on the same weights processed
    as SAE Lens loads gpt2-small-res-jb; prompts get BOS first, as TransformerLens does."""
    import transformers as tf
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    config = tf.GPT2Config(n_embd=D_MODEL, n_layer=2, n_head=N_HEADS, n_positions=64)
    config.vocab_size = len(engine.tokenizer.hf)
    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # biases and LayerNorms that matter
    hf.save_pretrained(tmp_path / "gpt2")
    engine.tokenizer.hf.save_pretrained(tmp_path / "gpt2")
    hook = "blocks.1.hook_resid_pre"
    write_sae(tmp_path / "sae", hook, CENTRED, seed=7)
    gpt2 = sw.Engine(str(tmp_path / "gpt2"), saes={"jb-like": tmp_path / "sae"})
    assert gpt2.saes.centres_writes and gpt2.saes.config("jb-like").view.centre

    cfg = HookedTransformerConfig(
        d_model=D_MODEL, d_head=D_MODEL // N_HEADS, n_heads=N_HEADS, d_mlp=4 * D_MODEL,
        n_layers=2, n_ctx=64, d_vocab=config.vocab_size, eps=config.layer_norm_epsilon,
        act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel", device="cpu",
    )  # fmt: skip
    tl = HookedTransformer(cfg)
    tl.load_and_process_state_dict(
        convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=True,
        center_unembed=False, fold_value_biases=False,
    )  # fmt: skip
    text = gpt2.text("The cat sat on the mat")
    assert text.ids[0] == engine.tokenizer.bos_id and text.ids.count(text.ids[0]) == 1
    _, cache = tl.eval().run_with_cache(torch.tensor([text.ids]))
    lens = lens_sae.load_from_disk(tmp_path / "sae", device="cpu", dtype="float32")
    want = lens.encode(cache[hook][0])
    feature = int(want[1:].sum(0).argmax())
    got = torch.tensor(gpt2.activations(text, "jb-like", feature).values)
    torch.testing.assert_close(got[1:], want[1:, feature], atol=1e-4, rtol=1e-4)
    assert got[1:].abs().max() > 0.1
