"""HTTP to an interp-engine server: JSON calls, NDJSON streams, and every fault as a named error.

The server (PyPI ``interp-engine``, ``python -m interp_engine.server``) answers 401 for a
missing or wrong bearer token, 422 for a request it refuses, and 503 with ``Retry-After`` when
its queue is full. Here those become ``RemoteAuthError``, ``RemoteRefused`` and, after a bounded
number of waits that honour ``Retry-After``, ``RemoteBusy``; a refused connection is
``RemoteUnreachable`` and a stream that ends without its ``done`` line is
``RemoteStreamBroken``. Nothing else in steer_widgets speaks HTTP.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import torch
from torch import Tensor

from ..errors import (
    RemoteAuthError,
    RemoteBusy,
    RemoteError,
    RemoteRefused,
    RemoteStreamBroken,
    RemoteUnreachable,
)

TOKEN_ENV = "INTERP_ENGINE_SERVER_TOKEN"  # the variable the server reads its token from
DEFAULT_RETRIES = 5
MAX_RETRY_WAIT_S = 30.0


class RemoteClient:
    """One server: ``get``/``post`` JSON, ``stream`` NDJSON lines. Thread-safe (one pool).

    ``retries`` bounds the waits after a 503; each wait is the server's ``Retry-After``
    (at most ``MAX_RETRY_WAIT_S``). ``read_timeout_s`` is generous because a request queued
    behind another generation gets its first byte only when a slot frees.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        retries: int = DEFAULT_RETRIES,
        read_timeout_s: float = 600.0,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = httpx.Timeout(read_timeout_s, connect=5.0)
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.retries = retries
        self.stats = {"requests": 0, "retries_503": 0}
        self._lock = threading.Lock()

    def get(self, path: str) -> dict:
        return self._json(self._open("GET", path, None, None, stream=False))

    def post(self, path: str, body: dict) -> dict:
        return self._json(self._open("POST", path, body, None, stream=False))

    def stream(
        self, path: str, body: dict, halt: Callable[[], bool] = lambda: False, what: str = ""
    ) -> Iterator[dict]:
        """Yield each NDJSON line as a dict until ``done``; close the stream as soon as
        ``halt()`` is true (checked after every line, so within one token). ``what`` names
        the stream in errors."""
        what = f"{what} stream" if what else "stream"
        resp = self._open("POST", path, body, halt, stream=True)
        if resp is None:  # halted while waiting to retry
            return
        n = 0
        try:
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                item = json.loads(line)
                if item.get("type") == "error":
                    raise RemoteStreamBroken(self.url, f"the server failed mid-{what}: {item}")
                yield item
                n += 1
                if item.get("type") == "done" or halt():
                    return
        except (httpx.TransportError, json.JSONDecodeError) as err:
            raise RemoteStreamBroken(
                self.url, f"the {what} broke after {n} lines ({type(err).__name__}: {err})"
            ) from err
        finally:
            resp.close()
        if not halt():
            raise RemoteStreamBroken(self.url, f"the {what} ended after {n} lines without 'done'")

    def close(self) -> None:
        self._http.close()

    # -- internals -----------------------------------------------------------------------
    def _open(self, method, path, body, halt, stream: bool) -> httpx.Response | None:
        """Send, retrying 503s; raise the named error for every other failure."""
        attempt = 0
        while True:
            with self._lock:
                self.stats["requests"] += 1
            try:
                request = self._http.build_request(method, path, json=body)
                resp = self._http.send(request, stream=stream)
            except httpx.TransportError as err:
                raise RemoteUnreachable(
                    self.url, f"no answer to {method} {path} ({type(err).__name__}: {err})"
                ) from err
            if resp.status_code < 400:
                return resp
            resp.read()
            resp.close()
            if resp.status_code != 503:
                raise self._error(resp, path)
            wait = retry_after(resp)
            if attempt == self.retries:
                raise RemoteBusy(
                    self.url,
                    f"{path} still busy after {attempt + 1} attempts: {_detail(resp)}",
                    attempt + 1,
                    wait,
                )
            with self._lock:
                self.stats["retries_503"] += 1
            if _sleep(wait, halt):
                return None
            attempt += 1

    def _error(self, resp: httpx.Response, path: str) -> RemoteError:
        detail = _detail(resp)
        if resp.status_code == 401:
            return RemoteAuthError(
                self.url,
                f"{detail} (pass token= to Engine.remote or set {TOKEN_ENV})",
            )
        if resp.status_code == 422:
            return RemoteRefused(self.url, f"{path} refused: {detail}")
        return RemoteError(self.url, f"{path} answered HTTP {resp.status_code}: {detail}")

    def _json(self, resp: httpx.Response) -> dict:
        try:
            return resp.json()
        except ValueError as err:
            raise RemoteError(self.url, f"answered something that is not JSON: {err}") from err


def retry_after(resp: httpx.Response) -> float:
    """The server's ``Retry-After`` in seconds (1 when absent or a date), capped."""
    try:
        wait = float(resp.headers.get("Retry-After", "1"))
    except ValueError:
        wait = 1.0
    return min(max(wait, 0.0), MAX_RETRY_WAIT_S)


def _sleep(seconds: float, halt: Callable[[], bool] | None) -> bool:
    """Wait ``seconds``, returning True early once ``halt()`` is true (a cancelled request)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if halt is not None and halt():
            return True
        time.sleep(min(0.05, left))
    return False


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail", resp.text)
    except ValueError:
        detail = resp.text
    return detail if isinstance(detail, str) else json.dumps(detail)


def encode_tensor(t: Tensor) -> dict:
    """A float32 tensor as the server's payload: exact little-endian bytes in base64."""
    a = t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4")
    return {"dtype": "float32", "shape": list(a.shape), "data": base64.b64encode(a).decode()}


def decode_tensor(payload: dict) -> Tensor:
    """A payload from the server (float32 or float16) as a float32 tensor."""
    dtypes = {"float32": "<f4", "float16": "<f2"}
    if payload.get("dtype") not in dtypes:
        raise ValueError(f"unexpected tensor dtype {payload.get('dtype')!r}")
    raw = np.frombuffer(base64.b64decode(payload["data"]), dtype=dtypes[payload["dtype"]])
    return torch.from_numpy(raw.astype(np.float32)).reshape(payload["shape"])
