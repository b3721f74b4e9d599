"""Every fast-runtime architecture at a realistic width against transformers' ``generate``.

Per architecture: a random-weight model built with transformers' config class (d_model 768,
12 layers as in GPT-2 small and Pythia-160m, vocabulary 32,000; each family's own switches:
GQA, head_dim 256 for Gemma, partial rotary for GPT-NeoX, ...), our runtime built from the
same state dict. Figures, all from this one run: decode tokens/s of ours and of transformers
(32 greedy tokens after a 24-token prompt, batch 1, best of 8 alternations: with 4, one
architecture in a run could land in a slow phase of this shared machine), ``ours_vs_hf``,
``greedy_equal_hf`` (our greedy tokens equal ``generate``'s), ``logits_max_abs_diff`` (prompt
logits against transformers' forward) and ``rows_identical`` (three rows, two of them
steered, 16 tokens sampled together equal each row sampled alone).
"""

from __future__ import annotations

import torch
import transformers as tf
from common import best_of, read_bandwidth

from steer_widgets.runtime.config import TransformerConfig
from steer_widgets.runtime.transformer import Transformer
from steer_widgets.steering.generation import Row, Sampling, decode

N_NEW, PROMPT_LEN, VOCAB = 32, 24, 32000


def configs(tiny: bool = False) -> dict:
    """Per architecture, a function building its transformers config: realistic width
    (d_model 768, 12 layers, vocabulary 32,000), or ``tiny`` (d_model 64, 2 layers, vocabulary
    512) to run the same code paths in seconds (``gpu_check.py --tiny``)."""
    d, layers, vocab = (64, 2, 512) if tiny else (768, 12, VOCAB)
    heads, kv, head_dim, gemma_head_dim = (4, 2, 16, 32) if tiny else (12, 4, 64, 256)
    mlp, mlp4 = (128, 256) if tiny else (2048, 3072)
    wide = dict(hidden_size=d, num_hidden_layers=layers, vocab_size=vocab)
    gemma = dict(
        **wide,
        intermediate_size=mlp4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=gemma_head_dim,
    )
    gqa = dict(**wide, intermediate_size=mlp, num_attention_heads=heads, num_key_value_heads=kv)
    return {
        "gpt2": lambda: tf.GPT2Config(
            n_embd=d, n_layer=layers, n_head=heads, vocab_size=vocab, bos_token_id=0, eos_token_id=0
        ),
        "gemma2": lambda: tf.Gemma2Config(**gemma),
        "gemma3": lambda: tf.Gemma3TextConfig(**gemma),
        "qwen2": lambda: tf.Qwen2Config(**{**gqa, "num_key_value_heads": 2}),
        "qwen3": lambda: tf.Qwen3Config(**gqa, head_dim=head_dim),
        "mistral": lambda: tf.MistralConfig(**gqa, head_dim=head_dim),
        "llama3": lambda: tf.LlamaConfig(
            **gqa,
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
            **wide,
            intermediate_size=mlp4,
            num_attention_heads=heads,
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


def _hf(hf, ids: list[int], n_new: int = N_NEW) -> list[int]:
    out = hf.generate(
        torch.tensor([ids], device=hf.device), max_new_tokens=n_new, do_sample=False,
        attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=hf.device),
        pad_token_id=0,
    )  # fmt: skip
    return out[0, len(ids) :].tolist()


def _rows_identical(model, ids: list[int]) -> bool:
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    direction = direction.to(model.device)
    hook = f"blocks.{model.cfg.n_layers // 2}.hook_resid_post"
    rows = [Row()] + [Row({hook: lambda x, s, c=c: x + c * direction}) for c in (4.0, -4.0)]
    sampling = Sampling(temperature=1.0, freq_penalty=1.0, seed=5, n_completion_tokens=16)
    together = _ours(model, ids, rows, sampling)
    return all(together[r] == _ours(model, ids, [row], sampling)[0] for r, row in enumerate(rows))


def check(
    name: str,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    tiny: bool = False,
    n_new: int = N_NEW,
    repeats: int = 8,
) -> dict:
    """The figures of one architecture: transformers' model and ours from the same random
    weights, on ``device`` in ``dtype``; ours and transformers timed alternately."""
    torch.manual_seed(0)
    config = configs(tiny)[name]()
    hf = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # both decode all n_new tokens, EOS or not
    ours = Transformer(
        TransformerConfig.from_hf_config(hf.config), hf.state_dict(), device=device, dtype=dtype
    )
    hf = hf.to(device=device, dtype=dtype)
    vocab = hf.config.vocab_size
    ids = torch.randint(0, vocab, (PROMPT_LEN,), generator=torch.Generator().manual_seed(0))
    ids = ids.tolist()
    greedy = Sampling(temperature=0.0, freq_penalty=0.0, seed=0, n_completion_tokens=n_new)
    ours_ids, hf_ids = _ours(ours, ids, [Row()], greedy)[0], _hf(hf, ids, n_new)  # warm-up too
    with torch.no_grad():
        prompt = torch.tensor([ids], device=device)
        diff = (ours.forward(prompt).float() - hf(prompt).logits.float()).abs().max()
    ours_s, hf_s = [], []
    for _ in range(repeats):  # alternate, so a noisy machine disturbs both alike
        ours_s.append(best_of(lambda: _ours(ours, ids, [Row()], greedy), repeats=1))
        hf_s.append(best_of(lambda: _hf(hf, ids, n_new), repeats=1))
    same = next(
        (i for i, (a, b) in enumerate(zip(ours_ids, hf_ids, strict=True)) if a != b), len(hf_ids)
    )
    return {
        "ours_tokens_per_s": n_new / min(ours_s),
        "hf_tokens_per_s": n_new / min(hf_s),
        "ours_vs_hf": min(hf_s) / min(ours_s),
        "greedy_equal_hf": ours_ids == hf_ids,
        "greedy_tokens_equal": same,
        "logits_max_abs_diff": float(diff),
        "rows_identical": _rows_identical(ours, ids),
        "row_groups": dict(ours.row_groups),
        "params_m": sum(p.numel() for p in hf.parameters()) / 1e6,
        "weight_mb_per_step": ours.weight_bytes() / 1e6,
    }


def run() -> dict:
    """Every architecture, and how close each runtime comes to the machine's read bandwidth
    (a step reads every weight once): where transformers is already near it, no runtime can
    be much faster."""
    bandwidth = read_bandwidth()  # first: it also warms the machine for the first model
    figures: dict = {name: check(name) for name in configs()}
    for f in figures.values():
        bound = bandwidth / (f["weight_mb_per_step"] * 1e6)
        f["ours_vs_bound"] = f["ours_tokens_per_s"] / bound
        f["hf_vs_bound"] = f["hf_tokens_per_s"] / bound
    figures["read_bandwidth_gb_s"] = bandwidth / 1e9
    figures["threads"] = torch.get_num_threads()
    return figures
