"""The public API as a table of calls, each argument with good values and odd ones, for the
property tests (``test_properties.py``) and for fuzzing with other seeds.

Every call takes keyword arguments drawn from its ``good`` strategies; an example swaps up to
two of them for an odd value of any type (or adds an unknown keyword). What the call must do:
return a result when nothing was swapped, and otherwise either return or raise a
``SteerWidgetsError`` that names what it refused (``field`` or ``source``), before any work.
The explorer may refuse in its status line instead of raising: then its error must say so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hypothesis import strategies as st

import steer_widgets as sw

NAN = math.nan
HOOK = "blocks.3.hook_resid_post"
UNKNOWN = "nope"  # an unknown keyword argument


def odd_values() -> list[Any]:
    """Values of every type that no argument takes as given (or takes only at an edge)."""
    return [
        None, True, False, b"I think that", bytearray(b"x"), "", " ", "\x00", "\ud800", "nope",
        "é漢🙂\u200b", "word " * 9000, 0, -1, 1, 2**64, -(2**63) - 1, 10**30, 1.5, -0.0, NAN,
        math.inf, -math.inf, [], [[]], [1, [2, [3]]], [None], ["abc"], [1.5], [-1], [10**9],
        (), {}, {"a": 1}, {"role": "user"}, [{"role": "user"}], object(), torch.zeros(0),
        torch.ones(3, dtype=torch.int64), torch.zeros(2, 576), torch.full((576,), NAN),
        torch.ones(576, dtype=torch.bool), torch.ones(576, dtype=torch.float16), torch.tensor(3.0),
        sw.Feature("no-such-sae", 1, 1.0), sw.Completion("x", (1, 2)),
    ]  # fmt: skip


ODD = st.sampled_from(odd_values())


@dataclass
class Call:
    """One public function: ``run(engine, explorer, **kwargs)`` and a strategy per argument."""

    name: str
    run: Callable[..., Any]
    good: dict[str, st.SearchStrategy]
    explorer: bool = False  # refusals may land in the status line
    unknown_ok: bool = False  # takes **kwargs of its own (say, Explorer settings)
    only_odd: bool = False  # a good call is too slow for a property run (a model load)
    odd: dict[str, list] = field(default_factory=dict)  # extra odd values per argument


def calls(engine, sources: list[str], tmp: Path) -> list[Call]:
    """The table. ``tmp`` is a folder the views may be written to."""
    early, late = sources[0], sources[-1]
    hooks = {s: engine.saes.config(s).hook_name for s in sources}
    width = engine.saes.config(early).d_in
    direction = torch.randn(width, generator=torch.Generator().manual_seed(0))
    prompt = st.sampled_from(["I think that", [{"role": "user", "content": "Hi there"}]])
    source = st.sampled_from([early, late])
    index = st.sampled_from([0, 11, 4095])
    count = st.integers(1, 5)
    request = st.builds(
        sw.SteerRequest, prompt=prompt, features=st.just((sw.Feature(early, 11, 20.0),)),
        n_completion_tokens=st.just(1), temperature=st.sampled_from([0.0, 0.7]),
        seed=st.integers(0, 3),
    )  # fmt: skip
    completion = st.sampled_from([None, [11, 12], (2,), sw.Completion(" yes", (4541,), "length")])
    sampling = {"n_completion_tokens": st.just(1), "seed": st.integers(0, 3)}
    views = _view_files(tmp)
    vector_file = sw.save_vectors([sw.Vector(direction, HOOK, 2.0)], tmp / "vector.gguf")
    examples = st.sampled_from([["I love dogs.", "Dogs bark at night."], None])
    e = engine

    def ex_call(method: str):
        return lambda engine, ex, **kw: getattr(ex, method)(**kw)

    def row_call(method: str):
        """A call on row 0, made on an explorer whose row 0 is a feature (so a good row is
        valid whatever the calls before it did)."""

        def run(engine, ex, **kw):
            while ex.features_ui.rows:
                ex.remove_feature(0)
            ex.add_feature(early, 11)
            return getattr(ex, method)(**kw)

        return run

    chat = engine.chat(features=[sw.Feature(early, 11, 20.0)], n_completion_tokens=2,
                       temperature=0.0)  # fmt: skip
    chat.say("Hi")  # a turn to edit
    return [
        Call("steer", lambda engine, ex, **kw: engine.steer(**kw), {"request": request}),
        Call("steer_stream", lambda engine, ex, **kw: list(engine.steer_stream(**kw)),
             {"request": request}),
        Call("steer_batch", lambda engine, ex, **kw: engine.steer_batch(**kw),
             {"requests": request.map(lambda r: {"a": r, "b": r.with_(features=(sw.Feature(late, 3, 9.0),))})}),
        Call("plan", lambda engine, ex, **kw: engine.plan(**kw), {"request": request}),
        Call("chat", lambda engine, ex, **kw: engine.chat(**kw),
             {"features": st.just([sw.Feature(early, 11, 20.0)]), "system": st.just("Be brief."),
              "temperature": st.sampled_from([0.0, 0.7]), "n_completion_tokens": st.just(2)}),
        Call("Chat.say", lambda engine, ex, **kw: chat.say(**kw), {"text": st.just("Hi there")},
             odd={"text": ["", " ", 7, ["Hi"]]}),
        Call("Chat.edit", lambda engine, ex, **kw: chat.edit(**kw),
             {"turn": st.just(0), "text": st.just("Hello")}, odd={"turn": [-1, 99, 0.5]}),
        Call("generate", lambda engine, ex, **kw: engine.generate(**kw),
             {"prompt": prompt, **sampling}),
        Call("samples", lambda engine, ex, **kw: engine.samples(**kw),
             {"prompt": prompt, "n": st.integers(1, 2), **sampling}),
        Call("token_logprobs", lambda engine, ex, **kw: engine.token_logprobs(**kw),
             {"prompt": prompt, "completion": completion.filter(lambda c: c is not None)}),
        Call("result", lambda engine, ex, **kw: engine.result(**kw),
             {"request": request.map(lambda r: r.with_(types=("DEFAULT",))),
              "outputs": st.just({"DEFAULT": sw.Completion(" yes", (4541,), "length")})}),
        Call("text", lambda engine, ex, **kw: engine.text(**kw),
             {"prompt": prompt, "completion": completion}),
        Call("feature_values", lambda engine, ex, **kw: engine.feature_values(**kw),
             {"text": st.just(e.text("I think that")), "source": source,
              "index": st.sampled_from([None, 0, 4095])}),
        Call("activations", lambda engine, ex, **kw: engine.activations(**kw),
             {"prompt": prompt, "source": source, "index": index, "completion": completion}),
        Call("top_features_per_token",
             lambda engine, ex, **kw: engine.top_features_per_token(**kw),
             {"prompt": prompt, "source": source, "k": count, "completion": completion}),
        Call("top_features", lambda engine, ex, **kw: engine.top_features(**kw),
             {"prompt": st.just("I think that"), "source": source, "n": count,
              "positions": st.sampled_from([None, [1, 2], [-1]]),
              "rank_by": st.sampled_from(["max", "sum"]), "completion": st.just(None)}),
        Call("neighbours", lambda engine, ex, **kw: engine.neighbours(**kw),
             {"source": source, "index": index, "n": count}),
        Call("feature_index", lambda engine, ex, **kw: engine.feature_index(**kw),
             {"source": source}),
        Call("concept_vector", lambda engine, ex, **kw: engine.concept_vector(**kw),
             {"positive": examples.filter(bool), "negative": st.just(None),
              "hook": st.sampled_from([None, HOOK])}),
        Call("search_features", lambda engine, ex, **kw: engine.search_features(**kw),
             {"query": st.just("dogs"), "sources": st.sampled_from([None, [late]]),
              "n": count, "examples": examples}),
        Call("decompose", lambda engine, ex, **kw: engine.decompose(**kw),
             {"vector": st.sampled_from([direction, sw.Vector(direction, hooks[early], 2.0)]),
              "source": st.just(early), "n": count}),
        Call("default_strength", lambda engine, ex, **kw: engine.default_strength(**kw),
             {"source": source}),
        Call("typical_norm", lambda engine, ex, **kw: engine.typical_norm(**kw),
             {"hook": st.sampled_from([hooks[early], hooks[late]])}),
        Call("Engine", lambda engine, ex, **kw: sw.Engine(engine.model, **kw),
             {"saes": st.sampled_from([[engine.saes.config(early).folder],
                                       {"mine": engine.saes.config(late).folder}]),
              "sae_budget_bytes": st.just(2**28),
              "products": st.sampled_from([None, "float32"])}),
        Call("Engine.remote", lambda engine, ex, **kw: sw.Engine.remote(**kw),
             {"url": st.just("http://127.0.0.1:9"), "token": st.just("t"),
              "retries": st.just(0)}, only_odd=True),
        Call("load_model", lambda engine, ex, **kw: sw.load_model(**kw),
             {"name": st.just(sw.DEFAULT_MODEL), "backend": st.just("auto"),
              "device": st.just("cpu"), "products": st.just("float32")}, only_odd=True),
        Call("SteerRequest.from_dict", lambda engine, ex, **kw: sw.SteerRequest.from_dict(kw),
             {k: st.just(v) for k, v in _record_fields(early).items()}, unknown_ok=False),
        Call("SteerRequest.with_", lambda engine, ex, **kw: _checked(engine, kw),
             {"seed": st.integers(0, 3), "temperature": st.just(0.0)}),
        Call("presets", lambda engine, ex, **kw: sw.presets(**kw),
             {"model": st.sampled_from([None, sw.DEFAULT_MODEL])}),
        Call("preset_view", lambda engine, ex, **kw: _preset_view(engine, **kw),
             {"name": st.sampled_from(sorted(sw.presets()))}),
        Call("Engine.vectors", lambda engine, ex, **kw: engine.vectors(**kw),
             {"request": request}),
        Call("load_vectors", lambda engine, ex, **kw: sw.load_vectors(**kw),
             {"source": st.just(vector_file), "model": st.sampled_from([None, engine])},
             odd={"source": [tmp, tmp / "missing.gguf", views["good"]]}),
        Call("save_vectors", lambda engine, ex, **kw: sw.save_vectors(**kw),
             {"vectors": st.just([sw.Vector(direction, HOOK, 2.0)]),
              "path": st.just(tmp / "saved.gguf"), "format": st.just("gguf"),
              "model": st.sampled_from([None, engine, "llama"])},
             odd={"path": [tmp, tmp / "no" / "such" / "x.gguf", tmp / "x.json"]}),
        Call("to_steering_vector", lambda engine, ex, **kw: sw.to_steering_vector(**kw),
             {"vectors": st.sampled_from([[sw.Vector(direction, HOOK, 2.0)],
                                          sw.Vector(direction, "blocks.4.hook_resid_pre")])}),
        Call("Explorer.add_feature", ex_call("add_feature"),
             {"source": source, "index": index, "strength": st.sampled_from([None, 5.0])},
             explorer=True),
        Call("Explorer.add_concept", ex_call("add_concept"),
             {"name": st.just("dogs"), "vector": st.just(sw.Vector(direction, HOOK, 3.0))},
             explorer=True),
        Call("Explorer.save_vectors", row_call("save_vectors"),
             {"path": st.just(tmp / "explorer.gguf"), "format": st.just("gguf")}, explorer=True,
             odd={"path": [tmp, tmp / "explorer.json"]}),
        Call("Explorer.load_vectors", ex_call("load_vectors"),
             {"path": st.just(vector_file), "name": st.sampled_from([None, "loaded"])},
             explorer=True, odd={"path": [tmp, tmp / "missing.gguf", views["good"]]}),
        Call("Explorer.add_vectors", ex_call("add_vectors"),
             {"name": st.just("two layers"),
              "vectors": st.just([sw.Vector(direction, HOOK, 2.0),
                                  sw.Vector(direction, "blocks.5.hook_resid_post", 2.0)])},
             explorer=True),
        Call("Explorer.set_strength", row_call("set_strength"),
             {"row": st.just(0), "value": st.floats(-50, 50)}, explorer=True),
        Call("Explorer.remove_feature", row_call("remove_feature"), {"row": st.just(0)},
             explorer=True),
        Call("Explorer.show_activations", row_call("show_activations"), {"row": st.just(0)},
             explorer=True),
        Call("Explorer.set_when", row_call("set_when"),
             {"row": st.just(0),
              "when": st.sampled_from([None, sw.When.tokens(1),
                                       sw.When(sw.Feature(early, 3), above=1.0)])},
             explorer=True, odd={"when": ["later", sw.When.tokens(3, 1)]}),
        Call("Explorer.set", ex_call("set"),
             {"temperature": st.sampled_from([0.0, 0.5]), "seed": st.integers(0, 9),
              "prompt": st.just("I think that"), "chat": st.booleans(),
              "sweep": st.sampled_from([None, (2.0,)])}, explorer=True),
        Call("Explorer.wait", ex_call("wait"), {"timeout": st.just(5.0)}, explorer=True),
        Call("Explorer.save_view", ex_call("save_view"), {"path": st.just(tmp / "view.json")},
             explorer=True, odd={"path": [tmp, tmp / "no" / "such" / "x.json"]}),
        Call("Explorer.load_view", lambda engine, ex, **kw: _load(ex, **kw),
             {"path": st.just(views["good"])}, explorer=True,
             odd={"path": [p for k, p in views.items() if k != "good"]}),
        Call("Explorer", lambda engine, ex, **kw: _explorer(engine, **kw),
             {"prompt": st.just("I think that"), "chat": st.booleans(),
              "features": st.sampled_from([(), [(early, 11)], [(late, 3, 9.0)]]),
              "sweep": st.sampled_from([None, (2.0,)]), "debounce_s": st.just(0.01),
              "temperature": st.just(0.0)}, explorer=True),
    ]  # fmt: skip


def _record_fields(source: str) -> dict:
    request = sw.SteerRequest("Hi", features=[sw.Feature(source, 1, 2.0)], sweep=(2.0,))
    record = request.with_(vectors=(sw.Vector([1.0] * 576, HOOK, 1.0),)).to_dict()
    return json.loads(json.dumps(record))


def _checked(engine, changes: dict):
    """``with_`` on a good request, then the engine's validation of what came out."""
    return engine.plan(sw.SteerRequest("Hi", types=("DEFAULT",)).with_(**changes))


