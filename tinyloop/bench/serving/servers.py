"""Start and stop the servers the HTTP comparison measures, each in a process group of
its own (Granian runs its worker in a child process), on free loopback ports."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections import deque
from pathlib import Path
from threading import Thread

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, command: list, env: dict, unset: tuple = ()):
        self.name, self.port = name, int(command[command.index("--port") + 1])
        full_env = {**os.environ, **env}
        for variable in unset:
            full_env.pop(variable, None)
        full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                                                if os.environ.get("PYTHONPATH") else []))
        self.process = subprocess.Popen(command, env=full_env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.log: deque = deque(maxlen=40)          # the last lines it printed, for an error message
        self.stopped = False                        # stop() was called (an exit not of its own)
        Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.log.append(line.rstrip())

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL if it has not ended within 10 s."""
        self.stopped = True
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass

    def tail(self) -> str:
        return " | ".join(list(self.log)[-5:])


def tinyloop_server(model: str, key: str, max_waiting: int, state_dir: str) -> Server:
    """`tinyloop serve`: Granian, one worker, the raw ASGI app."""
    port = free_port()
    return Server("tinyloop serve", [sys.executable, "-m", "tinyloop", "serve", "--model", model, "--port", str(port),
                                     "--max-waiting", str(max_waiting), "--log-level", "warning"],
                  {"TINYLOOP_API_KEY": key, "TINYLOOP_STATE_DIR": state_dir})


def tinyloop_serving(model: str, key: str, state_dir: str, name: str, max_running: int | None = None,
                     prefix_cache: bool = True, max_waiting: int = 64, device: str | None = None) -> Server:
    """`tinyloop serve` for the serving scenarios: TINYLOOP_MAX_RUNNING (None: the server's
    default) and TINYLOOP_PREFIX_CACHE set explicitly, so the caller's shell cannot change
    what is measured."""
    port = free_port()
    env = {"TINYLOOP_API_KEY": key, "TINYLOOP_STATE_DIR": state_dir,
           "TINYLOOP_PREFIX_CACHE": "1" if prefix_cache else "0"}
    if max_running is not None:
        env["TINYLOOP_MAX_RUNNING"] = str(max_running)
    command = [sys.executable, "-m", "tinyloop", "serve", "--model", model, "--port", str(port),
               "--max-waiting", str(max_waiting), "--log-level", "warning"]
    if device:
        command += ["--device", device]
    return Server(name, command, env, unset=() if max_running is not None else ("TINYLOOP_MAX_RUNNING",))


def fastapi_server(model: str, key: str, max_waiting: int) -> Server:
    """The comparison app (fastapi_app.py) under uvicorn, one worker, no access log."""
    port = free_port()
    return Server("FastAPI + uvicorn", [sys.executable, "-m", "uvicorn", "tinyloop.bench.serving.fastapi_app:app",
                                        "--port", str(port), "--log-level", "warning", "--no-access-log"],
                  {"TINYLOOP_BENCH_MODEL": model, "TINYLOOP_API_KEY": key,
                   "TINYLOOP_BENCH_MAX_WAITING": str(max_waiting)})


def missing_comparison_stack() -> str | None:
    """None when FastAPI, uvicorn and sse-starlette import, else what to install."""
    missing = []
    for module, package in (("fastapi", "fastapi"), ("uvicorn", "uvicorn"), ("sse_starlette", "sse-starlette")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if missing:
        return (f"{', '.join(missing)} not installed: pip install -e '.[bench]' (or pip install "
                f"{' '.join(missing)})")
    return None


def event_loops() -> str:
    """Both servers pick uvloop when it is installed (Granian's and uvicorn's 'auto')."""
    try:
        import uvloop  # noqa: F401
        return "uvloop"
    except ImportError:
        return "asyncio"
