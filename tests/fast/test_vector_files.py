"""Vector files without a model: each format's layout, exact round trips, llama.cpp's sums
and checks, Neuronpedia's shapes, the layer map of other tools' objects, and refusals by
name before anything is written."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

import steer_widgets as sw
from steer_widgets.steering.requests import Direction, SteerRequest
from steer_widgets.steering.vectors import VectorList, request_vectors

W = 8


def vec(seed: int, width: int = W) -> torch.Tensor:
    return torch.randn(width, generator=torch.Generator().manual_seed(seed))


def added(vectors) -> dict[str, torch.Tensor]:
    """What a list of vectors adds per hook (strength * vector, summed)."""
    out: dict[str, torch.Tensor] = {}
    for v in vectors:
        t = float(v.strength) * torch.as_tensor(v.vector, dtype=torch.float32)
        out[v.hook] = out[v.hook] + t if v.hook in out else t
    return out


def finish(writer: GGUFWriter) -> None:
    """What every GGUF writer here ends with, as the gguf package requires."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_raw(path, tensors: dict, hint: str | None = "llama", dtype=np.float32) -> None:
    """A control-vector GGUF written directly with the gguf package, as other tools do."""
    writer = GGUFWriter(str(path), "controlvector")
    if hint is not None:
        writer.add_string("controlvector.model_hint", hint)
    for name, t in tensors.items():
        writer.add_tensor(name, np.asarray(t, dtype=dtype))
    finish(writer)


def test_gguf_layout_is_what_llama_cpp_and_repeng_read(tmp_path):
    vectors = [
        sw.Vector(vec(1), "blocks.2.hook_resid_post", 3.5),
        sw.Vector(vec(2), "blocks.4.hook_resid_pre", -2.0),  # the output of block 3
    ]
    path = sw.save_vectors(vectors, tmp_path / "v.gguf", model="llama")
    reader = GGUFReader(path)
    field = reader.get_field("general.architecture")
    assert bytes(field.parts[-1]).decode() == "controlvector"
    assert bytes(reader.get_field("controlvector.model_hint").parts[-1]).decode() == "llama"
    assert int(reader.get_field("controlvector.layer_count").parts[-1][0]) == 2
    tensors = {t.name: t for t in reader.tensors}
    assert sorted(tensors) == ["direction.2", "direction.3"]
    for t in tensors.values():
        assert t.tensor_type == GGMLQuantizationType.F32 and list(t.shape) == [W]
    assert np.array_equal(tensors["direction.2"].data, (3.5 * vec(1)).numpy())
    assert np.array_equal(tensors["direction.3"].data, (-2.0 * vec(2)).numpy())


def test_ours_to_gguf_to_ours_adds_exactly_the_same(tmp_path):
    vectors = [
        sw.Vector(vec(1), "blocks.2.hook_resid_post", 3.5),
        sw.Vector(vec(3), "blocks.2.hook_resid_post", 0.25),  # one layer: summed
        sw.Vector(vec(2), "blocks.5.hook_resid_post", 1.0),
    ]
    back = sw.load_vectors(sw.save_vectors(vectors, tmp_path / "v.gguf"))
    assert [v.hook for v in back] == ["blocks.2.hook_resid_post", "blocks.5.hook_resid_post"]
    want, got = added(vectors), added(back)
    assert all(torch.equal(want[h], got[h]) for h in want)


def test_a_hook_no_block_output_reaches_is_refused_and_nothing_written(tmp_path):
    for hook in ("blocks.0.hook_resid_pre", "blocks.3.hook_attn_out", "blocks.1.attn.hook_z"):
        path = tmp_path / "v.gguf"
        with pytest.raises(sw.VectorUnsupported, match=hook.replace(".", r"\.")) as err:
            sw.save_vectors([sw.Vector(vec(1), hook)], path)
        assert err.value.source == "vectors[0]"
        assert not path.exists()


