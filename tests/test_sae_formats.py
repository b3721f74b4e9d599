"""Every SAE format the flagship SAE Lens releases use, read by us and by SAE Lens itself.

Each case writes a synthetic SAE (random weights) into ``tmp_path`` with the ``cfg.json``
fields the release's loader produces (``sae_lens/loading/pretrained_sae_loaders.py``,
``pretrained_saes.yaml``), then compares our ``encode``/``decode`` with
``sae_lens.SAE.load_from_disk`` on the same folder. Nothing here needs a model.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import steer_widgets as sw
from steer_widgets.sae.sae import SAE, SAEConfig
from steer_widgets.sae.store import SAEStore

D_IN, D_SAE = 64, 256

# gpt2-small-res-jb: the hub's flat pre-6.0 cfg.json (hook_point, "torch.float32", no
# architecture, no apply_b_dec_to_input), plus the release's config override.
GPT2_RES_JB = {
    "model_name": "gpt2-small", "hook_point": "blocks.8.hook_resid_pre", "hook_point_layer": 8,
    "hook_point_head_index": None, "dataset_path": "Skylion007/openwebtext",
    "is_dataset_tokenized": False, "context_size": 128, "d_in": D_IN, "d_sae": D_SAE,
    "dtype": "torch.float32", "device": "mps", "b_dec_init_method": "geometric_median",
    "expansion_factor": 32, "l1_coefficient": 8e-05, "lr": 0.0004,
    "model_from_pretrained_kwargs": {"center_writing_weights": True},
}  # fmt: skip
# gemma-scope-2b-pt-res-canonical: what get_gemma_2_config_from_hf returns.
GEMMA_SCOPE = {
    "architecture": "jumprelu", "d_in": D_IN, "d_sae": D_SAE, "dtype": "float32",
    "model_name": "gemma-2-2b", "hook_name": "blocks.20.hook_resid_post", "hook_head_index": None,
    "activation_fn": "relu", "finetuning_scaling_factor": False, "sae_lens_training_version": None,
    "prepend_bos": True, "dataset_path": "monology/pile-uncopyrighted", "context_size": 1024,
    "dataset_trust_remote_code": True, "apply_b_dec_to_input": False,
    "normalize_activations": None,
}  # fmt: skip
# Llama Scope (llama_scope_lxr_8x): what get_llama_scope_config_from_hf returns; bf16 weights.
LLAMA_SCOPE = {
    "architecture": "jumprelu", "jump_relu_threshold": 0.7, "d_in": D_IN, "d_sae": D_SAE,
    "dtype": "bfloat16", "model_name": "meta-llama/Llama-3.1-8B",
    "hook_name": "blocks.15.hook_resid_post", "hook_head_index": None, "activation_fn": "relu",
    "finetuning_scaling_factor": False, "sae_lens_training_version": None, "prepend_bos": True,
    "dataset_path": "cerebras/SlimPajama-627B", "context_size": 1024,
    "dataset_trust_remote_code": True, "apply_b_dec_to_input": False,
    "normalize_activations": "expected_average_only_in",
}  # fmt: skip


def layout_6(architecture: str, hook: str = "blocks.3.hook_resid_post", **top) -> dict:
    """SAE Lens 6's own ``save_model`` layout: model settings nested under ``metadata``."""
    return {
        "d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu",
        "apply_b_dec_to_input": True, "normalize_activations": "none",
        "reshape_activations": "none", "architecture": architecture,
        "metadata": {
            "model_name": "tiny", "hook_name": hook, "hook_head_index": None,
            "prepend_bos": True, "sae_lens_version": "6.54.12",
            "model_from_pretrained_kwargs": {},
        },
    } | top  # fmt: skip


CASES = {
    "gpt2-small-res-jb (flat, standard)": (GPT2_RES_JB, "standard"),
    "gemma-scope (jumprelu)": (GEMMA_SCOPE, "jumprelu"),
    "llama-scope (jumprelu, bf16)": (LLAMA_SCOPE, "jumprelu"),
    "standard": (layout_6("standard"), "standard"),
    "standard, no b_dec on input": (layout_6("standard", apply_b_dec_to_input=False), "standard"),
    "topk": (layout_6("topk", k=12), "topk"),
    "topk, rescaled by decoder norm": (
        layout_6("topk", k=12, rescale_acts_by_decoder_norm=True),
        "topk",
    ),
    "topk (flat, activation_fn_kwargs)": (
        {**GPT2_RES_JB, "activation_fn": "topk", "activation_fn_kwargs": {"k": 9}},
        "topk",
    ),
    "jumprelu": (layout_6("jumprelu"), "jumprelu"),
    "gated": (layout_6("gated"), "gated"),
    "constant_norm_rescale": (
        layout_6("standard", normalize_activations="constant_norm_rescale"),
        "standard",
    ),
    "layer_norm": (layout_6("jumprelu", normalize_activations="layer_norm"), "jumprelu"),
    "expected_average_only_in": (
        layout_6("topk", k=5, normalize_activations="expected_average_only_in"),
        "topk",
    ),
    "flat, normalize_activations=True": (
        {**GPT2_RES_JB, "normalize_activations": True},
        "standard",
    ),
}


