"""Parallel DEFAULT + STEERED (and sweeps) vs the same rows alone, in one run.

64 new tokens after a chat prompt, temperature 0.5, one feature of a default SAE, on the
default engine (the quantized model); EOS ignored by asking for a long answer (rows that stop
early are reported in ``min_tokens``). The four cases run interleaved, ALTERNATIONS times,
each alternation in a rotated order, so a noisy machine disturbs them alike: the ratios come
from each case's best time, and ``*_spread`` gives the lowest and highest ratio of single
alternations (how far one run's figure can stray).

``ratio_ragged8_vs_single``: 8 requests on 8 different prompts (chat and completion, 5 to
about 300 prompt tokens, 24 to 64 new tokens, greedy and sampled), DEFAULT + STEERED each,
in one ``steer_batch``, over the mean wall time of the same 8 requests run alone;
``ragged8_identical`` says, per request, whether both outputs equal their solo runs. Its
floor on a 2-core machine is near 3-4 whatever the decode kernel does: the 8 prefills cost
the same batched or alone. ``ratio_ragged8_decode_vs_single`` is the same ratio without the
prefills (``common.PrefillClock``): what batching the decode steps saves.
``int8_ratio_ragged8_decode_floor`` (``products="int8"`` only) is what that ratio would be if
each step cost what a solo run's step costs (``int8_ragged8_solo_step_ms``, a pair's) and
every row past a step's second cost only its matrix products at oneDNN's int8 GEMM rate on
this machine (``common.int8_gemm_macs_per_s``; ``int8_row_floor_ms``), nothing for its
attention, norms, sampling or block scales: a floor for the batch here, as the read bound
is for one row.

``vocab_pass_ms_per_row``: the end of a decode step (each row's token, log-probability and
top 5) per row, by rows and sampling, one native pass over every row (``native``) against
the same rows one at a time in Python (``rows_alone``), at torch's thread count; sampled
rows' noise is drawn beforehand, as the pool draws it while the model runs: the uniform
draws decoding queues for the native pass (which takes their logarithms only where a token
can win), Exp(1) values for the Python path.

``ragged_attention_ms``: the attention of one decode step, every layer (keys and values
streamed from memory, as in a step), for the 16 rows of the ragged batch at its prompts'
lengths (``ragged``) against the same 16 rows at one length with the same keys in all
(``even``): ``ratio`` near 1 says the threads share a ragged step's keys as evenly as an even
one's.

Every figure for both ``products`` settings (``int8_*``), but the vocabulary pass and the
ragged attention (neither depends on the products) and the floor (int8's alone).
"""

from __future__ import annotations

import os
import time

from common import CHAT, clocked_run, int8_gemm_macs_per_s, macs_per_row

SWEEP = (-2.0, -1.0, 2.0, 4.0)
ALTERNATIONS = int(os.environ.get("SW_BENCH_ALTERNATIONS", "7"))


def run() -> dict:
    """The figures with the default float32 products, then ``int8_*`` with
    ``products="int8"``; the vocabulary pass once (it reads logits, whatever made them)."""
    import steer_widgets as sw

    figures = _figures(sw.Engine.default())
    int8 = _figures(sw.Engine(sw.load_model(products="int8")))
    return {
        **figures,
        **{f"int8_{k}": v for k, v in int8.items()},
        "vocab_pass_ms_per_row": vocab_pass_ms_per_row(figures["vocab_size"]),
        "ragged_attention_ms": ragged_attention_ms(sw.Engine.default()),
    }


