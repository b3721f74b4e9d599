"""Engine.remote against a real interp-engine server on this machine, versus the local engine.

A server (eager backend, CPU, float32, the same torch thread count as this process) serves the
default model on 127.0.0.1. In one run: first-token latency and greedy tokens/s of one
48-token completion, remote and local (``remote_vs_local`` = remote / local tokens/s); the
same completion through interp-engine in this process (no HTTP), so ``http_ms_per_token`` is
remote minus in-process time per token (best of 3 each, interleaved); and the fraction of
rows (DEFAULT, STEERED, the three steer methods, four prompts) whose greedy tokens equal the
local engine's, plus the same for sampled rows (temperature 0.7, freq_penalty 0, the
server's sampler).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from common import CHAT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

N_TOKENS = 48
PROMPTS = ["I think that", CHAT, "The capital of France is", "Once upon a time"]


def _timed(steps) -> tuple[float, float]:
    """ms to the first of ``steps`` (an iterator of token counts so far) and tokens/s."""
    start = time.perf_counter()
    first, n = None, 0
    for n in steps:
        if first is None and n:
            first = time.perf_counter() - start
    return 1000 * first, n / (time.perf_counter() - start)


def _engine_steps(engine, request):
    engine.clear_caches()  # time generation, not the DEFAULT cache
    return (frame.step for frame in engine.steer_stream(request))


def _in_process_steps(model, ids: list[int], n_tokens: int):
    """The same greedy completion through interp-engine in this process: no HTTP."""
    from interp_engine import generate_stream

    kw = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 16, "stop_at_eos": False}
    steps = generate_stream(model, ids, max_tokens=n_tokens, **kw)
    return (i + 1 for i, _ in enumerate(steps))


def _best_of(makers: dict, repeats: int = 3) -> dict[str, tuple[float, float]]:
    """Fastest first token and rate of each, the runs interleaved so load drifts hit all."""
    best = {name: (float("inf"), 0.0) for name in makers}
    for _ in range(repeats):
        for name, make in makers.items():
            first, rate = _timed(make())
            best[name] = (min(best[name][0], first), max(best[name][1], rate))
    return best


METHODS = (("SIMPLE_ADDITIVE", 40.0), ("ORTHOGONAL_DECOMP", 8.0), ("PROJECTION_CAP", 2.0))


def _rows(remote, local, source: str, **sampling) -> list[bool]:
    """Per output row: remote tokens == local tokens (DEFAULT once per prompt)."""
    import steer_widgets as sw

    equal = []
    for prompt in PROMPTS:
        for i, (method, strength) in enumerate(METHODS):
            request = sw.SteerRequest(
                prompt,
                features=[sw.Feature(source, 123, strength)],
                types=("DEFAULT", "STEERED") if i == 0 else ("STEERED",),
                steer_method=method,
                n_completion_tokens=24,
                **sampling,
            )
            remote.clear_caches()
            local.clear_caches()
            got, want = remote.steer(request).outputs, local.steer(request).outputs
            equal += [got[k].token_ids == want[k].token_ids for k in want]
    return equal


def run() -> dict:
    import torch
    from interp_engine import load_model
    from interp_server import TOKEN, Server

    import steer_widgets as sw
    from steer_widgets.model import default_model_dir

    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(default_model_dir(), Path(tmp), threads=threads)
        try:
            started = time.perf_counter()
            remote = sw.Engine.remote(server.url, TOKEN, model=sw.DEFAULT_MODEL)
            connect_s = time.perf_counter() - started
            local = sw.Engine.default()
            source = local.saes.sources()[1]
            request = sw.SteerRequest(
                CHAT, types=("DEFAULT",), temperature=0, n_completion_tokens=N_TOKENS
            )
            ids = list(local.tokenizer.encode(CHAT).ids)
            folder = str(default_model_dir())
            model = load_model(folder, backend="eager", device="cpu", dtype="float32")
            best = _best_of(
                {
                    "remote": lambda: _engine_steps(remote, request),
                    "local": lambda: _engine_steps(local, request),
                    "direct": lambda: _in_process_steps(model, ids, N_TOKENS),
                }
            )
            (r_first, r_rate), (l_first, l_rate) = best["remote"], best["local"]
            d_first, direct = best["direct"]
            greedy = _rows(remote, local, source, temperature=0)
            sampled = _rows(remote, local, source, temperature=0.7, freq_penalty=0.0, seed=3)
            served_by = remote.served_by
        finally:
            server.stop()
    return {
        "threads": threads,
        "server_version": served_by["engine"],
        "guarantee": served_by["guarantee"].split(":")[0],
        "connect_s": connect_s,
        "first_token_ms": r_first,
        "local_first_token_ms": l_first,
        "remote_tokens_per_s": r_rate,
        "local_tokens_per_s": l_rate,
        "in_process_tokens_per_s": direct,
        "remote_vs_local": r_rate / l_rate,
        "http_ms_per_token": 1000 / r_rate - 1000 / direct,
        "http_first_token_ms": r_first - d_first,
        "greedy_equal_local": sum(greedy) / len(greedy),
        "greedy_rows": len(greedy),
        "sampled_equal_local": sum(sampled) / len(sampled),
    }
