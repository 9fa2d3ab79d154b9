"""Fault injection for the reliability tests: OFF in production.

The engine reads a fault plan only when TINYLOOP_TEST_HOOKS=1 is set; without it,
TINYLOOP_TEST_FAULT is ignored entirely (a stray variable cannot break a server).

    TINYLOOP_TEST_HOOKS=1 TINYLOOP_TEST_FAULT=decode:3    (raise before the 4th decode step)

A point is `prefill` (a step of a sequence's prefill), `decode` (a plain decode step) or
`speculative` (a step of a draft-and-verify round); the number is how many steps of that kind
run normally before the fault (default 0). The fault is an InjectedFault raised inside
the engine's step, where a kernel error would be: the engine treats it as any internal
error (worker_failed, README "Reliability").
"""
from __future__ import annotations

from dataclasses import dataclass

from tinyloop.env import env_flag
from tinyloop.errors import TinyLoopError

POINTS = ("prefill", "decode", "speculative")


class InjectedFault(RuntimeError):
    """The failure a test asked for (TINYLOOP_TEST_FAULT)."""


@dataclass
class FaultPlan:
    point: str           # one of POINTS
    after: int           # steps of that kind that run normally first
    seen: int = 0

    def before_step(self, sequence) -> None:
        """Called by the engine thread before each step of a sequence; raises at the planned one."""
        if not sequence.prompt_done:
            phase = "prefill"
        else:
            phase = "decode" if sequence.request.mode == "generate" else "speculative"
        if phase != self.point:
            return
        self.seen += 1
        if self.seen == self.after + 1:
            raise InjectedFault(f"injected fault before {self.point} step {self.seen} (TINYLOOP_TEST_FAULT)")


def fault_plan_from_env(env) -> FaultPlan | None:
    """The plan TINYLOOP_TEST_FAULT asks for, or None; always None unless TINYLOOP_TEST_HOOKS=1."""
    if not env_flag(env, "TINYLOOP_TEST_HOOKS"):
        return None
    spec = env.get("TINYLOOP_TEST_FAULT") or ""
    if not spec:
        return None
    point, _, after = spec.partition(":")
    if point not in POINTS or not (after == "" or after.isdigit()):
        raise TinyLoopError(f"TINYLOOP_TEST_FAULT must be POINT or POINT:N with POINT one of "
                            f"{', '.join(POINTS)}, got {spec!r}")
    return FaultPlan(point, int(after or 0))
