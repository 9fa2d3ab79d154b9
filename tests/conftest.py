import os
import re

import pytest

from tinyloop.model.loader import load_model
from tinyloop.model.testmodels import make_test_model

pytest_plugins = ["kernel_device"]  # the kernel_device fixture (CPU harness or GPU)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_path(model_dir):
    path = model_dir / "tiny-looped.tinyloop"
    make_test_model(path, "tiny-looped", seed=0)
    return path


@pytest.fixture(scope="session")
def model_path(model_dir):
    """The looped tiny model without an end-of-sequence token, so a generation runs to
    max_tokens: what the server tests serve (read only; a test that damages it copies it)."""
    path = model_dir / "tiny-looped-no-eos.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, eos_token_ids=())
    return path


@pytest.fixture(scope="session")
def tiny_files(model_dir):
    """The two tiny presets, and each quantized to int4 and int8 (RTN, groups of 16), by name:
    "tiny-looped", "tiny-looped int4", "tiny-looped-gpt int8", ...; and to int4 in groups of 32
    ("tiny-looped int4 g32": the layout the CUDA backend's tensor-core rows take)."""
    from tinyloop.quantize.pipeline import quantize_file
    paths = {}
    for preset, seed in (("tiny-looped", 0), ("tiny-looped-gpt", 1)):
        paths[preset] = model_dir / f"files-{preset}.tinyloop"
        make_test_model(paths[preset], preset, seed=seed)
        for bits in (4, 8):       # packed weights on the device: the quantized row and bulk kernels
            paths[f"{preset} int{bits}"] = model_dir / f"files-{preset}-int{bits}.tinyloop"
            quantize_file(paths[preset], paths[f"{preset} int{bits}"], bits, 16, "rtn", progress=False)
        paths[f"{preset} int4 g32"] = model_dir / f"files-{preset}-int4-g32.tinyloop"
        quantize_file(paths[preset], paths[f"{preset} int4 g32"], 4, 32, "rtn", progress=False)
    return paths


@pytest.fixture(scope="session")
def tiny(tiny_path):
    return load_model(tiny_path)


@pytest.fixture(scope="session")
def tiny_gpt(model_dir):
    path = model_dir / "tiny-looped-gpt.tinyloop"
    make_test_model(path, "tiny-looped-gpt", seed=1)
    return load_model(path)


@pytest.fixture
def granian_started(monkeypatch):
    """`tinyloop serve` run up to where Granian would start: Granian replaced by a stand-in
    that records the keyword arguments of each server made (address, port, ...)."""
    import granian
    made: list[dict] = []

    class StandIn:
        def __init__(self, *args, **kwargs):
            made.append(kwargs)

        def serve(self):
            pass
    monkeypatch.setattr(granian, "Granian", StandIn)
    return made


# -- the exactness matrix's reduced set (scripts/exactness_matrix.py) --------------------------
def pytest_addoption(parser):
    parser.addoption("--exactness-full", action="store_true",
                     help="run every case of the sweeps marked exactness(sample=N); without it only every "
                          "N-th runs (the reduced set; scripts/exactness_matrix.py runs the full set under this "
                          "CPU's own kernels and the reduced set under every other configuration)")
    parser.addoption("--exactness-reduced", action="store_true",
                     help="the reduced set (the default; kept for scripts that name it)")
    parser.addoption("--exactness-rest", action="store_true",
                     help="only the cases the reduced set leaves out (the full set less the reduced one: "
                          "scripts/exactness_matrix.py --after-suite, where the suite already ran the reduced set)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--exactness-full"):
        return
    rest = config.getoption("--exactness-rest")
    kept, dropped, seen = [], [], {}
    for item in items:
        mark = item.get_closest_marker("exactness")
        sample = mark.kwargs.get("sample", 1) if mark else 1
        function = (item.path, item.originalname)
        index = seen[function] = seen.get(function, -1) + 1
        in_reduced = index % sample == 0
        (kept if in_reduced != rest else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# -- no silent skips in CI -----------------------------------------------------------------------
# In CI (CI set and not "0"/"false") a skipped test is a failure, unless its reason says a GPU
# is what is missing: CI machines have none. Anything else a test needs, .ci/run installs.
GPU_REASON = re.compile(r"\bGPU\b|\bCUDA\b", re.IGNORECASE)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    if not GPU_REASON.search(reason):
        report.outcome = "failed"
        report.longrepr = (f"skipped in CI: {reason}\nOnly a missing GPU may skip a test in CI; "
                           "install what this test needs in .ci/run (or the dev extra).")
