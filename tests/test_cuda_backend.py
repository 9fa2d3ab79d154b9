"""The CUDA backend end to end, on the CPU: CudaBackend on a device of NumPy arrays whose
kernels are the cuda/*.cu sources compiled and run by the CPU harness (tests/cudasim).

What this shows without a GPU: the backend wires every kernel correctly (its logits
follow the CPU backend's within float rounding, for every KV cache mode and both layer
kinds), and the exactness rule holds on it by construction of the kernels: greedy
speculative and tree decoding equal plain decoding token for token, and a draft tree's
verify pass equals a sequential decode of each path bit for bit. With
TINYLOOP_TEST_DEVICE=cuda (scripts/gpu_check.sh) the same tests run on CuPy and a GPU.
"""
import contextlib
import os
import sys
from pathlib import Path
from dataclasses import replace

import numpy as np
import pytest
from test_model import random_config
from test_tree_verify import check_tree_against_paths

from tinyloop.backends.reference import NumpyBackend
from tinyloop.backends.cuda.backend import CudaBackend
from tinyloop.backends.cuda.compile import kernel_path
from tinyloop.backends.cuda.launch.memory import WrappedKernel
from tinyloop.engine.decode import prefill
from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.model.loader import load_model
from tinyloop.model.modelfile import write_model_file
from tinyloop.model.testmodels import random_weights, train_tokenizer

pytestmark = pytest.mark.harness       # the kernels run on the CPU harness (or a GPU): scripts/exactness_matrix.py

MODES = ["fp16", "int8", "int4", "int4-h", "fp32"]
ON_GPU = os.environ.get("TINYLOOP_TEST_DEVICE") == "cuda"
# The cases of the end-to-end sweeps that take the CPU harness tens of seconds each: one case
# of each sweep stays in the default run, the rest run with -m slow (CI runs both; on a GPU,
# scripts/gpu_check.sh runs them all).
SLOW_ON_THE_HARNESS = pytest.mark.slow


class HarnessDevice:
    """The CUDA backend's device (backends/cuda/device.py) made of NumPy arrays and the CPU harness."""
    name = "harness"
    xp = np
    tensor_cores = True           # the harness runs linear_tc.cu's stand-in for the mma instruction
    column_block_cap = 3          # the rows linear's decode calls: warps run through several columns

    def __init__(self, order: str = "id"):
        from cudasim import load_module
        self._load, self.order, self._modules = load_module, order, {}

    def module(self, name: str):
        if name not in self._modules:
            self._modules[name] = self._load(str(kernel_path(name)), order=self.order)
        return self._modules[name]

    capturing = False                 # inside capture() or a replay: a transfer from the host is refused

    def asarray(self, host, dtype=None):
        if self.capturing:            # as CuPy refuses an H2D copy while its stream captures a graph
            raise RuntimeError("the current stream is capturing, so H2D transfers are disallowed")
        return np.array(host, dtype=dtype)            # a copy, as a transfer to a device is

    def to_host(self, array):
        return np.array(array)

    def synchronize(self):
        pass

    def upload_ints(self, buffer, values):
        buffer[...] = values

    def wait_for_uploads(self):
        pass

    def copy_into(self, target, source):
        np.copyto(target, source)

    def measure(self, step):
        return step(), 0

    def capture(self, step, arena_bytes=None):
        """What a CUDA graph does, as far as NumPy can: the step is recorded with the token
        and position of its capture, and a replay re-runs it, so any value that does not
        come from the step's device inputs is stale, as it would be in a replayed graph."""
        result = self._captured(step)

        def replay():
            np.copyto(result, self._captured(step))
        return replay, result

    def _captured(self, step):
        self.capturing = True
        try:
            return step()
        finally:
            self.capturing = False


def cuda_backend(order: str = "id", graphs: bool = False, activations: str = "fp32", mma_rows: bool = False):
    if ON_GPU:
        from tinyloop.backends.cuda.device import CupyDevice
        return CudaBackend(CupyDevice(), graphs, activations, mma_rows)
    return CudaBackend(HarnessDevice(order), graphs, activations, mma_rows)


@pytest.mark.parametrize("preset,mode", [(p, m) for p in ("tiny-looped", "tiny-looped-gpt") for m in MODES]
                         + [(f"{p} int{b}", "fp16") for p in ("tiny-looped", "tiny-looped-gpt") for b in (4, 8)])
def test_logits_follow_the_cpu_backend(tiny_files, preset, mode):
    """Prefill (bulk kernels) and three decode steps (row kernels): logits within float
    rounding of the NumPy reference backend's (the CUDA kernels' twins), and the same greedy tokens. The two backends round
    differently (warp-order sums against BLAS), so in a quantized cache a value near a
    code boundary can land one code apart: the tolerance grows with the code step."""
    models = [load_model(tiny_files[preset], device, kv_mode=mode).model for device in (NumpyBackend(), cuda_backend())]
    prompt = [5, 17, 42, 9, 3, 88, 120, 7, 64, 31, 2, 200]
    loops = models[0].config.default_loops
    results = []
    for model in models:
        cache = model.new_cache(len(prompt) + 4, loops)
        rows = [model.backend.to_host(prefill(model, prompt, cache, loops))[0]]
        token = int(np.argmax(rows[-1]))
        for position in range(len(prompt), len(prompt) + 3):
            rows.append(model.backend.to_host(model.forward([token], [position], cache, loops))[0])
            token = int(np.argmax(rows[-1]))
        results.append(np.stack(rows))
    cpu, cuda = results
    tolerance = {"fp32": 1e-4, "fp16": 1e-4, "int8": 1e-3, "int4": 1e-2, "int4-h": 1e-2}[mode]
    assert np.abs(cuda - cpu).max() <= tolerance * np.abs(cpu).max(), np.abs(cuda - cpu).max()
    assert np.array_equal(cuda.argmax(axis=1), cpu.argmax(axis=1))


# both ~25 s on the harness: the default run's CUDA speculation check is
# test_replayed_verify_passes_equal_plain_generation (graph-replayed verify passes against plain generation)
@pytest.mark.parametrize("preset", [pytest.param(p, marks=SLOW_ON_THE_HARNESS) for p in ("tiny-looped", "tiny-looped-gpt")])
def test_greedy_speculation_equals_plain_generation_on_cuda(tiny_files, preset):
    model = load_model(tiny_files[preset], cuda_backend()).model
    rng = np.random.default_rng(7)
    for case in range(4):
        prompt = [int(t) for t in rng.integers(0, model.config.vocab_size, int(rng.integers(1, 30)))]
        verify = int(rng.integers(2, model.config.max_loops + 1))
        params = SpeculativeParams(int(rng.integers(1, verify)), verify, int(rng.integers(1, 6)),
                                   int(rng.integers(1, 4)))
        plain = generate(model, GenerationRequest(prompt, 12, loops=verify))
        for branches in sorted({1, params.branches}):
            p = SpeculativeParams(params.draft_loops, verify, params.draft_ahead, branches)
            spec = speculative_generate(model, GenerationRequest(prompt, 12), p)
            assert np.array_equal(spec.tokens, plain.tokens), (preset, case, p)


