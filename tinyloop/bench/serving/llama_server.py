"""llama.cpp's llama-server beside `tinyloop serve` in the serving scenarios: where to
find the binary, and how it is started (its own process group, a free loopback port)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tinyloop.bench.serving.servers import Server, free_port

BUILD_HINT = "build it with scripts/build_llama_server.sh (a few minutes; pip + cmake + a C++ compiler)"


def installed_path() -> Path:
    """Where scripts/build_llama_server.sh installs the binary."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tinyloop" / "llama-server" / "llama-server"


def locate(flag: str | None, gguf: str | None) -> dict:
    """-> {"status": "found", "path", "version"} or {"status": "skipped", "reason"}.
    flag: --llama-server; without it, llama-server on PATH, else the build script's place."""
    if not gguf:
        return {"status": "skipped", "reason": "needs --gguf (the GGUF the model was converted from)"}
    if flag:
        path = Path(flag)
        if not (path.is_file() and os.access(path, os.X_OK)):
            return {"status": "skipped", "reason": f"--llama-server {flag}: not an executable file; {BUILD_HINT}"}
    else:
        found = shutil.which("llama-server")
        path = Path(found) if found else installed_path()
        if not (path.is_file() and os.access(path, os.X_OK)):
            return {"status": "skipped", "reason": f"no llama-server on PATH or at {installed_path()}; "
                                                   f"{BUILD_HINT}, or pass --llama-server PATH"}
    return {"status": "found", "path": str(path.resolve()), "version": version(path)}


def version(path) -> str:
    """The first line of `llama-server --version` that names a version, or "?"."""
    try:
        run = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "?"
    for line in (run.stdout + run.stderr).splitlines():
        if line.startswith("version"):
            return line.split(":", 1)[-1].strip()
    return "?"


def start(binary: str, gguf: str, key: str, slots: int, context: int, threads: int) -> Server:
    """llama-server with `slots` parallel slots (-np) and `context` tokens of KV cache in all
    (-c; split evenly among the slots), continuous batching and the per-slot prompt cache
    on (its defaults), `threads` threads for decode and for batches."""
    port = free_port()
    command = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
               "-c", str(context), "-t", str(threads), "-tb", str(threads), "--api-key", key]
    return Server(f"llama-server -np {slots}", command, {})
