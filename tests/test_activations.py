"""fp16 activations (TINYLOOP_ACTIVATIONS=fp16): every linear layer's input but attention's
output is rounded to half by the kernel that makes it (the norms before q|k|v, the MLP and
the head; the MLP activation before down); the residual stream, attention, the KV cache and
every sum stay float32. Both backends implement it, and the exactness rule holds under it
(the full exactness suite runs under it in scripts/exactness_matrix.py)."""
import numpy as np
import pytest
from test_cuda_backend import cuda_backend

from asgi.settings import Settings
from tinyloop.backends.reference import NumpyBackend
from tinyloop.backends.select import select_backend
from tinyloop.cli import main
from tinyloop.engine.decode import prefill
from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import TinyLoopError
from tinyloop.model.loader import load_model


def logits_of_a_short_run(model, prompt, steps=3):
    """Prefill (bulk kernels) then `steps` greedy decode steps (row kernels): (1 + steps, V) on the host."""
    loops = model.config.default_loops
    cache = model.new_cache(len(prompt) + steps + 1, loops)
    rows = [model.backend.to_host(prefill(model, prompt, cache, loops))[0]]
    for position in range(len(prompt), len(prompt) + steps):
        token = int(np.argmax(rows[-1]))
        rows.append(model.backend.to_host(model.forward([token], [position], cache, loops))[0])
    return np.stack(rows)


PROMPT = [5, 17, 42, 9, 3, 88, 120, 7, 64, 31, 2, 200]


@pytest.mark.parametrize("preset", ["tiny-looped", "tiny-looped-gpt"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_linear_input_but_attentions_output_is_half(tiny_files, preset, device, monkeypatch):
    """What the linear layers are fed, by layer: half for q|k|v, up, down and the head under
    fp16; float32 for everything under fp32, and for attention's output always."""
    for activations in ("fp32", "fp16"):
        backend = select_backend("cpu", activations) if device == "cpu" else cuda_backend(activations=activations)
        model = load_model(tiny_files[preset], backend).model
        names = {id(model.weights.head): "head"}
        for layers in model.weights.layers.values():
            for layer in layers:
                names.update({id(getattr(layer, n)): n for n in ("qkv", "out", "up", "down")})
        fed = {}
        original = backend.linear

        def consumed(x, norm=None):
            """What the linear's kernel multiplies: x, or with a norm folded into the call (the CUDA
            rows kernels stage norm(h)) the norm's output, rounded to half where norm.half."""
            return x.dtype if norm is None else np.dtype(np.float16 if norm.half else np.float32)
        monkeypatch.setattr(backend, "linear", lambda x, w, exact, **kw: fed.setdefault(names[id(w)], set()).add(
            consumed(x, kw.get("norm"))) or original(x, w, exact, **kw))
        logits_of_a_short_run(model, PROMPT[:4], steps=1)
        half = {np.dtype(np.float16 if activations == "fp16" else np.float32)}
        assert fed == {"qkv": half, "out": {np.dtype(np.float32)}, "up": half, "down": half, "head": half}


@pytest.mark.parametrize("preset", ["tiny-looped", "tiny-looped-gpt", "tiny-looped int4"])
def test_the_cuda_backend_follows_the_cpu_backend_under_fp16(tiny_files, preset):
    """Harness (or GPU) CUDA backend and CPU backend, both fp16: logits within rounding and the
    same greedy tokens; and on each backend fp16 moves the logits off its fp32 ones, a little.
    (A float one ulp apart can round to halves one half ulp apart, and that spreads: between
    backends fp16 logits differ about as much as fp16 and fp32 do, ~3e-4 of the largest here,
    against ~1e-5 at fp32. The kernels' rounding is pinned bit for bit in test_cuda_*.py.)"""
    def backend(device, activations):                 # the CUDA kernels' twins are the NumPy reference's
        return NumpyBackend(activations=activations) if device == "cpu" else cuda_backend(activations=activations)

    runs = {(device, a): logits_of_a_short_run(load_model(tiny_files[preset], backend(device, a)).model, PROMPT)
            for device in ("cpu", "cuda") for a in ("fp32", "fp16")}
    scale = np.abs(runs["cpu", "fp32"]).max()
    between_backends = np.abs(runs["cuda", "fp16"] - runs["cpu", "fp16"]).max()
    assert between_backends <= 1e-3 * scale, between_backends
    assert np.array_equal(runs["cuda", "fp16"].argmax(axis=1), runs["cpu", "fp16"].argmax(axis=1))
    for device in ("cpu", "cuda"):
        from_fp32 = np.abs(runs[device, "fp16"] - runs[device, "fp32"]).max()
        assert 1e-5 * scale < from_fp32 <= 1e-3 * scale, (device, from_fp32)


@pytest.mark.parametrize("preset", ["tiny-looped", "tiny-looped int4"])
def test_a_long_prefill_runs_on_tensor_cores_and_follows_the_cpu(tiny_files, preset, monkeypatch):
    """A 70-token prompt under fp16: the CUDA backend's prefill goes to linear_tc (x and the
    weights in half, float32 sums) and its logits stay within rounding of the CPU backend's
    fp16 run on the NumPy reference backend (which keeps the weights in float32), with the
    same greedy tokens."""
    prompt = [int(t) for t in np.random.default_rng(70).integers(3, 500, 70)]
    cpu = logits_of_a_short_run(load_model(tiny_files[preset], NumpyBackend(activations="fp16")).model, prompt)
    backend = cuda_backend(activations="fp16")
    if not backend.tensor_cores:
        pytest.skip("this GPU has no f16 mma (before sm_80)")
    launched = []

    class Spy:                                    # records the kernels taken from linear_tc
        def __init__(self, module):
            self.module = module

        def get_function(self, name):
            launched.append(name)
            return self.module.get_function(name)

    original = backend._module
    monkeypatch.setattr(backend, "_module", lambda name: Spy(original(name)) if name == "linear_tc" else original(name))
    cuda = logits_of_a_short_run(load_model(tiny_files[preset], backend).model, prompt)
    kind = "int4" if "int4" in preset else "f32"
    assert {f"linear_tc_{kind}"} <= set(launched), set(launched)
    scale = np.abs(cpu).max()
    assert np.abs(cuda - cpu).max() <= 1.5e-3 * scale, np.abs(cuda - cpu).max() / scale
    assert np.array_equal(cuda.argmax(axis=1), cpu.argmax(axis=1))


# ~30 s: in the -m slow run (CI runs both); scripts/exactness_matrix.py runs the exactness set under fp16 too
@pytest.mark.slow
def test_greedy_speculation_stays_exact_under_fp16(tiny_files):
    """The exactness rule with half linear inputs, on both backends: speculative chains and
    trees give plain generation's tokens (a few cases here; scripts/exactness_matrix.py runs
    the whole exactness suite under TINYLOOP_ACTIVATIONS=fp16)."""
    rng = np.random.default_rng(16)
    for backend in (select_backend("cpu", "fp16"), cuda_backend(activations="fp16")):
        model = load_model(tiny_files["tiny-looped"], backend).model
        for case in range(3):
            prompt = [int(t) for t in rng.integers(3, model.config.vocab_size, int(rng.integers(1, 30)))]
            verify = int(rng.integers(2, model.config.max_loops + 1))
            plain = generate(model, GenerationRequest(prompt, 12, loops=verify, ignore_eos=True))
            for branches in (1, 3):
                params = SpeculativeParams(int(rng.integers(1, verify)), verify, int(rng.integers(1, 5)), branches)
                spec = speculative_generate(model, GenerationRequest(prompt, 12, ignore_eos=True), params)
                assert spec.tokens == plain.tokens, (backend.name, case, params)


def test_a_replayed_decode_step_equals_the_plain_forward_under_fp16(tiny_files):
    captured = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=True, activations="fp16")).model
    plain = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=False, activations="fp16")).model
    loops, prompt = 2, PROMPT
    caches = [m.new_cache(len(prompt) + 10, loops) for m in (captured, plain)]
    for model, cache in zip((captured, plain), caches):
        prefill(model, prompt, cache, loops)
    token = 11
    for position in range(len(prompt), len(prompt) + 6):
        ours = captured.backend.to_host(captured.decode(token, position, caches[0], loops))
        theirs = plain.backend.to_host(plain.forward([token], [position], caches[1], loops))
        assert np.array_equal(ours, theirs), position
        token = int(np.argmax(theirs))
    assert captured.backend.decode_runner(captured, caches[0], loops).replay is not None


