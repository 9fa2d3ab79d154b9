"""Quantizing whole models: the file, the loading, and exactness on quantized weights."""
import numpy as np
import pytest

from tinyloop.cli import main
from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import TinyLoopError
from tinyloop.model.loader import load_model
from tinyloop.model.modelfile import ModelFile
from tinyloop.model.quant import QuantizedTensor
from tinyloop.model.testmodels import make_test_model
from tinyloop.quantize.pipeline import quantize_file

CALIBRATION = open("tests/data/jargon-4.4.7-calibration.txt", encoding="utf-8").read()


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quant")
    source = folder / "tiny.tinyloop"
    make_test_model(source, "tiny-looped", seed=0)
    out = {}
    for bits, group, method, act in [(4, 32, "gptq", True), (2, 32, "gptq", False), (8, 64, "rtn", False)]:
        path = folder / f"q{bits}-{method}{'-act' if act else ''}.tinyloop"
        quantize_file(source, path, bits, group, method, act, CALIBRATION, calibration_tokens=1024,
                      seq_len=256, progress=False)
        out[(bits, method, act)] = path
    return source, out


def test_quantized_files_record_bits_group_method(quantized):
    _, files = quantized
    mf = ModelFile(files[(4, "gptq", True)])
    details = mf.quant_details()
    assert details == {"bits": [4], "group_size": [32], "method": ["gptq"], "act_order": True, "tensors": 28}
    q = mf.get("core.1.mlp.down.weight")
    assert isinstance(q, QuantizedTensor) and q.perm is not None
    assert not isinstance(mf.get("embed.weight"), QuantizedTensor)             # embeddings stay as stored
    assert ModelFile(files[(8, "rtn", False)]).quant_details()["method"] == ["rtn"]


def test_quantized_models_run_and_stay_close_to_the_original(quantized):
    source, files = quantized
    reference = load_model(source).model
    tokens = np.arange(3, 40)
    ref = reference.forward(tokens, np.arange(len(tokens)), reference.new_cache(40, 4), 4)
    errors = {}
    for key, path in files.items():
        model = load_model(path).model
        logits = model.forward(tokens, np.arange(len(tokens)), model.new_cache(40, 4), 4)
        errors[key] = float(np.mean(np.abs(logits - ref)))
    assert errors[(8, "rtn", False)] < errors[(4, "gptq", True)] < errors[(2, "gptq", False)]


@pytest.mark.exactness
@pytest.mark.parametrize("key", [(4, "gptq", True), (2, "gptq", False)])
def test_quantized_model_is_batch_invariant_and_speculation_exact(quantized, key):
    model = load_model(quantized[1][key]).model
    rng = np.random.default_rng(key[0])
    tokens = rng.integers(0, 512, 90)
    together = model.forward(tokens[40:], np.arange(40, 90), _prefilled(model, tokens), 6)
    cache = _prefilled(model, tokens)
    singles = np.concatenate([model.forward(tokens[p:p + 1], [p], cache, 6) for p in range(40, 90)])
    assert np.array_equal(together, singles)
    for case in range(8):
        prompt = [int(t) for t in rng.integers(0, 512, int(rng.integers(2, 30)))]
        plain = generate(model, GenerationRequest(prompt, 30, loops=8)).tokens
        for branches in (1, 4):
            out = speculative_generate(model, GenerationRequest(prompt, 30),
                                       SpeculativeParams(int(rng.integers(1, 8)), 8, 5, branches))
            assert out.tokens == plain


def _prefilled(model, tokens):
    cache = model.new_cache(90, 6)
    model.forward(tokens[:40], np.arange(40), cache, 6)
    return cache


def test_refusals(quantized, tmp_path):
    source, _ = quantized
    with pytest.raises(TinyLoopError, match="needs calibration text"):
        quantize_file(source, tmp_path / "x.tinyloop", 4, 32, "gptq", False, None, progress=False)
    with pytest.raises(TinyLoopError, match="act-order applies to --method gptq only"):
        quantize_file(source, tmp_path / "x.tinyloop", 4, 32, "rtn", True, None, progress=False)
    assert not (tmp_path / "x.tinyloop").exists()
    # widths the group size does not divide are padded, not refused (64-wide inputs, groups of 128)
    quantize_file(source, tmp_path / "g128.tinyloop", 4, 128, "rtn", False, None, progress=False)
    spec = ModelFile(tmp_path / "g128.tinyloop").quantization["core.0.attn.q.weight"]
    assert spec["shape"] == [64, 64] and spec["padded_in"] == 128
    assert load_model(tmp_path / "g128.tinyloop").model is not None


def test_quantize_cli(quantized, tmp_path, capsys):
    source, _ = quantized
    out = tmp_path / "cli.tinyloop"
    assert main(["quantize", str(source), str(out), "--bits", "4", "--group-size", "32", "--method", "rtn"]) == 0
    assert main(["info", str(out)]) == 0
    assert "bits [4], group size [32], method rtn" in capsys.readouterr().out
    assert main(["quantize", str(source), str(out), "--bits", "4", "--calibration", "/no/such/file"]) == 2


def test_default_calibration_length_fits_a_short_context(tmp_path):
    """GPTQ's default sequence length is 512 tokens or the model's context if shorter (a
    converted checkpoint may have 256); an explicit length past the context is a clear error."""
    source = tmp_path / "short.tinyloop"
    make_test_model(source, "tiny-looped-gpt", seed=2)           # max_seq_len 256
    text = CALIBRATION * 4
    quantize_file(source, tmp_path / "q.tinyloop", 8, 16, "gptq", False, text, calibration_tokens=700,
                  progress=False)
    assert load_model(tmp_path / "q.tinyloop").model.config.max_seq_len == 256
    with pytest.raises(TinyLoopError, match="--seq-len must be between 2 and the model's context \\(256\\)"):
        quantize_file(source, tmp_path / "x.tinyloop", 8, 16, "gptq", False, text, calibration_tokens=700,
                      seq_len=300, progress=False)
