"""The parent's side of a measuring worker (worker.py): start it, ask it, close it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tinyloop.errors import TinyLoopError

ROOT = Path(__file__).resolve().parents[2]        # the checkout (or site-packages) holding tinyloop/


class WorkerError(TinyLoopError):
    """A measurement failed in a worker process: reported as one line, like every CLI error."""


class Worker:
    def __init__(self, name: str, engine: str, python: str | None = None, root: str | None = None):
        """A worker measuring `engine` ("tinyloop" or "llama") with interpreter `python`
        (default: this one); root: the checkout whose tinyloop a tinyloop worker measures."""
        self.name = name
        command = [python or sys.executable, "-m", "tinyloop.bench.worker", engine]
        if root:
            command += ["--root", str(root)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                            env=env)
        except OSError as exc:
            raise WorkerError(f"{name}: cannot start {command[0]}: {exc.strerror}") from None
        self.pid = self.process.pid
        self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise WorkerError(f"{self.name}: the worker exited (status {self.process.returncode}); "
                              "its error is above")
        return json.loads(line)

    def ask(self, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        result = self._read()
        if "error" in result:
            raise WorkerError(f"{self.name}: {result['error']}")
        return result

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def llama_available(python: str | None) -> str | None:
    """None if `python` (default: this interpreter) can import llama_cpp, else why not."""
    command = [python or sys.executable, "-c", "import llama_cpp; print(llama_cpp.__version__)"]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {command[0]}: {exc}"
    if run.returncode != 0:
        where = python or "this Python"
        return (f"llama-cpp-python is not installed for {where} (pip install llama-cpp-python, "
                "or point --llama-python at an interpreter that has it)")
    return None
