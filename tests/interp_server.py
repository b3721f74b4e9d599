"""A real interp-engine server on 127.0.0.1 for the remote tests: the default model on CPU.

``python -m interp_engine.server`` (PyPI ``interp-engine``, installed by ``make`` as our
``remote`` extra) serves the clean float32 copy of the default model that
``model.default_model_dir()`` keeps; it is offline and starts in a few seconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TOKEN = "test-token-7f3a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process; ``url`` once ready. ``extra`` adds server flags (limits);
    ``threads`` is its torch thread count."""

    def __init__(
        self, model_dir: Path, workdir: Path, extra: tuple[str, ...] = (), threads: int = 1
    ) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        # A GGUF-built config keeps quantization_config, which transformers then refuses.
        assert "quantization_config" not in config, f"{model_dir} is not a clean copy"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"server-{self.port}.log"
        env = {**os.environ, "INTERP_ENGINE_SERVER_TOKEN": TOKEN, "HF_HUB_OFFLINE": "1"}
        env["OMP_NUM_THREADS"] = str(threads)
        cmd = [sys.executable, "-m", "interp_engine.server", "--model", str(model_dir)]
        cmd += ["--backend", "eager", "--device", "cpu", "--dtype", "float32"]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*cmd, *extra], cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if json.loads(r.read())["status"] == "ready":
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout_s} s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: no goodbye on open streams, as when a machine dies."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
