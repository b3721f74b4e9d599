"""A long day in the explorer, compressed: several threads drive one explorer on the
quantized default model at random, as a user's clicks and a notebook's calls would.

Run by ``test_soak.py`` in a subprocess (a crash or a deadlock is a failure there, and the
resident memory measured is the explorer's alone); by hand::

    python tests/soak.py --seconds 600 --runs 1000 --json soak.json

What it checks, printed as JSON at the end: every wait returned (a watchdog dumps the stacks
and exits 3 otherwise), no unnamed error (an exception other than a ``SteerWidgetsError``
naming its field or source, in any thread or in the explorer's traceback), the peak and last
resident memory, and that each finished run equals ``engine.steer`` of its record (the
request as JSON, read back), with the engine's caches cleared first so that DEFAULT is
decoded again.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import steer_widgets as sw

SOURCE = "12-smollm2-res-4k"
PROMPTS = ["I think that", "The ocean is", "My favourite food is", "Once upon a time"]
TOKENS = 8
WAIT_S = 120.0  # any wait longer than this is a deadlock


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory now (``VmHWM``: its peak) from Linux /proc, 0 elsewhere.
    Not ``getrusage``: its peak survives ``execve``, so a soak started by a large pytest
    process would report pytest's resident memory as its own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Soak:
    """The explorer, the actions a user takes on it, and what went wrong."""

    def __init__(self, engine: sw.Engine, folder: Path, seed: int) -> None:
        self.engine = engine
        self.folder = folder
        self.seed = seed
        self.ex = sw.Explorer(
            engine, features=[(SOURCE, 100)], n_completion_tokens=TOKENS, temperature=0,
            debounce_s=0.02,
        )  # fmt: skip
        self.problems: list[str] = []
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.peak_mb = 0.0

    # -- actions: each one thing a user does ---------------------------------------------
    def slider(self, rng: random.Random) -> None:
        rows = len(self.ex.features_ui.rows)
        self.ex.set_strength(rng.randrange(rows), rng.uniform(-40, 40))

    def settings(self, rng: random.Random) -> None:
        self.ex.set(temperature=rng.choice([0.0, 0.7]), seed=rng.randrange(4))

    def prompt(self, rng: random.Random) -> None:
        self.ex.set(prompt=rng.choice(PROMPTS))

    def run(self, rng: random.Random) -> None:
        self.ex.run()
        if rng.random() < 0.5:
            self.wait(self.ex.wait, "run")

    def stop(self, rng: random.Random) -> None:
        self.ex.stop()

    def evaluate(self, rng: random.Random) -> None:
        prompts = rng.sample(PROMPTS, 2)
        strengths = [0.0, rng.choice([0.5, 1.0, 1.5])]
        self.ex.evaluate(prompts, strengths)
        if rng.random() < 0.3:
            self.ex.stop_evaluation()
        if rng.random() < 0.3:
            self.wait(self.ex.wait_evaluation, "evaluation")

    def click(self, rng: random.Random) -> None:
        """A token click: its attribution, on the calling (message) thread."""
        outputs = self.ex.outputs
        label = rng.choice([k for k in outputs if k != "DEFAULT"] or ["STEERED"])
        n = len(outputs[label].token_ids) if label in outputs else 1
        self.ex.completions.select(label, rng.randrange(max(n, 1)))

    def effects(self, rng: random.Random) -> None:
        self.ex.completions.effect_on = rng.random() < 0.5

    def card(self, rng: random.Random) -> None:
        self.ex.picker.card.show(rng.choice(self.engine.saes.sources()), rng.randrange(4096))

    def features(self, rng: random.Random) -> None:
        rows = len(self.ex.features_ui.rows)
        if rows < 3 and rng.random() < 0.6:
            self.ex.add_feature(rng.choice(self.engine.saes.sources()), rng.randrange(4096))
        elif rows > 1:
            self.ex.remove_feature(rng.randrange(rows))

    def view(self, rng: random.Random) -> None:
        path = self.folder / f"view-{threading.get_ident()}.json"
        self.ex.save_view(path)
        other = sw.Explorer.load_view(path, engine=self.engine, live=False)
        other.close()

    def bad(self, rng: random.Random) -> None:
        """Input a user gets wrong: refused by name, the explorer stays usable."""
        calls = [
            lambda: self.ex.set(temperature=-1.0),
            lambda: self.ex.set_strength(7, 1.0),
            lambda: self.ex.set_strength(0, math.nan),
            lambda: self.ex.add_feature("no-such-sae", 3),
            lambda: self.ex.evaluate(["x"], ["strong"]),
            lambda: self.ex.completions.select("STEERED", 10_000),
            lambda: self.ex.set(n_completion_tokens=-2),
        ]
        rng.choice(calls)()

    # -- the loop -------------------------------------------------------------------------
    actions = {
        "slider": 8, "settings": 2, "prompt": 2, "run": 3, "stop": 1, "evaluate": 1,
        "click": 2, "effects": 1, "card": 2, "features": 1, "view": 1, "bad": 2,
    }  # fmt: skip

    def wait(self, fn, what: str) -> None:
        if not fn(WAIT_S):
            self.problem(f"{what}: wait did not return in {WAIT_S:.0f} s")

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)

    def act(self, rng: random.Random) -> None:
        name = rng.choices(list(self.actions), weights=list(self.actions.values()))[0]
        try:
            getattr(self, name)(rng)
        except sw.SteerWidgetsError as err:
            if not any(getattr(err, a, None) is not None for a in ("field", "source", "model")):
                self.problem(f"{name}: {err!r} names nothing")
        except Exception as err:  # an unnamed error: the defect this soak looks for
            self.problem(f"{name}: {type(err).__name__}: {err}")
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + 1
        self.peak_mb = max(self.peak_mb, rss_mb())

    def user(self, rng: random.Random, until: float, runs: int) -> None:
        while time.monotonic() < until or self.finished() < runs:
            self.act(rng)
            time.sleep(rng.expovariate(1 / 0.05))

    def finished(self) -> int:
        return sum(1 for r in self.ex.history if not r.get("cancelled"))


def tensor_mb() -> float:
    """Megabytes of tensor storage alive (each storage once): what the resident memory holds
    on purpose, as against what the allocator keeps."""
    import gc

    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values()) / 2**20


def replayed(engine: sw.Engine, runs: list[dict]) -> tuple[int, list[str]]:
    """Each finished run against ``engine.steer`` of its record, read back from JSON."""
    wrong = []
    for i, run in enumerate(runs):
        record = json.loads(json.dumps(run["request"].to_dict()))
        engine.clear_caches()  # DEFAULT decoded again, not served from the cache
        again = engine.steer(sw.SteerRequest.from_dict(record)).outputs
        got = {k: c.token_ids for k, c in run["outputs"].items()}
        if got != {k: c.token_ids for k, c in again.items()}:
            wrong.append(f"run {i}: {record}")
    return len(runs), wrong


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=0, help="go on until this many finished")
    parser.add_argument("--threads", type=int, default=3, help="users acting at once")
    parser.add_argument("--torch-threads", type=int, default=4, help="above a laptop's cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify", type=int, default=10**9, help="replay at most this many")
    parser.add_argument("--only", nargs="*", help="these actions alone (to find a leak)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    faulthandler.enable()
    caught: list[str] = []
    threading.excepthook = lambda a: caught.append(f"{a.thread.name}: {a.exc_type.__name__}")

    torch.set_num_threads(args.torch_threads)
    engine = sw.Engine.default()
    loaded_mb = rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        soak = Soak(engine, Path(tmp), args.seed)
        if args.only:
            soak.actions = {k: v for k, v in soak.actions.items() if k in args.only}
        if not soak.ex.wait(WAIT_S):
            print("the first run did not finish", file=sys.stderr)
            return 3
        started = time.monotonic()
        until = started + args.seconds
        users = [
            threading.Thread(
                target=soak.user, args=(random.Random(args.seed * 100 + i), until, args.runs),
                name=f"user-{i}", daemon=True,
            )
            for i in range(args.threads)
        ]  # fmt: skip
        for t in users:
            t.start()
        deadline = until + 600 + args.runs * 5.0
        for t in users:
            t.join(max(deadline - time.monotonic(), 1))
            if t.is_alive():  # a deadlock: show where every thread is
                faulthandler.dump_traceback(all_threads=True)
                return 3
        soak.ex.stop()
        soak.ex.stop_evaluation()
        for fn, what in ((soak.ex.wait, "run"), (soak.ex.wait_evaluation, "evaluation")):
            soak.wait(fn, what)
        soak.ex.explain.wait(WAIT_S)
        elapsed = time.monotonic() - started
        last_mb = rss_mb()
        held_mb = tensor_mb()
        runs = [r for r in soak.ex.history if not r.get("cancelled") and r.get("outputs")]
        traceback_text = soak.ex.last_traceback
        soak.ex.close()
        checked, wrong = replayed(engine, runs[: args.verify])
    report = {
        "seconds": round(elapsed, 1), "threads": args.threads, "seed": args.seed,
        "actions": soak.counts, "runs_finished": len(runs),
        "runs_replaced_or_stopped": sum(1 for r in soak.ex.history if r.get("cancelled")),
        "runs_checked": checked, "runs_wrong": wrong, "problems": soak.problems[:20],
        "thread_errors": caught[:20], "traceback": traceback_text,
        "rss_loaded_mb": round(loaded_mb), "rss_peak_mb": round(soak.peak_mb),
        "rss_last_mb": round(last_mb), "tensors_last_mb": round(held_mb),
        "rss_max_mb": round(rss_mb("VmHWM")),
        "torch_threads": torch.get_num_threads(),
    }  # fmt: skip
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
