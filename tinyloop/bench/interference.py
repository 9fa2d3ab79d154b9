"""How much of the machine other processes used while a run was timed (Linux /proc).

A run shares the CPUs with whatever else the machine does; on a small machine a test
suite or a build in the background slows a multi-threaded BLAS call many times over
(a thread waits at a barrier for a peer that is not scheduled). Each run records the
share of all CPUs' time spent by processes other than this one and the measuring
worker, so a disturbed figure says so instead of passing for the machine's speed.
"""
from __future__ import annotations

import os

DISTURBED = 0.10        # a run during which others used more than this share of the CPUs


def _machine() -> tuple | None:
    """(busy, total) clock ticks of all CPUs since boot; None where /proc/stat is missing."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)        # idle + iowait
    total = sum(values[:8])                                         # guest time is already in user
    return total - idle, total


def _process(pid: int) -> int:
    """User + system ticks of a process (all its threads), 0 if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


class Meter:
    """with Meter(worker_pid) as meter: ... ; meter.share: others' share of the CPUs (None if unknown)."""

    def __init__(self, pid: int):
        self.pids = (pid, os.getpid())
        self.share = None

    def __enter__(self):
        self.start = _machine(), sum(_process(p) for p in self.pids)
        return self

    def __exit__(self, *exc):
        machine, ours = _machine(), sum(_process(p) for p in self.pids)
        if machine is None or self.start[0] is None:
            return False
        busy, total = machine[0] - self.start[0][0], machine[1] - self.start[0][1]
        if total > 0:
            self.share = max(0.0, (busy - (ours - self.start[1])) / total)
        return False


def _group_members(groups: set) -> list:
    """Pids of the processes whose process group is one of `groups` (a server started in a
    session of its own and its worker processes)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) in groups:
                members.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return members


class GroupMeter(Meter):
    """Meter for runs against servers: ours = this process and every process of the
    servers' process groups (pgids), so only other processes count as disturbance."""

    def __init__(self, pgids):
        self.groups = set(pgids)
        self.share = None

    def __enter__(self):
        self.pids = tuple(_group_members(self.groups)) + (os.getpid(),)
        return super().__enter__()
