"""TINYLOOP_DEVICE=auto|cpu|cuda: which backend starts, and what it says about why."""
import builtins
import logging
import sys

import pytest

from tinyloop.backends.cuda import device as cuda_device
from tinyloop.backends.select import select_backend
from tinyloop.errors import TinyLoopError


@pytest.fixture
def no_cupy(monkeypatch):
    """An environment where `import cupy` fails, as on a machine without the extra."""
    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(builtins, "__import__", refuse)


def test_cuda_without_cupy_is_a_clear_error_naming_the_extra(no_cupy, monkeypatch):
    monkeypatch.delenv("TINYLOOP_DEVICE", raising=False)
    with pytest.raises(TinyLoopError) as error:
        select_backend("cuda")
    assert "CuPy is not installed" in str(error.value)
    assert ".[cuda12]" in str(error.value) and ".[cuda13]" in str(error.value)


def test_cuda_from_the_environment_variable_too(no_cupy, monkeypatch):
    monkeypatch.setenv("TINYLOOP_DEVICE", "cuda")
    with pytest.raises(TinyLoopError, match="TINYLOOP_DEVICE=cuda"):
        select_backend()


def test_auto_without_cupy_is_the_cpu_and_says_why(no_cupy, monkeypatch):
    monkeypatch.delenv("TINYLOOP_DEVICE", raising=False)
    backend = select_backend()
    assert backend.name == "cpu"
    assert backend.description.startswith("cpu (auto: CuPy is not installed")


def test_auto_without_a_gpu_is_the_cpu_and_says_why(monkeypatch):
    monkeypatch.setattr(cuda_device, "cuda_unavailable", lambda: "CuPy finds no GPU")
    backend = select_backend("auto")
    assert (backend.name, backend.description) == ("cpu", "cpu (auto: CuPy finds no GPU)")
    with pytest.raises(TinyLoopError, match="TINYLOOP_DEVICE=cuda, but CuPy finds no GPU"):
        select_backend("cuda")


def test_cpu_is_the_cpu_and_unknown_devices_are_refused():
    assert select_backend("cpu").description == "cpu (TINYLOOP_DEVICE=cpu)"
    assert select_backend("CPU").name == "cpu"
    with pytest.raises(TinyLoopError, match="must be one of auto, cpu, cuda, got 'gpu'"):
        select_backend("gpu")


def test_auto_with_a_gpu_picks_cuda(monkeypatch):
    """With CuPy seeing a device, auto is the CUDA backend (a stand-in device: no GPU here)."""
    class FakeCupyDevice:
        xp = None

        def describe(self):
            return "Some GPU (sm_90, 141 GiB), CuPy 14.0.0, CUDA runtime 13.0"
    monkeypatch.setattr(cuda_device, "cuda_unavailable", lambda: None)
    monkeypatch.setattr(cuda_device, "CupyDevice", FakeCupyDevice)
    backend = select_backend("auto")
    assert backend.name == "cuda"
    assert backend.description == "cuda (auto: Some GPU (sm_90, 141 GiB), CuPy 14.0.0, CUDA runtime 13.0)"
    assert select_backend("cuda").description.startswith("cuda (TINYLOOP_DEVICE=cuda: Some GPU")


def test_the_server_logs_the_choice(tmp_path, monkeypatch, caplog):
    from test_server_asgi import ready_app

    from tinyloop.model.testmodels import make_test_model
    make_test_model(tmp_path / "m.tinyloop", "tiny-looped")
    monkeypatch.setattr(cuda_device, "cuda_unavailable", lambda: "CuPy finds no GPU")
    with caplog.at_level(logging.INFO):
        ready_app(tmp_path / "m.tinyloop", device="auto")
    assert "device cpu (auto: CuPy finds no GPU)" in caplog.text
