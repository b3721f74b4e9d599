"""The researcher's first path, offline: models by hub or TransformerLens name and SAEs by
SAE Lens release id, against a hub cache the tests write (``hub_cache.py``).

One test per flagship release family (jb, Gemma Scope, Gemma Scope 2, Llama Scope, Pythia,
Qwen Scope): the engine by name on the fast runtime, the hook each SAE reads, its features
equal to SAE Lens' own ``SAE.from_pretrained`` of the same files on the model's own hook
values (TransformerLens' where it builds the model, with the release's
``model_from_pretrained_kwargs``; transformers' hidden states elsewhere), one steer, one
activation, the converted SAE in the user cache and reused. Then chat templates and BOS as
each tokenizer gives them, and the named errors a name can meet.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import httpx
import pytest
import torch

import steer_widgets as sw
from steer_widgets import errors
from steer_widgets.runtime.paths import cache_dir
from steer_widgets.runtime.transformer import Transformer
from steer_widgets.sae import releases

PROMPT = "The quick brown fox jumps over the lazy dog"
# family -> (model name as typed, release/sae id, hook, transformers hidden-state index)
CASES = {
    "jb": ("gpt2-small", "gpt2-small-res-jb/blocks.8.hook_resid_pre", "blocks.8.hook_resid_pre", 8),
    "gemma-scope": (
        "google/gemma-2-2b",
        "gemma-scope-2b-pt-res-canonical/layer_0/width_16k/canonical",
        "blocks.0.hook_resid_post",
        1,
    ),
    "gemma-scope-2": (
        "google/gemma-3-270m-it",
        "gemma-scope-2-270m-it-res/layer_12_width_16k_l0_medium",
        "blocks.12.hook_resid_post",
        13,
    ),
    "llama-scope": (
        "meta-llama/Llama-3.1-8B",
        "llama_scope_lxr_8x/l15r_8x",
        "blocks.15.hook_resid_post",
        16,
    ),
    "pythia": (
        "pythia-70m-deduped",
        "pythia-70m-deduped-res-sm/blocks.0.hook_resid_post",
        "blocks.0.hook_resid_post",
        1,
    ),
    "qwen-scope": (
        "Qwen/Qwen3-1.7B-Base",
        "qwen-scope-3-1.7b-base-w32k-l50/layer0",
        "blocks.0.hook_resid_post",
        1,
    ),
}
TL_BUILDS = {"jb": "gpt2-small", "pythia": "pythia-70m-deduped"}  # TransformerLens reads these
BIG = 2**31  # the Qwen Scope SAE is 512 MiB in float32


def _watched() -> list[Path]:
    """The user-cache folders a hub load could write to."""
    home = Path.home() / ".cache"
    return [
        home / "huggingface",
        home / "steer_widgets" / "saes",
        home / "steer_widgets" / "neuronpedia",
    ]


def _listing() -> dict[str, list[str]]:
    return {str(p): sorted(str(q) for q in p.rglob("*")) if p.exists() else [] for p in _watched()}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The hub cache as ``HF_HUB_CACHE`` (offline) and a temporary steer_widgets cache, for
    this module only (later modules see the user's caches again); on teardown, nothing new
    in the user's caches or in the work tree."""
    import huggingface_hub.constants as hf
    from hub_cache import build

    from steer_widgets.runtime import native

    native.extension()  # the compiled kernel from the user cache, before the cache moves
    before, tree = _listing(), _tree_files()
    root = tmp_path_factory.mktemp("by-name")
    cache = build(root)
    mp = pytest.MonkeyPatch()
    mp.setattr(hf, "HF_HUB_CACHE", str(cache))
    mp.setattr(hf, "HF_HUB_OFFLINE", True)
    mp.setenv("HF_HUB_CACHE", str(cache))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("STEER_WIDGETS_CACHE", str(root / "sw"))
    yield cache
    mp.undo()
    assert _listing() == before, "a hub load wrote into the user's cache"
    assert _tree_files() == tree, "a hub load wrote into the work tree"


def _tree_files() -> set[str]:
    """Files in the work tree that a hub load could leave (hub layouts, SAE files)."""
    root = Path(__file__).resolve().parents[1]
    names = ("models--*", "sae_weights.safetensors", "params.npz", "*.sae.pt")
    tops = [p for p in root.iterdir() if p.is_dir() and p.name not in (".venv", ".git")]
    return {str(p) for top in tops for n in names for p in top.rglob(n)} | {
        str(p) for n in names for p in root.glob(n)
    }


