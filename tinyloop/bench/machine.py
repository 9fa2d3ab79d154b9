"""The machine a bench ran on: CPU model and cores, BLAS, versions."""
from __future__ import annotations

import os
import platform
import sys


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def physical_cores() -> int | None:
    """Distinct (socket, core) pairs in /proc/cpuinfo; None where it does not say."""
    pairs, socket = set(), None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    socket = value.strip()
                elif key == "core id":
                    pairs.add((socket, value.strip()))
    except OSError:
        return None
    return len(pairs) or None


def blas() -> dict:
    """The BLAS NumPy uses and the kernel set it chose (needs threadpoolctl to say)."""
    info = {}
    try:
        from threadpoolctl import threadpool_info
        for pool in threadpool_info():
            if pool.get("user_api") == "blas":
                info = {"library": pool.get("internal_api"), "version": pool.get("version"),
                        "kernels": pool.get("architecture"), "threads": pool.get("num_threads")}
                break
    except ImportError:
        pass
    forced = os.environ.get("OPENBLAS_CORETYPE")
    if forced:
        info["forced_by_OPENBLAS_CORETYPE"] = forced
    return info


def describe() -> dict:
    import numpy as np
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_model(), "cores": physical_cores(), "logical_cpus": os.cpu_count(), "usable_cpus": usable,
            "system": f"{platform.system()} {platform.release()}", "python": sys.version.split()[0],
            "numpy": np.__version__, "blas": blas()}


def one_line(machine: dict) -> str:
    blas_info = machine["blas"]
    kernels = f" {blas_info['kernels']} kernels" if blas_info.get("kernels") else ""
    forced = (f" (forced by OPENBLAS_CORETYPE={blas_info['forced_by_OPENBLAS_CORETYPE']})"
              if blas_info.get("forced_by_OPENBLAS_CORETYPE") else "")
    # Without threadpoolctl the library is unknown, but a forced kernel set is still worth saying.
    name = " ".join(str(part) for part in (blas_info.get("library") or "BLAS", blas_info.get("version")) if part)
    library = f", {name}{kernels}{forced}" if blas_info else ""
    cores = f"{machine['cores']} cores, " if machine["cores"] else ""
    return (f"{machine['cpu']}, {cores}{machine['logical_cpus']} logical CPUs; Python {machine['python']}, "
            f"numpy {machine['numpy']}{library}")
