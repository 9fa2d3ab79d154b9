"""scripts/exactness_matrix.py: plans only what the CPU can run, controls the BLAS kernels
itself (never inheriting a pinned core type), reports what OpenBLAS really loaded, and
counts results honestly."""
import importlib.util
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tinyloop.backends.cpu.targets import FEATURES

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "exactness_matrix.py"
spec = importlib.util.spec_from_file_location("exactness_matrix", SCRIPT)
matrix = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = matrix          # dataclasses look their module up
spec.loader.exec_module(matrix)

HASWELL_FLAGS = {"pni", "ssse3", "sse4_2", "avx", "avx2", "fma"}
x86_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not (matrix.cpu_flags() or set()) >= {"avx"},
                              reason="OpenBLAS core types are x86-64 kernels; needs an AVX CPU")


def test_plan_runs_what_the_cpu_executes_and_names_what_it_lacks(monkeypatch):
    monkeypatch.setattr(matrix, "cpu_flags", lambda: HASWELL_FLAGS | {"bmi2", "f16c"})
    monkeypatch.setattr(matrix, "dispatch_targets", lambda: ["X86_V2", "X86_V3"])
    configs = {c.name: c for c in matrix.plan(full=False)}
    first = next(iter(configs.values()))
    assert first.env == {} and not first.reduced                       # the CPU's own kernels: the full set
    # every compile target paired with the core type of its instruction set, each once
    assert configs["haswell + Haswell"].env == {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": FEATURES["haswell"],
                                                "OPENBLAS_CORETYPE": "Haswell"}
    assert "+avx2" in FEATURES["haswell"] and "avx512" not in FEATURES["haswell"]   # the named CPU's, not this one's
    assert configs["haswell + Haswell"].reduced
    assert configs["generic + Prescott"].env == {"NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": "",
                                                 "OPENBLAS_CORETYPE": "Prescott"}
    assert configs["nehalem + Nehalem"].skipped == "" and configs["sandybridge + Sandybridge"].skipped == ""
    assert "avx512f" in configs["skylake-avx512 + SkylakeX"].skipped
    assert "avx512_bf16" in configs["icelake-server + Cooperlake"].skipped
    assert not matrix.plan(full=True)[4].reduced
    # the NumPy reference backend on NumPy's baseline SIMD, and fp16 activations
    assert configs["NumPy reference backend"].env == {"TINYLOOP_CPU_KERNELS": "numpy",
                                                      "NPY_DISABLE_CPU_FEATURES": "X86_V2 X86_V3"}
    assert configs["fp16 activations"].env == {"TINYLOOP_ACTIVATIONS": "fp16"} and configs["fp16 activations"].reduced
    # the CUDA-harness tests under the CPU's own configuration only; the rest of the full set
    # there only after the suite (--after-suite)
    assert first.harness and not any(c.harness for c in list(configs.values())[1:])
    assert not first.rest and matrix.plan(full=False, after_suite=True)[0].rest
    assert not any(c.rest for c in matrix.plan(full=False, after_suite=True)[1:])