def _lens(location: str):
    """SAE Lens' own load of a release id from the same cache (its Gemma Scope 2 loader asks
    the hub for shapes over HTTP: answered from the cached file, as ours does)."""
    from sae_lens import SAE

    release, sae_id = location.split("/", 1)
    with warnings.catch_warnings(), releases.cached_shape_probe():
        warnings.simplefilter("ignore")
        sae = SAE.from_pretrained(release, sae_id, device="cpu")
    return sae[0] if isinstance(sae, tuple) else sae


def _hook_values(family: str, engine, text) -> torch.Tensor:
    """The SAE's input as its trainers computed it: TransformerLens with the release's
    ``model_from_pretrained_kwargs`` where it builds the model, else transformers' hidden
    state (the raw residual stream)."""
    cfg = engine.saes.config("sae")
    ids = torch.tensor([text.ids])
    if family in TL_BUILDS:
        from transformer_lens import HookedTransformer

        tl = HookedTransformer.from_pretrained_no_processing(
            TL_BUILDS[family], device="cpu", **cfg.model_kwargs
        )
        _, cache = tl.run_with_cache(ids, names_filter=cfg.hook_name)
        return cache[cfg.hook_name][0]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(engine.model.source_dir, dtype=torch.float32)
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
    return out.hidden_states[CASES[family][3]][0]


@pytest.mark.parametrize("family", list(CASES))
def test_flagship_release_by_name(hub, family, monkeypatch):
    name, location, hook, _ = CASES[family]
    engine = sw.Engine(name, saes={"sae": location}, sae_budget_bytes=BIG)
    assert isinstance(engine.model.runtime, Transformer), "not on the fast runtime"
    cfg = engine.saes.config("sae")
    assert cfg.hook_name == hook
    release, sae_id = location.split("/", 1)
    assert cfg.folder == cache_dir() / "saes" / release / sae_id.replace("/", "__")
    assert cfg.neuronpedia_id == releases.release_info(release).neuronpedia_id(sae_id)
    lens = _lens(location)
    ours = engine.saes.get("sae")
    assert torch.equal(ours.W_dec, lens.W_dec.float())
    # the release's overrides: jb's SAEs read TransformerLens' centred stream
    assert cfg.view.centre == bool(cfg.model_kwargs.get("center_writing_weights"))
    assert cfg.view.centre == (family == "jb")

    text = engine.text(PROMPT)
    x = _hook_values(family, engine, text)
    theirs = lens.encode(x).float().detach()
    got = engine.feature_values(text, "sae")
    keep = [i for i, s in enumerate(text.special) if not s]
    torch.testing.assert_close(got[keep], theirs[keep], atol=2e-4, rtol=1e-3)
    assert (theirs[keep] > 0).any(), "no feature fires: the comparison would be empty"
    recon = ours.decode(ours.encode(x), x)
    torch.testing.assert_close(recon, lens.decode(theirs).float().detach(), atol=2e-4, rtol=1e-3)

    index = int(theirs[keep].amax(0).argmax())  # a feature that fires here
    act = engine.activations(PROMPT, "sae", index)
    assert act.max_value == pytest.approx(float(theirs[keep, index].max()), rel=1e-3, abs=2e-4)

    other = 7 if index != 7 else 8  # the firing one may already push the model's own token
    request = sw.SteerRequest(
        PROMPT,
        features=[sw.Feature("sae", other, 100.0 * float(x.norm(dim=-1).median()))],
        n_completion_tokens=4,
        temperature=0,
    )
    out = engine.steer(request).outputs
    assert out["STEERED"].token_ids != out["DEFAULT"].token_ids

    # reused from the user cache: SAE Lens is not asked again
    from sae_lens import SAE

    monkeypatch.setattr(SAE, "from_pretrained", _must_not_run)
    again = sw.Engine(engine.model, saes={"sae": location}, sae_budget_bytes=BIG)
    assert again.saes.config("sae").folder == cfg.folder


def _must_not_run(*args, **kwargs):
    raise AssertionError("SAE Lens was asked to load an SAE already in the cache")


# -- tokenizers: chat templates and BOS as each tokenizer gives them --------------------------
CHAT = [{"role": "user", "content": "Hello there"}]