class LaunchCounter:
    """A module wrapper that counts the launches of each kernel taken from it."""

    def __init__(self, module, counts):
        self.module, self.counts = module, counts

    def get_function(self, name):
        return CountedFunction(self.module.get_function(name), name, self.counts)


class CountedFunction(WrappedKernel):
    """A kernel that counts its launches (its shared memory opt-in goes to the kernel underneath)."""

    def __init__(self, function, name, counts):
        super().__init__(function, name=name, counts=counts)

    def __call__(self, *args, **kwargs):
        self.counts[self.name] = self.counts.get(self.name, 0) + 1
        return self.wrapped(*args, **kwargs)


def mma_rows_model(path, mode="fp16", order="id"):
    """A model on the CUDA backend with TINYLOOP_CUDA_MMA_ROWS's path, and its launch counts."""
    backend = cuda_backend(order, mma_rows=True)
    counts, original = {}, backend._module
    backend._module = lambda name: LaunchCounter(original(name), counts)
    return load_model(path, backend, kv_mode=mode).model, counts


@pytest.mark.exactness
@pytest.mark.parametrize("preset", [pytest.param(p, marks=SLOW_ON_THE_HARNESS)         # the tree test below is
                                    for p in ("tiny-looped int4 g32", "tiny-looped-gpt int4 g32")])   # the default run's
def test_greedy_speculation_equals_plain_generation_on_tensor_core_rows(tiny_files, preset):
    """TINYLOOP_CUDA_MMA_ROWS: decode, draft and verify rows through linear_mma_int4 (counted),
    chains and trees equal plain generation token for token over random prompts and depths.
    (Prefill is not the exact path: short prompts still go through linear_rows_*.)"""
    model, counts = mma_rows_model(tiny_files[preset])
    rng = np.random.default_rng(71)
    for case in range(2):
        prompt = [int(t) for t in rng.integers(0, model.config.vocab_size, int(rng.integers(1, 30)))]
        verify = int(rng.integers(2, model.config.max_loops + 1))
        params = SpeculativeParams(int(rng.integers(1, verify)), verify, int(rng.integers(2, 6)), 1 + case % 2)
        plain = generate(model, GenerationRequest(prompt, 10, loops=verify))
        spec = speculative_generate(model, GenerationRequest(prompt, 10), params)
        assert np.array_equal(spec.tokens, plain.tokens), (preset, case, params)
    assert counts.get("linear_mma_int4", 0) > 0, counts      # (short prefills stay on linear_rows_*)


@pytest.mark.parametrize("mode", [pytest.param("fp16", marks=SLOW_ON_THE_HARNESS), "int4-h"])
def test_the_fused_rope_gives_the_unfused_models_bits(tiny_files, mode):
    """RoPE inside the KV write and attention (fuses_rope, the default) against rope_rows first
    (the attribute off on one backend): the same logits and stored cache bits for a prefill
    and three decode steps, and no rope_rows launch when fused."""
    results = []
    for fused in (True, False):
        backend = cuda_backend()
        backend.fuses_rope = fused
        counts, original = {}, backend._module
        backend._module = lambda name, original=original, counts=counts: LaunchCounter(original(name), counts)
        model = load_model(tiny_files["tiny-looped"], backend, kv_mode=mode).model
        loops = model.config.default_loops
        prompt = [5, 17, 42, 9, 3, 88, 120, 7, 64, 31, 2]
        cache = model.new_cache(len(prompt) + 4, loops)
        rows = [backend.to_host(prefill(model, prompt, cache, loops))]
        token = int(np.argmax(rows[-1][-1]))
        for position in range(len(prompt), len(prompt) + 3):
            rows.append(backend.to_host(model.forward([token], [position], cache, loops)))
            token = int(np.argmax(rows[-1][-1]))
        stored = cache.stored(0, len(prompt) + 3)
        results.append((np.concatenate([r[-1:] for r in rows]), stored, counts.get("rope_rows", 0)))
    (fused_logits, fused_cache, fused_ropes), (plain_logits, plain_cache, plain_ropes) = results
    assert np.array_equal(fused_logits.view(np.uint32), plain_logits.view(np.uint32))
    for name in plain_cache:
        assert np.array_equal(np.asarray(fused_cache[name]).view(np.uint8), np.asarray(plain_cache[name]).view(np.uint8))
    assert fused_ropes == 0 and plain_ropes > 0


def test_the_fused_rope_in_a_batched_mix_gives_the_unfused_bits(tiny_files, monkeypatch):
    """Several requests stepped together (each part through kv_write_parts / attention_parts
    with rope=True, counted) and adaptive depth (its skipped iterations' slots re-written from
    the kept, rotated keys): every request's tokens the same fused and unfused, and batched as
    alone."""
    from test_batching import outcome, run_mix
    fused_parts = []
    original = CudaBackend.kv_write_parts

    def counting(self, keys, values, parts, holder, rope=False):
        if rope and len(parts) > 1:
            fused_parts.append(len(parts))
        return original(self, keys, values, parts, holder, rope)
    monkeypatch.setattr(CudaBackend, "kv_write_parts", counting)
    results = {}
    for fused in (True, False):
        backend = cuda_backend()
        backend.fuses_rope = fused
        model = load_model(tiny_files["tiny-looped"], backend).model
        rng = np.random.default_rng(3)
        requests = [GenerationRequest([int(t) for t in rng.integers(3, 200, 7)], max_tokens=4, loops="auto",
                                      exit_threshold=threshold, ignore_eos=True) for threshold in (1.0, 0.05)]
        requests.append(GenerationRequest([int(t) for t in rng.integers(3, 200, 9)], max_tokens=4, loops=3,
                                          ignore_eos=True))
        alone = [outcome(generate(model, r, prefill_chunk=32)) for r in requests]
        together = run_mix(model, requests, None, np.random.default_rng(1), [0, 0, 1], 32)
        assert together == alone
        results[fused] = together
    assert results[True] == results[False]
    assert fused_parts, "no batched step took the fused path"


@pytest.mark.exactness
def test_tree_verify_equals_sequential_decode_on_tensor_core_rows(tiny_files):
    """A random draft tree verified in one forward through linear_mma_int4: every node's logits
    and cache rows equal a sequential decode of its path, bit for bit."""
    model, counts = mma_rows_model(tiny_files["tiny-looped int4 g32"])
    check_tree_against_paths(model, np.random.default_rng(3100), model.config, "fp16", 0, max_plain_prompt=40)
    assert counts.get("linear_mma_int4", 0) > 0, counts


