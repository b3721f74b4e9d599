"""A Hugging Face hub cache written by hand: tiny random models under the repo ids users type
and SAE files in each flagship release's own repo layout and format, at the paths SAE Lens'
registry (``pretrained_saes.yaml``) maps its ids to.

``huggingface_hub`` reads ``models--ORG--NAME/refs/main`` (a commit id) and
``snapshots/<commit>/...`` offline, so ``HF_HUB_CACHE`` pointed here (with ``HF_HUB_OFFLINE=1``)
makes ``sw.Engine("gpt2-small", saes={...: "gpt2-small-res-jb/..."})`` run as it does with
network access. Models keep their real config keys and tokenizer behaviour (BOS, special
tokens, the -it models' chat templates) at toy widths, one layer deeper than the deepest SAE
(so transformers' last hidden state, which is normed, is never an SAE's hook), except where an SAE Lens loader takes
a width from a name (Gemma Scope: ``d_in`` 2304 from the repo, ``d_sae`` 16384 from
``width_16k``; Qwen Scope: 2048 and 32768 from the repo id): those models and SAEs have the
real widths, one layer, and weights that are mostly zeros (compressed) or strided views of a
small random tensor, so the cache writes in seconds and stays small on disk.

``python tests/hub_cache.py DIR`` writes one (for trying the notebook by hand).
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog, and then the dog sleeps all day long.",
    "I think that the capital of France is Paris, and the capital of Italy is Rome.",
    "Once upon a time there was a little girl who loved music, songs and melodies.",
    "def add(a, b):\n    return a + b\n",
    "Hello! How are you today? I am fine, thank you very much for asking.",
]

GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
    "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
    "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}"
    "{% endif %}"
)
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Per tokenizer family: special tokens (in id order), bos, eos, whether the tokenizer itself
# puts BOS first (Gemma and Llama 3 do; GPT-2, GPT-NeoX and Qwen do not).
TOKENIZERS = {
    "gpt2": dict(specials=["<|endoftext|>"], bos="<|endoftext|>", eos="<|endoftext|>"),
    "neox": dict(specials=["<|endoftext|>", "<|padding|>"], bos="<|endoftext|>", eos="<|endoftext|>"),
    "gemma": dict(
        specials=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        bos="<bos>", eos="<eos>", pad="<pad>", add_bos=True,
    ),
    "llama3": dict(
        specials=["<|begin_of_text|>", "<|end_of_text|>"],
        bos="<|begin_of_text|>", eos="<|end_of_text|>", add_bos=True,
    ),
    "qwen": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], eos="<|endoftext|>"),
    "chatml": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        bos="<|im_start|>", eos="<|im_end|>",
    ),
}  # fmt: skip


def commit_of(repo_id: str) -> str:
    return hashlib.sha1(repo_id.encode()).hexdigest()


def snapshot(cache: Path, repo_id: str) -> Path:
    """A repo's snapshot folder in the cache (``refs/main`` written)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = commit_of(repo_id)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    folder = repo / "snapshots" / commit
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_tokenizer(folder: Path, family: str, chat_template: str | None = None) -> int:
    """A byte-level BPE tokenizer with the family's special tokens; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    spec = TOKENIZERS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=spec["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    bos = spec.get("bos")
    if spec.get("add_bos"):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )  # fmt: skip
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=spec["eos"],
        pad_token=spec.get("pad"),
        additional_special_tokens=[t for t in spec["specials"] if t not in (bos, spec["eos"])],
    )
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(folder)
    return tok.get_vocab_size()


def write_model(cache: Path, repo_id: str, family: str, make_config, chat_template=None):
    """A tiny random-weight checkpoint of ``make_config(vocab)``'s class, saved as the hub has it."""
    import transformers as tf

    folder = snapshot(cache, repo_id)
    vocab = write_tokenizer(folder, family, chat_template)
    config = make_config(vocab)
    torch.manual_seed(int(commit_of(repo_id)[:6], 16))
    model = getattr(tf, config.architectures[0])(config)
    model.save_pretrained(folder)
    if chat_template and family == "gemma":  # -it models stop at the end of a turn too
        gen = json.loads((folder / "generation_config.json").read_text())
        names = TOKENIZERS[family]["specials"]
        gen["eos_token_id"] = [names.index("<eos>"), names.index("<end_of_turn>")]
        (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return folder


def _ids(vocab: int, family: str) -> dict:
    names = TOKENIZERS[family]["specials"]
    spec = TOKENIZERS[family]
    ids = {"eos_token_id": names.index(spec["eos"])}
    if spec.get("bos"):
        ids["bos_token_id"] = names.index(spec["bos"])
    if spec.get("pad"):
        ids["pad_token_id"] = names.index(spec["pad"])
    return ids | {"vocab_size": vocab}


def _cfg(cls_name: str, arch: str, family: str, **kw):
    def make(vocab: int):
        import transformers as tf

        return getattr(tf, cls_name)(architectures=[arch], **_ids(vocab, family), **kw)

    return make


LLAMA31_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
}  # fmt: skip
GEMMA2 = dict(
    hidden_size=2304, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=256, sliding_window=4096,
    attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=8192,
    hidden_activation="gelu_pytorch_tanh",
)  # fmt: skip
# repo id -> (tokenizer family, config maker, chat template)
MODELS: dict[str, tuple[str, Callable, str | None]] = {
    "gpt2": ("gpt2", _cfg("GPT2Config", "GPT2LMHeadModel", "gpt2", n_embd=64, n_layer=10, n_head=4, n_positions=1024, n_ctx=1024), None),
    "EleutherAI/pythia-70m-deduped": ("neox", _cfg(
        "GPTNeoXConfig", "GPTNeoXForCausalLM", "neox", hidden_size=64, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, rotary_pct=0.25, rotary_emb_base=10000,
        max_position_embeddings=2048,
        use_parallel_residual=True, tie_word_embeddings=False), None),
    "google/gemma-2-2b": ("gemma", _cfg("Gemma2Config", "Gemma2ForCausalLM", "gemma", **GEMMA2), None),
    "google/gemma-2-2b-it": ("gemma", _cfg("Gemma2Config", "Gemma2ForCausalLM", "gemma", **GEMMA2), GEMMA2_TEMPLATE),
    "google/gemma-3-270m-it": ("gemma", _cfg(
        "Gemma3TextConfig", "Gemma3ForCausalLM", "gemma", hidden_size=64, intermediate_size=128,
        num_hidden_layers=14, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        query_pre_attn_scalar=256, sliding_window=512, sliding_window_pattern=6,
        max_position_embeddings=32768,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
        GEMMA3_TEMPLATE),
    "meta-llama/Llama-3.1-8B": ("llama3", _cfg(
        "LlamaConfig", "LlamaForCausalLM", "llama3", hidden_size=64, intermediate_size=128,
        num_hidden_layers=17, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=131072, rope_parameters=LLAMA31_ROPE, tie_word_embeddings=False), None),
    "Qwen/Qwen3-1.7B-Base": ("qwen", _cfg(
        "Qwen3Config", "Qwen3ForCausalLM", "qwen", hidden_size=2048, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        max_position_embeddings=32768, tie_word_embeddings=True), None),
    # an architecture only TransformerLens runs here (GPT-Neo)
    "EleutherAI/gpt-neo-125M": ("gpt2", _cfg(
        "GPTNeoConfig", "GPTNeoForCausalLM", "gpt2", hidden_size=64, num_layers=2, num_heads=4,
        attention_types=[[["global", "local"], 1]], window_size=256, max_position_embeddings=2048), None),
    "HuggingFaceTB/SmolLM2-360M-Instruct": ("chatml", _cfg(
        "LlamaConfig", "LlamaForCausalLM", "chatml", hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=8192, tie_word_embeddings=True), SMOLLM2_TEMPLATE),
}  # fmt: skip


# ------------------------------------------------------------------------------- SAEs
def _directions(d_sae: int, d_in: int, live: int, seed: int) -> torch.Tensor:
    """Decoder rows [d_sae, d_in]: ``live`` random unit rows, the rest zero."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.zeros(d_sae, d_in)
    rows[:live] = torch.nn.functional.normalize(torch.randn(live, d_in, generator=g), dim=1)
    return rows


def _bias(n: int, seed: int, scale: float = 0.05) -> torch.Tensor:
    return scale * torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _safetensors(path: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def write_jb_style(folder: Path, hook: str, model: str, d_in: int, d_sae: int, seed: int) -> None:
    """SAE Lens' pre-6 flat ``cfg.json`` + ``sae_weights.safetensors`` (jbloom's reformatted
    GPT-2 folders, ctigges' Pythia ones)."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model_name": model, "hook_point": hook, "hook_point_layer": int(hook.split(".")[1]),
        "hook_point_head_index": None, "d_in": d_in, "d_sae": d_sae, "dtype": "torch.float32",
        "device": "cpu", "context_size": 128, "prepend_bos": True, "lp_norm": 1,
        "dataset_path": "Skylion007/openwebtext", "apply_b_dec_to_input": True,
        "finetuning_scaling_factor": False, "normalize_sae_decoder": True,
    }  # fmt: skip
    (folder / "cfg.json").write_text(json.dumps(cfg))
    w_dec = _directions(d_sae, d_in, d_sae, seed)
    _safetensors(
        folder / "sae_weights.safetensors",
        {"W_enc": w_dec.T * 2.0, "W_dec": w_dec, "b_enc": _bias(d_sae, seed + 1) - 0.02,
         "b_dec": _bias(d_in, seed + 2)},
    )  # fmt: skip


