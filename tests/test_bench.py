"""`tinyloop bench`: the command runs and its report is well formed. Nothing here looks at
how fast anything was: figures are checked for shape and consistency only."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinyloop.bench.figures import figures_from
from tinyloop.bench.plan import Item, default_speculative
from tinyloop.bench.report import render
from tinyloop.bench.runner import run_rounds
from tinyloop.bench.serving import loadgen
from tinyloop.bench.stats import percentile, ratio, summarize
from tinyloop.cli import main

ROOT = Path(__file__).resolve().parent.parent


def bench(*argv, block=(), timeout=240):
    """Run `tinyloop bench` in a fresh interpreter; `block` names modules made unimportable there."""
    code = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in block) + \
        "from tinyloop.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "bench", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def have(*modules) -> bool:
    try:
        for module in modules:
            __import__(module)
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "tiny.tinyloop"
    assert main(["new-model", str(path)]) == 0
    run = bench(str(path), "--quick", "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)                        # stdout is the JSON report and nothing else


def test_quick_json_has_every_section(quick):
    assert {"machine", "model", "settings", "engines", "sections", "figures", "http"} <= set(quick)
    machine = quick["machine"]
    assert machine["cpu"] and machine["logical_cpus"] >= 1 and machine["numpy"]
    assert quick["model"]["name"] == "tiny-looped" and quick["settings"]["quick"] is True
    kinds = {row["figure"] for row in quick["figures"]}
    assert kinds == {"prefill", "decode", "ttft", "speculative", "tree_speculative"}
    assert {row["params"]["loops"] for row in quick["figures"] if row["figure"] == "decode"} == {1, 4, 8}
    assert {row["params"]["prompt_tokens"] for row in quick["figures"] if row["figure"] == "prefill"} == {32, 128}
    assert quick["sections"]["engine"]["status"] == "measured"
    assert quick["sections"]["speculative"]["status"] == "measured"


def test_every_figure_is_a_median_of_its_runs(quick):
    rounds = quick["settings"]["rounds"]
    for row in quick["figures"]:
        figure = row["engines"]["TinyLoop"]
        assert len(figure["runs"]) == rounds, row["label"]
        assert figure["min"] == min(figure["runs"]) and figure["max"] == max(figure["runs"])
        assert figure["median"] == sorted(figure["runs"])[rounds // 2] and figure["min"] > 0
        assert row["unit"] == {"ttft": "ms"}.get(row["figure"], "tok/s")


def test_speculative_rows_are_exact_with_acceptance(quick):
    rows = [r for r in quick["figures"] if r["figure"] in ("speculative", "tree_speculative")]
    assert {r["params"]["K_branches"] for r in rows} == {1, 4}
    for row in rows:
        assert row["equal_to_plain"] is True and 0 <= row["acceptance"] <= 1
        assert row["params"]["draft_loops"] < row["params"]["verify_loops"] == 8
        assert row["ratios"]["TinyLoop / plain at verify loops"]["median"] == pytest.approx(
            row["engines"]["TinyLoop"]["median"] / row["plain"]["median"])


def test_llama_cpp_without_a_gguf_says_why(quick):
    llama = quick["engines"]["llama.cpp"]
    assert llama["status"] == "skipped" and "--gguf" in llama["reason"]
    assert quick["sections"]["llama.cpp"] == llama
    assert all(set(row["engines"]) == {"TinyLoop"} for row in quick["figures"])


def test_http_comparison_measured_or_says_why(quick):
    http = quick["http"]
    if not have("fastapi", "uvicorn", "sse_starlette"):
        assert http["status"] == "skipped" and "pip install" in http["reason"]
        return
    assert http["status"] == "measured", http.get("reason")
    assert http["servers"] == ["tinyloop serve", "FastAPI + uvicorn"] and http["all_200"]
    assert http["settings"]["max_waiting"] == http["settings"]["clients"]
    assert {r["measure"] for r in http["rows"]} == {"requests_per_s", "p50_ms", "p99_ms", "chunks_per_s",
                                                    "tokens_per_s"}
    for row in http["rows"]:
        for server in http["servers"]:
            assert len(row["servers"][server]["runs"]) == http["settings"]["rounds"]
        assert row["ratio"]["median"] == pytest.approx(row["servers"]["tinyloop serve"]["median"]
                                                       / row["servers"]["FastAPI + uvicorn"]["median"])


def test_tables_render(quick):
    text = render(quick)
    assert "decode after 64 tokens, loops 4 (tok/s)" in text and "speculative d4/v8, ahead 4" in text
    assert "llama.cpp: skipped" in text
    markdown = render(quick, markdown=True)
    assert "| figure | TinyLoop |" in markdown and "|---|---|" in markdown


def test_a_saved_report_renders_without_measuring(quick, tmp_path, capsys):
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(quick))
    assert main(["bench", "--load", str(saved), "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == render(quick, markdown=True)
    assert main(["bench", "--load", str(tmp_path / "none.json")]) == 2
    assert "cannot read a report" in capsys.readouterr().err


def test_missing_dependencies_are_reported_not_fatal(tmp_path):
    path = tmp_path / "standard.tinyloop"
    assert main(["new-model", str(path), "--preset", "tiny-standard"]) == 0
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    no_llama = tmp_path / "python-without-llama"
    no_llama.write_text("#!/bin/sh\nexit 1\n")
    no_llama.chmod(0o755)
    run = bench(str(path), "--quick", "--json", "--rounds", "1", "--gguf", str(gguf), "--llama-python",
                str(no_llama), block=("fastapi",))
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["engines"]["llama.cpp"]["status"] == "skipped"
    assert "llama-cpp-python is not installed" in report["engines"]["llama.cpp"]["reason"]
    assert report["http"]["status"] == "skipped" and "fastapi" in report["http"]["reason"]
    assert report["sections"]["speculative"]["status"] == "skipped"
    assert "one loop" in report["sections"]["speculative"]["reason"]
    assert {row["figure"] for row in report["figures"]} == {"prefill", "decode", "ttft"}


def test_plot_without_matplotlib_fails_before_measuring(tmp_path):
    run = bench("--http-only", "--plot", str(tmp_path / "b.png"), block=("matplotlib",), timeout=60)
    assert run.returncode == 2 and "--plot needs matplotlib" in run.stderr and not run.stdout
    assert not (tmp_path / "b.png").exists()


def test_plot_writes_a_png(quick, tmp_path):
    """matplotlib is in the dev extra, so the plot is drawn wherever the tests run."""
    from tinyloop.bench.plot import write_plot
    write_plot(quick, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the pieces, by hand ---------------------------------------------------------------------
def test_summaries_and_ratios_by_hand():
    assert summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": [3.0, 1.0, 2.0]}
    # runs of the same round pair up: 4/2, 9/3, 10/5 -> 2, 3, 2; medians 9/3
    got = ratio(summarize([4.0, 9.0, 10.0]), summarize([2.0, 3.0, 5.0]))
    assert got == {"median": 3.0, "min": 2.0, "max": 3.0}
    values = list(range(1, 101))
    assert percentile(values, 0.5) == 50 and percentile(values, 0.99) == 99 and percentile(values, 1.0) == 100
    assert percentile([5, 1, 3], 0.99) == 5 and percentile([7], 0.5) == 7


class FakeWorker:
    def __init__(self, name, log):
        self.name, self.log, self.calls, self.commands = name, log, 0, []

    def ask(self, **command):
        self.calls += 1
        self.log.append(self.name)
        self.commands.append(command)
        return {"value": 10.0 * self.calls if self.name == "TinyLoop" else 5.0}


def test_rounds_interleave_engines_and_drop_the_warm_up():
    from tinyloop.bench.plan import Settings
    log = []
    workers = {"TinyLoop": FakeWorker("TinyLoop", log), "other": FakeWorker("other", log)}
    settings = Settings(quick=True, rounds=3, warmup=1, min_seconds=0.01, settle=0, prompt_lengths=[4], context=4,
                        decode_tokens=2, loops=[1], speculative=[], speculative_prompts=1)
    items = [Item("p", "engine", {"op": "prefill", "prompt": 2, "loops": 1}, ["TinyLoop", "other"],
                  {"prompt_tokens": 2})]
    results = run_rounds(workers, items, settings, {"single": [1, 2, 3], "several": []}, progress=False)
    # each round starts with the engine that went second in the one before
    assert log == ["TinyLoop", "other", "other", "TinyLoop", "TinyLoop", "other", "other", "TinyLoop"]
    assert [r["value"] for r in results["p"]["TinyLoop"]] == [20.0, 30.0, 40.0]     # the warm-up's 10.0 is dropped
    for worker in workers.values():             # both engines get the same prompt ids
        assert all(c == {"op": "prefill", "prompt": [1, 2], "loops": 1, "min_seconds": c["min_seconds"]}
                   for c in worker.commands)
    row = figures_from(items, results, "fp16")[0]
    assert row["engines"]["TinyLoop"]["median"] == 30.0 and row["engines"]["other"]["runs"] == [5.0] * 3
    assert row["ratios"]["TinyLoop / other"] == {"median": 6.0, "min": 4.0, "max": 8.0}


async def _serve_once(reader, writer):
    """A stand-in server: GET -> JSON by Content-Length; POST -> an SSE stream, chunked, \\r\\n lines."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length")][0])
        await reader.readexactly(length)
        if head.startswith(b"GET"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        else:
            events = [b'data: {"choices": [{"text": "a"}]}\r\n\r\n', b'data: {"choices": [{"text": "b"}]}\r\n\r\n',
                      b'data: {"choices": [], "usage": {"completion_tokens": 2}}\r\n\r\n', b"data: [DONE]\r\n\r\n"]
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for event in events:                                  # split an event across two chunks
                for piece in (event[:7], event[7:]):
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            writer.write(b"0\r\n\r\n")
        await writer.drain()


def test_load_generator_reads_chunked_event_streams_and_counts_requests():
    async def scenario():
        server = await asyncio.start_server(lambda r, w: _serve_once(r, w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            streamed = await loadgen.streams("127.0.0.1", port, "k", "/s", {}, 2)
            closed = await loadgen.closed_loop("127.0.0.1", port, None, "/s", {}, 7, 3)
            await loadgen.wait_ready("127.0.0.1", port, None, "/health", 5, lambda: True)
        finally:
            server.close()
        return streamed, closed
    streamed, closed = asyncio.run(scenario())
    assert streamed["statuses"] == {"200": 2} and streamed["tokens_per_s"] > 0
    assert streamed["chunks_per_s"] * streamed["seconds"] == pytest.approx(6)     # 3 events x 2, [DONE] not counted
    assert streamed["tokens_per_s"] * streamed["seconds"] == pytest.approx(4)
    assert closed["requests"] == 7 and closed["statuses"] == {"200": 7} and closed["p50_ms"] <= closed["p99_ms"]


def test_default_speculative_settings_fit_the_model():
    info = {"min_loops": 1, "default_loops": 4, "max_loops": 8}
    assert default_speculative(info, [1, 4, 8], quick=True) == [(4, 8, 4, 1), (4, 8, 4, 4)]
    full = default_speculative(info, [1, 4, 8], quick=False)
    assert all(1 <= d < v == 8 and k * ahead <= 64 for d, v, ahead, k in full)
    assert default_speculative({"min_loops": 1, "default_loops": 1, "max_loops": 1}, [1], quick=False) == []


def test_bench_errors_are_one_line(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "missing.tinyloop"), "--no-http"]) == 2
    assert "tinyloop: error: model file not found" in capsys.readouterr().err


def test_a_preset_is_written_into_a_cache_dir_that_does_not_exist_yet(tmp_path):
    from tinyloop.bench.main import resolve_model
    from tinyloop.model.loader import load_model
    path = resolve_model("preset:tiny-looped", str(tmp_path / "new" / "nested"))
    assert path == str(tmp_path / "new" / "nested" / "bench-tiny-looped-seed0.tinyloop")
    assert load_model(path).config.max_loops > 1


def test_a_cache_dir_that_cannot_be_made_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["bench", "preset:tiny-looped", "--no-http", "--cache-dir", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert "tinyloop: error: --cache-dir" in err and "Traceback" not in err


BAD_ARGUMENTS = [
    (["--prompt-lengths", "0"], "--prompt-lengths: expected a whole number >= 1"),
    (["--prompt-lengths", "-5"], "--prompt-lengths: expected a whole number >= 1"),
    (["--context", "0"], "--context: expected a whole number >= 1"),
    (["--decode-tokens", "0"], "--decode-tokens: expected a whole number >= 1"),
    (["--rounds", "0"], "--rounds: expected a whole number >= 1"),
    (["--threads", "0"], "--threads: expected a whole number >= 1"),
    (["--settle", "-1"], "--settle: expected a number of seconds >= 0"),
    (["--settle", "nan"], "--settle: expected a number of seconds >= 0"),
    (["--device", "tpu"], "--device: invalid choice"),
    (["--speculative", "4,8,17,1"], "1 <= AHEAD <= 16"),
    (["--speculative", "4,8,16,16"], "K x AHEAD <= 64"),
    (["--plot", "/nonexistent-dir/b.png"], "--plot /nonexistent-dir/b.png: the folder"),
    (["--save", "/nonexistent-dir/b.json"], "--save /nonexistent-dir/b.json: the folder"),
    (["--gguf", "/nonexistent.gguf"], "--gguf /nonexistent.gguf: file not found"),
    (["--llama-python", "/nonexistent-python"], "--llama-python /nonexistent-python: not an executable"),
    # a missing checkout used to fall back to the installed tinyloop: this code measured as its own baseline
    (["--baseline", "/nonexistent-checkout"], "not a TinyLoop checkout"),
    (["--concurrency", "0"], "--concurrency: expected a whole number >= 1"),
    (["--concurrency", "2", "x"], "--concurrency: expected a whole number >= 1"),
    (["--chat-turns", "1"], "--chat-turns: expected a whole number >= 2"),
    (["--long-prompt", "0"], "--long-prompt: expected a whole number >= 1"),
    (["--interference-streams", "-1"], "--interference-streams: expected a whole number >= 0"),
    (["--serving-only"], "--serving-only needs --concurrency or --chat-turns"),
    (["--concurrency", "1", "--long-prompt", "600"], "must fit the model's context of 512 tokens"),
    (["--concurrency", "1", "--context", "400", "--decode-tokens", "100"], "must fit the model's context of 512"),
    (["--chat-turns", "2", "--system-tokens", "600"], "need about"),
]


@pytest.mark.parametrize("extra,message", BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_bad_arguments_are_refused_in_one_line_before_measuring(tmp_path, capsys, extra, message):
    argv = ["bench", "preset:tiny-looped", "--no-http", "--quick", "--cache-dir", str(tmp_path), *extra]
    try:
        code = main(argv)
    except SystemExit as exit_:                 # argparse's own refusals
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]            # argparse prints its usage first, then the one error line
    assert last.startswith(("tinyloop: error:", "tinyloop bench: error:")) and message in last, err


def test_a_failure_inside_a_worker_is_one_line(tmp_path, capsys):
    """--device cuda without CuPy fails in the measuring worker; the parent says so in one line."""
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed: the cuda device would load (this checks the no-GPU refusal)")
    except ImportError:
        pass
    code = main(["bench", "preset:tiny-looped", "--no-http", "--quick", "--cache-dir", str(tmp_path),
                 "--device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and "CuPy is not installed" in err and "Traceback" not in err, err


def test_interference_counts_only_other_processes(monkeypatch):
    from tinyloop.bench import interference
    machine = iter([(1000, 4000), (1300, 4400)])          # 300 busy ticks of 400 elapsed over all CPUs
    ours = iter([50, 50, 150, 60])                          # worker 50 -> 150, this process 50 -> 60: 110 ours
    monkeypatch.setattr(interference, "_machine", lambda: next(machine))
    monkeypatch.setattr(interference, "_process", lambda pid: next(ours))
    with interference.Meter(1234) as meter:
        pass
    assert meter.share == pytest.approx((300 - 110) / 400)
    monkeypatch.undo()
    with interference.Meter(os.getpid()) as real:           # the real /proc, where there is one
        sum(range(10000))
    assert real.share is None or 0 <= real.share <= 1


def test_machine_line_without_threadpoolctl_still_names_a_forced_kernel_set():
    # CI has no threadpoolctl; the BLAS entry then holds only the forced core type.
    from tinyloop.bench.machine import one_line
    machine = {"cpu": "CPU X", "cores": 2, "logical_cpus": 2, "python": "3.11", "numpy": "2.0",
               "blas": {"forced_by_OPENBLAS_CORETYPE": "Haswell"}}
    line = one_line(machine)
    assert "OPENBLAS_CORETYPE=Haswell" in line and "CPU X" in line
    machine["blas"] = {}
    assert one_line(machine).endswith("numpy 2.0")
    machine["blas"] = {"library": "openblas", "version": "0.3.27", "kernels": "SkylakeX"}
    assert "openblas 0.3.27 SkylakeX kernels" in one_line(machine)


# -- the serving scenarios (--concurrency, --chat-turns) -----------------------------------
@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    """Both serving scenarios on the tiny preset, tiny token counts, one round; a GGUF that
    exists but a llama-server that does not: llama-server is reported as skipped."""
    folder = tmp_path_factory.mktemp("serving")
    gguf = folder / "model.gguf"
    gguf.write_bytes(b"GGUF")
    run = bench("preset:tiny-looped", "--serving-only", "--cache-dir", str(folder), "--concurrency", "1", "2",
                "--decode-tokens", "4", "--context", "16", "--long-prompt", "150", "--interference-streams", "1",
                "--chat-turns", "2", "--system-tokens", "80", "--rounds", "1", "--settle", "0", "--quick", "--json",
                "--gguf", str(gguf), "--llama-server", str(folder / "no-such-llama-server"), timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_serving_only_skips_the_other_sections(serving):
    assert "figures" not in serving and serving["http"] == {"status": "skipped", "reason": "--serving-only"}
    assert serving["sections"]["concurrency"]["status"] == "measured"
    assert serving["sections"]["chat"]["status"] == "measured"


def test_concurrency_sweep_has_sane_numbers(serving):
    section = serving["concurrency"]
    assert section["problems"] == [], section["problems"]
    assert [level["concurrency"] for level in section["levels"]] == [1, 2]
    for level in section["levels"]:
        assert set(level["servers"]) == {"tinyloop", "tinyloop_1"}             # no llama-server
        for server in level["servers"].values():
            assert server["statuses"] == [{"200": level["concurrency"]}] and server["unattributed_tokens"] == 0
            assert server["prompt_tokens"] > 16                                  # the text and the chat template
            assert server["tokens_per_s"]["median"] > 0 and len(server["tokens_per_s"]["runs"]) == 1
            assert 0 < server["ttft_p50_ms"]["median"] <= server["ttft_p99_ms"]["median"]
            assert 0 <= server["itl_p50_ms"]["median"] <= server["itl_p99_ms"]["median"]
        ratios = level["ratios"]["tinyloop / tinyloop_1"]
        assert ratios["tokens_per_s"]["median"] == pytest.approx(level["servers"]["tinyloop"]["tokens_per_s"]["median"]
                                                                 / level["servers"]["tinyloop_1"]["tokens_per_s"]
                                                                 ["median"])
        assert "tinyloop / llama_server" not in level["ratios"]
    assert section["levels"][0]["ratios"]["tinyloop / tinyloop_1"]["tokens_per_s"]["median"] == 1.0   # the same runs
    how = section["settings"]["tinyloop_end_of_sequence"]
    assert how.startswith(("ignore_eos", "logit_bias -100"))


def test_interference_is_measured(serving):
    interference = serving["concurrency"]["interference"]
    assert interference["status"] == "measured" and interference["streams"] == 1
    mine = interference["servers"]["tinyloop"]
    assert mine["long_ttft_ms"]["median"] > 0 and mine["long_prompt_tokens"][0] >= 150
    # How many gaps fall in the window depends on timing (a fast prefill may leave none): only
    # their consistency is asserted, not their count
    assert mine["window_gaps"][0] >= 0
    if mine["window_gaps"][0]:
        assert mine["itl_window_p50_ms"]["median"] <= mine["itl_window_max_ms"]["median"]
    # whether the tiny model's stream (a few hundred tokens at thousands a second) outlasts the
    # long prompt's prefill is timing too: counted, within range, not required to be 0
    assert 0 <= mine["streams_ended_early"][0] <= interference["streams"] and "ratios" not in interference


def test_chat_turns_hit_the_prefix_cache_only_when_it_is_on(serving):
    chat = serving["chat"]
    assert chat["problems"] == [], chat["problems"]
    cached, cold = chat["servers"]["tinyloop_cache"], chat["servers"]["tinyloop_cold"]
    assert [t["turn"] for t in cached["turns"]] == [1, 2]
    assert cached["turns"][0]["cached_tokens"] == 0 < cached["turns"][1]["cached_tokens"]
    assert cached["turns"][1]["cached_tokens"] < cached["turns"][1]["prompt_tokens"]
    assert all(t["cached_tokens"] == 0 for t in cold["turns"])
    assert cached["turns"][1]["prompt_tokens"] > cached["turns"][0]["prompt_tokens"]   # the conversation grows
    assert cached["second_question"]["first_cached_tokens"] == 0 < cached["second_question"]["later_cached_tokens"]
    assert cold["second_question"]["later_cached_tokens"] == 0
    for server in (cached, cold):
        assert all(t["ttft_ms"]["median"] > 0 for t in server["turns"])
    assert set(chat["ratios"]) == {"tinyloop_cache / tinyloop_cold"} and len(chat["ratios"][
        "tinyloop_cache / tinyloop_cold"]["turns"]) == 2


def test_a_missing_llama_server_is_skipped_with_how_to_build_it(serving):
    for where in (serving["sections"]["llama-server"], serving["concurrency"]["llama_server"],
                  serving["chat"]["llama_server"]):
        assert where["status"] == "skipped"
        assert "no-such-llama-server: not an executable file" in where["reason"]
        assert "scripts/build_llama_server.sh" in where["reason"]


def test_serving_tables_render(serving):
    text = render(serving)
    assert "serving, concurrency sweep" in text and "aggregate tokens/s (all streams)" in text
    assert "TinyLoop(N) / TinyLoop(1)" in text and "long-prompt interference: 1 streams running" in text
    assert "multi-turn chat: time to first token per turn" in text and "a second question" in text
    assert "llama-server: skipped — --llama-server" in text
    markdown = render(serving, markdown=True)
    assert "| N | TinyLoop (max_running N) |" in markdown and "| turn | prompt tokens |" in markdown


def test_llama_server_is_looked_for_on_path_then_where_the_script_installs_it(tmp_path, monkeypatch):
    from tinyloop.bench.serving import llama_server
    assert "needs --gguf" in llama_server.locate(None, None)["reason"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    missing = llama_server.locate(None, "model.gguf")
    assert missing["status"] == "skipped" and str(tmp_path / "tinyloop" / "llama-server" / "llama-server") in \
        missing["reason"] and "build_llama_server.sh" in missing["reason"]
    binary = llama_server.installed_path()
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\necho 'version: 4242 (abcdef)' >&2\n")
    binary.chmod(0o755)
    found = llama_server.locate(None, "model.gguf")
    assert found == {"status": "found", "path": str(binary), "version": "4242 (abcdef)"}


async def _serve_chat_stream(reader, writer):
    """A stand-in chat server: a role chunk, then content: one token, two tokens (logprobs
    say so), one token, then usage saying 5 tokens (one no event accounted for)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length")][0])
    await reader.readexactly(length)
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")

    def send(data: bytes):
        event = b"data: " + data + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
    send(b'{"choices": [{"delta": {"role": "assistant"}}]}')
    await writer.drain()
    await asyncio.sleep(0.05)                                # the role chunk is not the first token
    for data, pause in ((b'{"choices": [{"delta": {"content": "a"}}]}', 0.02),
                        (b'{"choices": [{"delta": {"content": "bc"}, "logprobs": {"content": [{}, {}]}}]}', 0.02),
                        (b'{"choices": [{"delta": {"content": "d"}}]}', 0)):
        send(data)
        await writer.drain()
        await asyncio.sleep(pause)
    send(b'{"choices": [], "usage": {"completion_tokens": 5, "prompt_tokens": 3, '
         b'"prompt_tokens_details": {"cached_tokens": 2}}}')
    send(b"[DONE]")
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()


def test_streamed_tokens_are_timed_and_counted_not_chunks():
    from tinyloop.bench.serving.streaming import burst_figures, run_streams

    async def scenario():
        server = await asyncio.start_server(_serve_chat_stream, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await run_streams("127.0.0.1", port, "k", "/v1/chat/completions", [{}])
        finally:
            server.close()
    (record,), wall = asyncio.run(scenario())
    assert record.status == 200 and record.text == ["a", "bc", "d"]
    assert record.ttft_s >= 0.04                                 # measured to "a", not to the role chunk
    assert record.counted_tokens == 4 and record.tokens == 5 and record.unattributed_tokens == 1
    assert record.cached_tokens == 2 and record.usage["prompt_tokens"] == 3
    gaps = record.gaps()
    assert len(gaps) == 3 and gaps[0] == gaps[1] and gaps[0] + gaps[1] >= 0.015      # "bc": one gap spread over two
    figures = burst_figures([record], wall)
    assert figures["tokens"] == 5 and figures["unattributed_tokens"] == 1 and figures["gaps"] == 3
    assert figures["ttft_p50_ms"] == figures["ttft_p99_ms"] == pytest.approx(1000 * record.ttft_s)
