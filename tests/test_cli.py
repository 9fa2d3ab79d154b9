import subprocess
import sys

import pytest

from tinyloop.cli import main


def test_new_model_info_generate(tmp_path, capsys):
    path = tmp_path / "cli.tinyloop"
    assert main(["new-model", str(path), "--preset", "tiny-looped-gpt", "--seed", "4"]) == 0
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "quantization:   fp32" in out and "n_core: 2" in out and "stored tensors" in out
    assert main(["generate", str(path), "Hello", "--max-tokens", "5", "--temperature", "0.7",
                 "--seed", "1", "--loops", "2"]) == 0
    captured = capsys.readouterr()
    assert "completion 5 tokens, loops 2" in captured.err


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "cli.tinyloop"
    main(["new-model", str(path)])
    assert main(["generate", str(path), "Hi", "--loops", "99"]) == 2
    assert "tinyloop: error: loops must be in [1, 8] for this model, got 99" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "missing.tinyloop")]) == 2
    assert "cannot open" in capsys.readouterr().err
    assert main(["new-model", str(path), "--preset", "huge"]) == 2


@pytest.mark.parametrize("command", [[], ["generate"], ["info"], ["new-model"]])
def test_help_on_every_command(command):
    run = subprocess.run([sys.executable, "-m", "tinyloop", *command, "--help"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "usage: tinyloop" in run.stdout


def test_generate_stops_at_a_stop_string(tmp_path, capsys):
    path = tmp_path / "cli.tinyloop"
    main(["new-model", str(path)])
    capsys.readouterr()
    assert main(["generate", str(path), "The looped", "--max-tokens", "40", "--loops", "3"]) == 0
    full = capsys.readouterr().out.rstrip("\n")
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert len(full) > 10 and stop
    assert main(["generate", str(path), "The looped", "--max-tokens", "40", "--loops", "3", "--stop", stop,
                 "--stop", "never-in-the-output"]) == 0
    captured = capsys.readouterr()
    assert captured.out.rstrip("\n") == full[:full.index(stop)]
    assert captured.err.startswith("[stop]")