def random_weights(arch: str, seed: int, d_in: int = D_IN) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    w = {
        "W_enc": randn(d_in, D_SAE, scale=d_in**-0.5),
        "W_dec": randn(D_SAE, d_in, scale=0.3),  # rows not unit norm: rescaling matters
        "b_dec": randn(d_in, scale=0.2),
    }
    if arch == "gated":
        return w | {"b_gate": randn(D_SAE), "b_mag": randn(D_SAE), "r_mag": randn(D_SAE, scale=0.3)}
    w["b_enc"] = randn(D_SAE, scale=0.5)
    if arch == "jumprelu":  # thresholds that cut some active features and keep others
        w["threshold"] = torch.rand(D_SAE, generator=g) * 1.0
    return w


def write_sae(folder, cfg: dict, weights: dict) -> None:
    folder.mkdir(parents=True)
    dtype = torch.bfloat16 if cfg.get("dtype") == "bfloat16" else torch.float32
    save_file(
        {k: v.to(dtype).contiguous() for k, v in weights.items()},
        folder / "sae_weights.safetensors",
    )
    (folder / "cfg.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def lens_sae():
    from sae_lens import SAE as LensSAE  # ~20 s cold: only this module pays it

    return LensSAE


def inputs(seed: int = 1, d: int = D_IN) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 7, d, generator=g) * 1.5 + 0.4  # non-zero mean: centring matters


@pytest.mark.parametrize("name", list(CASES))
def test_encode_decode_equal_sae_lens(name, tmp_path, lens_sae):
    cfg_dict, arch = CASES[name]
    folder = tmp_path / "sae"
    write_sae(folder, cfg_dict, random_weights(arch, seed=len(name)))
    ours = SAE(SAEConfig.read("s", folder))
    assert ours.cfg.architecture == arch
    lens = lens_sae.load_from_disk(folder, device="cpu", dtype="float32")
    x = inputs()

    ours_acts = ours.encode(x)
    lens_acts = lens.encode(x)
    torch.testing.assert_close(ours_acts, lens_acts, atol=1e-5, rtol=1e-5)
    active = (lens_acts > 0).float().mean()
    assert 0.01 < active < 0.9, f"degenerate test data: {active:.3f} of features active"
    torch.testing.assert_close(
        ours.decode(ours_acts, x), lens.decode(lens_acts), atol=1e-5, rtol=1e-5
    )
    if arch != "topk":  # one encoder column gives the same feature
        for i in (0, 17, D_SAE - 1):
            torch.testing.assert_close(
                ours.encode_one(x, i), lens_acts[..., i], atol=1e-5, rtol=1e-5
            )


def test_config_fields_from_both_layouts(tmp_path):
    write_sae(tmp_path / "jb", GPT2_RES_JB, random_weights("standard", 0))
    jb = SAEConfig.read("jb", tmp_path / "jb")
    assert (jb.hook_name, jb.layer, jb.architecture) == ("blocks.8.hook_resid_pre", 8, "standard")
    assert jb.apply_b_dec_to_input and jb.prepend_bos and jb.hook_head_index is None
    assert jb.model_kwargs == {"center_writing_weights": True}
    new = layout_6("topk", hook="blocks.2.attn.hook_z", k=7)
    new["metadata"] |= {"hook_head_index": 3, "prepend_bos": False, "model_name": "m"}
    write_sae(tmp_path / "new", new, random_weights("topk", 0))
    cfg = SAEConfig.read("new", tmp_path / "new")
    assert (cfg.k, cfg.hook_head_index, cfg.prepend_bos, cfg.model_name) == (7, 3, False, "m")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"architecture": "transcoder", "d_out": D_IN}, "transcoders read one hook"),
        ({"architecture": "matching_pursuit"}, "not one of"),
        ({"normalize_activations": "whatever"}, "not an SAE Lens mode"),
        ({"metadata": {"model_name": "tiny"}}, "names no hook"),
        ({"d_sae": "wide"}, "unreadable"),
    ],
)
def test_unsupported_configs_are_named_errors(change, message, tmp_path):
    write_sae(tmp_path / "bad", layout_6("standard") | change, random_weights("standard", 0))
    with pytest.raises(sw.SourceError, match=message):
        SAEConfig.read("bad", tmp_path / "bad")


