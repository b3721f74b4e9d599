"""Every architecture of the fast runtime against transformers, offline.

Each case is a tiny random-weight model built with transformers' own config class, saved with
``save_pretrained`` and loaded through our loader, like a user's local folder. Sliding windows
and soft-caps are set small so prompts actually cross them. Checked: logits and every
``hook_resid_pre`` against transformers' fp32 forward, greedy tokens against ``generate``,
and batched rows (greedy and sampled, steered or not) against the same rows alone.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import transformers as tf

import steer_widgets as sw
from steer_widgets.runtime.config import TransformerConfig
from steer_widgets.runtime.linear import DEFAULT_KERNEL
from steer_widgets.runtime.model import load_model
from steer_widgets.runtime.transformer import Transformer
from steer_widgets.steering.generation import Row, Sampling, decode

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog sleeps all day long."
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _configs() -> dict:
    return {
        "llama": lambda: tf.LlamaConfig(**SIZES, num_key_value_heads=2),
        "llama3": lambda: tf.LlamaConfig(
            **SIZES, num_key_value_heads=2, max_position_embeddings=256, rope_parameters=LLAMA3_ROPE
        ),
        "mistral": lambda: tf.MistralConfig(
            **SIZES, num_key_value_heads=2, head_dim=16, sliding_window=7
        ),
        "qwen2": lambda: tf.Qwen2Config(
            **SIZES,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=7,
            max_window_layers=1,
        ),  # fmt: skip
        "qwen3": lambda: tf.Qwen3Config(**SIZES, num_key_value_heads=2, head_dim=16),
        "gemma2": lambda: tf.Gemma2Config(
            **SIZES,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=7,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=5.0,
        ),  # fmt: skip
        "gemma3": lambda: tf.Gemma3TextConfig(
            **SIZES,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=7,
            sliding_window_pattern=2,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),  # fmt: skip
        "gemma3_multimodal": lambda: tf.Gemma3Config(
            text_config=dict(
                SIZES,
                num_key_value_heads=2,
                head_dim=32,
                query_pre_attn_scalar=32,
                sliding_window=7,
                sliding_window_pattern=2,
            ),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,
            ),
            mm_tokens_per_image=4,
        ),  # fmt: skip
        "gpt2": lambda: tf.GPT2Config(n_embd=64, n_layer=3, n_head=4, n_positions=256),
        "gpt_neox": lambda: tf.GPTNeoXConfig(
            **SIZES,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
            },
        ),  # fmt: skip
    }


ARCHS = sorted(_configs())


def random_model(name: str, vocab: int):
    """A random-weight transformers model of ``name`` with a vocabulary of ``vocab``."""
    config = _configs()[name]()
    for part in (config, getattr(config, "text_config", config)):
        part.vocab_size, part.initializer_range = vocab, 0.1
    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 1:  # norms start at 1 or 0 and biases at 0: make them matter
                p.add_(torch.randn_like(p) * 0.1)
    return hf


def build(name: str, tokenizer, folder):
    """A random-weight transformers model of ``name``, saved into ``folder``."""
    hf = random_model(name, len(tokenizer))
    hf.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return hf


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, engine, tmp_path_factory):
    """(name, transformers model, our runtime loaded from the saved folder, prompt ids)."""
    folder = tmp_path_factory.mktemp(request.param)
    hf = build(request.param, engine.tokenizer.hf, folder)
    loaded = load_model(str(folder))
    assert isinstance(loaded.runtime, Transformer)
    ids = list(loaded.tokenizer.encode(PROMPT).ids)
    assert len(ids) > 12  # longer than the sliding windows
    return request.param, hf, loaded.runtime, ids


def test_logits_and_residuals_match_transformers(pair):
    _, hf, ours, ids = pair
    tokens = torch.tensor([ids])
    with torch.no_grad():
        ref = hf(tokens, output_hidden_states=True)
    captured = {}
    hooks = {
        f"blocks.{i}.hook_resid_pre": (lambda x, s, i=i: captured.__setitem__(i, x.clone()))
        for i in range(ours.cfg.n_layers)
    }
    logits = ours.forward(tokens, hooks=hooks)
    assert (logits - ref.logits).abs().max() < 1e-4
    for i in range(ours.cfg.n_layers):
        assert (captured[i] - ref.hidden_states[i]).abs().max() < 1e-4, i


def test_greedy_tokens_equal_generate(pair):
    _, hf, ours, ids = pair
    n = 12
    ref = hf.generate(
        torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
        attention_mask=torch.ones(1, len(ids), dtype=torch.long), pad_token_id=0,
    )[0, len(ids):].tolist()  # fmt: skip
    steps = decode(ours, ids, [Row()], Sampling(0.0, 0.0, 0, n), frozenset())
    assert [s.tokens[0] for s in steps] == ref


def _rows(ours) -> list[Row]:
    direction = torch.randn(ours.cfg.d_model, generator=torch.Generator().manual_seed(2))

    def add(c: float):
        return lambda x, start: x + c * direction

    hook = f"blocks.{ours.cfg.n_layers // 2}.hook_resid_post"
    return [Row(), Row({hook: add(2.0)}), Row({hook: add(-3.0)}), Row()]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_rows_equal_rows_alone(pair, temperature):
    _, _, ours, ids = pair
    sampling = Sampling(temperature, 1.0, 7, 10)
    rows = _rows(ours)
    together = [s.tokens for s in decode(ours, ids, rows, sampling, frozenset())]
    for r, row in enumerate(rows):
        alone = [s.tokens[0] for s in decode(ours, ids, [row], sampling, frozenset())]
        assert [t[r] for t in together] == alone, r
    assert [t[0] for t in together] != [t[1] for t in together]  # steering changed a row


WINDOWED = ["gemma2", "gemma3", "mistral", "qwen2"]  # every architecture with a sliding window


@pytest.mark.parametrize(
    ("name", "kernel"), [*((n, DEFAULT_KERNEL) for n in WINDOWED), ("mistral", "onednn")]
)
def test_ragged_rows_past_the_window_equal_their_solo_runs(name, kernel):
    """Two prompts of 11 and 17 tokens decoded together take ragged steps (each row at its
    own position) past the layers' window of 7: each row equals its solo run, token for
    token and in every token probability. Gemma 2's soft-capped attention, and any model
    without the native kernel, takes the per-row path; the others the native ragged kernel.
    The window changes these rows' results, so a ragged step that ignored it would fail."""
    hf = random_model(name, vocab=256)
    ours = Transformer(TransformerConfig.from_hf_config(hf.config), hf.state_dict(), kernel=kernel)
    assert 7 in ours.cfg.windows and (ours.cfg.attn_softcap is not None) == (name == "gemma2")
    rows = [
        Row(prompt_ids=tuple(range(3, 14)), sampling=Sampling(0.0, 0.0, 0, 5)),
        Row(prompt_ids=tuple(range(40, 57)), sampling=Sampling(1.0, 1.0, 3, 8)),
    ]  # fmt: skip
    together = list(decode(ours, None, rows, None, frozenset()))
    assert len(together) == 8
    for r, row in enumerate(rows):
        alone = list(decode(ours, None, [row], None, frozenset()))
        assert [s.tokens[r] for s in together[: len(alone)]] == [s.tokens[0] for s in alone]
        assert [s.probs[r] for s in together[: len(alone)]] == [s.probs[0] for s in alone], r
    unwindowed = copy.copy(ours)
    unwindowed.cfg = dataclasses.replace(ours.cfg, windows=())
    for row in rows:
        windowed = [s.probs for s in decode(ours, None, [row], None, frozenset())]
        assert [s.probs for s in decode(unwindowed, None, [row], None, frozenset())] != windowed


