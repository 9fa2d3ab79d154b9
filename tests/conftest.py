import pytest

from tinyloop.loader import load_model
from tinyloop.testmodels import make_test_model


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
