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
