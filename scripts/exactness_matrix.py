"""Re-run the exactness tests under every compile target, BLAS kernel set and NumPy SIMD level
this CPU can run, and compare the compiled kernels' logits across compile targets.

    python scripts/exactness_matrix.py            # full set under the CPU's own kernels, reduced under the rest
    python scripts/exactness_matrix.py --full     # the full exactness set under every configuration
    python scripts/exactness_matrix.py --list     # what would run here, and why; runs nothing
    python scripts/exactness_matrix.py --jobs 2   # two configurations at a time (default: one)
    python scripts/exactness_matrix.py --after-suite  # CI: the suite ran the reduced set here already

The CPU kernels (backends/cpu, the default) are compiled by numba for the CPU it runs on
unless NUMBA_CPU_NAME names another target (with NUMBA_CPU_FEATURES naming that CPU's
features: backends/cpu/targets.py; a name alone keeps this CPU's), and their integer kernels
pick their instructions by the target (VNNI, AVX2, SSSE3 or portable code, kernels/simd.py); NumPy's
OpenBLAS, which the NumPy reference backend and the tests' oracles use, picks its kernels
for the CPU it finds (DYNAMIC_ARCH), and NumPy picks SIMD loops the same way. So "bit for
bit" proved on one machine says little about the next. Each configuration runs
`pytest -m exactness` in a fresh process:
- this CPU's own compile target and BLAS kernels: the full set;
- each numba compile target this CPU executes, paired with the OpenBLAS core type of the
  same instruction set: generic with Prescott (SSE3), nehalem with Nehalem, sandybridge
  with Sandybridge (AVX), haswell with Haswell (AVX2), skylake-avx512 with SkylakeX and
  icelake-server with Cooperlake (AVX-512): the reduced set (every 2nd to 4th case of the
  long sweeps), so every target and every core type runs once;
- the NumPy reference backend (TINYLOOP_CPU_KERNELS=numpy) with NumPy narrowed to its
  baseline SIMD (NPY_DISABLE_CPU_FEATURES): its own exactness claims, reduced;
- TINYLOOP_ACTIVATIONS=fp16 (linear inputs rounded to half), reduced.
The kernels OpenBLAS actually loaded are read back (OPENBLAS_VERBOSE=2) and reported.

The tests that run the CUDA kernel sources on the CPU harness (marked `harness`: tests/cudasim)
run under this CPU's own configuration only. What the other configurations change cannot
break an equality these tests check: the harness compiles the kernels with g++ and fixed flags
(tests/cudasim/build.py), the CUDA backend calls no numba kernel and no BLAS, and these tests
name their activations themselves; NumPy's SIMD level can move host-side inputs (the rope
table, computed with NumPy on a GPU host too), which both sides of each comparison share.
With --after-suite the first configuration runs only the cases the reduced set leaves out
(--exactness-rest): the test suite and `pytest -m slow`, under the same configuration, run the
reduced set, so CI runs each case once there.

Then scripts/logit_fingerprint.py writes the logits of every forward path (prefill, decode,
verify, a draft tree; float and int8/int4/int2 models; every KV mode; a window) under this
CPU's own target, NUMBA_CPU_NAME=generic and every named target this CPU executes, and every
file must equal the first bit for bit. Exit status 0 only when every configuration that ran passed.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyloop.backends.cpu.targets import compile_env  # noqa: E402  (numba's target and its features)

# OpenBLAS core type -> the /proc/cpuinfo flags its kernels need
CORE_TYPES = {
    "Prescott": {"pni"},
    "Nehalem": {"ssse3", "sse4_2"},
    "Sandybridge": {"avx"},
    "Haswell": {"avx2", "fma"},
    "SkylakeX": {"avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512cd"},
    "Cooperlake": {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"},
    "SapphireRapids": {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_tile"},
}

# numba (LLVM) compile target -> the /proc/cpuinfo flags its code needs
COMPILE_TARGETS = {
    "generic": set(),
    "nehalem": {"ssse3", "sse4_2"},
    "sandybridge": {"avx"},
    "haswell": {"avx2", "fma", "bmi2", "f16c"},
    "skylake-avx512": {"avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512cd"},
    "icelake-server": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi"},
}

_PROBE = """
import numpy
try:
    from numpy._core._multiarray_umath import __cpu_features__ as found, __cpu_dispatch__ as dispatch
except ImportError:
    from numpy.core._multiarray_umath import __cpu_features__ as found, __cpu_dispatch__ as dispatch
