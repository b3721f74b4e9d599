"""A long day in the explorer, compressed: several threads drive one explorer on the
quantized default model at random, as a user's clicks and a notebook's calls would.

Run by ``test_soak.py`` in a subprocess (a crash or a deadlock is a failure there, and the
resident memory measured is the explorer's alone); by hand::

    python tests/soak.py --actions 6000 --runs 100 --json soak.json

It counts work, not seconds: the users act until every kind of action has been taken
``--each`` times, ``--actions`` in all, ``--runs`` runs have finished and ``--replaced`` were
replaced or stopped, so a slower machine does the same work in more time. ``--hang-s`` is a
hang guard only (exit 4 naming what was still missing).

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
from dataclasses import dataclass
from pathlib import Path

import torch

import steer_widgets as sw

SOURCE = "12-smollm2-res-4k"
PROMPTS = ["I think that", "The ocean is", "My favourite food is", "Once upon a time"]
TOKENS = 8
WAIT_S = 120.0  # any wait longer than this is a deadlock
# While only finished runs are missing: actions that never replace the run, and runs waited for
CALM = {"run": 3, "click": 2, "card": 2, "view": 1}


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


@dataclass(frozen=True)
class Goal:
    """The work a soak does before it stops: counts, never seconds."""

    each: int = 2  # every kind of action at least this often
    actions: int = 150  # actions in all
    runs: int = 3  # runs finished (each replayed against engine.steer)
    replaced: int = 3  # runs replaced by a newer change or stopped


class Soak:
    """The explorer, the actions a user takes on it, and what went wrong."""

    def __init__(self, engine: sw.Engine, folder: Path, seed: int, goal: Goal = Goal()) -> None:
        self.engine = engine
        self.folder = folder
        self.seed = seed
        self.goal = goal
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

    def run(self, rng: random.Random, calm: bool = False) -> None:
        self.ex.run()
        if calm or rng.random() < 0.5:
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

    def act(self, rng: random.Random, calm: bool = False) -> None:
        """One action drawn by weight; ``calm``: one that lets the running run finish."""
        weights = {k: v for k, v in CALM.items() if calm and k in self.actions} or self.actions
        name = rng.choices(list(weights), weights=list(weights.values()))[0]
        try:
            getattr(self, name)(rng, calm) if name == "run" else getattr(self, name)(rng)
        except sw.SteerWidgetsError as err:
            if not any(getattr(err, a, None) is not None for a in ("field", "source", "model")):
                self.problem(f"{name}: {err!r} names nothing")
        except Exception as err:  # an unnamed error: the defect this soak looks for
            self.problem(f"{name}: {type(err).__name__}: {err}")
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + 1
        self.peak_mb = max(self.peak_mb, rss_mb())

    def user(self, rng: random.Random, hang_at: float) -> None:
        """Act until the goal is met (or the hang guard's time has come)."""
        while (missing := self.missing()) and time.monotonic() < hang_at:
            self.act(rng, calm=missing == ["runs"])
            time.sleep(rng.expovariate(1 / 0.05))

    def missing(self) -> list[str]:
        """The parts of the goal not met yet: once only finished runs are missing, the users
        calm down (no action that replaces the run) so that runs finish on any machine."""
        with self.lock:
            counts = dict(self.counts)
        history = list(self.ex.history)
        gaps = {
            "each": any(counts.get(k, 0) < self.goal.each for k in self.actions),
            "actions": sum(counts.values()) < self.goal.actions,
            "replaced": len(replaced_runs(history)) < self.goal.replaced,
            "runs": len(finished_runs(history)) < self.goal.runs,
        }
        return [name for name, short in gaps.items() if short]


def finished_runs(history: list[dict]) -> list[dict]:
    return [r for r in history if not r.get("cancelled") and r.get("outputs")]


def replaced_runs(history: list[dict]) -> list[dict]:
    return [r for r in history if r.get("cancelled")]


def drive(soak: Soak, threads: int, seed: int, hang_s: float) -> int:
    """The users acting until the goal is met: 0, or 4 when the hang guard's time came first
    (what was missing on stderr), or 3 when a user never came back (every stack dumped)."""
    hang_at = time.monotonic() + hang_s
    users = [
        threading.Thread(
            target=soak.user, args=(random.Random(seed * 100 + i), hang_at),
            name=f"user-{i}", daemon=True,
        )
        for i in range(threads)
    ]  # fmt: skip
    for t in users:
        t.start()
    for t in users:
        t.join(max(hang_at + 2 * WAIT_S - time.monotonic(), 1))
        if t.is_alive():  # a deadlock: show where every thread is
            faulthandler.dump_traceback(all_threads=True)
            return 3
    if missing := soak.missing():
        print(f"hang guard: the soak's goal {soak.goal} was not met in {hang_s:.0f} s, "
              f"missing {missing}; actions {soak.counts}", file=sys.stderr)  # fmt: skip
        return 4
    return 0


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
    parser.add_argument("--each", type=int, default=Goal.each, help="each kind of action")
    parser.add_argument("--actions", type=int, default=Goal.actions, help="actions in all")
    parser.add_argument("--runs", type=int, default=Goal.runs, help="runs finished")
    parser.add_argument("--replaced", type=int, default=Goal.replaced, help="runs replaced")
    parser.add_argument("--hang-s", type=float, default=1800.0, help="a hang guard, not a goal")
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
    goal = Goal(args.each, args.actions, args.runs, args.replaced)
    with tempfile.TemporaryDirectory() as tmp:
        soak = Soak(engine, Path(tmp), args.seed, goal)
        if args.only:
            soak.actions = {k: v for k, v in soak.actions.items() if k in args.only}
        if not soak.ex.wait(WAIT_S):
            print("the first run did not finish", file=sys.stderr)
            return 3
        started = time.monotonic()
        if code := drive(soak, args.threads, args.seed, args.hang_s):
            return code
        soak.ex.stop()
        soak.ex.stop_evaluation()
        for fn, what in ((soak.ex.wait, "run"), (soak.ex.wait_evaluation, "evaluation")):
            soak.wait(fn, what)
        soak.ex.explain.wait(WAIT_S)
        elapsed = time.monotonic() - started
        last_mb = rss_mb()
        held_mb = tensor_mb()
        runs = finished_runs(soak.ex.history)
        traceback_text = soak.ex.last_traceback
        soak.ex.close()
        checked, wrong = replayed(engine, runs[: args.verify])
    report = {
        "seconds": round(elapsed, 1), "threads": args.threads, "seed": args.seed,
        "actions": soak.counts, "runs_finished": len(runs),
        "runs_replaced_or_stopped": len(replaced_runs(soak.ex.history)),
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
