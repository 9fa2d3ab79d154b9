"""A real Granian process serving TinyLoop, for the reliability tests and scripts
(scripts/fuzz_api.py and scripts/soak.py import it from here).

    with LiveServer(model_path, key="k") as server:
        httpx.get(server.base + "/health", headers=server.auth)
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """`granian --interface asgi asgi.app:app` on a free loopback port, its output in a log
    file. start() waits until /health answers `ready` (or raises with the log)."""

    def __init__(self, model_path, key: str | None = "live-test-key", env: dict | None = None,
                 state_dir=None, ready_timeout: float = 600):
        self.model_path, self.key = str(model_path), key
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._tmp = tempfile.TemporaryDirectory(prefix="tinyloop-live-")
        self.state_dir = Path(state_dir or Path(self._tmp.name) / "state")
        self.log_path = Path(self._tmp.name) / "granian.log"
        self.env = {**os.environ, "TINYLOOP_MODEL_PATH": self.model_path,
                    "TINYLOOP_STATE_DIR": str(self.state_dir), **(env or {})}
        if key is not None:
            self.env["TINYLOOP_API_KEY"] = key
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen | None = None

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def start(self, wait_ready: bool = True) -> "LiveServer":
        self._log = open(self.log_path, "w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
             "--port", str(self.port), "asgi.app:app"],
            cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        if wait_ready:
            self.wait_for(lambda health: health == "ready", "ready")
        return self

    def health(self) -> tuple[int, dict] | None:
        try:
            response = httpx.get(f"{self.base}/health", headers=self.auth, timeout=2)
            return response.status_code, response.json()
        except (httpx.HTTPError, ValueError):
            return None

    def metrics(self, timeout: float = 30) -> dict:
        """/metrics as {name or name{labels}: value} (labels kept as written)."""
        values = {}
        text = httpx.get(f"{self.base}/metrics", headers=self.auth, timeout=timeout).text
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_for(self, condition, what: str) -> dict:
        """Poll /health until condition(status text) holds; raise with the log if the
        process exits or the timeout passes."""
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            answer = self.health()
            if answer is not None and condition(answer[1].get("status")):
                return answer[1]
            if self.process.poll() is not None:
                raise AssertionError(f"granian exited with {self.process.returncode} before /health said "
                                     f"{what}:\n{self.log()}")
            time.sleep(0.1)
        raise AssertionError(f"/health did not say {what} within {self.ready_timeout} s "
                             f"(last: {self.health()}):\n{self.log()}")

    def worker_pid(self) -> int | None:
        """Granian's worker process (the one holding the model): the main process's child."""
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then wait; the exit status (SIGKILL and an AssertionError past timeout)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
                raise AssertionError(f"granian did not exit within {timeout} s of SIGTERM:\n{self.log()}")
        return self.process.returncode

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if hasattr(self, "_log"):
            self._log.close()
        self._tmp.cleanup()

    def __enter__(self) -> "LiveServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        try:
            if self.process is not None and self.process.poll() is None:
                self.stop()
        finally:
            self.close()


def summed(values: dict, name: str) -> float:
    """A metric's value summed over its labels (LiveServer.metrics())."""
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))
