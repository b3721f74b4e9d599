"""The on-disk cache of Neuronpedia explanations keeps every entry when threads and
processes fetch at once (no network: the fetch itself is replaced)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from steer_widgets.sae import neuronpedia


def test_concurrent_fetches_keep_every_explanation(tmp_path, monkeypatch):
    """Two fetches that both read the file before either writes (a barrier makes sure) used
    to write back their own snapshot: the second erased the first's explanations."""
    monkeypatch.setenv("STEER_WIDGETS_CACHE", str(tmp_path))
    monkeypatch.setattr(neuronpedia, "offline", lambda: False)
    barrier = threading.Barrier(2)

    def described(neuronpedia_id: str, index: int) -> str:
        barrier.wait(timeout=10)
        return f"feature {index}"

    monkeypatch.setattr(neuronpedia, "_description", described)
    errors: list[BaseException] = []

    def fetch(indices):
        try:
            neuronpedia.Explanations("m/src").fetch(indices)
        except BaseException as err:  # a failure in a thread fails the test
            errors.append(err)

    threads = [threading.Thread(target=fetch, args=([i, i + 10],)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert neuronpedia.Explanations("m/src").cached() == {i: f"feature {i}" for i in (1, 2, 11, 12)}
    assert sorted(p.name for p in (tmp_path / "neuronpedia").iterdir()) == [
        "m__src.json", "m__src.lock",
    ]  # fmt: skip


WRITER = """
import sys
from steer_widgets.sae import neuronpedia
neuronpedia.offline = lambda: False
neuronpedia._description = lambda nid, i: f"feature {i}"
start = int(sys.argv[1])
for i in range(start, start + 40):
    neuronpedia.Explanations("m/src").fetch([i])
"""


def test_processes_writing_at_once_lose_nothing(tmp_path):
    env = {"STEER_WIDGETS_CACHE": str(tmp_path), "PATH": ""}
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(start)], env=env)
        for start in (0, 100, 200)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    saved = json.loads((tmp_path / "neuronpedia" / "m__src.json").read_text())
    assert len(saved) == 120