@pytest.mark.parametrize(
    "name, bos_from",
    [
        ("google/gemma-2-2b-it", "tokenizer"),  # <bos> from the tokenizer and the template
        ("google/gemma-3-270m-it", "tokenizer"),
        ("meta-llama/Llama-3.1-8B", "tokenizer"),  # <|begin_of_text|>
        ("gpt2-small", "engine"),  # no BOS from GPT-2's tokenizer: TransformerLens' rule
        ("pythia-70m-deduped", "engine"),
        ("Qwen/Qwen3-1.7B-Base", None),  # Qwen has no BOS at all
    ],
)
def test_prompts_tokenize_as_the_models_tokenizer_does(hub, name, bos_from):
    engine = sw.Engine(name, saes=[])
    hf = engine.tokenizer.hf
    ids = list(engine.text(PROMPT).ids)
    plain = hf(PROMPT)["input_ids"]
    bos = hf.bos_token_id
    assert ids == ([bos, *plain] if bos_from == "engine" else plain)
    assert (ids[0] == bos) == (bos_from is not None)
    if not engine.tokenizer.has_chat_template:
        with pytest.raises(sw.RequestError, match="no chat template"):
            engine.text(CHAT)
        return
    rendered = hf.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    chat = engine.text(CHAT)
    assert list(chat.ids) == hf(rendered, add_special_tokens=False)["input_ids"]
    assert rendered.startswith("<bos><start_of_turn>user\nHello there<end_of_turn>\n")
    assert rendered.endswith("<start_of_turn>model\n")
    assert list(chat.ids).count(bos) == 1 and chat.ids[0] == bos  # no double BOS
    content = [t for t, s in zip(chat.tokens, chat.special, strict=True) if not s]
    assert "".join(content).strip() == "Hello there"


def test_base_sae_fits_its_it_model_and_tl_names_resolve(hub):
    """Gemma Scope (trained on gemma-2-2b) on gemma-2-2b-it, the model named by its
    TransformerLens name; the SAE is the one already converted (same folder)."""
    engine = sw.Engine("gemma-2-2b-it", saes={"gs": CASES["gemma-scope"][1]}, sae_budget_bytes=BIG)
    assert engine.model.hub_id == "google/gemma-2-2b-it"
    assert isinstance(engine.model.runtime, Transformer)
    assert engine.saes.config("gs").hook_name == "blocks.0.hook_resid_post"


# -- errors a name can meet, each named before any work ----------------------------------------
def _hub_error(cls, status: int):
    url = "https://huggingface.co/api/models/x"
    response = httpx.Response(status, request=httpx.Request("GET", url))
    return cls(f"{status} from the hub", response=response)


def test_gated_and_missing_model_repos_are_named(hub, monkeypatch):
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from steer_widgets.runtime import model

    def gated(repo_id, filename):
        raise _hub_error(GatedRepoError, 403)

    monkeypatch.setattr(model, "_hub_file", gated)
    with pytest.raises(errors.ModelGated, match="gated: accept its licence"):
        sw.Engine("meta-llama/Llama-3.1-8B")

    def missing(repo_id, filename):
        raise _hub_error(RepositoryNotFoundError, 404)

    monkeypatch.setattr(model, "_hub_file", missing)
    with pytest.raises(errors.ModelNotFound, match="did you mean 'gpt2-small'"):
        sw.Engine("gpt2-smal")


def test_no_network_and_no_cache_is_named(hub):
    with pytest.raises(errors.ModelUnavailable, match="not in the hub cache") as err:
        sw.Engine("google/gemma-2-9b")
    assert str(hub) in str(err.value) and "HF_HUB_OFFLINE" in str(err.value)
    assert isinstance(err.value, OSError)  # what callers caught before
    engine = sw.Engine("gpt2-small", saes=[])
    with pytest.raises(errors.SourceUnavailable, match="not in the hub cache"):
        engine.saes.add("gpt2-small-res-jb/blocks.3.hook_resid_pre")


def test_gated_sae_repo_is_named(hub, monkeypatch):
    from huggingface_hub.errors import GatedRepoError
    from sae_lens import SAE

    def gated(*args, **kwargs):
        raise OSError("could not load") from _hub_error(GatedRepoError, 403)

    monkeypatch.setattr(SAE, "from_pretrained", gated)
    engine = sw.Engine("gpt2-small", saes=[])
    with pytest.raises(errors.SourceUnavailable, match="jbloom/GPT2-Small-SAEs-Reformatted"):
        engine.saes.add("gpt2-small-res-jb/blocks.5.hook_resid_pre")


