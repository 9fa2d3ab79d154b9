"""The KV cache mode from the environment, as the API document spells it, plus one
clearer variable:

    TINYLOOP_KV_CACHE=fp16|int8|int4|int4-h|fp32      (default fp16)
    TINYLOOP_KV_INT8=1                                -> int8
    TINYLOOP_KV_INT4=1                                -> int4
    TINYLOOP_KV_INT4=1 TINYLOOP_KV_H_MODE=1           -> int4-h
    TINYLOOP_KV_BUDGET_MB=N                           the KV pool size (requests needing more: 400)

Settings that disagree are an error naming them (the server refuses to start).
"""
from __future__ import annotations

import os

from tinyloop.env import env_flag, env_number
from tinyloop.errors import TinyLoopError
from tinyloop.kv.modes import KV_MODES


def kv_mode_from_env(env=None) -> str:
    env = os.environ if env is None else env
    int8, int4, hadamard = (env_flag(env, "TINYLOOP_KV_INT8"), env_flag(env, "TINYLOOP_KV_INT4"),
                            env_flag(env, "TINYLOOP_KV_H_MODE"))
    if int8 and int4:
        raise TinyLoopError("TINYLOOP_KV_INT8=1 and TINYLOOP_KV_INT4=1 conflict: choose one cache mode")
    if hadamard and not int4:
        raise TinyLoopError("TINYLOOP_KV_H_MODE=1 needs TINYLOOP_KV_INT4=1 (the Hadamard rotation is for "
                            "the int4 cache: int4-h)" + (", not TINYLOOP_KV_INT8=1" if int8 else ""))
    legacy = "int8" if int8 else "int4-h" if hadamard else "int4" if int4 else None
    explicit = env.get("TINYLOOP_KV_CACHE") or None
    if explicit is not None and explicit not in KV_MODES:
        raise TinyLoopError(f"TINYLOOP_KV_CACHE must be one of {', '.join(KV_MODES)}, got {explicit!r}")
    if explicit and legacy and explicit != legacy:
        flags = " ".join(f"{n}=1" for n, on in (("TINYLOOP_KV_INT8", int8), ("TINYLOOP_KV_INT4", int4),
                                                  ("TINYLOOP_KV_H_MODE", hadamard)) if on)
        raise TinyLoopError(f"TINYLOOP_KV_CACHE={explicit} conflicts with {flags} (which means {legacy})")
    return explicit or legacy or "fp16"


def kv_budget_from_env(env=None) -> int | None:
    megabytes = env_number(os.environ if env is None else env, "TINYLOOP_KV_BUDGET_MB", None, float,
                           "a number of MiB", lambda n: 0 < n < float("inf"), "positive")
    return None if megabytes is None else int(megabytes * 2**20)
