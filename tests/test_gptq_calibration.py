"""GPTQ calibrates each linear on the inputs it sees in the quantized model (README
"Quantization"): every layer after the ones already quantized, and a shared core layer
on its inputs from every loop iteration.

The oracle is built from the written models, not from the pipeline: for each linear, the
float model with every linear calibrated before it swapped for its quantized version
(from the written file) is run forward with the transformer's capture hook, and the
Hessian GPTQ was given must be 2 X^T X / n of exactly the inputs that linear sees there,
n = tokens x loops for a core layer (its inputs from every iteration)."""
from pathlib import Path

import numpy as np
import pytest

from tinyloop.backends.reference import NumpyBackend
from tinyloop.model.loader import load_model
from tinyloop.model.testmodels import make_test_model
from tinyloop.quantize import pipeline

SUBLAYER_INPUT = {"qkv": "qkv", "out": "out", "up": "up", "down": "down"}     # fused: up = gate|up


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gptq-calibration")
    make_test_model(folder / "m.tinyloop", "tiny-looped", seed=3)
    given = {}
    real = pipeline.Quantizer.quantize_sublayer

    def spy(self, stage, index, sublayer, hessian=None):
        given[(stage, index, sublayer)] = None if hessian is None else np.array(hessian)
        return real(self, stage, index, sublayer, hessian)

    pipeline.Quantizer.quantize_sublayer = spy
    try:
        quantizer = pipeline.Quantizer(folder / "m.tinyloop", 4, 32, "gptq", progress=False)
        text = Path(__file__).with_name("data").joinpath("jargon-4.4.7-calibration.txt").read_text()
        ids = quantizer.loaded.encode_prompt(text)[:200]
        quantizer.run_gptq(ids, 64, loops=3)
        quantizer.write(folder / "q.tinyloop")
    finally:
        pipeline.Quantizer.quantize_sublayer = real
    sequences = [ids[i:i + 64] for i in range(0, len(ids) - 1, 64)]
    return given, folder, sequences


def model_quantized_before(folder, linear, order):
    """The float model with every linear calibrated before `linear` (in `order`) quantized, on the
    NumPy reference backend the quantizer calibrates on (float activations)."""
    mixed = load_model(folder / "m.tinyloop", device=NumpyBackend(), kv_mode="fp32")
    quantized = load_model(folder / "q.tinyloop", device=NumpyBackend(), kv_mode="fp32")
    for stage, index, sublayer in order[:order.index(linear)]:
        setattr(mixed.model.weights.layers[stage][index], sublayer,
                getattr(quantized.model.weights.layers[stage][index], sublayer))
    return mixed


def linear_inputs(loaded, sequences, loops):
    """(stage, index, linear input name) -> every row that linear sees, over all sequences."""
    model = loaded.model
    seen = {}

    def capture(stage, index, name, x):
        seen.setdefault((stage, index, name), []).append(np.asarray(x, np.float64))
    for tokens in sequences:
        cache = model.new_cache(len(tokens), loops)
        plan = model.contiguous_plan(0, len(tokens), cache, exact=False)
        trunk = model.trunk(tokens, plan, cache, loops, capture)
        model.coda(trunk.hidden, plan, cache, model.coda_base(loops), capture)
    return {key: np.concatenate(rows) for key, rows in seen.items()}


def test_every_linear_was_calibrated_once_in_execution_order(calibrated):
    given, folder, _ = calibrated
    c = load_model(folder / "m.tinyloop").config
    expected = [(stage, i, s) for stage, count in (("prelude", c.n_prelude), ("core", c.n_core), ("coda", c.n_coda))
                for i in range(count) for s in SUBLAYER_INPUT]
    assert list(given) == expected and all(h is not None for h in given.values())


def test_each_hessian_comes_from_the_inputs_the_linear_sees_after_the_ones_before_it_are_quantized(calibrated):
    given, folder, sequences = calibrated
    order = list(given)
    tokens = sum(len(s) for s in sequences)
    for stage, index, sublayer in order:
        mixed = model_quantized_before(folder, (stage, index, sublayer), order)
        x = linear_inputs(mixed, sequences, loops=3)[(stage, index, SUBLAYER_INPUT[sublayer])]
        assert len(x) == tokens * (3 if stage == "core" else 1)          # every loop iteration
        expected = 2.0 * x.T @ x / len(x)
        np.testing.assert_allclose(given[(stage, index, sublayer)], expected, rtol=1e-4,
                                   atol=1e-6 * np.abs(expected).max(), err_msg=f"{stage}.{index}.{sublayer}")