print("SIMD:" + ",".join(name for name in dispatch if found.get(name)))
"""


@dataclass
class Configuration:
    name: str
    env: dict                       # variables to set; None values are removed
    reduced: bool
    why: str
    harness: bool = False           # also the CUDA-harness tests (this CPU's own configuration only)
    rest: bool = False              # only the cases the reduced set leaves out (--after-suite)
    kernels: str = "?"              # what OpenBLAS loaded
    simd: str = "?"                 # NumPy's active dispatch targets
    skipped: str = ""
    passed: int = 0
    failed: int = 0
    seconds: float = 0.0
    tail: list = field(default_factory=list)

    def set_name(self) -> str:
        cases = "rest of the full" if self.rest else "reduced" if self.reduced else "full"
        return cases if self.harness else f"{cases} (no harness)"


def cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    match = re.search(r"^flags\s*:\s*(.*)$", text, re.MULTILINE)
    return set(match.group(1).split()) if match else None


def environment(overrides: dict) -> dict:
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)          # every configuration says its own, or lets OpenBLAS choose
    env.pop("NPY_DISABLE_CPU_FEATURES", None)
    env.pop("TINYLOOP_ACTIVATIONS", None)
    env.pop("TINYLOOP_CPU_KERNELS", None)
    env.pop("NUMBA_CPU_NAME", None)
    env.pop("NUMBA_CPU_FEATURES", None)
    for key, value in overrides.items():
        if value is not None:
            env[key] = value
    return env


def probe(config: Configuration) -> None:
    """Which OpenBLAS kernels and NumPy SIMD targets this configuration really gets."""
    env = environment({**config.env, "OPENBLAS_VERBOSE": "2"})
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True)
    text = out.stdout + out.stderr
    core = re.findall(r"Core: (\w+)", text)
    config.kernels = core[-1] if core else "not OpenBLAS (kernels cannot be forced)"
    simd = re.search(r"SIMD:(.*)", text)
    config.simd = (simd.group(1) or "baseline only") if simd else "?"


def dispatch_targets() -> list[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE], env=environment({}), capture_output=True, text=True)
    match = re.search(r"SIMD:(.*)", out.stdout)
    return [t for t in match.group(1).split(",") if t] if match else []


# numba compile target -> the OpenBLAS core type of the same instruction set, run together
PAIRS = (("generic", "Prescott"), ("nehalem", "Nehalem"), ("sandybridge", "Sandybridge"), ("haswell", "Haswell"),
         ("skylake-avx512", "SkylakeX"), ("icelake-server", "Cooperlake"))


def plan(full: bool, after_suite: bool = False) -> list[Configuration]:
    configs = [Configuration("this CPU's own kernels", {}, reduced=False, harness=True, rest=after_suite,
                             why="this CPU's own compile target, OPENBLAS_CORETYPE unset: the full set"
                                 + (" less the reduced set the suite runs" if after_suite else ""))]
    flags = cpu_flags()
    for target, core in PAIRS:
        needs = COMPILE_TARGETS[target] | CORE_TYPES[core]
        name = f"{target} + {core}"
        if flags is None:
            configs.append(Configuration(name, {}, True, "", skipped="no /proc/cpuinfo: cannot tell what runs"))
        elif not needs <= flags:
            configs.append(Configuration(name, {}, True, "", skipped=f"CPU lacks {' '.join(sorted(needs - flags))}"))
        else:
            configs.append(Configuration(name, {**compile_env(target), "OPENBLAS_CORETYPE": core},
                                         reduced=not full, why=f"NUMBA_CPU_NAME={target} (its features) OPENBLAS_CORETYPE={core}"))
    targets = dispatch_targets()
    configs.append(Configuration("NumPy reference backend", {"TINYLOOP_CPU_KERNELS": "numpy",
                                                             "NPY_DISABLE_CPU_FEATURES": " ".join(targets) or None},
                                 reduced=not full, why="TINYLOOP_CPU_KERNELS=numpy, NumPy's baseline SIMD: the "
                                                       "reference backend's own claims"))
    configs.append(Configuration("fp16 activations", {"TINYLOOP_ACTIVATIONS": "fp16"}, reduced=not full,
                                 why="TINYLOOP_ACTIVATIONS=fp16: the exactness rule with half linear inputs"))
    return configs


@dataclass
class Target:
    name: str                       # NUMBA_CPU_NAME, or "" for this CPU's own
    skipped: str = ""
    arrays: int = 0
    differing: list = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""


def compile_targets() -> list[Target]:
    flags = cpu_flags()
    targets = [Target("")]
    for name, needs in COMPILE_TARGETS.items():
        if flags is None:
            targets.append(Target(name, skipped="no /proc/cpuinfo: cannot tell what runs"))
        elif not needs <= flags:
            targets.append(Target(name, skipped=f"CPU lacks {' '.join(sorted(needs - flags))}"))
        else:
            targets.append(Target(name))
    return targets


def fingerprint(target: Target, path: Path) -> dict | None:
    """Run scripts/logit_fingerprint.py on the compiled kernels under `target`; its arrays."""
    import numpy as np
    env = environment({"TINYLOOP_CPU_KERNELS": "numba", **compile_env(target.name)})
    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "logit_fingerprint.py"), str(path)], cwd=ROOT,
                         env=env, capture_output=True, text=True)
    target.seconds = time.perf_counter() - start
    if out.returncode != 0:
        target.error = (out.stdout + out.stderr).strip().splitlines()[-1:] or ["failed"]
        target.error = target.error[0]
        return None
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    target.arrays = len(arrays)
    return arrays


def compare_targets(workdir: Path, jobs: int = 1) -> list[Target]:
    """Every compile target's logits against this CPU's own target's, bit for bit (the
    fingerprints written `jobs` at a time, each its own process; compared in order)."""
    import numpy as np
    targets = compile_targets()
    reference = None
    runnable = [t for t in targets if not t.skipped]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        written = {id(t): pool.submit(fingerprint, t, workdir / f"{t.name or 'host'}.npz") for t in runnable}
    for target in targets:
        if target.skipped:
            print(f"  {target.name:<24} skipped: {target.skipped}")
            continue
        label = target.name or "this CPU's own target"
        print(f"  {label:<24} logits of every path ...", end=" ", flush=True)
        arrays = written[id(target)].result()
        if arrays is None:
            print(f"FAILED: {target.error}")
            continue
        if reference is None:
            reference = arrays
        else:
            target.differing = [key for key in reference
                                if key not in arrays or arrays[key].tobytes() != reference[key].tobytes()]
        verdict = "ok" if not target.differing else f"FAILED: {len(target.differing)} arrays differ"
        print(f"{verdict}: {target.arrays} arrays in {target.seconds:.0f} s", flush=True)
        for key in target.differing[:10]:
            print(f"      differs: {key.replace('|', '/')}")
    return targets


def run(config: Configuration, pytest_args: list[str]) -> None:
    marks = "exactness" if config.harness else "exactness and not harness"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marks, *pytest_args]
    if config.rest:
        command.append("--exactness-rest")
    elif not config.reduced:
        command.append("--exactness-full")
    start = time.perf_counter()
    out = subprocess.run(command, cwd=ROOT, env=environment(config.env), capture_output=True, text=True)
    config.seconds = time.perf_counter() - start
    lines = (out.stdout + out.stderr).strip().splitlines()
    summary = lines[-1] if lines else ""
    config.passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", summary)) else 0
    config.failed = int(m.group(1)) if (m := re.search(r"(\d+) (?:failed|errors?)", summary)) else 0
    if out.returncode != 0 and config.failed == 0:
        config.failed = 1                       # pytest itself failed (collection, crash)
    if out.returncode != 0:
        config.tail = [line for line in lines if line.startswith(("FAILED", "ERROR"))][:20] or lines[-20:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the full exactness set under every configuration")
    parser.add_argument("--list", action="store_true", help="show the configurations and exit")
    parser.add_argument("--after-suite", action="store_true",
                        help="the test suite and -m slow run (or ran) the reduced set under this CPU's own "
                             "configuration: run only the rest of the full set there (CI)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="configurations run at once, each its own process (default 1; the tests "
                             "are single-threaded compute, and no result depends on timing)")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --), e.g. -- -x")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    configs = plan(args.full, args.after_suite)
    seen_kernels: dict[tuple, str] = {}
    for config in configs:
        if config.skipped:
            continue
        probe(config)
        # what the run depends on: the kernels loaded, and any setting of ours (fp16 activations)
        key = (config.kernels, config.simd, config.env.get("TINYLOOP_ACTIVATIONS"),
               config.env.get("TINYLOOP_CPU_KERNELS"), config.env.get("NUMBA_CPU_NAME"))
        if key in seen_kernels:
            config.skipped = f"OpenBLAS loaded {config.kernels} kernels: already run as '{seen_kernels[key]}'"
        else:
            seen_kernels[key] = config.name
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; exactness tests: pytest -m exactness")
    for config in configs:
        if config.skipped or args.list:
            state = (f"skipped: {config.skipped}" if config.skipped else
                     f"would run: {config.why}; OpenBLAS {config.kernels}; NumPy SIMD {config.simd}")
            print(f"  {config.name:<24} {state}")
    if not args.list:
        to_run = [c for c in configs if not c.skipped]
        print(f"running {len(to_run)} configurations, {args.jobs} at a time", flush=True)
        # each configuration is its own pytest process; threads only wait on them
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            done = {pool.submit(run, config, args.pytest_args): config for config in to_run}
            for future in as_completed(done):
                config = done[future]
                future.result()
                verdict = "ok" if not config.failed else "FAILED"
                print(f"  {config.name:<24} {config.why}; OpenBLAS {config.kernels}; NumPy SIMD {config.simd}; "
                      f"{config.set_name()} set: {verdict}: {config.passed} passed, "
                      f"{config.failed} failed in {config.seconds:.0f} s", flush=True)
                for line in config.tail:
                    print(f"      {line}")
    if args.list:
        for target in compile_targets():
            state = f"skipped: {target.skipped}" if target.skipped else "would compare its logits with the first"
            print(f"  compile target {target.name or '(this CPU)':<16} {state}")
        return 0
    print("compiled CPU kernels across compile targets: logits bit for bit (scripts/logit_fingerprint.py)")
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        targets = compare_targets(Path(tmp), args.jobs)
    ran = [c for c in configs if not c.skipped]
    failed = [c.name for c in ran if c.failed]
    compared = [t for t in targets if not t.skipped]
    failed += [f"compile target {t.name or 'host'}" for t in compared if t.error or t.differing]
    print(f"\n{len(ran)} configurations run, {len(compared)} compile targets compared, {len(failed)} failed"
          + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed or not ran or len(compared) < 2 else 0


if __name__ == "__main__":
    sys.exit(main())