def test_direction_zero_is_written_with_a_warning_that_llama_cpp_refuses_it(tmp_path):
    with pytest.warns(sw.VectorWarning, match="llama.cpp refuses"):
        path = sw.save_vectors([sw.Vector(vec(1), "blocks.0.hook_resid_post")], tmp_path / "a.gguf")
    (back,) = sw.load_vectors(path)  # repeng's first layer reads back as itself
    assert back.hook == "blocks.0.hook_resid_post" and torch.equal(back.vector, vec(1))


def test_files_and_scales_sum_as_llama_cpp_sums_them(tmp_path):
    write_raw(tmp_path / "a.gguf", {"direction.1": vec(1), "direction.3": vec(2)})
    write_raw(tmp_path / "b.gguf", {"direction.3": vec(3), "direction.03": vec(4)}, hint=None)
    got = sw.load_vectors([(tmp_path / "a.gguf", 2.0), (str(tmp_path / "b.gguf"), -0.5)])
    assert [v.hook for v in got] == ["blocks.1.hook_resid_post", "blocks.3.hook_resid_post"]
    assert got[0].strength == 2.0 and torch.equal(got[0].vector, vec(1))  # one part: kept
    want = torch.zeros(W)
    for t, s in ((vec(2), 2.0), (vec(3), -0.5), (vec(4), -0.5)):
        want += t * torch.tensor(s)
    assert got[1].strength == 1.0 and torch.equal(got[1].vector, want)
    single = sw.load_vectors((tmp_path / "a.gguf", 3.0))
    assert [v.strength for v in single] == [3.0, 3.0]


def test_a_gguf_llama_cpp_would_refuse_is_a_named_error(tmp_path):
    cases = {
        "name": {"weights.1": vec(1)},
        "negative": {"direction.-1": vec(1)},
        "f16": "f16",
        "2d": {"direction.1": np.ones((2, W))},
        "empty": {},
    }
    for name, tensors in cases.items():
        path = tmp_path / f"{name}.gguf"
        if tensors == "f16":
            write_raw(path, {"direction.1": vec(1)}, dtype=np.float16)
        else:
            write_raw(path, tensors)
        with pytest.raises(sw.VectorError) as err:
            sw.load_vectors(path)
        assert err.value.source == str(path), name
    write_raw(tmp_path / "wide.gguf", {"direction.1": vec(1, 6)})
    write_raw(tmp_path / "ok.gguf", {"direction.1": vec(1)})
    with pytest.raises(sw.VectorModelMismatch, match="6 wide, the others 8"):
        sw.load_vectors([tmp_path / "ok.gguf", tmp_path / "wide.gguf"])


def test_neuronpedia_shapes_read_and_round_trip(tmp_path):
    v = vec(5).tolist()
    shapes = {
        "steer": {"vectors": [{"steering_vector": v, "strength": 4.0, "hook": "blocks.3.hook_resid_post"}]},
        "upload": {"modelId": "gemma-2-2b-it", "layerNumber": 3, "hookType": "hook_resid_pre",
                   "vector": v, "vectorDefaultSteerStrength": 44, "vectorLabel": "x"},
        "record": {"vector": {"modelId": "m", "hookName": "blocks.3.hook_resid_pre", "values": v,
                              "defaultSteerStrength": 44}},
        "listed": [{"hookName": "blocks.3.hook_resid_pre", "vector": v,
                    "vectorDefaultSteerStrength": None}],
    }  # fmt: skip
    strengths = {"steer": 4.0, "upload": 44.0, "record": 44.0, "listed": 1.0}
    for name, body in shapes.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(body))
        (got,) = sw.load_vectors(path)
        assert got.strength == strengths[name] and torch.equal(got.vector, vec(5)), name
        hook = "blocks.3.hook_resid_post" if name == "steer" else "blocks.3.hook_resid_pre"
        assert got.hook == hook
    mine = [
        sw.Vector(vec(6), "blocks.1.attn.hook_z", -7.25),
        sw.Vector(vec(7), "blocks.2.hook_mlp_out", 2),
    ]
    back = sw.load_vectors(sw.save_vectors(mine, tmp_path / "mine.json", format="neuronpedia"))
    for a, b in zip(mine, back, strict=True):
        assert (a.hook, float(a.strength)) == (b.hook, b.strength) and torch.equal(
            a.vector, b.vector
        )