def test_tensor_core_rows_follow_the_cpu_backend(tiny_files):
    """Logits of decode steps with the exact path on tensor cores: within what rounding the
    activations and weights to half allows (1e-2 of the largest logit) of the NumPy reference
    backend's, the same greedy tokens; and not the float32 rows kernels' bits."""
    path = tiny_files["tiny-looped int4 g32"]
    cpu = load_model(path, NumpyBackend()).model
    mma, counts = mma_rows_model(path)
    rows32 = load_model(path, cuda_backend()).model
    prompt = [5, 17, 42, 9, 3, 88, 120, 7]
    loops = cpu.config.default_loops
    logits = []
    for model in (cpu, mma, rows32):
        cache = model.new_cache(len(prompt) + 3, loops)
        prefill(model, prompt, cache, loops)
        token, rows = 11, []
        for position in range(len(prompt), len(prompt) + 3):
            rows.append(model.backend.to_host(model.forward([token], [position], cache, loops))[0])
            token = int(np.argmax(rows[-1]))
        logits.append(np.stack(rows))
    want, got, fp32 = logits
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max(), np.abs(got - want).max()
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))
    assert not np.array_equal(got, fp32) and counts.get("linear_mma_int4", 0) > 0


@pytest.mark.parametrize("case", [pytest.param(c, marks=SLOW_ON_THE_HARNESS) if c != 2 else c for c in range(5)])
def test_tree_verify_equals_sequential_decode_on_cuda(tmp_path, case):
    """Every node of a random draft tree: verify logits and stored cache rows equal a
    sequential decode of its path, bit for bit (each KV mode once; windows and wrapped rings)."""
    rng = np.random.default_rng(3000 + case)
    config = random_config(rng, 512)
    mode, window = MODES[case], int(rng.choice([0, 20, 70]))
    path = write_model_file(tmp_path / "m.tinyloop", config, random_weights(config, case), train_tokenizer().to_str())
    model = load_model(path, cuda_backend("reverse" if case % 2 else "id"), kv_mode=mode).model
    check_tree_against_paths(model, rng, config, mode, window, max_plain_prompt=100)


@pytest.mark.parametrize("preset,mode,window,prompt_len,steps", [
    ("tiny-looped", "fp16", 64, 150, 110),                      # a ring buffer's wrap
    ("tiny-looped", "fp16", 0, 250, 12),                        # 256: a 64-key block edge and a chunk edge
    ("tiny-looped-gpt", "fp16", 0, 4, 5),                       # learned positions: the step's positions input
    pytest.param("tiny-looped", "int4-h", 64, 150, 110, marks=SLOW_ON_THE_HARNESS)])
def test_a_replayed_decode_step_equals_the_plain_forward(tiny_files, preset, mode, window, prompt_len, steps):
    """Graph-captured decode (graphs.py): the first step warms up, the second is captured
    with its token and position frozen, later steps replay it with new values in the step's
    device inputs. Every step's logits equal a plain forward's bit for bit, across a ring
    buffer's wrap, and without a window across position 256 (a 64-key block edge, and a chunk
    edge of attention at S = 1 and at S = 4), so nothing the kernels read comes from the frozen host
    values; on a learned-position model the position embedding reads the step's positions
    input (it once read the token ids). (On the CPU a replay re-runs the step;
    scripts/gpu_check.sh runs it on a GPU, where it is a real graph replay.)"""
    captured = load_model(tiny_files[preset], cuda_backend(graphs=True), kv_mode=mode).model
    plain = load_model(tiny_files[preset], cuda_backend(graphs=False), kv_mode=mode).model
    loops, prompt = 2, [int(t) for t in np.random.default_rng(5).integers(3, 500, prompt_len)]
    caches = [m.new_cache(len(prompt) + steps + 10, loops, window=window) for m in (captured, plain)]
    for model, cache in zip((captured, plain), caches):
        prefill(model, prompt, cache, loops)
    token, runner = 11, captured.backend.decode_runner(captured, caches[0], loops)
    for position in range(len(prompt), len(prompt) + steps):
        ours = captured.backend.to_host(captured.decode(token, position, caches[0], loops))
        theirs = plain.backend.to_host(plain.forward([token], [position], caches[1], loops))
        assert np.array_equal(ours, theirs), position
        token = int(np.argmax(theirs))
    assert (caches[0].ring is not None) == bool(window) and runner.steps == steps and runner.replay is not None
    assert captured.backend.decode_runner(captured, caches[0], loops) is runner
    assert plain.backend.decode_runner(plain, caches[1], loops) is None


def test_a_replayed_multi_row_forward_equals_the_plain_forward(tiny_files):
    """graphs.ForwardGraph (what scripts/bench_gpu.py times a 16-row step with): captured once
    with its rows frozen, replayed at later positions, crossing the 256-key mark (a chunk edge at S = 1 and 4);
    every replay's logits equal a plain forward's bit for bit."""
    from tinyloop.backends.cuda.graphs import ForwardGraph
    captured = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=True)).model
    plain = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=False)).model
    loops, n_rows, prompt = 2, 4, [int(t) for t in np.random.default_rng(6).integers(3, 500, 240)]
    caches = [m.new_cache(len(prompt) + 40, loops) for m in (captured, plain)]
    for model, cache in zip((captured, plain), caches):
        prefill(model, prompt, cache, loops)
    graph = ForwardGraph(captured.backend, captured, caches[0], loops, n_rows)
    rng = np.random.default_rng(9)
    for start in range(len(prompt), len(prompt) + 32, n_rows):
        tokens, positions = [int(t) for t in rng.integers(3, 500, n_rows)], list(range(start, start + n_rows))
        ours = captured.backend.to_host(graph(tokens, positions))
        theirs = plain.backend.to_host(plain.forward(tokens, positions, caches[1], loops))
        assert np.array_equal(ours, theirs), start
    assert graph.steps == 8 and graph.replay is not None
    with pytest.raises(ValueError, match="4 rows"):
        graph([1], [300])


@pytest.mark.parametrize("branches,window", [(1, 0), pytest.param(3, 64, marks=SLOW_ON_THE_HARNESS)])
def test_replayed_verify_passes_equal_plain_generation(tiny_files, branches, window):
    """Graph-captured verify passes (graphs.py VerifyGraph, one per node count): greedy
    speculative decoding with the decode step and every verify pass captured and replayed
    equals plain generation token for token, a chain and a 3-branch tree, with a ring
    buffer wrapping under the tree's paths. The first verify of a size warms up, the second
    is captured with its positions and tree frozen in the step; later rounds replay it with
    the new round's values in device buffers, so a value taken from the host would be stale."""
    captured = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=True)).model
    plain = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=False)).model
    prompt = [int(t) for t in np.random.default_rng(8 + branches).integers(3, 500, 40)]
    request = GenerationRequest(prompt, 64, ignore_eos=True, cache_window=window)    # base crosses block 1
    params = SpeculativeParams(1, 3, 3, branches)
    expected = generate(plain, replace(request, loops=3)).tokens
    got = speculative_generate(captured, request, params).tokens
    assert got == expected
    graphs = list(captured.backend._verify_graphs.values())
    replayed = [g for g in graphs if g.replay is not None and g.steps >= 4]
    assert replayed and all(g.tree == (branches > 1) for g in replayed), [(g.n_rows, g.tree, g.steps) for g in graphs]


