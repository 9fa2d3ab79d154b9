"""Server settings, from TINYLOOP_* environment variables (documented in the README)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tinyloop.env import env_flag, env_number
from tinyloop.kv.config import kv_budget_from_env, kv_mode_from_env


def _int(name: str, default: int, low: int) -> int:
    return env_number(os.environ, name, default, int, "an integer", lambda n: n >= low, f">= {low}")


def _seconds(name: str, default: float) -> float:
    return env_number(os.environ, name, default, float, "a number of seconds",
                      lambda n: 0 <= n < float("inf"), ">= 0 seconds")


def _device() -> str | None:
    """TINYLOOP_DEVICE, its name checked at start: a typo is a startup error, not a server
    that comes up answering 503 to everything (whether CUDA is there is checked at load)."""
    from tinyloop.backends.select import check_device
    value = os.environ.get("TINYLOOP_DEVICE")
    return check_device(value) if value else None


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "tinyloop"


@dataclass(frozen=True)
class Settings:
    model_path: str | None
    api_key: str | None            # from TINYLOOP_API_KEY; else the key file is used
    auth: bool                     # TINYLOOP_AUTH=0 turns authentication off, explicitly
    state_dir: Path
    max_waiting: int
    max_body_bytes: int
    exit_on_failure: bool
    commit: str | None
    device: str | None
    kv_mode: str = "fp16"
    kv_budget_bytes: int | None = None
    drain_timeout_s: float = 30.0  # after SIGTERM: how long admitted generations may still run
    max_running: int | None = None     # generations stepped together; None: the backend's default
    prefill_chunk: int | None = None   # prompt rows per prefill forward; None: the backend's default
    step_tokens: int | None = None     # rows one engine step takes at most (prefill chunks); None: 2 chunks
    prefix_cache: bool = True          # TINYLOOP_PREFIX_CACHE=0 turns the prefix cache off

    @classmethod
    def from_env(cls) -> "Settings":
        from tinyloop.backends.cuda.graphs import graphs_enabled
        graphs_enabled()                    # TINYLOOP_CUDA_GRAPHS: read by the CUDA backend, a typo refused here
        from tinyloop.backends.cuda.backend import mma_rows_enabled, pair_enabled
        mma_rows_enabled()                  # TINYLOOP_CUDA_MMA_ROWS: likewise
        pair_enabled()                      # TINYLOOP_CUDA_PAIR: likewise
        from tinyloop.backends.cuda.dependent_launch import dependent_launch_enabled
        dependent_launch_enabled()          # TINYLOOP_CUDA_PDL: likewise
        from tinyloop.backends.select import activations_from_env
        activations_from_env()              # TINYLOOP_ACTIVATIONS: read when the backend is made, checked here
        return cls(
            model_path=os.environ.get("TINYLOOP_MODEL_PATH") or None,
            api_key=os.environ.get("TINYLOOP_API_KEY") or None,
            auth=env_flag(os.environ, "TINYLOOP_AUTH", True),
            state_dir=Path(os.environ.get("TINYLOOP_STATE_DIR") or default_state_dir()),
            max_waiting=_int("TINYLOOP_MAX_WAITING", 8, 0),
            max_body_bytes=_int("TINYLOOP_MAX_BODY_BYTES", 1 << 20, 1024),
            exit_on_failure=env_flag(os.environ, "TINYLOOP_EXIT_ON_FAILURE"),
            commit=os.environ.get("TINYLOOP_COMMIT") or None,
            device=_device(),
            kv_mode=kv_mode_from_env(),
            kv_budget_bytes=kv_budget_from_env(),
            drain_timeout_s=_seconds("TINYLOOP_DRAIN_TIMEOUT", 30.0),
            max_running=_int("TINYLOOP_MAX_RUNNING", 0, 1) or None,
            prefill_chunk=_int("TINYLOOP_PREFILL_CHUNK", 0, 1) or None,
            step_tokens=_int("TINYLOOP_STEP_TOKENS", 0, 1) or None,
            prefix_cache=env_flag(os.environ, "TINYLOOP_PREFIX_CACHE", True),
        )
