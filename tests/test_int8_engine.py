"""``products="int8"`` on the default model: every route still gives each row its solo
tokens and probabilities, at any thread count, and every place it cannot apply is a named
refusal before anything loads. (The kernel itself: ``test_int8_products.py``.)"""

from __future__ import annotations

import pytest
import torch
from test_evaluate import check_rows_exact
from test_invariance import assert_ragged_step_rows_equal_rows_alone
from test_quantized import random_blocks
from test_ragged import batch_requests, same, solo

import steer_widgets as sw
from steer_widgets.runtime import native, quant
from steer_widgets.runtime.invariance import ANY_ROWS

pytestmark = pytest.mark.skipif(native.extension() is None, reason="needs the native kernel")


@pytest.fixture(scope="module")
def engine8():
    return sw.Engine(sw.load_model(products="int8"))


def test_the_engine_reads_int8_blocks_and_its_logits_stay_near_float32(engine8, engine):
    runtime = engine8.model.runtime
    assert runtime.products == "int8"
    assert {lin.products for layer in runtime.layers for lin in (layer.wqkv, layer.w_down)} == {
        "int8"
    }
    ids = torch.tensor([engine.text("The ocean is deep and").ids])
    want, got = engine.model.runtime.forward(ids)[0], runtime.forward(ids)[0]
    assert not torch.equal(got, want)  # the activations' rounding shows
    assert torch.equal(got.argmax(-1), want.argmax(-1))  # and changes no greedy token here
    # the embedding lookups read the float32 layout: the same rows as the float32 model's
    rows = torch.tensor([0, 5, 49151])
    assert torch.equal(runtime.embed.rows(rows), engine.model.runtime.embed.rows(rows))


def test_a_ragged_step_of_many_rows_equals_each_row_alone(engine8):
    """More rows than the calibration measures, in one fused call a block."""
    assert engine8.model.runtime.row_groups["matmul"] == ANY_ROWS
    assert_ragged_step_rows_equal_rows_alone(engine8.model.runtime, rows=40)


def test_a_ragged_batch_equals_each_request_alone(engine8, sources):
    requests = batch_requests(engine8, sources)
    solos = {name: solo(engine8, r) for name, r in requests.items()}
    engine8.clear_caches()
    got = engine8.steer_batch(requests)
    for name, result in got.items():
        for label, completion in result.outputs.items():
            assert same(completion, solos[name][label]), (name, label)


def test_thread_counts_give_the_same_tokens(engine8, sources):
    request = sw.SteerRequest(
        "Tell me about the sea.", features=[sw.Feature(sources[1], 11, 40.0)], sweep=(2.0,),
        n_completion_tokens=12, temperature=0.8, seed=4,
    )  # fmt: skip
    threads, results = torch.get_num_threads(), []
    try:
        for n in (1, 3, 8):
            torch.set_num_threads(n)
            engine8.clear_caches()
            results.append(engine8.steer(request).outputs)
    finally:
        torch.set_num_threads(threads)
    assert results[0] == results[1] == results[2]


def test_evaluate_rows_equal_their_solo_runs(engine8, sources):
    steering = sw.SteerRequest("x", features=[sw.Feature(sources[-1], 3, 30.0)])
    ev = engine8.evaluate(
        steering, prompts=["I think", "The city"], strengths=(1.0, 2.0), progress=False,
        n_completion_tokens=6, temperature=0.7, seed=2,
    )  # fmt: skip
    check_rows_exact(engine8, ev)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"products": "int4"}, "one of"),
        ({"products": None}, "one of"),
        ({"products": "int8", "quantized": False}, "not a GGUF"),
        ({"products": "int8", "backend": "transformer_lens"}, "transformer_lens"),
        ({"products": "int8", "device": "meta"}, "CPU"),
        ({"products": "int8", "dtype": torch.bfloat16}, "float32 activations"),
        ({"products": "int8", "kernel": "onednn"}, "native"),
    ],
)
def test_where_int8_cannot_apply_it_is_refused_by_name(kwargs, says):
    with pytest.raises(sw.RequestError, match=says) as err:
        sw.load_model(**kwargs)
    assert err.value.field == "products"