def test_hook_names_and_widths(pair):
    name, _, ours, _ = pair
    widths = ours.hook_widths()
    assert widths["blocks.0.attn.hook_z"] == ours.cfg.n_heads * ours.cfg.d_head
    assert widths["blocks.0.hook_resid_post"] == ours.cfg.d_model
    assert ("blocks.0.hook_resid_mid" in widths) == (name != "gpt_neox")  # parallel block


def test_unsupported_folder_is_refused_by_name(engine, tmp_path):
    config = tf.LlamaConfig(**SIZES, rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    config.vocab_size = len(engine.tokenizer.hf)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(NotImplementedError, match="LlamaForCausalLM"):
        load_model(str(tmp_path))


def _tl_config(name: str, c):
    """TransformerLens' own switches for the same tiny architecture (its loader needs a hub
    name, so the config is written out here the way TransformerLens writes its presets)."""
    from transformer_lens import HookedTransformerConfig

    common = dict(
        d_model=c.d_model, d_head=c.d_head, n_heads=c.n_heads, d_mlp=c.d_mlp,
        n_layers=c.n_layers, n_ctx=256, d_vocab=c.vocab_size, eps=c.norm_eps,
        dtype=torch.float32, device="cpu", default_prepend_bos=False,
    )  # fmt: skip
    if name == "gpt2":
        return HookedTransformerConfig(
            **common, act_fn="gelu_new", normalization_type="LN",
            positional_embedding_type="standard", original_architecture="GPT2LMHeadModel",
        )  # fmt: skip
    if name == "gpt_neox":
        return HookedTransformerConfig(
            **common, act_fn="gelu", normalization_type="LN", positional_embedding_type="rotary",
            rotary_dim=2 * len(c.ropes[0].inv_freq), rotary_adjacent_pairs=False,
            parallel_attn_mlp=True, original_architecture="GPTNeoXForCausalLM",
        )  # fmt: skip
    return HookedTransformerConfig(
        **common, act_fn="gelu_pytorch_tanh", normalization_type="RMS",
        positional_embedding_type="rotary", rotary_dim=c.d_head, rotary_base=10000.0,
        rotary_adjacent_pairs=False, n_key_value_heads=c.n_kv_heads, use_local_attn=True,
        window_size=7, attn_types=["local", "global", "local"], attn_scores_soft_cap=2.0,
        output_logits_soft_cap=5.0, attn_scale=24**0.5, gated_mlp=True, final_rms=True,
        use_normalization_before_and_after=True, original_architecture="Gemma2ForCausalLM",
    )  # fmt: skip


@pytest.mark.parametrize("name", ["gpt2", "gpt_neox", "gemma2"])
def test_every_hook_equals_transformer_lens(engine, tmp_path, name):
    """Hook values equal HookedTransformer's on the same unprocessed weights, at every hook
    point (GPT-2: gpt2-small-res-jb's family; Gemma 2: Gemma Scope's, with its post-norms)."""
    pytest.importorskip("transformer_lens")
    from transformer_lens import HookedTransformer
    from transformer_lens.pretrained import weight_conversions as wc

    hf = build(name, engine.tokenizer.hf, tmp_path)
    ours = load_model(str(tmp_path)).runtime
    cfg = _tl_config(name, ours.cfg)
    convert = {"gpt2": wc.convert_gpt2_weights, "gpt_neox": wc.convert_neox_weights}
    tl = HookedTransformer(cfg)
    tl.load_state_dict(convert.get(name, wc.convert_gemma_weights)(hf, cfg), strict=False)
    tokens = torch.tensor([engine.tokenizer.encode(PROMPT).ids])
    logits, cache = tl.eval().run_with_cache(tokens)
    seen = {}
    hooks = {n: (lambda x, s, n=n: seen.__setitem__(n, x.clone())) for n in ours.hook_names}
    assert (ours.forward(tokens, hooks=hooks) - logits).abs().max() < 1e-4
    assert set(seen) == set(ours.hook_names) and set(seen) <= set(cache.cache_dict)
    for hook in ours.hook_names:
        assert (seen[hook] - cache[hook]).abs().max() < 1e-4, hook


@pytest.mark.parametrize("name", ["gpt2", "gemma2"])
def test_engine_steers_another_architecture_exactly(engine, tmp_path, name):
    """The public engine on a local folder of another architecture: a steered sweep beside
    DEFAULT, every row equal to the same row requested alone."""
    build(name, engine.tokenizer.hf, tmp_path)
    other = sw.Engine(str(tmp_path), saes=[])
    assert isinstance(other.model.runtime, Transformer)
    vector = torch.randn(
        other.model.runtime.cfg.d_model, generator=torch.Generator().manual_seed(0)
    )
    request = sw.SteerRequest(
        prompt=PROMPT, vectors=[sw.Vector(vector, "blocks.1.hook_resid_pre", 4.0)],
        n_completion_tokens=8, temperature=1.0, seed=4, sweep=(-1.0, 2.0),
    )  # fmt: skip
    together = other.steer(request).outputs
    assert len(together) == 4 and together["DEFAULT"].token_ids != together["STEERED"].token_ids
    for label, output in together.items():
        other.clear_caches()
        if label == "DEFAULT":
            alone = other.steer(request.with_(types=("DEFAULT",), sweep=()))
        else:
            multiplier = 1.0 if label == "STEERED" else float(label.split("*")[1])
            alone = other.steer(
                request.with_(types=("STEERED",), sweep=(), strength_multiplier=multiplier)
            )
        assert (
            alone.outputs[label if label in alone.outputs else "STEERED"].token_ids
            == output.token_ids
        ), label
