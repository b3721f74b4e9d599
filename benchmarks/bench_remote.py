"""Engine.remote against a real interp-engine server on this machine, versus the local engine.

A server (eager backend, CPU, float32, the same torch thread count as this process) serves the
default model on 127.0.0.1. In one run: first-token latency and greedy tokens/s of one
48-token completion, remote and local (``remote_vs_local`` = remote / local tokens/s); the
same completion through interp-engine in this process (no HTTP), so ``http_ms_per_token`` is
remote minus in-process time per token; and the fraction of rows (DEFAULT, STEERED, the
three steer methods, four prompts) whose greedy tokens equal the local engine's, plus the
same for sampled rows (temperature 0.7, freq_penalty 0, the server's sampler).
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


def _first_token_and_rate(engine, request) -> tuple[float, float]:
    """ms to the first streamed token and tokens/s over the whole completion (cold caches)."""
    engine.clear_caches()
    start = time.perf_counter()
    first, n = None, 0
    for frame in engine.steer_stream(request):
        n = frame.step
        if first is None and n:
            first = time.perf_counter() - start
    return 1000 * first, n / (time.perf_counter() - start)


def _in_process_rate(model_dir: Path, ids: list[int]) -> float:
    """Tokens/s of the same greedy completion through interp-engine without a server."""
    from interp_engine import generate_stream, load_model

    model = load_model(str(model_dir), backend="eager", device="cpu", dtype="float32")
    kw = {"max_tokens": N_TOKENS, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 16}
    list(generate_stream(model, ids, **{**kw, "max_tokens": 4}))  # warm
    start = time.perf_counter()
    n = sum(1 for _ in generate_stream(model, ids, stop_at_eos=False, **kw))
    return n / (time.perf_counter() - start)


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
            _first_token_and_rate(remote, request.with_(n_completion_tokens=4))  # warm
            r_first, r_rate = _first_token_and_rate(remote, request)
            l_first, l_rate = _first_token_and_rate(local, request)
            ids = list(local.tokenizer.encode(CHAT).ids)
            direct = _in_process_rate(default_model_dir(), ids)
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
        "greedy_equal_local": sum(greedy) / len(greedy),
        "greedy_rows": len(greedy),
        "sampled_equal_local": sum(sampled) / len(sampled),
    }