def test_hook_dicts_as_safetensors_and_pt(tmp_path):
    d = {"blocks.1.hook_resid_post": vec(1), "blocks.2.hook_mlp_out": vec(2)}
    torch.save(d, tmp_path / "v.pt")
    got = sw.load_vectors(tmp_path / "v.pt")
    assert {v.hook: v.vector for v in got}.keys() == d.keys()
    assert all(torch.equal(v.vector, d[v.hook]) and v.strength == 1.0 for v in got)
    mine = [
        sw.Vector(vec(3), "blocks.1.hook_resid_post", 2.0),
        sw.Vector(vec(4), "blocks.1.hook_resid_post", -1),
    ]
    back = sw.load_vectors(sw.save_vectors(mine, tmp_path / "v.safetensors", format="safetensors"))
    assert len(back) == 1 and torch.equal(added(back)["blocks.1.hook_resid_post"], added(mine)["blocks.1.hook_resid_post"])  # fmt: skip


def test_what_a_file_cannot_apply_is_recorded_and_named(tmp_path):
    vectors = VectorList(
        [sw.Vector(vec(1), "blocks.2.hook_resid_post", 2.0)],
        {"prompt_multiplier": 3.0, "steer_special_tokens": False},
    )
    with pytest.warns(sw.VectorWarning, match="prompt_multiplier=3.0, steer_special_tokens=False"):
        path = sw.save_vectors(vectors, tmp_path / "v.gguf")
    reader = GGUFReader(path)
    assert float(reader.get_field("steer_widgets.prompt_multiplier").parts[-1][0]) == 3.0
    assert bool(reader.get_field("steer_widgets.steer_special_tokens").parts[-1][0]) is False
    plain = VectorList(vectors, {"prompt_multiplier": 1.0, "steer_special_tokens": True})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sw.save_vectors(plain, tmp_path / "w.json", format="neuronpedia")


@dataclass
class FakeControlVector:  # repeng's ControlVector, duck-typed
    model_type: str
    directions: dict


@dataclass
class FakeSteeringVector:  # steering-vectors' SteeringVector, duck-typed
    layer_activations: dict
    layer_type: str = "decoder_block"


def test_other_tools_objects_land_where_they_add():
    cv = sw.load_vectors(FakeControlVector("llama", {3: vec(1).numpy(), 1: vec(2).numpy()}))
    assert [(v.hook, v.strength) for v in cv] == [
        ("blocks.1.hook_resid_post", 1.0), ("blocks.3.hook_resid_post", 1.0),
    ]  # fmt: skip
    kinds = {
        "decoder_block": "hook_resid_post",
        "self_attn": "hook_attn_out",
        "mlp": "hook_mlp_out",
    }
    for layer_type, kind in kinds.items():
        (got,) = sw.load_vectors(FakeSteeringVector({2: vec(3)}, layer_type))
        assert got.hook == f"blocks.2.{kind}" and torch.equal(got.vector, vec(3))
    for layer_type in ("input_layernorm", "post_attention_layernorm", "nope"):
        with pytest.raises(sw.VectorUnsupported, match=layer_type):
            sw.load_vectors(FakeSteeringVector({2: vec(3)}, layer_type))
    with pytest.raises(sw.VectorError, match="counts from the end"):
        sw.load_vectors(FakeControlVector("llama", {-1: vec(1).numpy()}))


def test_to_steering_vector_needs_one_layer_type():
    mixed = [
        sw.Vector(vec(1), "blocks.1.hook_resid_post"),
        sw.Vector(vec(2), "blocks.1.hook_mlp_out"),
    ]
    with pytest.raises(sw.VectorUnsupported, match="one layer_type"):
        sw.to_steering_vector(mixed)
    with pytest.raises(sw.VectorUnsupported, match="blocks.0.hook_resid_pre"):
        sw.to_steering_vector([sw.Vector(vec(1), "blocks.0.hook_resid_pre")])