def write_gemma_scope(folder: Path, d_in: int, d_sae: int, live: int, seed: int) -> None:
    """Gemma Scope's ``params.npz`` (W_enc, W_dec, b_enc, b_dec, threshold), compressed: only
    the first ``live`` features have weights."""
    folder.mkdir(parents=True, exist_ok=True)
    w_dec = _directions(d_sae, d_in, live, seed)
    b_enc = torch.full((d_sae,), -1.0)
    b_enc[:live] = _bias(live, seed + 1)
    threshold = torch.full((d_sae,), 0.02)
    np.savez_compressed(
        folder / "params.npz",
        W_enc=(w_dec.T * 3.0).numpy(), W_dec=w_dec.numpy(), b_enc=b_enc.numpy(),
        b_dec=_bias(d_in, seed + 2).numpy(), threshold=threshold.numpy(),
    )  # fmt: skip


def write_gemma_scope_2(folder: Path, d_in: int, d_sae: int, seed: int, layer: int) -> None:
    """Gemma Scope 2's ``params.safetensors`` (lower-case w_enc, w_dec) and ``config.json``."""
    w_dec = _directions(d_sae, d_in, d_sae, seed)
    _safetensors(
        folder / "params.safetensors",
        {"w_enc": w_dec.T * 3.0, "w_dec": w_dec, "b_enc": _bias(d_sae, seed + 1),
         "b_dec": _bias(d_in, seed + 2), "threshold": torch.full((d_sae,), 0.05)},
    )  # fmt: skip
    cfg = {"architecture": "jump_relu", "model_name": "google/gemma-3-270m-it",
           "hf_hook_point_in": f"model.layers.{layer}.output", "width": d_sae, "l0": 60}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))


