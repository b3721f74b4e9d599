"""Engine.remote against a real interp-engine server on this machine, versus the local engine.

A server (eager backend, CPU, float32, the same torch thread count as this process) serves the
default model on 127.0.0.1. In one run: first-token latency and greedy tokens/s of one
48-token completion, remote and local (``remote_vs_local`` = remote / local tokens/s); the
same completion through interp-engine in this process (no HTTP), so ``http_ms_per_token`` is
remote minus in-process time per token (best of 3 each, interleaved), beside two figures a
busy machine cannot blur: this process's CPU time per remote token and the round trip of a
small request; and the fraction of rows (DEFAULT, STEERED, the three steer methods, four
prompts) whose greedy tokens equal the local engine's, plus the same for sampled rows
(temperature 0.7, freq_penalty 0, the server's sampler).
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


def _timed(steps) -> tuple[float, float, float]:
    """ms to the first of ``steps`` (token counts so far), tokens/s, and this process's CPU
    ms per token (for the remote engine: our side of HTTP, JSON and threads, which a busy
    machine's wall clock cannot resolve)."""
    start, cpu = time.perf_counter(), time.process_time()
    first, n = None, 0
    for n in steps:
        if first is None and n:
            first = time.perf_counter() - start
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return 1000 * first, n / wall, 1000 * cpu / max(n, 1)


def _engine_steps(engine, request):
    engine.clear_caches()  # time generation, not the DEFAULT cache
    return (frame.step for frame in engine.steer_stream(request))


def _in_process_steps(model, ids: list[int], n_tokens: int):
    """The same greedy completion through interp-engine in this process: no HTTP."""
    from interp_engine import generate_stream

    kw = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 16, "stop_at_eos": False}
    steps = generate_stream(model, ids, max_tokens=n_tokens, **kw)
    return (i + 1 for i, _ in enumerate(steps))


def _best_of(makers: dict, repeats: int = 3) -> dict[str, tuple[float, float, float]]:
    """Best first token, rate and CPU per token of each, runs interleaved so load drifts
    hit all of them alike."""
    best = {name: (float("inf"), 0.0, float("inf")) for name in makers}
    for _ in range(repeats):
        for name, make in makers.items():
            got = _timed(make())
            old = best[name]
            best[name] = (min(old[0], got[0]), max(old[1], got[1]), min(old[2], got[2]))
    return best


def _roundtrip_ms(client, repeats: int = 20) -> float:
    """Fastest small authenticated request: the fixed cost of one HTTP exchange."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        client.post("/v1/tokenize", {"text": "hi", "prepend_bos": False})
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


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
    from steer_widgets.runtime.model import default_model_dir

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
            (r_first, r_rate, r_cpu), (l_first, l_rate, _) = best["remote"], best["local"]
            d_first, direct, _ = best["direct"]
            roundtrip = _roundtrip_ms(remote.client)
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
        "client_cpu_ms_per_token": r_cpu,
        "http_roundtrip_ms": roundtrip,
        "greedy_equal_local": sum(greedy) / len(greedy),
        "greedy_rows": len(greedy),
        "sampled_equal_local": sum(sampled) / len(sampled),
    }
