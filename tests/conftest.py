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
def tiny(tiny_path):
    return load_model(tiny_path)


@pytest.fixture(scope="session")
def tiny_gpt(model_dir):
    path = model_dir / "tiny-looped-gpt.tinyloop"
    make_test_model(path, "tiny-looped-gpt", seed=1)
    return load_model(path)


# -- the exactness matrix's reduced set (scripts/exactness_matrix.py) --------------------------
def pytest_addoption(parser):
    parser.addoption("--exactness-reduced", action="store_true",
                     help="of each sweep marked exactness(sample=N), run every N-th case only "
                          "(the reduced set scripts/exactness_matrix.py runs under each extra BLAS core type)")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--exactness-reduced"):
        return
    kept, dropped, seen = [], [], {}
    for item in items:
        mark = item.get_closest_marker("exactness")
        sample = mark.kwargs.get("sample", 1) if mark else 1
        function = (item.path, item.originalname)
        index = seen[function] = seen.get(function, -1) + 1
        (kept if index % sample == 0 else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