@pytest.mark.parametrize(
    "location, error, words",
    [
        ("gpt2-small-res-jbb/blocks.8.hook_resid_pre", errors.SourceNotFound, "'gpt2-small-res-jb'"),
        ("gpt2-small-res-jb/blocks.8.hook_resid_pree", errors.SourceNotFound, "'blocks.8.hook_resid_pre'"),
        ("pythia-70m-deduped-res-sm/blocks.0.hook_resid_post", errors.SourceModelMismatch, "pythia"),
        ("gemma-scope-2b-pt-transcoders/layer_0/width_16k/average_l0_76", errors.SourceUnsupported, "transcoder"),
        ("gemma-scope-2-270m-it-transcoders/transcoder/layer_12_width_16k_l0_big", errors.SourceUnsupported, "transcoder"),
        ("temporal-sae-gemma-2-2b/blocks.12.hook_resid_post", errors.SourceUnsupported, "temporal"),
        ("gpt2-small-res-jb", errors.SourceError, "release/sae_id"),
    ],
)  # fmt: skip
def test_release_ids_are_checked_against_the_registry_first(
    hub, monkeypatch, location, error, words
):
    """Refused from the registry alone: SAE Lens is never asked to load anything."""
    from sae_lens import SAE

    monkeypatch.setattr(SAE, "from_pretrained", _must_not_run)
    engine = sw.Engine("gpt2-small", saes=[])
    with pytest.raises(error, match=words):
        engine.saes.add(location)


# -- Neuronpedia: links, explanations on demand (a local server), offline -------------------
class _Neuronpedia:
    """Serves Neuronpedia's feature endpoint, ``GET /api/feature/{model}/{source}/{index}``,
    in its documented shape (the feature, ``explanations: [{description, ...}]``)."""

    def __init__(self, explanations: dict[str, dict[int, str]]) -> None:
        import http.server
        import threading

        self.asked: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.asked.append(self.path)
                parts = self.path.strip("/").split("/")
                if len(parts) != 5 or parts[:2] != ["api", "feature"]:
                    return self.send_error(404)
                model, source, index = parts[2], parts[3], int(parts[4])
                text = explanations.get(f"{model}/{source}", {}).get(index)
                body = {
                    "modelId": model, "layer": source, "index": str(index), "maxActApprox": 3.5,
                    "explanations": [] if text is None else [
                        {"description": text, "typeName": "oai_token-act-pair",
                         "explanationModelName": "gpt-4o-mini"}
                    ],
                }  # fmt: skip
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_neuronpedia_links_labels_and_offline(hub, monkeypatch):
    from steer_widgets.widgets.card import FeatureCard

    location = CASES["jb"][1]
    monkeypatch.delenv("NEURONPEDIA_URL", raising=False)
    engine = sw.Engine("gpt2-small", saes={"8-res-jb": location})
    fi = engine.feature_index("8-res-jb")
    assert fi.neuronpedia_id == "gpt2-small/8-res-jb"  # from SAE Lens' registry
    assert fi.url(100) == "https://www.neuronpedia.org/gpt2-small/8-res-jb/100"

    server = _Neuronpedia({"gpt2-small/8-res-jb": {5: "references to cats and kittens"}})
    try:
        monkeypatch.setenv("NEURONPEDIA_URL", server.url)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        shown: list[str] = []
        card = FeatureCard(engine, on_steer=lambda *a: None, on_error=shown.append)
        card.show("8-res-jb", 5)
        assert card.wait(10)  # the explanation comes from the card's worker thread
        assert shown == []
        assert "references to cats and kittens" in card.body.value
        assert f"href='{server.url}/gpt2-small/8-res-jb/5'" in card.body.value
        assert [i.index for i in fi.search("kittens")] == [5]
        assert fi.label(5) == "references to cats and kittens"
        card.show("8-res-jb", 5)  # asked once, then read from disk
        card.show("8-res-jb", 6)  # a feature without an explanation: its local label
        assert card.wait(10)
        assert server.asked == [
            "/api/feature/gpt2-small/8-res-jb/5",
            "/api/feature/gpt2-small/8-res-jb/6",
        ]
        assert fi.infos[6].label == ""  # none on Neuronpedia: the top-token label stays
        card.close()
    finally:
        server.close()
    # a fresh engine reads the labels from disk, with no server
    again = sw.Engine(engine.model, saes={"8-res-jb": location}).feature_index("8-res-jb")
    assert again.label(5) == "references to cats and kittens"
    unreachable = sw.Engine(engine.model, saes={"8-res-jb": location})
    card = FeatureCard(unreachable, on_steer=lambda *a: None, on_error=shown.append)
    card.show("8-res-jb", 7)
    assert card.wait(10)
    assert "could not be reached" in card.body.value and shown == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: a clear note, the local label
    card.show("8-res-jb", 8)
    assert "need the network (HF_HUB_OFFLINE set)" in card.body.value
    assert unreachable.feature_index("8-res-jb").label(8) in card.body.value
    card.close()


