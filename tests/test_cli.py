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


@pytest.mark.parametrize("command", [[], ["generate"], ["info"], ["new-model"], ["bench"]])
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


def test_info_kv_sizes_count_keys_and_values_once(tmp_path, capsys, monkeypatch):
    """tiny-looped-gpt: 3 KV heads x 16 per layer instance. One token's keys and values
    together, by hand: packed fp16 2 x 3 x 16 x 2 bytes = 192; int4 2 x 3 x (16/2 codes +
    4 bytes of f16 scale and min for the one 16-wide group) = 72. The CPU keeps fp32 with a
    column of ones on the values: (3 x 16 + 3 x 17) x 4 = 396 (packed: 2 x 3 x 16 x 4 = 384)."""
    from tinyloop.backends.cuda import device as cuda_device
    path = tmp_path / "cli.tinyloop"
    main(["new-model", str(path), "--preset", "tiny-looped-gpt"])
    assert main(["info", str(path), "--loops", "2", "--context", "64", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "fp16       192 bytes per token per layer instance,      768 per token" in out
    assert "fp32       396 bytes per token per layer instance (packed: 384),     1584 per token" in out
    assert "int4        72 bytes per token per layer instance,      288 per token" in out
    monkeypatch.setattr(cuda_device, "cuda_unavailable", lambda: "CuPy is not installed")
    assert main(["info", str(path), "--loops", "2", "--context", "64", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "on the cuda backend" in out
    assert "fp16       192 bytes per token per layer instance,      768 per token" in out


SERVE_VARIABLES = ("TINYLOOP_MODEL_PATH", "TINYLOOP_MAX_WAITING", "TINYLOOP_AUTH", "TINYLOOP_STATE_DIR",
                   "TINYLOOP_DEVICE", "TINYLOOP_EXIT_ON_FAILURE", "TINYLOOP_KV_CACHE", "TINYLOOP_DRAIN_TIMEOUT",
                   "TINYLOOP_ACTIVATIONS", "TINYLOOP_MAX_RUNNING", "TINYLOOP_PREFIX_CACHE", "TINYLOOP_PREFILL_CHUNK",
                   "TINYLOOP_STEP_TOKENS")


@pytest.fixture
def serve_settings(tmp_path, monkeypatch, granian_started):
    """Run `tinyloop serve ...` up to the point Granian would start; return the settings the
    server would read (from the environment the command leaves)."""
    from asgi.settings import Settings

    for name in SERVE_VARIABLES:
        # set, then delete: monkeypatch records the variable's state either way, so what
        # `serve` writes into os.environ is undone after the test (a bare delenv of an unset
        # variable records nothing, and the flags' values leaked into later tests)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("TINYLOOP_API_KEY", "k" * 32)
    path = tmp_path / "m.tinyloop"
    main(["new-model", str(path)])

    def run(*flags, **env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert main(["serve", "--model", str(path), "--port", str(free_port()), *flags]) == 0
        return Settings.from_env()
    return run


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_flags_default_to_their_variables(serve_settings, tmp_path):
    """Each serve flag that mirrors a TINYLOOP_* variable: absent, the variable holds;
    given, the flag wins."""
    settings = serve_settings(TINYLOOP_MAX_WAITING="2", TINYLOOP_DEVICE="cpu", TINYLOOP_KV_CACHE="int8",
                              TINYLOOP_AUTH="0", TINYLOOP_STATE_DIR=str(tmp_path / "state"),
                              TINYLOOP_EXIT_ON_FAILURE="1")
    assert (settings.max_waiting, settings.device, settings.kv_mode, settings.auth) == (2, "cpu", "int8", False)
    assert str(settings.state_dir) == str(tmp_path / "state") and settings.exit_on_failure
    settings = serve_settings("--max-waiting", "5", "--device", "auto", "--kv-cache", "int4",
                              "--state-dir", str(tmp_path / "other"), "--activations", "fp16")
    assert (settings.max_waiting, settings.device, settings.kv_mode) == (5, "auto", "int4")
    assert str(settings.state_dir) == str(tmp_path / "other")
    from tinyloop.backends.select import select_backend
    assert select_backend("cpu").activations == "fp16"            # what the server's backend will use


def test_serve_drain_timeout_flag_variable_and_default(serve_settings, monkeypatch):
    from asgi.settings import Settings
    from tinyloop.errors import TinyLoopError

    assert serve_settings().drain_timeout_s == 30
    assert serve_settings(TINYLOOP_DRAIN_TIMEOUT="12.5").drain_timeout_s == 12.5
    assert serve_settings("--drain-timeout", "0").drain_timeout_s == 0
    for wrong in ("-1", "soon", "inf"):
        monkeypatch.setenv("TINYLOOP_DRAIN_TIMEOUT", wrong)
        with pytest.raises(TinyLoopError, match="TINYLOOP_DRAIN_TIMEOUT"):
            Settings.from_env()


def test_serve_defaults_without_flags_or_variables(serve_settings):
    settings = serve_settings()
    assert (settings.max_waiting, settings.device, settings.auth, settings.exit_on_failure) == (8, None, True, False)
    assert (settings.max_running, settings.prefix_cache, settings.prefill_chunk) == (None, True, None)


def test_serve_batching_flags_and_variables(serve_settings, monkeypatch):
    """--max-running and --no-prefix-cache set their variables; the variables are read, and bad
    values are refused by name at start."""
    from asgi.settings import Settings
    from tinyloop.errors import TinyLoopError

    settings = serve_settings(TINYLOOP_MAX_RUNNING="3", TINYLOOP_PREFILL_CHUNK="64", TINYLOOP_STEP_TOKENS="200")
    assert (settings.max_running, settings.prefill_chunk, settings.step_tokens) == (3, 64, 200)
    settings = serve_settings("--max-running", "1", "--no-prefix-cache")
    assert (settings.max_running, settings.prefix_cache) == (1, False)
    for name, wrong in (("TINYLOOP_MAX_RUNNING", "0"), ("TINYLOOP_MAX_RUNNING", "many"),
                        ("TINYLOOP_PREFILL_CHUNK", "-5"), ("TINYLOOP_PREFIX_CACHE", "perhaps")):
        monkeypatch.setenv(name, wrong)
        with pytest.raises(TinyLoopError, match=name):
            Settings.from_env()
        monkeypatch.delenv(name)


@pytest.mark.parametrize("name, value, message", [
    ("TINYLOOP_MAX_WAITING", "-1", "TINYLOOP_MAX_WAITING must be >= 0, got '-1'"),
    ("TINYLOOP_MAX_WAITING", "many", "TINYLOOP_MAX_WAITING must be an integer, got 'many'"),
    ("TINYLOOP_MAX_BODY_BYTES", "100", "TINYLOOP_MAX_BODY_BYTES must be >= 1024, got '100'"),
    ("TINYLOOP_DRAIN_TIMEOUT", "soon", "TINYLOOP_DRAIN_TIMEOUT must be a number of seconds, got 'soon'"),
    ("TINYLOOP_CUDA_GRAPHS", "maybe", "TINYLOOP_CUDA_GRAPHS must be 1 or 0, got 'maybe'"),     # was "on"
    ("TINYLOOP_CUDA_MMA_ROWS", "yes please", "TINYLOOP_CUDA_MMA_ROWS must be 1 or 0, got 'yes please'"),
    ("TINYLOOP_CUDA_PDL", "fast", "TINYLOOP_CUDA_PDL must be 1 or 0, got 'fast'"),
    ("TINYLOOP_CUDA_PAIR", "both", "TINYLOOP_CUDA_PAIR must be 1 or 0, got 'both'"),
])
def test_numeric_settings_name_the_variable_and_the_rule(monkeypatch, name, value, message):
    from asgi.settings import Settings
    from tinyloop.errors import TinyLoopError
    monkeypatch.setenv(name, value)
    with pytest.raises(TinyLoopError) as error:
        Settings.from_env()
    assert str(error.value) == message


def test_an_empty_flag_variable_means_unset(monkeypatch):
    """An empty TINYLOOP_* yes/no variable takes the default, as an empty number does."""
    from asgi.settings import Settings
    from tinyloop.backends.cuda.graphs import graphs_enabled
    for name in ("TINYLOOP_CUDA_GRAPHS", "TINYLOOP_AUTH", "TINYLOOP_EXIT_ON_FAILURE"):
        monkeypatch.setenv(name, "")
    assert graphs_enabled() is True
    settings = Settings.from_env()
    assert settings.auth is True and settings.exit_on_failure is False
    monkeypatch.setenv("TINYLOOP_CUDA_GRAPHS", "0")
    assert graphs_enabled() is False


@pytest.mark.parametrize("flags, message", [
    (["--port", "0"], "--port: expected a TCP port, 1-65535, got '0'"),
    (["--port", "65536"], "--port: expected a TCP port, 1-65535, got '65536'"),
    (["--port", "-1"], "--port: expected a TCP port"),
    (["--port", "http"], "--port: expected a TCP port"),
    (["--device", "tpu"], "--device: invalid choice: 'tpu'"),
    (["--host", "999.1.1.1"], "--host 999.1.1.1: not an IP address, and the name does not resolve"),
    (["--host", "no-such-host.invalid"], "--host no-such-host.invalid: not an IP address"),
])
def test_serve_refuses_bad_flags_in_one_line_before_starting(serve_settings, capsys, tmp_path, flags, message):
    """Each was a Python traceback from Granian (port out of range, a host name) or a
    server that came up answering 503 to everything (a misspelt device)."""
    path = tmp_path / "m.tinyloop"
    try:
        code = main(["serve", "--model", str(path), *flags])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_serve_binds_a_host_name_as_its_address(serve_settings, granian_started):
    serve_settings("--host", "localhost")
    assert granian_started[-1]["address"] in ("127.0.0.1", "::1")


def test_serve_refuses_a_port_another_server_listens_on(serve_settings, capsys, tmp_path):
    """Granian's listener sets SO_REUSEPORT: without the check a second server started on a
    busy port and silently shared its connections with the first."""
    import socket
    path = tmp_path / "m.tinyloop"
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)    # as Granian's own listener
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert main(["serve", "--model", str(path), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1 port {port}: Address already in use" in err
    assert serve_settings("--port", str(port)) is not None     # free again once the other has gone


def test_a_misspelt_device_variable_is_a_startup_error(monkeypatch):
    from asgi.settings import Settings
    from tinyloop.errors import TinyLoopError
    monkeypatch.setenv("TINYLOOP_DEVICE", "gpu")
    with pytest.raises(TinyLoopError, match="TINYLOOP_DEVICE must be one of auto, cpu, cuda, got 'gpu'"):
        Settings.from_env()
    monkeypatch.setenv("TINYLOOP_DEVICE", "CUDA")           # names are case-blind, as the backend reads them
    assert Settings.from_env().device == "cuda"                # and normalised


@pytest.mark.parametrize("command, message", [
    (["new-model", "{missing}/x.tinyloop"], "x.tinyloop: cannot write: No such file or directory"),
    (["info", "{model}", "--context", "-5"], "--context: expected a whole number >= 1, got '-5'"),
    (["info", "{model}", "--device", "tpu"], "--device: invalid choice: 'tpu'"),
])
def test_more_bad_arguments_are_one_line(tmp_path, capsys, command, message):
    model = tmp_path / "m.tinyloop"
    assert main(["new-model", str(model)]) == 0
    argv = [part.format(missing=tmp_path / "missing", model=model) for part in command]
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]            # argparse prints its usage first, then the one error line
    assert code == 2 and "Traceback" not in err and message in last and "error:" in last, err
    assert not list(tmp_path.glob("**/*.partial"))


def test_quantize_refuses_to_overwrite_its_input_and_a_damp_that_is_not_positive(tmp_path, capsys):
    import hashlib
    model = tmp_path / "m.tinyloop"
    assert main(["new-model", str(model)]) == 0
    before = hashlib.sha256(model.read_bytes()).hexdigest()
    assert main(["quantize", str(model), str(model), "--bits", "8", "--method", "rtn"]) == 2
    assert "OUT is IN" in capsys.readouterr().err
    assert hashlib.sha256(model.read_bytes()).hexdigest() == before           # untouched
    for damp in ("0", "-1", "nan"):
        with pytest.raises(SystemExit) as exit_:
            main(["quantize", str(model), str(tmp_path / "q.tinyloop"), "--bits", "8", "--damp", damp])
        assert exit_.value.code == 2 and "--damp: expected a number > 0" in capsys.readouterr().err


def test_gptq_on_a_hessian_that_damping_cannot_fix_says_what_to_do():
    """It was numpy's LinAlgError traceback from `tinyloop quantize`."""
    import numpy as np

    from tinyloop.errors import TinyLoopError
    from tinyloop.quantize.gptq import gptq_quantize
    weight = np.ones((4, 32), np.float32)
    hessian = np.eye(32, dtype=np.float64)
    hessian[0, 1] = hessian[1, 0] = 3.0            # eigenvalues -2 and 4: indefinite
    with pytest.raises(TinyLoopError, match="not positive definite.*raise --damp"):
        gptq_quantize(weight, hessian, 8, 32, damp=0.01)


def test_new_model_seed_and_convert_folder_are_checked(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["new-model", str(tmp_path / "n.tinyloop"), "--seed", "-1"])
    assert exit_.value.code == 2 and "--seed: expected a whole number >= 0" in capsys.readouterr().err
    assert main(["convert", str(tmp_path), str(tmp_path / "o.tinyloop")]) == 2
    assert "a folder without config.json: not a Hugging Face checkpoint" in capsys.readouterr().err