def _figures(engine) -> dict:
    import steer_widgets as sw
    from steer_widgets.runtime.quant import QuantLinear

    source = engine.saes.sources()[len(engine.saes.sources()) // 2]
    base = sw.SteerRequest(
        CHAT, features=[sw.Feature(source, 11, 40.0)], n_completion_tokens=64, temperature=0.5
    )
    cases = {
        "default": base.with_(types=("DEFAULT",)),
        "steered": base.with_(types=("STEERED",)),
        "pair": base,
        "sweep5": base.with_(types=("DEFAULT",), sweep=SWEEP),
    }
    results, times = {}, {name: [] for name in cases}
    names = list(cases)
    for name in names:  # warm up: first-call costs are not generation
        engine.steer(cases[name])
    for a in range(ALTERNATIONS):
        for name in names[a % len(names) :] + names[: a % len(names)]:
            engine.clear_caches()  # time real generation, not the DEFAULT cache
            start = time.perf_counter()
            results[name] = engine.steer(cases[name])
            times[name].append(time.perf_counter() - start)
    seconds = {name: min(t) for name, t in times.items()}
    solo = {"DEFAULT": results["default"].outputs["DEFAULT"]}
    solo["STEERED"] = results["steered"].outputs["STEERED"]
    identical = results["pair"].outputs == {k: solo[k] for k in ("DEFAULT", "STEERED")}
    for m in SWEEP:
        engine.clear_caches()
        alone = engine.steer(base.with_(types=("STEERED",), strength_multiplier=m))
        identical &= results["sweep5"].outputs[f"STEERED*{m:g}"] == alone.outputs["STEERED"]
    identical &= results["sweep5"].outputs["DEFAULT"] == solo["DEFAULT"]
    a, b, c, d = (seconds[k] for k in ("default", "steered", "pair", "sweep5"))
    lengths = [len(o.token_ids) for r in results.values() for o in r.outputs.values()]

    def spread(case: str) -> list[float]:
        ratios = [t / s for t, s in zip(times[case], times["default"], strict=True)]
        return [round(min(ratios), 3), round(max(ratios), 3)]

    ragged = ragged8(engine, source)
    return {
        **ragged,
        "step_ms_by_rows": step_ms_by_rows(engine),
        "vocab_size": engine.model.runtime.cfg.vocab_size,
        "default_s": a,
        "steered_s": b,
        "pair_s": c,
        "sweep5_s": d,
        "ratio_pair_vs_single": c / a,
        "ratio_pair_vs_serial": c / (a + b),
        "ratio_sweep5_vs_single": d / a,
        "ratio_pair_vs_single_spread": spread("pair"),
        "ratio_sweep5_vs_single_spread": spread("sweep5"),
        "alternations": ALTERNATIONS,
        "identical": bool(identical),
        "min_tokens": min(lengths),
        "quantized": isinstance(engine.model.runtime.layers[0].wqkv, QuantLinear),
    }


LONG = " ".join(
    f"Entry {i}: the keeper of the lighthouse logged the passing ships." for i in range(22)
)


def ragged_requests(source: str) -> dict:
    """Eight requests on eight prompts of different kinds, lengths and sampling settings."""
    import steer_widgets as sw
    from steer_widgets.analysis.evaluator import panel

    chats = [p for p in panel() if not isinstance(p, str)][:3]
    texts = [p for p in panel() if isinstance(p, str)][:3]
    prompts = [*chats, *texts, "Once upon a time, in a", LONG]
    out = {}
    for i, prompt in enumerate(prompts):
        out[f"r{i}"] = sw.SteerRequest(
            prompt,
            features=[sw.Feature(source, 11, 40.0)],
            n_completion_tokens=(24, 40, 64)[i % 3],
            temperature=(0.0, 0.5, 1.0)[i % 3],
            freq_penalty=1.0 if i % 4 == 3 else 0.0,
            seed=i,
        )
    return out


def ragged8(engine, source: str) -> dict:
    """One ragged ``steer_batch`` of 8 requests against each request alone, alternated."""
    requests = ragged_requests(source)
    engine.steer_batch(requests)  # warm up
    runtime = engine.model.runtime
    batch_times, batch_decode, solo_means, solo_decode = [], [], [], []
    together, solo = {}, {}
    for _ in range(max(2, ALTERNATIONS // 2)):
        engine.clear_caches()
        wall, decode, batch_rows = clocked_run(
            lambda: together.update(engine.steer_batch(requests)), runtime
        )
        batch_times.append(wall)
        batch_decode.append(decode)
        seconds, decodes, solo_rows = [], [], []
        for name, request in requests.items():
            engine.clear_caches()
            wall, decode, rows = clocked_run(
                lambda n=name, r=request: solo.update({n: engine.steer(r)}), runtime
            )
            seconds.append(wall)
            decodes.append(decode)
            solo_rows.append(rows)
        solo_means.append(sum(seconds) / len(seconds))
        solo_decode.append(sum(decodes) / len(decodes))
    ratios = [b / s for b, s in zip(batch_times, solo_means, strict=True)]
    prompt_tokens = [len(engine.plan(r)[0].ids) for r in requests.values()]
    int8 = runtime.products == "int8"
    floor = decode_floor(runtime, batch_rows, solo_rows, min(solo_decode)) if int8 else {}
    return {
        **floor,
        "ragged8_s": min(batch_times),
        "ragged8_solo_mean_s": min(solo_means),
        "ratio_ragged8_vs_single": min(batch_times) / min(solo_means),
        "ratio_ragged8_vs_single_spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "ragged8_decode_s": min(batch_decode),
        "ragged8_solo_mean_decode_s": min(solo_decode),
        "ratio_ragged8_decode_vs_single": min(batch_decode) / min(solo_decode),
        "ragged8_prompt_tokens": [min(prompt_tokens), max(prompt_tokens)],
        "ragged8_identical": {
            name: together[name].outputs == solo[name].outputs for name in requests
        },
    }


def decode_floor(runtime, batch_rows: list[int], solo_rows: list[list[int]], solo_s: float):
    """``ratio_ragged8_decode_floor`` of an int8 runtime (see the top): the batch's decode
    steps priced at a solo step's cost plus ``row_floor_ms`` for each row past the second,
    over the solo runs' mean decode time (``solo_s``); ``solo_rows`` holds each solo run's
    steps' rows."""
    row = macs_per_row(runtime.cfg) / int8_gemm_macs_per_s()
    steps = sum(len(rows) for rows in solo_rows) / len(solo_rows)
    step = solo_s / steps  # a pair's step, all its costs (both rows, sampling, Python)
    batch = sum(step + max(0, rows - 2) * row for rows in batch_rows)
    return {
        "row_floor_ms": round(1000 * row, 4),
        "ragged8_solo_step_ms": round(1000 * step, 3),
        "ratio_ragged8_decode_floor": batch / solo_s,
    }


def vocab_pass_ms_per_row(vocab: int, repeats: int = 200) -> dict[str, dict[str, float]]:
    """ms per row of ``generation.sample_step`` with and without the native pass, best of 5
    rounds of ``repeats`` steps, for 1 and 8 rows, greedy and sampled (temperature 0.5,
    frequency penalty 1)."""
    import torch

    from steer_widgets.runtime import native
    from steer_widgets.steering.generation import (
        Row,
        RowSampler,
        Sampling,
        sample_rows,
        sample_step,
    )

    if native.extension() is None:
        return {"skipped": "the native kernel did not build here"}
    out = {}
    for rows, temperature in ((1, 0.0), (1, 0.5), (8, 0.0), (8, 0.5)):
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)) * 4
        drawn = {
            "native": torch.empty(vocab, dtype=torch.float64).uniform_(),
            "rows_alone": torch.empty(vocab).exponential_(1),
        }
        sampling = Sampling(temperature=temperature, freq_penalty=1.0)
        samplers = [RowSampler(sampling, [1, 2, 3], vocab, seed=r) for r in range(rows)]
        row_list, live = [Row()] * rows, list(range(rows))
        best = {}
        for name, step in (("native", sample_step), ("rows_alone", sample_rows)):
            for sampler in samplers:  # drawn already, as the pool draws it
                sampler.next_draw = lambda d=drawn[name]: d
            rounds = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(repeats):
                    step(samplers, row_list, live, logits)
                rounds.append(time.perf_counter() - start)
            best[name] = 1000 * min(rounds) / repeats / rows
        case = f"{rows}_rows_{'greedy' if temperature == 0 else 'sampled'}"
        out[case] = {k: round(v, 3) for k, v in best.items()}
        out[case]["speedup"] = round(best["rows_alone"] / best["native"], 2)
    return out


def ragged_attention_ms(engine, repeats: int = 60) -> dict[str, float]:
    """Best-decile ms of every layer's ragged attention for the ragged batch's 16 rows (each
    request's two rows at its prompt's length) and for 16 rows of one length, the same keys
    in all; random keys and values, one cache per layer."""
    import torch

    from steer_widgets.runtime import native

    if native.extension() is None:
        return {"skipped": "the native kernel did not build here"}
    cfg, op = engine.model.runtime.cfg, native.op("ragged_attention")
    source = engine.saes.sources()[len(engine.saes.sources()) // 2]
    lengths = [len(engine.plan(r)[0].ids) for r in ragged_requests(source).values()]
    ragged = [n for n in lengths for _ in range(2)]
    cases = {"ragged": ragged, "even": [sum(ragged) // len(ragged)] * len(ragged)}
    gen, rows = torch.Generator().manual_seed(0), len(ragged)
    shape = (rows, cfg.n_kv_heads, max(ragged) + 1, cfg.d_head)
    caches = [
        (torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen))
        for _ in range(cfg.n_layers)
    ]
    q = torch.randn(rows, cfg.n_heads, 1, cfg.d_head, generator=gen)
    new_kv = torch.randn(2, rows, cfg.n_kv_heads, 1, cfg.d_head, generator=gen)
    out = {}
    for name, positions in cases.items():
        starts, order = torch.tensor(positions), torch.arange(rows)

        def step(starts=starts, order=order) -> None:
            for k, v in caches:
                op(q, k, v, new_kv[0], new_kv[1], cfg.d_head**-0.5, order, starts, 0)

        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        out[name] = round(1000 * sorted(times)[repeats // 10], 3)
    out["ratio"] = round(out["ragged"] / out["even"], 3)
    return out


def step_ms_by_rows(engine, rows=(1, 2, 4, 8, 16, 32, 64)) -> dict[int, float]:
    """One ragged decode step (rows at positions 40 to 63) of the runtime alone, best of 5,
    by number of rows: what an extra row costs, and where ``batch.MAX_ROWS`` stops paying.
    One row's 64-token prefill is copied to every row, so each position read was written."""
    import torch

    runtime, out = engine.model.runtime, {}
    for b in rows:
        cache = runtime.new_cache(b, 66)
        runtime.forward(torch.arange(64).view(1, 64), cache.view(0))
        for r in range(1, b):
            cache.copy_row(0, r)
        feed, lengths, best = (
            torch.zeros(b, 1, dtype=torch.long),
            [40 + 7 * r % 24 for r in range(b)],
            [],
        )
        for _ in range(5):
            cache.lengths = list(lengths)
            start = time.perf_counter()
            runtime.forward(feed, cache, rows=list(range(b)))
            best.append(time.perf_counter() - start)
        out[b] = round(1000 * min(best), 2)
    return out
