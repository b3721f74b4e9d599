"""Neuronpedia's pages and explanations for SAEs that have them (SAE Lens' registry gives each
release SAE a Neuronpedia id, ``model/source`` such as ``gpt2-small/8-res-jb``).

Explanations are fetched on demand, one feature per request (``GET
/api/feature/{model}/{source}/{index}``, whose JSON carries ``explanations: [{description}]``),
and kept on disk under ``cache_dir()/neuronpedia`` so a feature is asked for once. For many
features Neuronpedia asks for its exports instead of the API, so nothing here fetches a
whole SAE unasked. Offline (``HF_HUB_OFFLINE`` or ``STEER_WIDGETS_OFFLINE`` set, or nothing
answers) a ``NeuronpediaUnavailable`` says so and callers keep their local labels.
``NEURONPEDIA_URL`` points at another server (a mirror, or a test's).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import SteerWidgetsError
from ..files import write_text_atomically
from ..runtime.paths import cache_dir

DEFAULT_URL = "https://www.neuronpedia.org"
TIMEOUT_S = 5.0
OFFLINE_VARS = ("STEER_WIDGETS_OFFLINE", "HF_HUB_OFFLINE")


class NeuronpediaUnavailable(SteerWidgetsError, ConnectionError):
    """Neuronpedia cannot be asked (offline, unreachable, rate-limited): local labels stay."""


def base_url() -> str:
    return os.environ.get("NEURONPEDIA_URL", DEFAULT_URL).rstrip("/")


def feature_url(neuronpedia_id: str, index: int) -> str:
    """The feature's page, e.g. https://www.neuronpedia.org/gpt2-small/8-res-jb/100."""
    return f"{base_url()}/{neuronpedia_id}/{int(index)}"


def offline() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARS
    )


class Explanations:
    """The on-disk cache of one SAE's explanations (``""``: asked, none written yet)."""

    _lock = threading.Lock()

    def __init__(self, neuronpedia_id: str) -> None:
        self.neuronpedia_id = neuronpedia_id
        self.path = cache_dir() / "neuronpedia" / f"{neuronpedia_id.replace('/', '__')}.json"

    def cached(self) -> dict[int, str]:
        try:
            return {int(k): str(v) for k, v in json.loads(self.path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def fetch(self, indices: Iterable[int]) -> dict[int, str]:
        """Explanations of ``indices``, asking Neuronpedia for the ones not on disk yet. The
        file is written once per call, not once per index (each write rewrites it whole),
        and also when a later request fails, so what arrived is kept."""
        have = self.cached()
        wanted = [int(i) for i in indices]
        missing = [i for i in wanted if i not in have]
        if missing and offline():
            raise NeuronpediaUnavailable(_offline_message())
        fetched: dict[int, str] = {}
        try:
            for i in missing:
                fetched[i] = _description(self.neuronpedia_id, i)
        finally:
            if fetched:
                self._save(fetched)
        have.update(fetched)
        return {i: have[i] for i in wanted}

    def _save(self, new: dict[int, str]) -> None:
        """``new`` merged into the file as it is now (other threads and processes add to it
        too), under the class lock and a lock file beside it, written whole or not at all
        through a temporary file of this call's own (``files.py``): no entry is lost, no two
        writers share a name, and a failed write is a ``FileWriteError``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, _locked(self.path.with_suffix(".lock")):
            merged = {**self.cached(), **new}
            write_text_atomically(
                self.path, json.dumps({str(k): v for k, v in sorted(merged.items())})
            )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (flock; where there is none, as on
    Windows, the class lock alone)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _offline_message() -> str:
    set_vars = [v for v in OFFLINE_VARS if os.environ.get(v)]
    return (
        f"Neuronpedia explanations need the network ({', '.join(set_vars)} set); "
        "local labels are shown"
    )


def _description(neuronpedia_id: str, index: int) -> str:
    """The first explanation's text of one feature, or ``""`` when it has none."""
    model, source = neuronpedia_id.split("/", 1)
    path = "/".join(urllib.parse.quote(p, safe="") for p in (model, source, str(index)))
    url = f"{base_url()}/api/feature/{path}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            data = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return ""
        raise NeuronpediaUnavailable(f"Neuronpedia answered HTTP {err.code} for {url}") from err
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise NeuronpediaUnavailable(
            f"Neuronpedia could not be reached at {base_url()} ({err}); local labels are shown"
        ) from err
    for explanation in (data or {}).get("explanations") or ():
        text = str((explanation or {}).get("description") or "").strip()
        if text:
            return text
    return ""
