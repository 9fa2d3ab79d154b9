"""In CI a skipped test is a failure unless the reason says a GPU is missing (conftest.py)."""
import os
import subprocess
import sys
from pathlib import Path

PROBE = '''
import pytest

def test_skips_for_a_missing_package():
    pytest.skip("some package is missing")

def test_skips_for_a_missing_gpu():
    pytest.skip("no GPU here")

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_marked_cuda():
    pass

@pytest.mark.skipif(True, reason="systemd-analyze is not installed")
def test_marked_tool():
    pass

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
'''


def run_probe(tmp_path, ci, *extra):
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "conftest",
                             "--rootdir", str(tmp_path), *extra, str(tmp_path / "test_probe.py")],
                            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    return result.stdout


def test_in_ci_only_a_missing_gpu_may_skip(tmp_path):
    out = run_probe(tmp_path, "1")
    assert "FAILED test_probe.py::test_skips_for_a_missing_package" in out
    assert "ERROR test_probe.py::test_marked_tool" in out
    assert "SKIPPED [1] test_probe.py:8: no GPU here" in out
    assert "needs a CUDA device" in out and "1 failed, 2 skipped, 1 xfailed, 1 error" in out


def test_the_rule_holds_in_worker_processes_too(tmp_path):
    """The README and CI run the suite with -n 2 (pytest-xdist): the verdict is made in the
    workers' reports, and the controller must count it the same."""
    out = run_probe(tmp_path, "1", "-n", "2")
    assert "FAILED test_probe.py::test_skips_for_a_missing_package" in out
    assert "needs a CUDA device" in out and "1 failed, 2 skipped, 1 xfailed, 1 error" in out


def test_outside_ci_skips_are_skips(tmp_path):
    for ci in (None, "0", "false"):
        assert "4 skipped, 1 xfailed" in run_probe(tmp_path, ci), ci