def test_the_setting_is_checked_and_reported(monkeypatch, tiny_files):
    monkeypatch.setenv("TINYLOOP_ACTIVATIONS", "fp8")
    with pytest.raises(TinyLoopError, match="TINYLOOP_ACTIVATIONS must be one of fp32, fp16, got 'fp8'"):
        Settings.from_env()
    with pytest.raises(TinyLoopError, match="TINYLOOP_ACTIVATIONS"):
        select_backend("cpu")
    monkeypatch.setenv("TINYLOOP_ACTIVATIONS", "FP16")
    backend = select_backend("cpu")
    assert backend.activations == "fp16" and backend.description == "cpu (TINYLOOP_DEVICE=cpu, fp16 activations)"
    monkeypatch.delenv("TINYLOOP_ACTIVATIONS")
    assert select_backend("cpu").activations == "fp32"
    assert select_backend("cpu", "fp16").activations == "fp16"           # an argument beats the variable
    with pytest.raises(TinyLoopError, match="asked of a backend made with 'fp32'"):
        load_model(tiny_files["tiny-looped"], select_backend("cpu", "fp32"), activations="fp16")


def test_generate_takes_the_flag(tmp_path, capsys):
    path = tmp_path / "m.tinyloop"
    main(["new-model", str(path)])
    assert main(["generate", str(path), "Hello", "--max-tokens", "4", "--activations", "fp16"]) == 0
    assert "completion 4 tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", str(path), "Hello", "--activations", "bf16"])
    assert "invalid choice: 'bf16'" in capsys.readouterr().err