class ArgmaxSpy:
    """The sampling module with argmax_rows launches counted: those outside a capture or replay
    (the harness's capturing flag) are the ones a greedy step launches after its graph."""

    def __init__(self, backend):
        self.outside, self.device, self.top_k = 0, backend.device, 0
        original = backend._module

        def module(name):
            real = original(name)
            return self._wrapped(real) if name == "sampling" else real
        backend._module = module

    def _wrapped(self, real):
        spy = self

        class Module:
            def get_function(self, name):
                fn = real.get_function(name)
                if name == "top_k_rows":
                    def counted(*args, **kwargs):
                        spy.top_k += 1
                        return fn(*args, **kwargs)
                    return counted
                if name != "argmax_rows":
                    return fn

                def launch(*args, **kwargs):
                    spy.outside += not spy.capturing()
                    return fn(*args, **kwargs)
                return launch
        return Module()

    def capturing(self) -> bool:
        """Inside a capture (or, on the harness, a replay, which re-runs the step): a GPU's
        replay launches nothing from Python, so only its capture counts there."""
        if hasattr(self.device, "capturing"):
            return self.device.capturing
        return self.device.xp.cuda.get_current_stream().is_capturing()

    def argmax(self, backend, logits):
        """-> (ids, launches outside a graph it took)."""
        before = self.outside
        ids = backend.argmax(logits)
        return ids, self.outside - before


def test_a_replayed_graph_brings_its_greedy_ids_along(tiny_files):
    """Every captured graph runs argmax_rows after its head (graphs.py GraphArgmax): after a
    replay, backend.argmax of the logits the graph handed out launches nothing and gives those
    logits' argmax; the warm-up step's logits, a copy, or logits of an earlier step another graph
    has replayed since still launch their own. Decode, batch decode and verify graphs."""
    from tinyloop.model.batch import run_passes
    from test_cuda_batch import decode_pass, started
    from tinyloop.kv.pool import KVPool
    backend = cuda_backend(graphs=True)
    spy = ArgmaxSpy(backend)
    model = load_model(tiny_files["tiny-looped"], backend).model
    loops, prompt = 2, [int(t) for t in np.random.default_rng(3).integers(3, 500, 30)]
    cache = model.new_cache(len(prompt) + 16, loops)
    token = int(np.argmax(backend.to_host(prefill(model, prompt, cache, loops))[0]))
    for step in range(4):                                   # warm-up, capture, replays
        logits = model.decode(token, len(prompt) + step, cache, loops)
        ids, launches = spy.argmax(backend, logits)
        assert list(ids) == [int(np.argmax(backend.to_host(logits)[0]))]
        assert launches == (1 if step == 0 else 0), (step, launches)
        assert spy.argmax(backend, logits.copy())[1] == 1
        token = int(ids[0])
    # a batch graph of three requests: each row's ids, then the decode graph's logits are stale
    pool = KVPool.for_model(model, 32 << 20)
    caches, tokens = started(model, [prompt[:9], prompt[:20], prompt], loops, pool, capacity=60)
    positions = [9, 20, 30]
    for step in range(4):
        passes = [decode_pass(model, c, t, p + step, loops) for c, t, p in zip(caches, tokens, positions)]
        run_passes(model, passes)
        for i, p in enumerate(passes):
            ids, launches = spy.argmax(backend, p.logits)
            assert list(ids) == [int(np.argmax(backend.to_host(p.logits)[0]))], (step, i)
            assert launches == (1 if step == 0 else 0), (step, i, launches)
            tokens[i] = int(ids[0])
    assert spy.argmax(backend, logits)[1] == 1               # the decode graph's, from before the batch
    # verify graphs: greedy speculation replays them; the last one's logits carry their ids
    request = GenerationRequest(prompt, 24, ignore_eos=True)
    speculative_generate(model, request, SpeculativeParams(1, 2, 3, 2))
    assert max(g.steps for g in backend._verify_graphs.values()) >= 3
    last = [g for g in backend._verify_graphs.values()
            if g.replay is not None and backend.graph_argmax.lookup(g.logits) is not None]
    assert len(last) == 1                                    # the last round's verify graph
    ids, launches = spy.argmax(backend, last[0].logits)
    assert launches == 0 and np.array_equal(ids, backend.to_host(last[0].logits).argmax(axis=1))


@pytest.mark.parametrize("branches,window", [(1, 0), pytest.param(2, 0, marks=SLOW_ON_THE_HARNESS),
                                             pytest.param(3, 64, marks=SLOW_ON_THE_HARNESS)])
def test_replayed_draft_levels_equal_the_eager_ones(tiny_files, branches, window):
    """Graph-captured draft levels (graphs.py DraftGraph, one per node count, chain or tree, and
    the round's last level, which only writes the draft coda's rows and has no head): every
    level's logits and the states it hands the verify equal the eager draft's bit for bit,
    level after level over a whole greedy speculative generation (a draft graph that drafted
    other tokens would still give plain generation's tokens, so the levels themselves are
    compared), and a chain's levels, which replay one graph, keep each level's states apart."""
    from tinyloop.model.transformer import LoopedTransformer
    levels = {True: [], False: []}
    original = LoopedTransformer.draft

    def recording(self, *args):
        logits, trunk = original(self, *args)
        levels[self.backend.graphs].append((None if logits is None else self.backend.to_host(logits),
                                            self.backend.to_host(trunk.hidden),
                                            self.backend.to_host(trunk.injected), trunk, self.backend))
        return logits, trunk
    LoopedTransformer.draft = recording
    try:
        prompt = [int(t) for t in np.random.default_rng(4 + branches).integers(3, 500, 40)]
        request = GenerationRequest(prompt, 40, ignore_eos=True, cache_window=window)
        params = SpeculativeParams(1, 3, 3, branches)
        tokens = {}
        for graphs in (True, False):
            backend = cuda_backend(graphs=graphs)
            spy = ArgmaxSpy(backend)
            model = load_model(tiny_files["tiny-looped"], backend).model
            tokens[graphs] = speculative_generate(model, request, params).tokens
            if graphs:
                drafts, graph_spy = list(model.backend._draft_graphs.values()), spy
    finally:
        LoopedTransformer.draft = original
    assert tokens[True] == tokens[False]
    assert len(levels[True]) == len(levels[False]) > 6
    for i, (ours, theirs) in enumerate(zip(levels[True], levels[False])):
        assert (ours[0] is None) == (theirs[0] is None), i        # the round's last level has no head
        for a, b in zip(ours[:3], theirs[:3]):
            assert a is None or np.array_equal(a.view(np.uint32), b.view(np.uint32)), i
    # the states handed out earlier are unchanged by later replays (they are copies)
    for ours, _ in zip(levels[True], levels[False]):
        assert np.array_equal(ours[4].to_host(ours[3].hidden).view(np.uint32), ours[1].view(np.uint32))
    for head in (True, False):          # the levels the draft runs, and the round's last one
        assert any(g.replay is not None and g.steps >= 4 for g in drafts if g.head == head), \
            [(g.n_rows, g.tree, g.head, g.steps) for g in drafts]
    assert all(g.tree == (branches > 1) for g in drafts if g.n_rows > 1)
    if branches == 1:       # a chain's next node is the draft's argmax, which its graph brought along
        assert graph_spy.top_k == 0
        # argmax launched outside a graph: the prefill's token and each graph's first (eager)
        # step, not a draft level's or a verify's replay (41 levels here)
        assert graph_spy.outside < 10 < len(levels[True]), (graph_spy.outside, len(levels[True]))