@pytest.mark.parametrize(
    "source", [None, True, 7, b"x", "", "nope.gguf", "word " * 9000, "\x00", "\ud800", [], object()]
)
def test_bad_sources_are_named_errors(source):
    with pytest.raises(sw.VectorError):
        sw.load_vectors(source)


def test_bad_saves_are_named_errors_before_writing(tmp_path):
    good = [sw.Vector(vec(1), "blocks.1.hook_resid_post")]
    with pytest.raises(sw.VectorError) as err:
        sw.save_vectors(good, tmp_path / "v.bin", format="bin")
    assert err.value.source == "format"
    for path in (tmp_path, tmp_path / "no" / "v.gguf", None, "", tmp_path / "v.json", "nope"):
        with pytest.raises(sw.VectorError):
            sw.save_vectors(good, path)
    for vectors in ([], None, [None], [sw.Vector(vec(1), "blocks.1.hook_resid_post", float("nan"))],
                    [sw.Vector(torch.full((W,), float("inf")), "blocks.1.hook_resid_post")]):  # fmt: skip
        with pytest.raises(sw.VectorError):
            sw.save_vectors(vectors, tmp_path / "v.gguf")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(sw.VectorError):
        sw.load_vectors(tmp_path / "x.gguf", model="not a model")


def _direction(hook: str, seed: int, strength: float) -> Direction:
    return Direction(hook, vec(seed), strength)


def test_request_vectors_are_what_simple_additive_adds():
    request = SteerRequest("Hi", strength_multiplier=2.5, prompt_multiplier=2.0, sweep=(9.0,))
    got = request_vectors(request, [_direction("blocks.1.hook_resid_post", 1, 4.0)])
    assert got[0].strength == 2.5 * 4.0 and torch.equal(got[0].vector, vec(1))
    assert got.notes == {"prompt_multiplier": 2.0, "steer_special_tokens": True}
    for method in ("ORTHOGONAL_DECOMP", "PROJECTION_CAP"):
        with pytest.raises(sw.VectorUnsupported, match=method) as err:
            request_vectors(request.with_(steer_method=method), [])
        assert err.value.source == "steer_method"


def test_vectors_of_two_widths_at_one_layer_are_a_named_error(tmp_path):
    """blocks.2.hook_resid_post and blocks.3.hook_resid_pre are one control-vector layer."""
    two = [sw.Vector(vec(1, 4), "blocks.2.hook_resid_post"),
           sw.Vector(vec(2, 5), "blocks.3.hook_resid_pre")]  # fmt: skip
    with pytest.raises(sw.VectorModelMismatch, match="5 wide.*4"):
        sw.save_vectors(two, tmp_path / "v.gguf")
    with pytest.raises(sw.VectorModelMismatch, match="5 wide.*4"):
        sw.to_steering_vector(two)
    assert not (tmp_path / "v.gguf").exists()


@pytest.mark.parametrize("fmt", ["gguf", "neuronpedia", "safetensors"])
def test_a_file_that_cannot_be_written_is_a_named_error(fmt):
    """/proc takes no new files, even from root: the OSError is named, not raised raw."""
    suffix = {"gguf": ".gguf", "neuronpedia": ".json", "safetensors": ".safetensors"}[fmt]
    path = f"/proc/steer-widgets-test{suffix}"
    with pytest.raises(sw.VectorError, match="could not be written") as err:
        sw.save_vectors([sw.Vector(vec(1), "blocks.2.hook_resid_post")], path, format=fmt)
    assert err.value.source == path


def test_a_warning_points_at_the_callers_line(tmp_path):
    vectors = VectorList(
        [sw.Vector(vec(1), "blocks.2.hook_resid_post")], {"prompt_multiplier": 2.0}
    )
    with pytest.warns(sw.VectorWarning) as seen:
        sw.save_vectors(vectors, tmp_path / "v.gguf")
    assert seen[0].filename == __file__
    with pytest.warns(sw.VectorWarning) as seen:
        sw.save_vectors([sw.Vector(vec(1), "blocks.0.hook_resid_post")], tmp_path / "z.gguf")
    assert seen[0].filename == __file__


