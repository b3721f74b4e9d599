"""The offline default model: loads with no network, answers chat, matches transformers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import steer_widgets as sw
from steer_widgets.runtime.model import default_model_dir
from steer_widgets.steering.generation import Row, Sampling, decode

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def greedy_ids(engine, prompt, n: int) -> list[int]:
    return list(engine.generate(prompt, n_completion_tokens=n, temperature=0).token_ids)


def test_loads_and_answers_chat_with_network_unreachable(tmp_path):
    """A fresh process, hub offline and every proxy pointing at a closed port."""
    code = textwrap.dedent(
        """
        import steer_widgets as sw
        from steer_widgets.runtime.model import load_model
        engine = sw.Engine(load_model(), saes=[])
        out = engine.generate([{"role": "user", "content": "What is the capital of France?"}],
                              n_completion_tokens=12, temperature=0)
        print("ANSWER:" + out.text)
        """
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env |= {k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
    env |= {k.lower(): v for k, v in env.items() if k.endswith("_PROXY")}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = proc.stdout.split("ANSWER:", 1)[1]
    assert "Paris" in answer


@pytest.fixture(scope="module")
def hf_model(engine):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        (engine.model.source_dir or default_model_dir()), dtype=torch.float32
    ).eval()


def test_logits_match_transformers(engine, hf_model):
    ids = torch.tensor([engine.tokenizer.encode(CHAT).ids])
    with torch.no_grad():
        ref = hf_model(ids).logits
    ours = engine.model.runtime.forward(ids)
    assert (ours - ref).abs().max() < 1e-3


@pytest.mark.parametrize(
    "prompt",
    [CHAT, "The history of the printing press", [{"role": "user", "content": "Write a poem."}]],
)
def test_greedy_matches_transformers_token_for_token(engine, hf_model, prompt):
    n = 24
    ids = list(engine.tokenizer.encode(prompt).ids)
    ref = hf_model.generate(
        torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=engine.tokenizer.eos_id
    )[0, len(ids) :].tolist()
    assert greedy_ids(engine, prompt, n) == ref


def test_chat_template_has_single_bos_and_flags_scaffolding(engine):
    enc = engine.tokenizer.encode(CHAT)
    assert enc.ids.count(engine.tokenizer.bos_id) == 3  # system, user, assistant headers
    assert enc.ids[0] == engine.tokenizer.bos_id and enc.ids[1] != engine.tokenizer.bos_id
    content = [
        engine.tokenizer.hf.decode([i]) for i, s in zip(enc.ids, enc.special, strict=False) if not s
    ]
    assert "".join(content) == "What is the capital of France?"


def test_stops_at_eos_and_sampling_is_seeded(engine):
    short = engine.generate(CHAT, n_completion_tokens=40, temperature=0)
    assert short.stop == "eos" and short.token_ids[-1] == engine.tokenizer.eos_id
    a = engine.generate("Once upon a time", n_completion_tokens=12, temperature=1.0, seed=5)
    b = engine.generate("Once upon a time", n_completion_tokens=12, temperature=1.0, seed=5)
    c = engine.generate("Once upon a time", n_completion_tokens=12, temperature=1.0, seed=6)
    assert a.token_ids == b.token_ids != c.token_ids


def test_streaming_yields_growing_prefixes(engine):
    request = sw.SteerRequest(
        prompt="The sea is", types=("DEFAULT",), n_completion_tokens=6, seed=3
    )
    frames = list(engine.steer_stream(request))
    lengths = [len(f.outputs["DEFAULT"].token_ids) for f in frames]
    assert lengths[:6] == [1, 2, 3, 4, 5, 6] and frames[-1].done
    final = frames[-1].outputs["DEFAULT"].token_ids
    assert all(
        final[: len(f.outputs["DEFAULT"].token_ids)] == f.outputs["DEFAULT"].token_ids
        for f in frames
    )


def test_freq_penalty_changes_sampling(engine):
    base = dict(n_completion_tokens=16, temperature=1.0, seed=1)
    a = engine.generate("the the the the", freq_penalty=0.0, **base)
    b = engine.generate("the the the the", freq_penalty=2.0, **base)
    assert a.token_ids != b.token_ids


@pytest.mark.parametrize(
    ("prompt", "changes", "field"),
    [
        ("", {}, "prompt"),
        ("   ", {}, "prompt"),
        ("hi " * 9000, {}, "prompt"),
        ("hi", {"n_completion_tokens": -1}, "n_completion_tokens"),
        ("hi", {"n_completion_tokens": 0}, "n_completion_tokens"),
        ("hi", {"temperature": -1.0}, "temperature"),
        ([{"role": "robot", "content": "hi"}], {}, "prompt[0].role"),
        ([{"role": "user"}], {}, "prompt[0]"),
        ([], {}, "prompt"),
    ],
)
def test_bad_input_names_the_field(engine, prompt, changes, field):
    with pytest.raises(sw.RequestError) as info:
        engine.generate(prompt, **changes)
    assert info.value.field == field
    assert engine.generate("ok", n_completion_tokens=2).token_ids  # engine still usable


def test_chat_on_model_without_template_is_an_error(engine):
    from steer_widgets.runtime.tokens import Tokenizer

    hf = engine.tokenizer.hf
    saved = hf.chat_template
    try:
        hf.chat_template = None
        with pytest.raises(sw.RequestError, match="no chat template"):
            Tokenizer(hf).encode(CHAT)
    finally:
        hf.chat_template = saved


def test_unknown_model_offline_says_what_is_missing():
    with pytest.raises(OSError, match="not-a-real/model"):
        sw.load_model("not-a-real/model")


def test_decode_loop_direct(engine):
    """The low-level loop used by the engine: one row, greedy, no stop tokens."""
    ids = engine.tokenizer.encode("One, two, three,").ids
    steps = list(decode(engine.model.runtime, ids, [Row()], Sampling(0, 0, 0, 5), frozenset()))
    assert len(steps) == 5
    # greedy: each token is the argmax of a plain forward (no cache) over everything before it
    text = list(ids)
    for step in steps:
        with torch.no_grad():
            logits = engine.model.runtime.forward(torch.tensor([text]))[0, -1]
        assert step.tokens[0] == int(logits.argmax())
        text.append(step.tokens[0])


def test_layers_split_over_devices_give_the_same_logits(engine):
    """A model larger than one device is split layer-wise; here two 'devices' are the CPU."""
    from safetensors.torch import load_file

    from steer_widgets.runtime.transformer import Transformer, place_layers

    assert place_layers(["cuda:0", "cuda:1"], 4) == [
        torch.device(d) for d in ("cuda:0",) * 2 + ("cuda:1",) * 2
    ]
    state = load_file((engine.model.source_dir or default_model_dir()) / "model.safetensors")
    split = Transformer(engine.model.runtime.cfg, state, device=["cpu", "cpu"])
    ids = torch.tensor([engine.tokenizer.encode("Split me across devices").ids])
    assert torch.equal(split.forward(ids), engine.model.runtime.forward(ids))


def test_a_model_file_and_an_sae_folder_under_the_home_folder(engine, tmp_path, monkeypatch):
    """``~`` is the home folder for ``load_model`` and ``saes.add`` as for every file the
    package takes (``files.user_path``); before, both looked for a folder named ``~``."""
    from steer_widgets.runtime.model import gguf_path, load_model
    from steer_widgets.runtime.paths import cache_dir
    from steer_widgets.sae.store import SAEStore

    monkeypatch.setenv("STEER_WIDGETS_CACHE", str(cache_dir()))  # the same cache as before
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "model.gguf").symlink_to(gguf_path())
    source = engine.saes.sources()[0]
    (tmp_path / "sae").symlink_to(engine.saes.config(source).folder, target_is_directory=True)
    loaded = load_model("~/model.gguf")
    assert loaded.name == str(tmp_path / "model.gguf")
    prompt = "The capital of France is"
    ids = list(
        sw.Engine(loaded, saes=[]).generate(prompt, n_completion_tokens=4, temperature=0).token_ids
    )
    assert ids == list(engine.generate(prompt, n_completion_tokens=4, temperature=0).token_ids)
    store = SAEStore(engine.model.runtime.hook_widths())
    name = store.add("~/sae", "home-sae")
    assert store.config(name).hook_name == engine.saes.config(source).hook_name