def write_llama_scope(
    folder: Path, layer: int, d_in: int, d_sae: int, seed: int, norm_factor: float
):
    """Llama Scope's ``hyperparams.json`` + ``checkpoints/final.safetensors`` (encoder/decoder
    as ``nn.Linear`` weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    hyper = {
        "d_model": d_in, "d_sae": d_sae, "hook_point_in": f"blocks.{layer}.hook_resid_post",
        "hook_point_out": f"blocks.{layer}.hook_resid_post", "jump_relu_threshold": 0.01,
        "dataset_average_activation_norm": {"in": d_in**0.5 / norm_factor, "out": d_in**0.5 / norm_factor},
        "act_fn": "jumprelu", "top_k": 50, "sparsity_include_decoder_norm": True,
    }  # fmt: skip
    (folder / "hyperparams.json").write_text(json.dumps(hyper))
    w_dec = _directions(d_sae, d_in, d_sae, seed)
    _safetensors(
        folder / "checkpoints" / "final.safetensors",
        {"encoder.weight": w_dec * 2.0, "decoder.weight": w_dec.T, "encoder.bias": _bias(d_sae, seed + 1),
         "decoder.bias": _bias(d_in, seed + 2)},
    )  # fmt: skip


def write_qwen_scope(path: Path, d_in: int, d_sae: int, seed: int) -> None:
    """Qwen Scope's ``layerN.sae.pt`` (W_enc [d_sae, d_in], W_dec [d_in, d_sae]): the matrices
    are strided views of one small random vector (rows shifted copies), so the file is small.
    Spread encoder biases keep the k-th and (k+1)-th activations apart (rows this alike would
    otherwise tie within float32 noise, and TopK's choice would depend on the runtime)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(d_sae + d_in, generator=g) / d_in**0.5
    w_enc = torch.as_strided(base, (d_sae, d_in), (1, 1))
    w_dec = torch.as_strided(base, (d_in, d_sae), (1, 1))
    buf = io.BytesIO()
    torch.save(
        {"W_enc": w_enc, "W_dec": w_dec, "b_enc": _bias(d_sae, seed + 1, 0.5), "b_dec": _bias(d_in, seed + 2)},
        buf,
    )  # fmt: skip
    path.write_bytes(buf.getvalue())


# Where each flagship family's SAE lands: (release, sae id) as users type them.
FAMILIES = {
    "jb": ("gpt2-small-res-jb", "blocks.8.hook_resid_pre"),
    "gemma-scope": ("gemma-scope-2b-pt-res-canonical", "layer_0/width_16k/canonical"),
    "gemma-scope-2": ("gemma-scope-2-270m-it-res", "layer_12_width_16k_l0_medium"),
    "llama-scope": ("llama_scope_lxr_8x", "l15r_8x"),
    "pythia": ("pythia-70m-deduped-res-sm", "blocks.0.hook_resid_post"),
    "qwen-scope": ("qwen-scope-3-1.7b-base-w32k-l50", "layer0"),
}


def write_saes(cache: Path) -> None:
    jb = snapshot(cache, "jbloom/GPT2-Small-SAEs-Reformatted")
    for layer in (0, 8):
        hook = f"blocks.{layer}.hook_resid_pre"
        write_jb_style(jb / hook, hook, "gpt2-small", 64, 256, seed=10 + layer)
    write_gemma_scope(
        snapshot(cache, "google/gemma-scope-2b-pt-res") / "layer_0/width_16k/average_l0_105",
        d_in=2304, d_sae=16384, live=512, seed=20,
    )  # fmt: skip
    write_gemma_scope_2(
        snapshot(cache, "google/gemma-scope-2-270m-it") / "resid_post/layer_12_width_16k_l0_medium",
        d_in=64, d_sae=512, seed=30, layer=12,
    )  # fmt: skip
    write_llama_scope(
        snapshot(cache, "fnlp/Llama3_1-8B-Base-LXR-8x") / "Llama3_1-8B-Base-L15R-8x",
        layer=15, d_in=64, d_sae=512, seed=40, norm_factor=_registry_norm("llama_scope_lxr_8x", "l15r_8x"),
    )  # fmt: skip
    write_jb_style(
        snapshot(cache, "ctigges/pythia-70m-deduped__res-sm_processed") / "0-res-sm",
        "blocks.0.hook_resid_post", "pythia-70m-deduped", 64, 256, seed=50,
    )  # fmt: skip
    write_qwen_scope(
        snapshot(cache, "Qwen/SAE-Res-Qwen3-1.7B-Base-W32K-L0_50") / "layer0.sae.pt",
        d_in=2048, d_sae=32768, seed=60,
    )  # fmt: skip


def _registry_norm(release: str, sae_id: str) -> float:
    from steer_widgets.sae.releases import release_info

    return float(release_info(release).sae(sae_id).get("norm_scaling_factor") or 1.0)


def build(root: Path) -> Path:
    """Write the whole cache under ``root``; returns the folder for ``HF_HUB_CACHE``."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        cache = Path(root) / "hub"
        for repo_id, (family, make_config, template) in MODELS.items():
            write_model(cache, repo_id, family, make_config, template)
        write_saes(cache)
    finally:
        if was_on:
            logging.enable_progress_bar()
    return cache


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