def test_to_steering_vector_refuses_attention_outputs_a_model_norms():
    """Gemma norms attention and MLP outputs before the residual sum: our hook_attn_out is
    after that norm, steering-vectors' self_attn output before it."""
    from types import SimpleNamespace

    def model(sandwich: bool):
        return SimpleNamespace(
            runtime=SimpleNamespace(cfg=SimpleNamespace(sandwich_norms=sandwich))
        )

    attn = [sw.Vector(vec(1), "blocks.2.hook_attn_out")]
    with pytest.raises(sw.VectorUnsupported, match="norms the output at blocks.2.hook_attn_out"):
        sw.to_steering_vector(attn, model=model(True))
    post = [sw.Vector(vec(1), "blocks.2.hook_resid_post")]
    assert sw.to_steering_vector(post, model=model(True)).layer_type == "decoder_block"
    assert sw.to_steering_vector(attn, model=model(False)).layer_type == "self_attn"


def fake_model(tmp_path, name: str, model_type: str, hub_id: str | None = None, layers: int = 4):
    """A loaded model as ``load_vectors(model=)`` reads it: its name and hub id, hook widths,
    depth, and the ``model_type`` of its folder's config.json."""
    from types import SimpleNamespace

    folder = tmp_path / f"model-{model_type}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    hooks = ("hook_resid_pre", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
    widths = {f"blocks.{k}.{h}": W for k in range(layers) for h in hooks}
    runtime = SimpleNamespace(cfg=SimpleNamespace(n_layers=layers), hook_widths=lambda: widths)
    return SimpleNamespace(name=name, hub_id=hub_id, runtime=runtime, source_dir=folder)


def write_dialz(path, model_type: str, directions: dict) -> None:
    """As dialz 1.1.4's ``SteeringVector.export_gguf`` writes (dialz/vector.py, PyPI wheel
    dialz-1.1.4)::

        arch = "steeringvector"
        writer = gguf.GGUFWriter(path, arch)
        writer.add_string(f"{arch}.model_hint", self.model_type)
        writer.add_uint32(f"{arch}.layer_count", len(self.directions))
        for layer in self.directions.keys():
            writer.add_tensor(f"direction.{layer}", self.directions[layer])

    ``model_type`` is ``model.config.model_type``; ``directions[layer]`` is float32 (PCA
    components or a mean difference ``.astype(np.float32)``) read at
    ``hidden_states[layer + 1]``, the output of ``model.layers[layer]``, and
    ``SteeringModel.set_control(v, scalar)`` adds ``scalar * directions[layer]`` to that
    layer's output."""
    arch = "steeringvector"
    writer = GGUFWriter(str(path), arch)
    writer.add_string(f"{arch}.model_hint", model_type)
    writer.add_uint32(f"{arch}.layer_count", len(directions))
    for layer in directions.keys():
        writer.add_tensor(f"direction.{layer}", directions[layer])
    finish(writer)


