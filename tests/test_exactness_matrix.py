"""scripts/exactness_matrix.py: plans only what the CPU can run, controls the BLAS kernels
itself (never inheriting a pinned core type), reports what OpenBLAS really loaded, and
counts results honestly."""
import importlib.util
import platform
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "exactness_matrix.py"
spec = importlib.util.spec_from_file_location("exactness_matrix", SCRIPT)
matrix = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = matrix          # dataclasses look their module up
spec.loader.exec_module(matrix)

HASWELL_FLAGS = {"pni", "ssse3", "sse4_2", "avx", "avx2", "fma"}
x86_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not (matrix.cpu_flags() or set()) >= {"avx"},
                              reason="OpenBLAS core types are x86-64 kernels; needs an AVX CPU")


def test_plan_runs_what_the_cpu_executes_and_names_what_it_lacks(monkeypatch):
    monkeypatch.setattr(matrix, "cpu_flags", lambda: HASWELL_FLAGS)
    configs = {c.name: c for c in matrix.plan(full=False)}
    first = next(iter(configs.values()))
    assert first.env == {} and not first.reduced                       # the CPU's own kernels: the full set
    assert configs["Haswell"].env == {"OPENBLAS_CORETYPE": "Haswell"} and configs["Haswell"].reduced
    assert configs["Prescott"].skipped == "" and configs["Sandybridge"].skipped == ""
    assert "avx512f" in configs["SkylakeX"].skipped and "avx512_bf16" in configs["Cooperlake"].skipped
    assert not matrix.plan(full=True)[4].reduced
    # fp16 activations: the exactness rule with half linear inputs, under the CPU's own kernels
    assert configs["fp16 activations"].env == {"TINYLOOP_ACTIVATIONS": "fp16"} and configs["fp16 activations"].reduced


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


def test_the_reduced_set_samples_the_marked_sweeps_and_keeps_the_rest():
    def collected(*extra):
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                              "-m", "exactness", "tests/test_speculative.py", "tests/test_layout_invariance.py", *extra],
                             cwd=SCRIPT.parent.parent, capture_output=True, text=True)
        return {line for line in out.stdout.splitlines() if "::" in line}
    full, reduced = collected(), collected("--exactness-reduced")
    sweep = "tests/test_speculative.py::test_greedy_speculation_equals_plain_generation"
    assert {t for t in reduced if t.startswith(sweep)} == {f"{sweep}[{b}]" for b in (0, 2, 4, 6, 8)}
    assert {t for t in full if t.startswith(sweep)} == {f"{sweep}[{b}]" for b in range(10)}
    unsampled = {t for t in full if not t.startswith(sweep)}
    assert unsampled and unsampled <= reduced


def test_the_fp16_configuration_is_not_taken_for_a_repeat_of_the_same_kernels(monkeypatch, capsys):
    """Configurations whose OpenBLAS kernels and SIMD match one already run are skipped, but the
    fp16-activations one runs the same kernels on purpose: it must still run."""
    monkeypatch.setattr(matrix, "cpu_flags", lambda: HASWELL_FLAGS)

    def same_kernels_everywhere(config):
        config.kernels, config.simd = "Haswell", "X86_V3"
    monkeypatch.setattr(matrix, "probe", same_kernels_everywhere)
    monkeypatch.setattr(matrix.sys, "argv", ["exactness_matrix.py", "--list"])
    matrix.main()
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    fp16 = next(line for line in lines if line.startswith("fp16 activations"))
    haswell = next(line for line in lines if line.startswith("Haswell"))
    assert "would run" in fp16 and "skipped" in haswell, (fp16, haswell)
