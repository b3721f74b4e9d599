"""Every fast-runtime architecture at a realistic width against transformers' ``generate``.

Per architecture: a random-weight model built with transformers' config class (d_model 768,
12 layers as in GPT-2 small and Pythia-160m, vocabulary 32,000; each family's own switches:
GQA, head_dim 256 for Gemma, partial rotary for GPT-NeoX, ...), our runtime built from the
same state dict. Figures, all from this one run: decode tokens/s of ours and of transformers
(32 greedy tokens after a 24-token prompt, batch 1, best of 2), ``ours_vs_hf``,
``greedy_equal_hf`` (our greedy tokens equal ``generate``'s), ``logits_max_abs_diff`` (prompt
logits against transformers' forward) and ``rows_identical`` (three rows, two of them
steered, 16 tokens sampled together equal each row sampled alone).
"""

from __future__ import annotations

import torch
import transformers as tf
from common import best_of

from steer_widgets.generation import Row, Sampling, decode
from steer_widgets.transformer import Transformer, TransformerConfig

N_NEW, PROMPT_LEN, VOCAB = 32, 24, 32000
WIDE = dict(hidden_size=768, num_hidden_layers=12, vocab_size=VOCAB)

CONFIGS = {
    "gpt2": lambda: tf.GPT2Config(n_embd=768, n_layer=12, n_head=12, vocab_size=VOCAB),
    "gemma2": lambda: tf.Gemma2Config(
        **WIDE, intermediate_size=3072, num_attention_heads=4, num_key_value_heads=2, head_dim=256
    ),
    "gemma3": lambda: tf.Gemma3TextConfig(
        **WIDE, intermediate_size=3072, num_attention_heads=4, num_key_value_heads=2, head_dim=256
    ),
    "qwen2": lambda: tf.Qwen2Config(
        **WIDE, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=2
    ),
    "qwen3": lambda: tf.Qwen3Config(
        **WIDE, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=4, head_dim=64
    ),
    "mistral": lambda: tf.MistralConfig(
        **WIDE, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=4, head_dim=64
    ),
    "llama3": lambda: tf.LlamaConfig(
        **WIDE,
        intermediate_size=2048,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),  # fmt: skip
    "gpt_neox": lambda: tf.GPTNeoXConfig(
        **WIDE,
        intermediate_size=3072,
        num_attention_heads=12,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    ),  # fmt: skip
}


def _ours(model, ids: list[int], rows: list[Row], sampling: Sampling) -> list[list[int]]:
    steps = list(decode(model, ids, rows, sampling, frozenset()))
    return [[s.tokens[r] for s in steps] for r in range(len(rows))]


def _hf(hf, ids: list[int]) -> list[int]:
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
        attention_mask=torch.ones(1, len(ids), dtype=torch.long), pad_token_id=0,
    )  # fmt: skip
    return out[0, len(ids) :].tolist()


def _rows_identical(model, ids: list[int]) -> bool:
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    hook = f"blocks.{model.cfg.n_layers // 2}.hook_resid_post"
    rows = [Row()] + [Row({hook: lambda x, s, c=c: x + c * direction}) for c in (4.0, -4.0)]
    sampling = Sampling(temperature=1.0, freq_penalty=1.0, seed=5, n_completion_tokens=16)
    together = _ours(model, ids, rows, sampling)
    return all(together[r] == _ours(model, ids, [row], sampling)[0] for r, row in enumerate(rows))


def _one(name: str) -> dict:
    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=torch.float32).eval()
    ours = Transformer(TransformerConfig.from_hf_config(hf.config), hf.state_dict())
    ids = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(0))
    ids = ids.tolist()
    greedy = Sampling(temperature=0.0, freq_penalty=0.0, seed=0, n_completion_tokens=N_NEW)
    equal = _ours(ours, ids, [Row()], greedy)[0] == _hf(hf, ids)  # also warms both up
    with torch.no_grad():
        diff = (ours.forward(torch.tensor([ids])) - hf(torch.tensor([ids])).logits).abs().max()
    ours_s = best_of(lambda: _ours(ours, ids, [Row()], greedy), repeats=2)
    hf_s = best_of(lambda: _hf(hf, ids), repeats=2)
    return {
        "ours_tokens_per_s": N_NEW / ours_s,
        "hf_tokens_per_s": N_NEW / hf_s,
        "ours_vs_hf": hf_s / ours_s,
        "greedy_equal_hf": equal,
        "logits_max_abs_diff": float(diff),
        "rows_identical": _rows_identical(ours, ids),
        "params_m": sum(p.numel() for p in hf.parameters()) / 1e6,
    }


def run() -> dict:
    figures: dict = {name: _one(name) for name in CONFIGS}
    figures["threads"] = torch.get_num_threads()
    return figures