def write_easysteer(path, directions: dict, model_type: str = "unknown") -> None:
    """As EasySteer's ``StatisticalControlVector.export_gguf`` writes (easysteer/steer/
    utils.py, ZJU-REAL/EasySteer at 312c6d87166221ef54e372cf0c31d545d6b2a176)::

        arch = "controlvector"
        writer = gguf.GGUFWriter(path, arch)
        writer.add_string(f"{arch}.model_hint", self.model_type)
        writer.add_string(f"{arch}.method", self.method)
        writer.add_uint32(f"{arch}.layer_count", len(self.directions))
        # then each metadata value: int/float -> add_float32(f"{arch}.{key}"), str ->
        # add_string, a dict -> add_float32(f"{arch}.{key}.{subkey}") per number
        for layer in self.directions.keys():
            writer.add_tensor(f"direction.{layer}", self.directions[layer])

    ``model_type`` defaults to "unknown" ("Only echoed into the gguf model_hint field for
    repeng compatibility"); the repo's own experiment files carry user labels ("qwen",
    "qwen2.5"). Directions are ``direction.astype(np.float32)`` keyed by the decoder layer
    whose output the vLLM fork (EasySteer-vllm-v1) hooks and adds ``scale * vector`` to."""
    arch = "controlvector"
    writer = GGUFWriter(str(path), arch)
    writer.add_string(f"{arch}.model_hint", model_type)
    writer.add_string(f"{arch}.method", "diffmean")
    writer.add_uint32(f"{arch}.layer_count", len(directions))
    metadata = {"normalize": True, "n_positive": 12, "n_negative": 12, "token_pos": -1,
                "explained_variance": {"1": 0.5}}  # fmt: skip
    for key, value in metadata.items():
        if isinstance(value, (int, float)):
            writer.add_float32(f"{arch}.{key}", float(value))
        elif isinstance(value, dict):
            for subkey, subvalue in value.items():
                writer.add_float32(f"{arch}.{key}.{subkey}", float(subvalue))
    for layer in directions.keys():
        writer.add_tensor(f"direction.{layer}", directions[layer])
    finish(writer)


def test_dialz_files_land_at_the_layer_output_and_their_hint_is_checked(tmp_path):
    dirs = {3: vec(1).numpy(), 1: vec(2).numpy()}  # dialz's default order: last layer first
    write_dialz(tmp_path / "gemma.gguf", "gemma2", dirs)
    llama = fake_model(tmp_path, "org/Tiny-Llama", "llama")
    with pytest.raises(sw.VectorModelMismatch, match="'gemma2'.*'llama'") as err:
        sw.load_vectors(tmp_path / "gemma.gguf", model=llama)
    assert err.value.source == str(tmp_path / "gemma.gguf")
    write_dialz(tmp_path / "llama.gguf", "llama", dirs)
    got = sw.load_vectors(tmp_path / "llama.gguf", model=llama)
    assert [v.hook for v in got] == ["blocks.1.hook_resid_post", "blocks.3.hook_resid_post"]
    assert torch.equal(got[0].vector, vec(2)) and torch.equal(got[1].vector, vec(1))
    assert [v.strength for v in got] == [1.0, 1.0]  # set_control's scalar is the scale


def test_our_gguf_has_the_hint_dialz_import_gguf_requires(tmp_path):
    """dialz 1.1.4's ``import_gguf`` warns on another architecture but raises without
    ``steeringvector.model_hint``: ``modelf = reader.get_field("steeringvector.model_hint")
    ... raise ValueError(".gguf file missing steeringvector.model_hint field")``."""
    path = sw.save_vectors([sw.Vector(vec(1), "blocks.2.hook_resid_post")], tmp_path / "v.gguf", model="llama")  # fmt: skip
    reader = GGUFReader(path)
    modelf = reader.get_field("steeringvector.model_hint")
    assert modelf is not None and str(bytes(modelf.parts[-1]), encoding="utf-8") == "llama"
    directions = {int(t.name.split(".")[1]): t.data for t in reader.tensors}  # as dialz reads
    assert list(directions) == [2] and np.array_equal(directions[2], vec(1).numpy())


def test_easysteer_files_land_at_the_layer_output_and_their_label_is_not_checked(tmp_path):
    dirs = {0: vec(1).numpy(), 1: vec(2).numpy(), 2: vec(3).numpy()}
    write_easysteer(tmp_path / "e.gguf", dirs, model_type="qwen2.5")  # a label, not qwen2's type
    qwen = fake_model(tmp_path, "Qwen/Qwen2.5-1.5B-Instruct", "qwen2")
    got = sw.load_vectors(tmp_path / "e.gguf", model=qwen)
    assert [v.hook for v in got] == [f"blocks.{k}.hook_resid_post" for k in (0, 1, 2)]
    assert all(torch.equal(v.vector, vec(k + 1)) and v.strength == 1.0 for k, v in enumerate(got))
    write_easysteer(tmp_path / "u.gguf", dirs)  # EasySteer's default hint
    assert len(sw.load_vectors(tmp_path / "u.gguf", model=qwen)) == 3
    write_easysteer(tmp_path / "w.gguf", {1: np.ones(4, dtype=np.float32)})
    with pytest.raises(sw.VectorModelMismatch, match="4 wide"):  # widths are still checked
        sw.load_vectors(tmp_path / "w.gguf", model=qwen)