def test_hook_head_index_reads_and_writes_one_head(tmp_path, lens_sae):
    """A per-head SAE reads its head's slice of ``attn.hook_z`` and steers only that slice."""
    d_head, n_heads, head = 16, 4, 2
    cfg = layout_6("standard", hook="blocks.1.attn.hook_z", d_in=d_head)
    cfg["metadata"]["hook_head_index"] = head
    write_sae(tmp_path / "head", cfg, random_weights("standard", 5, d_in=d_head))
    store = SAEStore({"blocks.1.attn.hook_z": d_head * n_heads})
    name = store.add(tmp_path / "head", "head")
    z = inputs(d=d_head * n_heads)
    lens = lens_sae.load_from_disk(tmp_path / "head", device="cpu", dtype="float32")
    part = z[..., head * d_head : (head + 1) * d_head]
    torch.testing.assert_close(store.get(name).encode(z), lens.encode(part), atol=1e-5, rtol=1e-5)

    direction = store.direction(name, 5)
    assert direction.shape == (d_head * n_heads,)
    assert torch.equal(direction[head * d_head : (head + 1) * d_head], lens.W_dec[5].detach())
    assert not direction[: head * d_head].any() and not direction[(head + 1) * d_head :].any()

    bad = layout_6("standard", hook="blocks.1.attn.hook_z", d_in=d_head)
    bad["metadata"]["hook_head_index"] = n_heads  # one past the last head
    write_sae(tmp_path / "bad", bad, random_weights("standard", 5, d_in=d_head))
    with pytest.raises(sw.SourceError, match="hook_head_index 4"):
        store.add(tmp_path / "bad", "bad")
    assert store.sources() == [name]


def test_one_feature_index_check(tmp_path):
    write_sae(tmp_path / "s", layout_6("standard"), random_weights("standard", 0))
    store = SAEStore({"blocks.3.hook_resid_post": D_IN})
    name = store.add(tmp_path / "s")
    assert name == "3-s"  # {layer}-{folder} from the one parse of cfg.json
    for bad in (-1, D_SAE, True, 2.0):
        with pytest.raises(sw.SourceError, match="out of range"):
            store.decoder_row(name, bad)
    assert store.check_index(name, D_SAE - 1).d_sae == D_SAE
    assert torch.equal(store.decoder_row(name, torch.tensor(3)), store.decoder_row(name, 3))
    assert store.stats()["row_reads"] == 1  # one cache entry for both spellings of 3


def test_per_head_rows_have_no_output_tokens():
    from steer_widgets.sae.feature_index import top_output_tokens

    rows = top_output_tokens(torch.randn(3, 16), torch.randn(64, 50), tokenizer=None)
    assert rows == [([], []), ([], []), ([], [])]


def test_new_layout_without_a_version_is_read_as_new(tmp_path):
    """A cfg.json written by hand with ``metadata`` but no ``sae_lens_version``."""
    cfg = {"architecture": "standard", "d_in": D_IN, "d_sae": D_SAE}
    cfg["metadata"] = {"hook_name": "blocks.3.hook_resid_post", "prepend_bos": False}
    write_sae(tmp_path / "hand", cfg, random_weights("standard", 0))
    read = SAEConfig.read("hand", tmp_path / "hand")
    assert (read.hook_name, read.prepend_bos) == ("blocks.3.hook_resid_post", False)


def test_logit_lens_runs_on_the_unembeddings_device():
    """On a GPU the SAE's decoder stays in CPU memory while the unembedding is on the
    device (found by ``benchmarks/gpu_check.py`` on an H200: evaluate's feature labels
    failed). The meta device stands in for the GPU here: only the placement is checked."""
    from steer_widgets.sae.feature_index import logit_lens

    w_dec, norm = torch.randn(700, 16), torch.rand(16)
    unembed = torch.randn(16, 50)
    top, bottom = logit_lens(w_dec, unembed.to("meta"), norm, k=4)
    assert top.device.type == bottom.device.type == "meta"
    assert top.shape == bottom.shape == (700, 4)
    want = logit_lens(w_dec, unembed, norm, k=4)[0]
    assert torch.equal(want, ((w_dec * norm) @ unembed).topk(4, dim=-1).indices)