def test_an_it_model_by_name_chats_stops_searches_and_opens_the_explorer(hub):
    """Gemma 3 270M IT with Gemma Scope 2 by name: a chat stops at ``<end_of_turn>`` (its
    generation_config's eos, not the tokenizer's), concept vector, feature search, explorer."""
    name, location, hook, _ = CASES["gemma-scope-2"]
    engine = sw.Engine(name, saes={"12-gs2": location})
    end_of_turn = engine.tokenizer.hf.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn in engine.stop_ids and engine.tokenizer.eos_id in engine.stop_ids
    vector = engine.concept_vector("cats")
    assert vector.hook in engine.hook_names and vector.strength > 0
    matches = engine.search_features("cats", sources=["12-gs2"], n=3)
    assert len(matches) == 3 and all(m.source == "12-gs2" and m.label for m in matches)
    ex = sw.Explorer(
        engine, prompt="Tell me about cats", chat=True, n_completion_tokens=6,
        features=[("12-gs2", 3, 10.0)],
    )  # fmt: skip
    ex.wait()
    assert sorted(ex.outputs) == ["DEFAULT", "STEERED"] and not ex.error


def test_other_architectures_run_through_transformer_lens_by_name(hub):
    """GPT-Neo is not a fast-runtime architecture: by its TransformerLens name it loads from
    the hub cache through TransformerLens."""
    from steer_widgets.runtime.tl_runtime import TransformerLensRuntime

    engine = sw.Engine("gpt-neo-125M", saes=[])
    assert isinstance(engine.model.runtime, TransformerLensRuntime)
    assert engine.model.hub_id == "EleutherAI/gpt-neo-125M"
    out = engine.generate(PROMPT, n_completion_tokens=3, temperature=0)
    assert len(out.token_ids) == 3


def test_a_release_reads_the_same_features_through_transformer_lens(hub):
    """gpt2-small-res-jb on TransformerLens' runtime (``backend="transformer_lens"``) reads
    what it reads on the fast runtime: the release's centring is applied at the hook on both."""
    from steer_widgets.runtime.tl_runtime import TransformerLensRuntime

    name, location, _, _ = CASES["jb"]
    fast = sw.Engine(name, saes={"sae": location})
    tl = sw.Engine(name, saes={"sae": location}, backend="transformer_lens")
    assert isinstance(tl.model.runtime, TransformerLensRuntime)
    assert tl.saes.config("sae").view.centre and fast.saes.config("sae").view.centre
    text = fast.text(PROMPT)
    assert tl.text(PROMPT).ids == text.ids
    torch.testing.assert_close(
        tl.feature_values(text, "sae"), fast.feature_values(text, "sae"), atol=2e-4, rtol=1e-3
    )


def test_a_base_model_without_chat_template_gets_concepts_and_the_explorer(hub):
    """GPT-2 has no chat template: the shipped (chat) neutral and contrast sets are read as
    plain text, so typical norms, concept vectors, search and the explorer's feature rows
    work (they refused every feature before)."""
    name, location, hook, _ = CASES["jb"]
    engine = sw.Engine(name, saes={"8-res-jb": location})
    assert not engine.tokenizer.has_chat_template
    assert engine.typical_norm(hook) > 0
    assert engine.concept_vector("cats").hook in engine.hook_names
    assert len(engine.search_features("cats", n=2)) == 2
    ex = sw.Explorer(
        engine, prompt=PROMPT, n_completion_tokens=4, temperature=0,
        features=[("8-res-jb", 3, 1.0)],
    )  # fmt: skip
    ex.wait()
    assert sorted(ex.outputs) == ["DEFAULT", "STEERED"] and not ex.error
