"""scripts/cuda_compile_check.py runs its compiles in a pool of processes: every (compiler, file,
arch) once, the longest sources first, every failure reported (none lost in a worker), and the
resource table in the sources' order whichever compile finished first.

No CUDA compiler is needed: a stand-in nvcc (a shell script) prints what ptxas -v prints; where
a test asks, a.cu's compiles wait until c.cu's has run, so they finish out of order (a wait for
that state, not a sleep)."""
import importlib.util
import re
import stat
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "cuda_compile_check.py"
spec = importlib.util.spec_from_file_location("cuda_compile_check", SCRIPT)
check = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = check          # the pool's workers find run_job by its module
spec.loader.exec_module(check)

# $1.. are nvcc's arguments: -arch=sm_XX ... source. One entry per source and arch; SPILL in the
# environment names a source whose sm_90 compile spills, FAIL one whose compiles fail; with
# C_DONE set, c.cu's compile creates that file and a.cu's wait for it (30 s at most).
FAKE_NVCC = r"""#!/usr/bin/env bash
for a in "$@"; do case "$a" in -arch=sm_*) arch=${a#-arch=sm_};; esac; done
source=$(basename "${@: -1}" .cu)
if [ "$source" = "$FAIL" ]; then echo "$source.cu(1): error: broken" >&2; exit 2; fi
if [ -n "$C_DONE" ]; then
    case "$source" in
        c) touch "$C_DONE";;
        a) for _ in $(seq 300); do [ -e "$C_DONE" ] && break; sleep 0.1; done;;
    esac
fi
spill=0; if [ "$source" = "$SPILL" ] && [ "$arch" = 90 ]; then spill=8; fi
echo "ptxas info    : Compiling entry function 'k_$source' for 'sm_$arch'" >&2
echo "ptxas info    : Function properties for k_$source" >&2
echo "    0 bytes stack frame, $spill bytes spill stores, $spill bytes spill loads" >&2
echo "ptxas info    : Used 40 registers, used 1 barriers, 16 bytes smem" >&2
"""


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """Three sources (a.cu the longest, with a header it includes), the stand-in nvcc, no NVRTC."""
    source_dir = tmp_path / "cuda"
    source_dir.mkdir()
    (source_dir / "big.cuh").write_text("// " + "x" * 4000 + "\n")
    (source_dir / "a.cu").write_text('#include "big.cuh"\n')
    (source_dir / "b.cu").write_text("// " + "y" * 100 + "\n")
    (source_dir / "c.cu").write_text("// c\n")
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(check, "KERNEL_DIR", source_dir)
    monkeypatch.setattr(check, "nvrtc_library", lambda: None)
    monkeypatch.setattr(check.shutil, "which", lambda name: str(nvcc) if name == "nvcc" else None)
    monkeypatch.delenv("SPILL", raising=False)
    monkeypatch.delenv("FAIL", raising=False)
    monkeypatch.delenv("C_DONE", raising=False)
    return source_dir


def run_main(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["cuda_compile_check.py", *args])
    code = check.main()
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_has_every_compile_once_and_the_longest_source_first(kernels):
    jobs = check.plan("libnvrtc.so", "/bin/nvcc")
    assert [j[1].name for j in jobs][0] == "a.cu"                  # a.cu plus the header it includes
    kinds = [(kind, source.name, arch) for kind, source, arch, _tool in jobs]
    assert len(kinds) == len(set(kinds)) == 3 * 4                  # nvrtc and nvcc, sm_80 and sm_90
    assert ("nvrtc", "c.cu", "90") in kinds and ("nvcc", "b.cu", "80") in kinds
    assert [j[0] for j in check.plan(None, "/bin/nvcc")] == ["nvcc"] * 6


