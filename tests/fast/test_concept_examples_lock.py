"""``Concepts.examples`` from several threads at once (the run, the concept-sets worker and
an evaluation share one engine): a concept's examples are written once and the shared cache
stays whole. No model: a fake engine whose ``samples`` counts its calls."""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import SimpleNamespace

from steer_widgets.analysis.concepts import SAMPLES_PER_TEMPLATE, Concepts

THREADS = 8


class CountingEngine:
    """Just what ``Concepts._sample`` reads: a tokenizer flag and ``samples``."""

    def __init__(self) -> None:
        self.tokenizer = SimpleNamespace(has_chat_template=False)
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def samples(self, prompt: str, n: int, **_sampling) -> list:
        with self._lock:
            self.calls[prompt] += 1
        # Widens the race: without a lock every thread misses the cache while the first is
        # still here (a GIL switch alone rarely lands in the few bytecodes between miss and put).
        time.sleep(0.05)
        return [SimpleNamespace(complete=True, text=f" sample {i}") for i in range(n)]


def test_one_concepts_examples_are_written_once_for_eight_threads():
    engine = CountingEngine()
    concepts = Concepts(engine)
    start = threading.Barrier(THREADS)
    got, errors = [], []

    def ask(concept: str) -> None:
        start.wait()
        try:
            got.append((concept, concepts.examples(concept)))
        except Exception as err:  # any exception fails the test below, named
            errors.append(err)

    names = ["cats", "dogs"] * (THREADS // 2)
    threads = [threading.Thread(target=ask, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    cats, dogs = (f"Here is a short text about {n}:\n" for n in ("cats", "dogs"))
    assert dict(engine.calls) == {cats: 1, dogs: 1}  # the model wrote each set once
    for concept, examples in got:
        assert examples == concepts.examples(concept)  # every thread got the kept set
        assert len(examples) == SAMPLES_PER_TEMPLATE
    concepts.clear()
    assert concepts.examples("cats") and engine.calls[cats] == 2  # cleared: asked again
