"""Many threads on one engine: steering, activations and SAE loads at once, under a small
SAE budget. Every request gets exactly its solo result and no cache is corrupted."""

from __future__ import annotations

import threading

import pytest

import steer_widgets as sw

TEXTS = ["The Eiffel Tower in Paris", "Rivers of France and Spain", "I think that"]
ROUNDS = 2


def steer_requests(sources):
    chat = [{"role": "user", "content": "Tell me a story."}]
    return [
        sw.SteerRequest("I think that", features=[sw.Feature(sources[1], 11, 60.0)], sweep=(2.0,),
                        n_completion_tokens=6, temperature=0.8, seed=3),
        sw.SteerRequest(chat, features=[sw.Feature(sources[2], 5, 40.0)], n_completion_tokens=6,
                        temperature=1.0, seed=9, steer_special_tokens=False),
        sw.SteerRequest("Once upon a time", features=[sw.Feature(sources[0], 7, 30.0)],
                        n_completion_tokens=6, temperature=0.0, freq_penalty=0.0),
    ]  # fmt: skip


def tokens(result):
    return {k: c.token_ids for k, c in result.outputs.items()}


@pytest.mark.filterwarnings("ignore:SAE store holds")  # pinned SAEs may exceed it for a moment
def test_concurrent_requests_equal_their_solo_results(engine, sources):
    one_sae = engine.saes.config(sources[0]).nbytes()
    shared = sw.Engine(engine.model, sae_budget_bytes=int(1.5 * one_sae))  # forces evictions
    requests = steer_requests(sources)
    solo_steer = []
    for r in requests:
        shared.clear_caches()
        solo_steer.append(tokens(shared.steer(r)))
    queries = [(t, s, 1 + 7 * i) for i, t in enumerate(TEXTS) for s in sources]
    solo_acts = [shared.activations(t, s, i).values for t, s, i in queries]
    solo_top = [shared.top_features(t, s, n=5).indices for t, s, _ in queries]
    shared.clear_caches()

    failures: list[str] = []

    def steer_worker(k: int) -> None:
        for n in range(ROUNDS):
            order = requests[k:] + requests[:k]  # each thread starts somewhere else
            for r in order:
                got = tokens(shared.steer(r))
                if got != solo_steer[requests.index(r)]:
                    failures.append(f"steer {requests.index(r)} in thread {k}, round {n}")

    def acts_worker(k: int) -> None:
        for n in range(ROUNDS):
            for q in range(len(queries))[k::2]:
                t, s, i = queries[q]
                if shared.activations(t, s, i).values != solo_acts[q]:
                    failures.append(f"activations {queries[q]} round {n}")
                if shared.top_features(t, s, n=5).indices != solo_top[q]:
                    failures.append(f"top features {queries[q]} round {n}")

    def load_worker() -> None:
        for _ in range(ROUNDS * 3):
            for s in sources:
                with shared.saes.using(s) as (sae,):
                    if sae.W_dec.shape[0] != shared.saes.config(s).d_sae:
                        failures.append(f"load {s}")

    def guarded(fn, *args):
        def run():
            try:
                fn(*args)
            except Exception as err:  # any exception in a thread is a failure
                failures.append(f"{fn.__name__}{args}: {type(err).__name__}: {err}")

        return threading.Thread(target=run)

    threads = [guarded(steer_worker, k) for k in range(3)]
    threads += [guarded(acts_worker, k) for k in range(2)] + [guarded(load_worker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not failures, failures
    stats = shared.saes.stats()
    assert stats["evictions"] > 0 and stats["resident_bytes"] <= shared.saes.budget_bytes
    for r, want in zip(requests, solo_steer, strict=True):  # and the caches still serve exactly
        assert tokens(shared.steer(r)) == want