@pytest.mark.parametrize("graphs", [False, True])
def test_a_draft_rest_pass_writes_what_a_plain_forward_writes(tiny_files, graphs):
    """The round's last level (a pass of tokens through d iterations whose coda only writes its
    cache rows: Pass.is_draft_rest, model.draft without the head; a replayed graph from its second
    step) against the spec's oracle, a plain forward at d loops on a cache of its own: with the
    side coda at the plain forward's coda slots, every slot's stored row is the same bits, and so
    are the states after the d iterations (the forward's hidden before its coda is not exposed,
    so the states are compared with model.trunk's)."""
    from tinyloop.model.batch import Pass, run_passes
    model = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=graphs)).model
    backend, d, loops = model.backend, 1, 3
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, 500, 20)]
    caches = [model.new_cache(40, loops) for _ in range(3)]
    for cache in caches:
        prefill(model, prompt, cache, loops)
    for step, token in enumerate((7, 99, 23, 5)):
        position = len(prompt) + step
        rest = Pass(caches[0], np.array([position]), position, d, tokens=[token], side=(d, model.coda_base(d)))
        run_passes(model, [rest])
        model.forward([token], [position], caches[1], d)
        for name, ours in backend.kv_stored(caches[0].storage, [position]).items():
            theirs = backend.kv_stored(caches[1].storage, [position])[name]
            assert np.array_equal(ours.view(np.uint8), theirs.view(np.uint8)), (step, name)
        plan = model.plan(np.array([position]), position, caches[2])
        trunk = model.resume(model.trunk([token], plan, caches[2], 0), plan, caches[2], d)
        assert np.array_equal(backend.to_host(rest.trunk_out.hidden), backend.to_host(trunk.hidden)), step
        assert rest.logits is None and rest.iterations_run == d
    if graphs:
        assert any(not g.head and g.replay is not None for g in backend._draft_graphs.values())


def test_the_device_orders_its_streams_without_waiting_on_the_host():
    """CupyDevice's stream order, with a stand-in for CuPy that records it: an upload or a copy
    into a graph's inputs runs on the graph stream after the work queued on the current stream
    and before whatever the current stream runs next; a replay likewise, without a host wait
    (the greedy ids' copy to the host is the step's one wait)."""
    from types import SimpleNamespace
    from tinyloop.backends.cuda.device import CupyDevice
    log = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def record(self):
            log.append(("record", self.name))
            return self.name

        def wait_event(self, event):
            log.append(("wait", self.name, event))

        def synchronize(self):
            log.append(("host waits", self.name))

        def __enter__(self):
            fake.current.append(self)

        def __exit__(self, *exc):
            fake.current.pop()

        def begin_capture(self):
            pass

        def end_capture(self):
            return SimpleNamespace(launch=lambda stream: log.append(("replay", stream.name)))

    class Buffer:
        def set(self, values):
            log.append(("copy", fake.current[-1].name))

        def __setitem__(self, key, value):
            log.append(("copy", fake.current[-1].name))

    fake = SimpleNamespace(current=[Stream("current")])
    fake.cuda = SimpleNamespace(Stream=lambda non_blocking: Stream("graph"),
                                get_current_stream=lambda: fake.current[-1],
                                using_allocator=lambda allocator: contextlib.nullcontext(),
                                Memory=lambda n: SimpleNamespace(size=n))
    device = object.__new__(CupyDevice)
    device.xp, device._modules, device._stream = fake, {}, None
    device.upload_ints(Buffer(), [1, 2])
    assert log == [("record", "current"), ("wait", "graph", "current"), ("copy", "graph"),
                   ("record", "graph"), ("wait", "current", "graph")]
    log.clear()
    device.copy_into(Buffer(), None)
    assert log == [("record", "current"), ("wait", "graph", "current"), ("copy", "graph"),
                   ("record", "graph"), ("wait", "current", "graph")]
    replay, _ = device.capture(lambda: None, 0)
    log.clear()
    replay()
    assert log == [("record", "current"), ("wait", "graph", "current"), ("replay", "graph"),
                   ("record", "graph"), ("wait", "current", "graph")]


def test_tail_rows_bound_covers_every_tree_and_is_tight():
    """A captured tree verify pads its path rows to tail_rows_bound(T): every T-node tree's
    tail fits (the deepest tree, a chain of T nodes, at every base offset in a block), and
    some base needs all of it."""
    from tinyloop.backends.cuda.graphs import tail_rows_bound
    from tinyloop.model.plan import Geometry, TreeRows, build_plan
    for n_nodes in (1, 2, 3, 17, 64, 65):
        widths = []
        for base in range(0, 130):
            positions = base + np.arange(n_nodes)
            path_rows = np.tril(base + np.arange(n_nodes)[None, :].repeat(n_nodes, 0))      # node i: base..base+i
            plan = build_plan(positions, base, Geometry(512, None, 0), tree=TreeRows(base, path_rows))
            widths.append(plan.attention.n_tail * 64)
        assert max(widths) == tail_rows_bound(n_nodes), (n_nodes, max(widths))