def test_an_engine_takes_its_models_products_or_refuses_another(engine8, engine):
    assert sw.Engine(engine8.model, saes={}).model.runtime.products == "int8"
    with pytest.raises(sw.RequestError, match="loaded with products='float32'") as err:
        sw.Engine(engine.model, saes={}, products="int8")
    assert err.value.field == "products"


def test_the_float32_layout_comes_back_from_the_int8_one():
    """An int8 matrix holds one copy of its blocks: the float32 layout its lookups and its
    backward read is rearranged from it, and equals the one packed from the file."""
    for name in quant.SUPPORTED:
        k = 96 * quant.WEIGHTS[name] // quant.QK
        raw = random_blocks(name, 40, k, seed=7)
        back = quant.float_layout(quant.pack_int8(raw, name), quant.kernel_type(name))
        assert torch.equal(back, quant.pack(raw, name)), name
        lin8 = quant.QuantLinear(raw, name, k, products="int8")
        assert lin8.resident_bytes() == lin8.nbytes()  # one copy until read as floats
        lin32 = quant.QuantLinear(raw, name, k)
        assert torch.equal(lin8.dense(), lin32.dense()), name
        assert lin8.resident_bytes() == lin8.nbytes() + back.numel()  # the float layout kept
        assert lin32.resident_bytes() == lin32.nbytes()  # float32 reads its one layout


def test_records_name_the_setting_and_replay_only_where_it_holds(engine8, engine, sources):
    request = sw.SteerRequest(
        "The sea", features=[sw.Feature(sources[1], 11, 40.0)], n_completion_tokens=4, seed=1
    )
    record = engine8.steer(request).to_dict()
    assert record["products"] == "int8"
    assert engine8.steer(record).outputs == engine8.steer(request).outputs
    for replay in (engine.steer, engine.steer_stream, lambda r: engine.steer_batch({"a": r})):
        with pytest.raises(sw.RequestError, match="made with products='int8'") as err:
            replay(record)
        assert err.value.field in ("products", "requests['a'].products")
    assert engine.steer(request).to_dict()["products"] == "float32"
    ev = engine8.evaluate(
        request, prompts=["I think"], strengths=(1.0,), progress=False, n_completion_tokens=3
    )
    assert ev.to_dict()["products"] == "int8"
    with pytest.raises(sw.RequestError, match="made with products='int8'"):
        engine.evaluate(ev.to_dict(), progress=False)
    assert engine8.evaluate(ev.to_dict(), progress=False).rows == ev.rows


def test_a_saved_view_names_the_setting_and_loads_only_where_it_holds(engine8, engine, tmp_path):
    ex = sw.Explorer(engine8, live=False)
    ex.set(prompt="The sea", n_completion_tokens=3, seed=1)
    view = ex.save_view(tmp_path / "view.json")
    assert view["products"] == "int8"
    with pytest.raises(sw.RequestError, match="made with products='int8'"):
        sw.Explorer.load_view(tmp_path / "view.json", engine)
    loaded = sw.Explorer.load_view(tmp_path / "view.json", engine8)
    assert loaded.wait(60) and loaded.request() == ex.request()  # its run ends here


def test_packing_on_many_threads_gives_one_threads_bytes():
    """A matrix's chunks are packed on torch's thread count (``quant._packed``): at 4, 8 and
    16 threads (more than this machine's cores) each layout is byte for byte one thread's,
    for every type, with more chunks than threads."""
    before = torch.get_num_threads()
    rows = 40 * quant.CHUNK * quant.BLOCK + 5  # 41 chunks, the last one short
    try:
        for name in quant.SUPPORTED:
            k = 2 * quant.WEIGHTS[name]
            raw = random_blocks(name, rows, k, seed=11)
            torch.set_num_threads(1)
            want = [quant.pack(raw, name), quant.pack_int8(raw, name)]
            for threads in (4, 8, 16):
                torch.set_num_threads(threads)
                got = [quant.pack(raw, name), quant.pack_int8(raw, name)]
                assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (
                    name,
                    threads,
                )
    finally:
        torch.set_num_threads(before)
