"""Every build of the native kernel a user's CPU gets, end to end on the default model.

This machine's build is ``-march=native`` (AVX-512 or AVX2, whichever it has). The other
builds run here in fresh processes, each compiled into a scratch cache: the AVX2 build
(``-march=x86-64-v3``: what a CPU without AVX-512 compiles) and the portable C++ path (what
ARM and other CPUs compile; built for x86-64 with hardware FMA, as those have it). Each loads
the default engine on its quantized blocks and steers it: greedy tokens equal this machine's
build's and transformers', and every row of a batch equals its solo run, greedy and sampled.
Each build is compiled once per session, shared with the other files that run it
(``kernel_variants.py``). The machine without a compiler is ``test_no_compiler.py``'s."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from kernel_variants import AVX2, PORTABLE, ROOT, runs_here
from torch_threads import at_threads

import steer_widgets as sw
from steer_widgets.runtime import native

CHAT = [{"role": "user", "content": "Tell me about the ocean."}]
VARIANTS = {"avx2": AVX2, "portable": PORTABLE}  # the portable one: FMA in hardware, as on ARM

SCRIPT = """
import json, sys, torch
from steer_widgets.runtime import native, quant
native.FLAGS[:] = sys.argv[1].split()
import steer_widgets as sw
from tests.test_build_paths import rows_and_solo
assert native.extension() is not None, "the variant did not build"
engine = sw.Engine.default()
assert isinstance(engine.model.runtime.embed, quant.QuantLinear)
print(json.dumps(rows_and_solo(engine)))
"""


def requests(sources: list[str]) -> list[sw.SteerRequest]:
    middle = sources[len(sources) // 2]
    return [
        sw.SteerRequest(CHAT, features=[sw.Feature(middle, 11, 60.0)], sweep=(2.0,),
                        n_completion_tokens=12, temperature=0.0),
        sw.SteerRequest("I think that", features=[sw.Feature(sources[0], 5, 40.0)],
                        n_completion_tokens=12, temperature=0.8, seed=3),
    ]  # fmt: skip


def rows_and_solo(engine: sw.Engine) -> list[dict]:
    """Each request's rows together, and each row generated alone; last, both requests (two
    prompts, greedy and sampled) as one ragged ``steer_batch`` against the same solo rows."""
    out = []
    reqs = requests(engine.saes.sources())
    for request in reqs:
        engine.clear_caches()
        together = {k: list(c.token_ids) for k, c in engine.steer(request).outputs.items()}
        solo = {}
        for label, mult in [("DEFAULT", None), ("STEERED", 1.0)] + [
            (k, m) for k, m in zip(list(together)[2:], request.sweep, strict=True)
        ]:
            engine.clear_caches()
            if mult is None:
                alone = request.with_(types=("DEFAULT",), sweep=())
                solo[label] = list(engine.steer(alone).outputs["DEFAULT"].token_ids)
            else:
                m = mult * request.strength_multiplier
                alone = request.with_(types=("STEERED",), sweep=(), strength_multiplier=m)
                solo[label] = list(engine.steer(alone).outputs["STEERED"].token_ids)
        out.append({"together": together, "solo": solo})
    engine.clear_caches()
    batch = engine.steer_batch({str(i): r for i, r in enumerate(reqs)})
    ragged = {
        f"{i}.{label}": list(c.token_ids)
        for i in range(len(reqs))
        for label, c in batch[str(i)].outputs.items()
    }
    alone = {f"{i}.{label}": ids for i, o in enumerate(out) for label, ids in o["solo"].items()}
    return [*out, {"together": ragged, "solo": alone}]


@pytest.fixture(scope="module")
def here(engine) -> list[dict]:
    """This machine's build, one thread (the variants run at torch's default count)."""
    with at_threads(1):
        return rows_and_solo(engine)


@pytest.fixture(scope="module")
def transformers_greedy(engine) -> list[int]:
    from transformers import AutoModelForCausalLM

    from steer_widgets.runtime.model import default_model_dir

    hf = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    ids = list(engine.tokenizer.encode(CHAT).ids)
    out = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=2)
    return out[0, len(ids) :].tolist()


@pytest.mark.skipif(native.extension() is None, reason="no C++ compiler here")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_build_steers_the_default_model_exactly(
    variant, here, transformers_greedy, kernel_variants
):
    if not runs_here("avx2", "fma", "f16c"):
        pytest.skip("these builds are x86-64 ones: needs a CPU with AVX2, FMA and F16C")
    flags, env = kernel_variants.flags(VARIANTS[variant]), kernel_variants.env(VARIANTS[variant])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, flags],
        env=env, capture_output=True, text=True, timeout=1200, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for request in got:
        assert request["together"] == request["solo"], variant  # rows equal solo rows
    assert got[0]["together"] == here[0]["together"]  # greedy: this machine's build's tokens
    assert got[0]["together"]["DEFAULT"] == transformers_greedy