def test_the_fused_gelu_gives_the_unfused_models_bits(tiny_files, monkeypatch):
    """A GELU model's up projection with the activation in its epilogue (CudaBackend.linear_gelu)
    gives the logits of the separate linear and gelu_tanh launches (the base backend's
    linear_gelu), bit for bit, through prefill (bulk) and decode (rows)."""
    from tinyloop.backends.base import Backend
    results = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(CudaBackend, "linear_gelu", Backend.linear_gelu)
        model = load_model(tiny_files["tiny-looped-gpt"], cuda_backend()).model
        assert model.config.mlp == "gelu"
        prompt, loops = [5, 17, 42, 9, 3, 88, 120, 7, 64, 31, 2, 200] * 3, model.config.default_loops
        cache = model.new_cache(len(prompt) + 4, loops)
        rows = [model.backend.to_host(prefill(model, prompt, cache, loops))]
        for position in range(len(prompt), len(prompt) + 3):
            rows.append(model.backend.to_host(model.forward([7], [position], cache, loops)))
        results.append(np.concatenate(rows))
    assert np.array_equal(results[0].view(np.uint32), results[1].view(np.uint32))


class ToggleClock:
    """A stub of bench_gpu's EventClock for the on/off stages: records the backend's `attribute` at
    each timing and answers on_s or off_s by it. (The harness's replay re-runs Python, which needs
    the runner's inputs: the stub only records.)"""

    def __init__(self, backend, attribute: str, on_s: float, off_s: float):
        self.backend, self.attribute, self.on_s, self.off_s, self.seen = backend, attribute, on_s, off_s, []

    def replays(self, replay, n):
        on = getattr(self.backend, self.attribute)
        self.seen.append(on)
        return self.on_s if on else self.off_s


def test_bench_gpu_times_the_decode_step_with_the_kv_write_folded_and_apart(tiny_files):
    """scripts/bench_gpu.py's kv_fold stage times the decode graph with the KV write folded, then
    as a launch of its own, compares the two steps' bits and leaves the fold on."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_gpu
    backend = cuda_backend(graphs=True)
    model = load_model(tiny_files["tiny-looped"], backend).model
    clock = ToggleClock(backend, "fuses_kv_write", 2e-6, 4e-6)
    figures = bench_gpu.kv_fold_figures(clock, model, 2, 70, 1)
    assert clock.seen == [True, False]
    assert figures["same_bits"] is True and figures["folded_over_apart"] == 0.5
    assert backend.fuses_kv_write is True


def test_bench_gpu_times_the_decode_step_with_the_pair_and_without(tiny_files, monkeypatch):
    """scripts/bench_gpu.py's pair stage (toggled_figures on fuses_pair) times the decode graph with
    the out and up projections as one launch, then as two, compares the two steps' bits and
    leaves the attribute as TINYLOOP_CUDA_PAIR set it (off by default; on with 1)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_gpu
    assert cuda_backend().fuses_pair is False
    monkeypatch.setenv("TINYLOOP_CUDA_PAIR", "1")
    backend = cuda_backend(graphs=True)
    assert backend.fuses_pair is True
    model = load_model(tiny_files["tiny-looped int4"], backend).model
    clock = ToggleClock(backend, "fuses_pair", 3e-6, 4e-6)
    figures = bench_gpu.toggled_figures(clock, model, "fuses_pair", 2, 70, 1)
    assert clock.seen == [True, False]
    assert figures["same_bits"] is True and figures["on_over_off"] == 0.75
    assert backend.fuses_pair is True