def test_table_keeps_the_sources_order_whatever_finishes_first(kernels, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("C_DONE", str(tmp_path / "c-done"))
    code, out, err = run_main(monkeypatch, capsys, "--jobs", "3")
    assert code == 0, err
    finished = [name for name, _arch in re.findall(r"^nvcc (\w)\.cu sm_(\d+): 1 kernels", out, re.M)]
    assert len(finished) == 6 and finished.index("c") < finished.index("a")   # a.cu started first, ended later
    table_rows = re.findall(r"^\| (\w)\.cu \| `k_\w` \| sm_(\d+) \| 40 \| 16 \| 0 \| 0 / 0 \|$", out, re.M)
    assert table_rows == [("a", "80"), ("a", "90"), ("b", "80"), ("b", "90"), ("c", "80"), ("c", "90")]
    assert "6 compiles, 3 at a time" in out


def test_written_resources_do_not_depend_on_the_number_of_workers(kernels, monkeypatch, capsys):
    monkeypatch.setattr(check.subprocess, "run", _version_or_real(check.subprocess.run))
    assert run_main(monkeypatch, capsys, "--jobs", "1", "--write")[0] == 0
    one = (kernels / "RESOURCES.md").read_text()
    assert run_main(monkeypatch, capsys, "--jobs", "4", "--write")[0] == 0
    assert (kernels / "RESOURCES.md").read_text() == one and "| c.cu | `k_c` | sm_90 |" in one


def _version_or_real(real):
    def run(command, *args, **kwargs):
        if command[1:] == ["--version"]:
            return type("Done", (), {"stdout": "Cuda compilation tools, release 0.0\n", "returncode": 0})()
        return real(command, *args, **kwargs)
    return run


def test_a_spill_in_one_worker_fails_the_check(kernels, monkeypatch, capsys):
    monkeypatch.setenv("SPILL", "b")
    code, _out, err = run_main(monkeypatch, capsys, "--jobs", "2")
    assert code == 1
    assert "FAIL: b.cu k_b sm_90: stack 0 B, spills 8 / 8 B" in err
    assert "k_a" not in err and "sm_80" not in err


def test_a_failed_compile_is_reported_and_the_rest_still_run(kernels, monkeypatch, capsys):
    monkeypatch.setenv("FAIL", "b")
    code, out, err = run_main(monkeypatch, capsys, "--jobs", "2")
    assert code == 1
    assert err.count("FAIL: nvcc failed on b.cu") == 2 and "error: broken" in err
    assert "nvcc b.cu sm_80: failed" in out
    assert re.findall(r"^\| (\w)\.cu \|", out, re.M) == ["a", "a", "c", "c"]


def test_required_compiler_missing_fails_and_jobs_must_be_positive(kernels, monkeypatch, capsys):
    code, _out, err = run_main(monkeypatch, capsys, "--require", "nvrtc")
    assert code == 1 and "FAIL: NVRTC not found" in err
    with pytest.raises(SystemExit) as exited:
        run_main(monkeypatch, capsys, "--jobs", "0")
    assert exited.value.code == 2


def test_every_sm_90_entry_must_wait_and_release():
    """The PTX check on text shaped as NVRTC writes it: an entry without the release fails, by name."""
    ptx = (".visible .entry good(\n.param .u64 p\n)\n{\ngriddepcontrol.wait;\ngriddepcontrol.launch_dependents;\n}\n"
           ".visible .entry bad(\n.param .u64 p\n)\n{\ngriddepcontrol.wait;\nret;\n}\n")
    assert check.entry_failures(Path("k.cu"), ptx) == ["k.cu bad sm_90: griddepcontrol.launch_dependents missing"]
    assert check.entry_failures(Path("k.cu"), "// no entries") == ["k.cu sm_90: no entry found in the PTX"]


def test_an_entry_failure_found_in_a_worker_fails_the_check(capsys):
    """NVRTC's outcome as a worker returns it: the sm_90 PTX's entry failures join the failures."""
    failures = []
    missing = "k.cu bad sm_90: griddepcontrol.wait missing"
    check.report(("nvrtc", Path("k.cu"), "90", "libnvrtc.so"), (1000, "", [missing]), 2.0, failures)
    check.report(("nvrtc", Path("k.cu"), "80", "libnvrtc.so"), (900, "", None), 2.0, failures)
    assert failures == [missing]
    out = capsys.readouterr().out
    assert "k.cu sm_90: ok, cubin 1000 bytes; programmatic dependent launch in every entry: 1 wrong" in out
    assert "k.cu sm_80: ok, cubin 900 bytes (2 s)" in out