def test_a_pinned_core_type_in_the_callers_environment_is_not_inherited(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")
    monkeypatch.setenv("NPY_DISABLE_CPU_FEATURES", "X86_V4")
    monkeypatch.setenv("TINYLOOP_ACTIVATIONS", "fp16")
    env = matrix.environment({})
    assert "OPENBLAS_CORETYPE" not in env and "NPY_DISABLE_CPU_FEATURES" not in env
    assert "TINYLOOP_ACTIVATIONS" not in env
    assert matrix.environment({"OPENBLAS_CORETYPE": "Haswell"})["OPENBLAS_CORETYPE"] == "Haswell"


@x86_only
def test_probe_reports_the_kernels_openblas_loaded(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Nehalem")          # pinned by the caller: must not leak
    forced = matrix.Configuration("Nehalem", {"OPENBLAS_CORETYPE": "Nehalem"}, True, "")
    own = matrix.Configuration("own", {}, False, "")
    matrix.probe(forced)
    matrix.probe(own)
    if forced.kernels.startswith("not OpenBLAS"):
        pytest.skip("NumPy here is not built on OpenBLAS")
    assert forced.kernels == "Nehalem"
    assert own.kernels != "Nehalem"                              # an AVX CPU picks newer kernels itself
    assert own.simd not in ("", "?")


def test_run_counts_passes_and_failures():
    config = matrix.Configuration("Haswell", {}, True, "")
    matrix.run(config, ["tests/test_layout_invariance.py", "-k", "row_sums"])
    assert (config.passed, config.failed) == (6, 0) and config.tail == []
    broken = matrix.Configuration("none", {}, True, "")
    matrix.run(broken, ["tests/test_layout_invariance.py", "-k", "no_such_test_name"])
    assert broken.failed == 1 and broken.tail                     # nothing ran: a failure, not a pass


def test_a_configuration_without_the_harness_leaves_the_harness_tests_out():
    """run() with harness off deselects the CUDA-harness tests (nothing left: a failure, not a
    pass); with it on they run."""
    args = ["tests/test_cuda_linear_mma.py::test_mma_row_invariance"]
    without = matrix.Configuration("generic", {}, True, "")
    matrix.run(without, args)
    assert (without.passed, without.failed) == (0, 1)
    own = matrix.Configuration("own", {}, False, "", harness=True)
    matrix.run(own, args)
    assert own.passed >= 1 and own.failed == 0


def test_only_cuda_harness_modules_carry_the_harness_mark():
    """The mark takes tests out of every configuration but the first, so it must never reach a
    test of the CPU kernels: every exactness test marked harness lives in a test_cuda_* module,
    and every exactness test of the modules that load the harness is marked."""
    def collected(marks):
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                              "--exactness-full", "-m", marks], cwd=SCRIPT.parent.parent, capture_output=True, text=True)
        return {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    harness = collected("exactness and harness")
    assert harness == {"tests/test_cuda_backend.py", "tests/test_cuda_linear.py", "tests/test_cuda_linear_mma.py"}
    assert not {f for f in collected("exactness and not harness") if Path(f).name.startswith("test_cuda")}


def test_the_reduced_set_samples_the_marked_sweeps_and_keeps_the_rest():
    def collected(*extra):
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                              "-m", "exactness", "tests/test_speculative.py", "tests/test_layout_invariance.py", *extra],
                             cwd=SCRIPT.parent.parent, capture_output=True, text=True)
        return {line for line in out.stdout.splitlines() if "::" in line}
    full, reduced = collected("--exactness-full"), collected()          # the reduced set is the default
    rest = collected("--exactness-rest")                                 # the full set less the reduced one
    assert reduced and rest and not reduced & rest and reduced | rest == full
    sweep = "tests/test_speculative.py::test_greedy_speculation_equals_plain_generation"
    assert {t for t in reduced if t.startswith(sweep)} == {f"{sweep}[{b}]" for b in (0, 2, 4, 6, 8)}
    assert {t for t in full if t.startswith(sweep)} == {f"{sweep}[{b}]" for b in range(10)}
    unsampled = {t for t in full if not t.startswith(sweep)}
    assert unsampled and unsampled <= reduced


def test_the_fp16_configuration_is_not_taken_for_a_repeat_of_the_same_kernels(monkeypatch, capsys):
    """Configurations whose kernels, SIMD and settings all match one already run are skipped;
    ones that differ in a setting of ours (the numba target, fp16 activations, the backend)
    run even where OpenBLAS loads the same kernels."""
    monkeypatch.setattr(matrix, "cpu_flags", lambda: HASWELL_FLAGS | {"bmi2", "f16c"})

    def same_kernels_everywhere(config):
        config.kernels, config.simd = "Haswell", "X86_V3"
    monkeypatch.setattr(matrix, "probe", same_kernels_everywhere)
    monkeypatch.setattr(matrix.sys, "argv", ["exactness_matrix.py", "--list"])
    matrix.main()
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    for name in ("fp16 activations", "haswell + Haswell", "generic + Prescott", "NumPy reference backend"):
        line = next(line for line in lines if line.startswith(name))
        assert "would run" in line, line

def test_jobs_run_configurations_at_once_and_count_every_one(monkeypatch, capsys):
    """--jobs 2: two configurations' runs are in progress together (each waits at a barrier
    for the other: run one at a time, the barrier times out and breaks), every planned
    configuration runs once, and one failure fails the whole matrix."""
    import threading
    monkeypatch.setattr(matrix, "cpu_flags", lambda: HASWELL_FLAGS | {"bmi2", "f16c"})

    def own_kernels(config):
        config.kernels, config.simd = config.name, "X86_V3"
    monkeypatch.setattr(matrix, "probe", own_kernels)
    barrier, ran, lock = threading.Barrier(2, timeout=30), [], threading.Lock()

    def fake_run(config, pytest_args):
        with lock:
            first_two = len(ran) < 2
            ran.append(config.name)
        if first_two:
            barrier.wait()
        config.passed, config.failed = 3, int(config.name.startswith("generic"))
    monkeypatch.setattr(matrix, "run", fake_run)
    monkeypatch.setattr(matrix, "compare_targets", lambda workdir, jobs: [])
    monkeypatch.setattr(matrix.sys, "argv", ["exactness_matrix.py", "--jobs", "2"])
    status = matrix.main()
    planned = [c.name for c in matrix.plan(False) if not c.skipped]
    assert sorted(ran) == sorted(planned) and len(ran) >= 3
    assert status == 1
    out = capsys.readouterr().out
    assert "generic + Prescott" in out and "FAILED: 3 passed, 1 failed" in out


def test_jobs_must_be_positive(monkeypatch):
    monkeypatch.setattr(matrix.sys, "argv", ["exactness_matrix.py", "--jobs", "0"])
    with pytest.raises(SystemExit) as stopped:
        matrix.main()
    assert stopped.value.code == 2