def _preset_view(engine, **kw):
    from steer_widgets.widgets.presets import preset_view

    return preset_view(engine=engine, **kw)


def _explorer(engine, **kw):
    return sw.Explorer(engine, live=False, **kw)


def _load(ex, **kw):
    return type(ex).load_view(engine=ex.engine, live=False, **kw)


def _view_files(tmp: Path) -> dict[str, Path]:
    """A good saved view and files that are not one."""
    good = {
        "steer_widgets_view": 1, "chat": False, "prompt": "Hi", "live": False,
        "request": sw.SteerRequest("Hi", types=("DEFAULT",), n_completion_tokens=1).to_dict(),
        "concepts": [], "outputs": {},
    }  # fmt: skip
    bodies = {
        "good": json.dumps(good), "null": "null", "list": "[]", "number": "7",
        "garbage": "{not json", "binary": "\udcff", "bare": '{"steer_widgets_view": 1}',
        "bad_request": json.dumps({**good, "request": None}),
        "bad_prompt": json.dumps({**good, "prompt": 5}),
        "bad_concepts": json.dumps({**good, "concepts": 5}),
        "bad_outputs": json.dumps({**good, "outputs": [1]}),
    }  # fmt: skip
    paths = {}
    for name, body in bodies.items():
        paths[name] = tmp / f"{name}.json"
        paths[name].write_bytes(body.encode("utf-8", "surrogateescape"))
    paths["missing"] = tmp / "missing.json"
    paths["folder"] = tmp
    return paths


def examples(table: list[Call]) -> st.SearchStrategy:
    """(call, kwargs, swapped argument names): a good call with up to two arguments swapped
    for odd values, or an unknown keyword added."""

    def one(call: Call) -> st.SearchStrategy:
        names = sorted(call.good)
        good = st.fixed_dictionaries(call.good)
        least = 1 if call.only_odd or not names else 0
        swapped = st.lists(st.sampled_from(names + [UNKNOWN]), min_size=least, max_size=2,
                           unique=True) if names else st.just([UNKNOWN])  # fmt: skip

        def fill(pair):
            kwargs, which = pair
            return st.fixed_dictionaries(
                {
                    n: st.sampled_from(call.odd.get(n, [])) | ODD if call.odd.get(n) else ODD
                    for n in which
                }  # fmt: skip
            ).map(lambda odd: (call, {**kwargs, **odd}, tuple(which)))

        return st.tuples(good, swapped).flatmap(fill)

    return st.sampled_from(table).flatmap(one)