def test_bench_gpu_times_the_decode_step_with_dependent_launch_and_without(tiny_files):
    """scripts/bench_gpu.py's dependent_launch stage times the decode graph of two copies of one
    model (on a GPU: one device launching plainly, one with programmatic dependent launch) side by
    side, and compares their steps' bits; a copy that computes other bits is reported as such."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_gpu
    models = [load_model(tiny_files[p], cuda_backend(graphs=True)).model for p in ("tiny-looped", "tiny-looped")]

    class Clock:
        def __init__(self):
            self.replayed = []

        def replays(self, replay, n):
            self.replayed.append(replay)
            return 3e-6 if len(self.replayed) == 1 else 2e-6
    clock = Clock()
    figures = bench_gpu.dependent_launch_figures(clock, *models, 2, 70, 1)
    assert len(set(map(id, clock.replayed))) == 2
    assert figures["same_bits"] is True and figures["dependent_over_plain"] == pytest.approx(2 / 3)
    other = load_model(tiny_files["tiny-looped-gpt"], cuda_backend(graphs=True)).model
    assert bench_gpu.dependent_launch_figures(Clock(), models[0], other, 2, 70, 1)["same_bits"] is False


def test_bench_gpu_times_a_quantized_kv_caches_step_and_attentions_share(tiny_files):
    """scripts/bench_gpu.py's kv_modes stage: the decode graph of a model loaded with an int4 KV
    cache replayed, and one eager step of it run through the per-kernel table, attention's share
    being the attention kernels' time over the sum (a stub clock: 1 of 4 us)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_gpu
    model = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=True), kv_mode="int4").model
    stepped = []

    class Clock:
        def replays(self, replay, n):
            return 2e-6

        def kernel_table(self, backend, step):
            stepped.append(backend.to_host(step()))
            return [{"kernel": "linear_rows_int4", "grid": [4, 1, 1], "calls": 6, "total_us": 3.0},
                    {"kernel": "attention_int4", "grid": [1, 2, 2], "calls": 2, "total_us": 1.0}]

    class Cupy:                                  # what the stage asks of CuPy: a device sync
        class cuda:
            class Device:
                def synchronize(self):
                    pass
    figures = bench_gpu.kv_mode_figures(Cupy, Clock(), model, 2, 70, 1)
    assert figures["kv_mode"] == "int4" and figures["decode_graph_us"] == pytest.approx(2.0)
    assert figures["attention_share"] == pytest.approx(0.25) and figures["launches"] == 8
    assert len(stepped) == 1 and np.all(np.isfinite(stepped[0]))
    assert model.backend.graphs is True                     # left as the engine runs
    # the contexts stage takes its eager table the same way, after its replays
    plain = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=True)).model
    figures = bench_gpu.context_figures(Cupy, Clock(), plain, 2, 70, 1, 1)
    assert figures["attention_share"] == pytest.approx(0.25) and figures["verify16_over_decode"] == 1.0
    assert len(stepped) == 2 and plain.backend.graphs is True


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU: programmatic dependent launch overlaps grids only on a device")
@pytest.mark.parametrize("graphs", [False, True])
def test_dependent_launch_gives_the_plain_launches_bits(tiny_files, graphs):
    """TINYLOOP_CUDA_PDL's launches (every kernel through cuLaunchKernelEx with programmatic
    stream serialization) give the plain launches' bits: decode steps eager or replayed as graphs,
    then a 5-row forward after them, across the 256-key mark."""
    from tinyloop.backends.cuda.device import CupyDevice
    devices = [CupyDevice(dependent_launch=False), CupyDevice(dependent_launch=True)]
    if not devices[1].dependent_launch:
        pytest.skip("needs an sm_90 GPU: programmatic dependent launch starts there")
    models = [load_model(tiny_files["tiny-looped"], CudaBackend(d, graphs), kv_mode="fp16").model for d in devices]
    loops, prompt = 2, [int(t) for t in np.random.default_rng(9).integers(3, 500, 250)]
    caches = [m.new_cache(400, loops) for m in models]
    seen = [[], []]
    for i, (model, cache) in enumerate(zip(models, caches)):
        seen[i].append(model.backend.to_host(prefill(model, prompt, cache, loops)))
        token = 11
        for position in range(len(prompt), len(prompt) + 12):
            seen[i].append(model.backend.to_host(model.decode(token, position, cache, loops)))
            token = int(np.argmax(seen[i][-1][-1]))
        rows = list(range(position + 1, position + 6))                 # right after the decoded ones
        seen[i].append(model.backend.to_host(model.forward([3, 4, 5, 6, 7], rows, cache, loops)))
    for ours, theirs in zip(*seen):
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_bench_gpu_times_the_rows_linear_with_and_without_the_column_cap(tiny_files):
    """scripts/bench_gpu.py's linear stage times each decode linear on the capped grid (the
    backend's column_block_cap, which the harness device sets to 3) and again uncapped, side by
    side, and leaves the cap as it found it; the grids really differ (the launches are counted)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_gpu
    model = load_model(tiny_files["tiny-looped"], cuda_backend()).model
    backend = model.backend
    grids = []
    module = backend._module("linear")
    real = module.get_function

    def counting(name):
        fn = real(name)
        return (lambda grid, block, args, **kw: (grids.append((name, grid[0])), fn(grid, block, args, **kw))) \
            if name.startswith("linear_rows") else fn

    class Clock:
        def captured_calls(self, call, calls):
            call()
            return 2e-6 if backend.column_block_cap else 3e-6

        def eager_calls(self, call, calls):
            return 4e-6
    module.get_function = counting
    try:
        figures = bench_gpu.linear_figures(np, Clock(), backend, model.weights.layers["core"][0], 1, 2)
    finally:
        module.get_function = real
    assert backend.column_block_cap == 3
    for name in ("qkv", "out", "up", "down"):
        assert figures[name]["graph_us"] == 2.0 and figures[name]["uncapped_graph_us"] == 3.0
        assert figures[name]["column_block_cap"] == 3
    columns = model.weights.layers["core"][0].up.out_features
    assert ("linear_rows_" + model.weights.layers["core"][0].up.segments[0].kernel, min(3, -(-columns // 8))) in grids
    assert ("linear_rows_" + model.weights.layers["core"][0].up.segments[0].kernel, -(-columns // 8)) in grids



def fold_on_and_off(tiny_files, preset, attribute, activations="fp32", graphs=False, kv_mode=None, mma_rows=False):
    """The same model file on two CUDA backends, the fold `attribute` on, then off: each runs a
    prefill, three decode steps and a 5-row verify-shaped forward (mma_rows: on the tensor-core
    rows). -> [(logits of all of them, launches by kernel during the three decode steps, the KV
    pool's bytes) for on, for off]."""
    runs = []
    for on in (True, False):
        backend = cuda_backend(activations=activations, graphs=graphs, mma_rows=mma_rows)
        setattr(backend, attribute, on)
        counts, original = {}, backend._module
        backend._module = lambda name, original=original, counts=counts: LaunchCounter(original(name), counts)
        model = load_model(tiny_files[preset], backend, **({"kv_mode": kv_mode} if kv_mode else {})).model
        loops = model.config.default_loops
        prompt = [5, 17, 42, 9, 3, 88, 120, 7, 64, 31, 2, 200] * 3
        cache = model.new_cache(len(prompt) + 12, loops)
        rows = [backend.to_host(prefill(model, prompt, cache, loops))]
        before = dict(counts)
        for position in range(len(prompt), len(prompt) + 3):
            rows.append(backend.to_host(model.forward([7], [position], cache, loops)))
        decode = {k: v - before.get(k, 0) for k, v in counts.items() if v != before.get(k, 0)}
        start = len(prompt) + 3
        rows.append(backend.to_host(model.forward([7, 8, 9, 10, 11], list(range(start, start + 5)), cache, loops)))
        pool = [backend.to_host(a).view(np.uint8).copy() for a in cache.storage.pool.arrays()]
        runs.append((np.concatenate(rows), decode, pool))
    return runs


def same_bits(a, b) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.exactness
@pytest.mark.parametrize("preset,activations", [("tiny-looped", "fp32"), ("tiny-looped-gpt", "fp32"),
                                                ("tiny-looped int4", "fp16"), ("tiny-looped-gpt int4", "fp16")])
def test_the_fused_norm_gives_the_unfused_models_bits(tiny_files, preset, activations):
    """Norms inside the exact linears (fuses_norm, the default: the rows kernels stage norm(h))
    against the norm kernel then the linear (the attribute off on one backend): the same logits
    bit for bit for a prefill, three decode steps and a 5-row verify-shaped forward, on an RMS
    and SwiGLU model and a layer-norm (with bias) and GELU one, float and half activations. The
    fused decode step launches no norm kernel at all (the final norm rides on the head)."""
    (fused, fused_launches, _), (apart, apart_launches, _) = fold_on_and_off(tiny_files, preset, "fuses_norm",
                                                                             activations)
    assert same_bits(fused, apart)
    norms = [sum(launches.get(k, 0) for k in ("rms_norm", "layer_norm")) for launches in (fused_launches, apart_launches)]
    assert norms[0] == 0 and norms[1] > 0, norms


@pytest.mark.exactness
@pytest.mark.parametrize("preset,activations,graphs", [("tiny-looped int4 g32", "fp32", False),
                                                       ("tiny-looped-gpt int4 g32", "fp16", True)])
def test_the_folded_norm_on_tensor_core_rows_gives_the_unfolded_models_bits(tiny_files, preset, activations, graphs):
    """TINYLOOP_CUDA_MMA_ROWS with the norms inside linear_mma (fuses_norm on) against the norm
    kernel then linear_mma (off): the same logits bit for bit for a prefill, three decode steps
    and a 5-row verify-shaped forward, RMS/SwiGLU and layer-norm/GELU, float and half
    activations, eager and as captured graphs. The folded decode step launches no norm kernel
    and its linears are linear_mma's."""
    (fused, fused_launches, _), (apart, apart_launches, _) = fold_on_and_off(tiny_files, preset, "fuses_norm",
                                                                             activations, graphs, mma_rows=True)
    assert same_bits(fused, apart)
    norms = [sum(launches.get(k, 0) for k in ("rms_norm", "layer_norm")) for launches in (fused_launches, apart_launches)]
    assert norms[0] == 0 and norms[1] > 0, norms
    assert fused_launches.get("linear_mma_int4", 0) > 0, fused_launches


def test_tensor_core_rows_fold_the_norm_into_calls_of_at_most_four_rows(tiny_files):
    """On the tensor-core rows the pre-norm rides on linear_mma for up to MMA_NORM_FOLD_MAX_ROWS
    (4) rows: a 4-row forward launches no norm kernel, a 5-row one runs the norm kernel first
    (past 4 rows the fold costs more than the launch, on paper), with each row's bits the same
    either way: the 5-row forward's first four rows equal the 4-row forward's."""
    from tinyloop.backends.cuda.launch.linear import MMA_NORM_FOLD_MAX_ROWS
    assert MMA_NORM_FOLD_MAX_ROWS == 4
    results = []
    for width in (4, 5):
        model, counts = mma_rows_model(tiny_files["tiny-looped-gpt int4 g32"])
        loops = model.config.default_loops
        prompt = [5, 17, 42, 9, 3, 88, 120, 7]
        cache = model.new_cache(len(prompt) + 8, loops)
        prefill(model, prompt, cache, loops)
        before = dict(counts)
        logits = model.backend.to_host(model.forward(list(range(10, 10 + width)),
                                                     list(range(len(prompt), len(prompt) + width)), cache, loops))
        launched = {k: v - before.get(k, 0) for k, v in counts.items() if v != before.get(k, 0)}
        assert launched.get("linear_mma_int4", 0) > 0, launched
        results.append((logits, launched.get("layer_norm", 0)))
    (four, four_norms), (five, five_norms) = results
    assert four_norms == 0 and five_norms > 0, (four_norms, five_norms)
    assert same_bits(four, five[:4])


@pytest.mark.exactness
@pytest.mark.parametrize("preset,activations,graphs", [("tiny-looped", "fp32", False), ("tiny-looped int4", "fp16", True)])
def test_the_fused_swiglu_gives_the_unfused_models_bits(tiny_files, preset, activations, graphs):
    """SwiGLU inside the exact down projection (fuses_swiglu, the default: the rows kernels stage
    swiglu(up)) against the swiglu kernel then the linear (the attribute off on one backend): the
    same logits bit for bit for a prefill (bulk: the swiglu keeps its launch), three decode steps
    and a 5-row verify-shaped forward, float and half activations, eager and as captured graphs.
    A fused decode step launches no swiglu at all."""
    (fused, fused_launches, _), (apart, apart_launches, _) = fold_on_and_off(tiny_files, preset, "fuses_swiglu",
                                                                             activations, graphs)
    assert same_bits(fused, apart)
    assert fused_launches.get("swiglu", 0) == 0 and apart_launches.get("swiglu", 0) > 0


@pytest.mark.exactness
@pytest.mark.parametrize("preset,activations,graphs", [("tiny-looped int4", "fp32", False),
                                                       ("tiny-looped-gpt int4", "fp16", True)])
def test_the_paired_out_and_up_projections_give_the_unpaired_models_bits(tiny_files, preset, activations, graphs):
    """The out projection's residual add and the MLP's norm-linear in one launch (fuses_pair on:
    linear_rows_pair_int4, the second call's blocks waiting for the first's) against the
    two launches (the attribute off on one backend): the same logits bit for bit for a prefill
    (bulk: two launches), three decode steps and a 5-row verify-shaped forward, on an RMS/SwiGLU
    and a layer-norm/GELU model, float and half activations, eager and as captured graphs. A
    paired decode step makes one pair launch a layer instance, and two rows launches fewer."""
    (paired, paired_launches, _), (apart, apart_launches, _) = fold_on_and_off(tiny_files, preset, "fuses_pair",
                                                                               activations, graphs)
    assert same_bits(paired, apart)
    pairs = paired_launches.get("linear_rows_pair_int4", 0)
    assert pairs > 0 and "linear_rows_pair_int4" not in apart_launches, (paired_launches, apart_launches)
    assert apart_launches["linear_rows_int4"] - paired_launches["linear_rows_int4"] == 2 * pairs


@pytest.mark.exactness
@pytest.mark.parametrize("preset,mode,graphs", [("tiny-looped", "fp16", False), ("tiny-looped-gpt", "int4-h", False),
                                                ("tiny-looped int4", "int8", True), ("tiny-looped-gpt", "fp32", True)])
def test_the_folded_kv_write_gives_the_unfolded_models_bits(tiny_files, preset, mode, graphs):
    """The KV write inside the qkv linear (fuses_kv_write, the default: the rows kernels store each
    row once its columns are summed) against the kv_write launch after it (the attribute off on
    one backend): the same logits and the same cache, byte for byte, after a prefill (bulk: the
    write keeps its launch), three decode steps and a 5-row verify-shaped forward, eager and as
    captured graphs, on an RMS/SwiGLU and a layer-norm/GELU model. A folded decode step launches
    no kv_write at all."""
    (folded, folded_launches, folded_pool), (apart, apart_launches, apart_pool) = fold_on_and_off(
        tiny_files, preset, "fuses_kv_write", graphs=graphs, kv_mode=mode)
    assert same_bits(folded, apart)
    for a, b in zip(folded_pool, apart_pool):
        assert np.array_equal(a, b)
    writes = [sum(v for k, v in launches.items() if k.startswith("kv_write_")) for launches in (folded_launches, apart_launches)]
    assert writes[0] == 0 and writes[1] > 0, writes


@pytest.mark.exactness
@pytest.mark.parametrize("preset,mode,graphs", [("tiny-looped-gpt int4 g32", "fp16", False),
                                                ("tiny-looped-gpt int4 g32", "int4-h", True)])
def test_the_folded_kv_write_on_tensor_core_rows_gives_the_unfolded_models_bits(tiny_files, preset, mode, graphs):
    """TINYLOOP_CUDA_MMA_ROWS with the KV write inside linear_mma's qkv call against the kv_write
    launch after it: the same logits and cache bytes after a prefill, three decode steps (the
    norm folded too) and a 5-row forward (the norm kernel first, the KV write still folded),
    eager and as graphs. A folded decode step launches no kv_write, and its qkv is linear_mma's."""
    (folded, folded_launches, folded_pool), (apart, apart_launches, apart_pool) = fold_on_and_off(
        tiny_files, preset, "fuses_kv_write", graphs=graphs, kv_mode=mode, mma_rows=True)
    assert same_bits(folded, apart)
    for a, b in zip(folded_pool, apart_pool):
        assert np.array_equal(a, b)
    writes = [sum(v for k, v in launches.items() if k.startswith("kv_write_")) for launches in (folded_launches, apart_launches)]
    assert writes[0] == 0 and writes[1] > 0, writes
    assert folded_launches.get("linear_mma_int4", 0) > 0 and not folded_launches.get("linear_rows_int4"), folded_launches