def test_a_neuronpedia_file_for_another_model_is_refused_by_its_model_id(tmp_path):
    smol = fake_model(
        tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct", "llama",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    )  # fmt: skip
    upload = {"modelId": "gpt2-small", "layerNumber": 2, "hookType": "hook_resid_pre",
              "vector": vec(5).tolist(), "vectorDefaultSteerStrength": 4}  # fmt: skip
    record = {"vector": {"modelId": "gemma-2-2b", "hookName": "blocks.2.hook_resid_pre",
                         "values": vec(5).tolist()}}  # fmt: skip
    for name, body, model in (("u", upload, "gpt2-small"), ("r", record, "gemma-2-2b")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(body))
        with pytest.raises(sw.VectorModelMismatch, match=f"'{model}'.*SmolLM2") as err:
            sw.load_vectors(path, model=smol)
        assert err.value.source == str(path)
        assert len(sw.load_vectors(path)) == 1  # without a model nothing is compared
    with pytest.raises(sw.VectorModelMismatch, match="'gpt2-small'"):
        sw.load_vectors(upload, model=smol)
    for same in ("SmolLM2-135M-Instruct", "smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):  # fmt: skip
        assert len(sw.load_vectors({**upload, "modelId": same}, model=smol)) == 1
    unnamed = {k: v for k, v in upload.items() if k != "modelId"}
    assert len(sw.load_vectors(unnamed, model=smol)) == 1
    # Neuronpedia's ids against the hub's: punctuation aside, and gpt2-small is gpt2
    llama31 = fake_model(tmp_path, "meta-llama/Llama-3.1-8B", "llama")
    assert len(sw.load_vectors({**upload, "modelId": "llama3.1-8b"}, model=llama31)) == 1
    gpt2 = fake_model(tmp_path, "gpt2", "gpt2", hub_id="gpt2")
    assert len(sw.load_vectors(upload, model=gpt2)) == 1


def test_our_neuronpedia_file_names_its_model_and_round_trips(tmp_path):
    smol = fake_model(
        tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct", "llama",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    )  # fmt: skip
    mine = [sw.Vector(vec(6), "blocks.1.hook_resid_post", 2.5)]
    path = sw.save_vectors(mine, tmp_path / "v.json", format="neuronpedia", model=smol)
    body = json.loads(path.read_text())
    assert body["modelId"] == "SmolLM2-135M-Instruct" and body["model"] == "llama"
    (back,) = sw.load_vectors(path, model=smol)
    assert back.strength == 2.5 and torch.equal(back.vector, vec(6))
    gguf_named = fake_model(tmp_path, "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "llama")
    assert len(sw.load_vectors(path, model=gguf_named)) == 1
    other = fake_model(tmp_path, "google/gemma-2-2b", "gemma2")
    with pytest.raises(sw.VectorModelMismatch, match="'SmolLM2-135M-Instruct'.*gemma-2-2b"):
        sw.load_vectors(path, model=other)
    plain = sw.save_vectors(mine, tmp_path / "p.json", format="neuronpedia", model="llama")
    assert "modelId" not in json.loads(plain.read_text())  # an architecture names no model


def test_a_home_that_does_not_exist_is_a_named_error(tmp_path):
    """``~nosuchuser`` makes ``Path.expanduser`` raise RuntimeError (no such home), which
    escaped raw from both calls."""
    path = "~nosuchuser-steer-widgets/v.gguf"
    with pytest.raises(sw.VectorError) as err:
        sw.load_vectors(path)
    assert err.value.source == path
    with pytest.raises(sw.VectorError, match="not a usable path") as err:
        sw.save_vectors([sw.Vector(vec(1), "blocks.1.hook_resid_post")], path)
    assert err.value.source == path
