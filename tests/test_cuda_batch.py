"""Several caches in one launch, and batches of decode steps as one replayed graph (the CUDA
backend's batch.py and graphs.py BatchDecodeGraph), on the CPU harness (or a GPU with
TINYLOOP_TEST_DEVICE=cuda).

The oracle is each part run alone: the launchers with one cache's table row, and the model's
plain forward on a cache of its own. Every comparison is bit for bit."""
import types

import numpy as np
import pytest
from test_cuda_attention import bits_equal, kernel
from test_cuda_backend import LaunchCounter, cuda_backend
from test_cuda_kv import F, fused_keys_values

from tinyloop.backends.cuda.batch import stacked_tables
from tinyloop.backends.cuda.graphs import BATCH_BUCKETS
from tinyloop.backends.cuda.launch import attention as attention_launch
from tinyloop.backends.cuda.launch import kv as kv_launch
from tinyloop.backends.reference.twins import attention as twin
from tinyloop.backends.reference.twins import kv as twin_kv
from tinyloop.engine.decode import prefill
from tinyloop.kv.pool import KVPool
from tinyloop.model.batch import Pass, run_passes
from tinyloop.model.loader import load_model

MODES = ["fp16", "fp32", "int8", "int4", "int4-h"]
N_KV, HEAD_DIM = 2, 32


def shared_pool(device, mode, widths, n_slots=3, seed=0):
    """One pool and a table (n_slots, width) per part over disjoint, shuffled blocks of it
    (the null block 0 never handed out): what several caches of one engine look like."""
    rng = np.random.default_rng(seed)
    total = n_slots * sum(widths)
    ids = (rng.permutation(total + 3)[:total] + 1).astype(np.int32)
    tables, start = [], 0
    for width in widths:
        tables.append(ids[start:start + n_slots * width].reshape(n_slots, width))
        start += n_slots * width
    pool = kv_launch.DeviceKV.allocate(mode, N_KV, 64 * (total + 4), HEAD_DIM, types.SimpleNamespace(zeros=device.zeros))

    def view(table):
        def upload(buffer, values):
            buffer[...] = device.asarray(np.asarray(values, np.int32))
        return kv_launch.DeviceView(pool, table, device.zeros(table.shape, np.int32), upload)
    return pool, [view(t) for t in tables]


def token_tables(device, tables, part_slots, token_parts):
    """The stacked table of batch.py and each token's offset: (s P + p) W."""
    n_slots, width = max(t.shape[0] for t in tables), max(t.shape[1] for t in tables)
    stacked = stacked_tables(tables, n_slots, width)
    offsets = (np.asarray(part_slots)[token_parts] * len(tables) + token_parts) * width
    return kv_launch.TokenTables(device.asarray(stacked.reshape(-1)), device.asarray(offsets.astype(np.int32))), width


def pool_bytes(device, pool) -> list:
    return [device.to_host(a).view(np.uint8).copy() for a in pool.arrays()]


@pytest.mark.parametrize("mode", MODES)
def test_one_kv_write_for_several_caches_stores_each_parts_rows(kernel_device, mode):
    """Three caches' tokens, each part at its own slot, written by one launch through the
    stacked tables: the pool afterwards is byte for byte what one launch per part leaves, and
    what the twin stores through each token's own table row. A token's table taken from
    another part's row (offsets wrong by one part) fails this."""
    device = kernel_device
    sizes, slots, widths = [3, 1, 4], [2, 0, 1], [2, 3, 1]
    token_parts = np.repeat(np.arange(3), sizes)
    rng = np.random.default_rng(5)
    fused, k_cols, v_cols = fused_keys_values(rng, sum(sizes), N_KV, HEAD_DIM)
    rows = np.concatenate([rng.choice(64 * w, n, replace=False) for w, n in zip(widths, sizes)])
    keys_values = device.asarray(fused)
    keys = keys_values[:, k_cols].reshape(-1, N_KV, HEAD_DIM)
    values = keys_values[:, v_cols].reshape(-1, N_KV, HEAD_DIM)
    rows_dev = device.asarray(rows.astype(np.int32))

    batched_pool, views = shared_pool(device, mode, widths)
    tables, _ = token_tables(device, [v.table for v in views], slots, token_parts)
    kv_launch.kv_write(device.module("kv"), views[0], 0, rows_dev, keys, values, tables=tables)

    alone_pool, alone_views = shared_pool(device, mode, widths)
    start = 0
    for view, slot, n in zip(alone_views, slots, sizes):
        kv_launch.kv_write(device.module("kv"), view, slot, rows_dev[start:start + n], keys[start:start + n],
                           values[start:start + n])
        start += n
    for got, want in zip(pool_bytes(device, batched_pool), pool_bytes(device, alone_pool)):
        assert np.array_equal(got, want)

    twin_pool = kv_launch.DeviceKV.allocate(mode, N_KV, batched_pool.rows, HEAD_DIM)
    per_token = np.stack([np.concatenate([views[p].table[slots[p]], np.zeros(3 - widths[p], np.int32)])
                          for p in token_parts])                                   # (T, W) each token's row
    host = fused.reshape(fused.shape[0], -1)
    twin_kv.kv_write(mode, twin_pool.keys, twin_pool.values, per_token, rows,
                     host[:, k_cols].reshape(-1, N_KV, HEAD_DIM), host[:, v_cols].reshape(-1, N_KV, HEAD_DIM))
    for got, want in zip(pool_bytes(device, batched_pool), [a.view(np.uint8) for a in twin_pool.arrays()]):
        assert np.array_equal(got, want)


def filled_pool(device, mode, widths, n_slots=3, seed=1):
    """shared_pool with every row of every slot of every part holding random keys and values
    (stored by the kv twin), the rest of the pool NaN / 0xFF (never read)."""
    pool, views = shared_pool(device, mode, widths, n_slots, seed)
    host = kv_launch.DeviceKV.allocate(mode, N_KV, pool.rows, HEAD_DIM)
    for array in host.arrays():
        array.view(np.uint8)[...] = 0xFF
    rng = np.random.default_rng(seed)
    for view in views:
        rows = view.table.shape[1] * 64
        for slot in range(n_slots):
            keys, values = rng.standard_normal((2, rows, N_KV, HEAD_DIM)).astype(F)
            twin_kv.kv_write(mode, host.keys, host.values, view.table[slot], np.arange(rows), keys, values)
    for mine, theirs in zip(host.arrays(), pool.arrays()):
        theirs[...] = device.asarray(mine)
    return host, views


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("window", [0, 70])
def test_one_attention_launch_for_several_caches_gives_each_query_its_alone_bits(kernel_device, mode, window):
    """Queries of three caches (a decode row, a 5-row verify, a 2-row stretch; positions across
    64-key block edges, which are attention's chunk edges at S = 1), each part at its own slot, in one launch through the
    stacked tables: each part's rows are bit for bit its own launch's, and the twin's with each
    query's own table row. Reading every query through the first part's table fails this."""
    device = kernel_device
    widths, slots = [5, 2, 8], [1, 2, 0]
    host, views = filled_pool(device, mode, widths)
    positions = [np.array([300]), np.arange(60, 65), np.array([255, 256])]
    sizes = [len(p) for p in positions]
    token_parts = np.repeat(np.arange(3), sizes)
    rng = np.random.default_rng(7)
    q = rng.standard_normal((sum(sizes), 2 * N_KV, HEAD_DIM)).astype(F)
    all_positions = np.concatenate(positions)
    tables, width = token_tables(device, [v.table for v in views], slots, token_parts)
    chunks = attention_launch.max_chunks(width * 64, window, 0)
    out = device.zeros(q.shape, F)
    counters = device.zeros(q.shape[0] * N_KV, np.uint32)
    attention_launch.attention(device.module("attention"), views[0], device.asarray(q), 0,
                               device.asarray(all_positions.astype(np.int32)), window, 0, None, None, 0, 0.125, out,
                               chunks=chunks, counters=counters, tables=tables)
    batched = device.to_host(out)
    assert not device.to_host(counters).any()
    start = 0
    for view, slot, pos in zip(views, slots, positions):
        alone = kernel(device, view, q[start:start + len(pos)], slot, pos, window)
        assert bits_equal(batched[start:start + len(pos)], alone), (view.table.shape, slot)
        start += len(pos)
    per_token = np.stack([np.concatenate([views[p].table[slots[p]], np.zeros(width - widths[p], np.int32)])
                          for p in token_parts])
    assert bits_equal(batched, twin.attention(mode, q, host.keys, host.values, per_token, all_positions, window,
                                              scale=0.125))


def test_token_tables_are_checked():
    t = kv_launch.TokenTables(np.zeros(8, np.int32), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="3 offsets for 2 tokens"):
        t.check(2)
    with pytest.raises(ValueError, match="offsets must be a contiguous int32"):
        kv_launch.TokenTables(np.zeros(8, np.int32), np.zeros(3, np.int64)).check(3)


# -- the model: batched steps on the CUDA backend --------------------------------------------------

def started(model, prompts, loops, pool, capacity=40):
    """A cache per prompt in `pool`, prefilled (alone) -> (caches, last tokens)."""
    caches, tokens = [], []
    for prompt in prompts:
        cache = model.new_cache(capacity, loops, pool=pool)
        logits = prefill(model, prompt, cache, loops)
        caches.append(cache)
        tokens.append(int(np.argmax(model.backend.to_host(logits)[0])))
    return caches, tokens


def decode_pass(model, cache, token, position, loops):
    return Pass(cache, np.array([position]), position, loops, tokens=[token], coda=model.coda_base(loops), head="all")


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(21)
    return [[int(t) for t in rng.integers(3, 200, n)] for n in (5, 12, 3, 9, 7)]


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("preset", ["tiny-looped", pytest.param("tiny-looped-gpt", marks=pytest.mark.slow)])
def test_a_batched_step_launches_one_kv_write_and_one_attention_per_layer(tiny_files, prompts, preset, fold,
                                                                         monkeypatch):
    """Five requests at three loop counts stepped together eagerly (graphs off): core rounds
    whose parts sit at different slots, rows of different cache widths. Each request's logits
    equal its plain forward alone bit for bit, each layer call is one kv_write (none where the
    write is folded into the qkv linear, the default) and one attention launch, not one per
    request, and a step builds (and uploads) one layout per set of requests its rounds run, not
    one per layer."""
    import tinyloop.backends.cuda.backend as backend_module
    layouts = []
    original_build = backend_module.build_layout
    monkeypatch.setattr(backend_module, "build_layout", lambda *a: layouts.append(1) or original_build(*a))
    backend = cuda_backend(graphs=False)
    backend.fuses_kv_write = fold
    model = load_model(tiny_files[preset], backend).model
    plain = load_model(tiny_files[preset], cuda_backend(graphs=False)).model
    loops = [2, 3, 2, 1, 3]
    pools = [KVPool.for_model(m, 32 << 20) for m in (model, plain)]
    caches, tokens, mirrors = [], [], []
    for i, (prompt, n) in enumerate(zip(prompts, loops)):          # cache widths 1 to 5 blocks
        (cache,), (token,) = started(model, [prompt], n, pools[0], capacity=40 + 64 * i)
        (mirror,), _ = started(plain, [prompt], n, pools[1], capacity=40 + 64 * i)
        caches.append(cache), tokens.append(token), mirrors.append(mirror)
    counts = {}
    module = backend.device.module("kv"), backend.device.module("attention")
    backend.device._modules["kv"] = LaunchCounter(module[0], counts)
    backend.device._modules["attention"] = LaunchCounter(module[1], counts)
    for step in range(3):
        positions = [len(p) + step for p in prompts]
        passes = [decode_pass(model, c, t, position, n) for c, t, position, n in zip(caches, tokens, positions, loops)]
        counts.clear(), layouts.clear()
        run_passes(model, passes)
        assert len(layouts) == len(set(loops))        # rounds run all five, then loops >= 2, then >= 3
        instances = model.config.n_prelude + model.config.n_core * max(loops) + model.config.n_coda
        assert counts.get("kv_write_fp16", 0) == (0 if fold else instances), counts
        assert sum(v for k, v in counts.items() if k.startswith("attention_")) == instances, counts
        new_tokens = []
        for p, mirror, position, n, token in zip(passes, mirrors, positions, loops, tokens):
            theirs = plain.backend.to_host(plain.forward([token], [position], mirror, n))
            assert bits_equal(backend.to_host(p.logits), theirs), (step, n)
            new_tokens.append(int(np.argmax(theirs)))
        tokens = new_tokens


@pytest.mark.parametrize("preset", ["tiny-looped", "tiny-looped-gpt"])
def test_batches_of_decode_steps_replay_one_graph_per_bucket_across_requests(tiny_files, preset):
    """Requests join and leave a decoding batch (1, 2, 3, 4, 3, then 1 rows: buckets 1, 2 and 4,
    the 3-row steps padded), their caches 2 to 5 blocks wide, three of them crossing a 64-row
    block edge (a block taken between replays); every step's logits equal each request's plain
    forward alone, bit for bit. A graph is captured once per bucket and table width and replayed
    for later steps, and newcomers reuse it (the 4-row graph by a 3-row step after two requests
    finish; the first request's 1-row graph by the last): what changes lives in the graph's
    inputs (tokens, positions, write rows, block tables). On the CPU a replay re-runs the step
    with its first values frozen, so anything read from the host would be stale, and a released
    cache that a replay touched would hold blocks again. Learned positions (tiny-looped-gpt)
    come from the inputs' positions, not its tokens."""
    backend = cuda_backend(graphs=True)
    model = load_model(tiny_files[preset], backend).model
    plain = load_model(tiny_files[preset], cuda_backend(graphs=False)).model
    loops = 2
    rng = np.random.default_rng(21)
    prompts = [[int(t) for t in rng.integers(3, 200, n)] for n in (58, 12, 60, 9, 60)]
    capacities = (200, 100, 300, 90, 200)                      # 4, 2, 5, 2 and 4 blocks a slot
    pools = [KVPool.for_model(m, 32 << 20) for m in (model, plain)]
    ours, theirs, tokens = [], [], []
    for prompt, capacity in zip(prompts, capacities):
        (cache,), (token,) = started(model, [prompt], loops, pools[0], capacity)
        (mirror,), _ = started(plain, [prompt], loops, pools[1], capacity)
        ours.append(cache), theirs.append(mirror), tokens.append(token)
    positions = [len(p) for p in prompts]
    schedule = [[0]] * 3 + [[0, 1]] * 3 + [[0, 1, 2]] * 3 + [[0, 1, 2, 3]] * 3 + [[2, 3, 4]] * 4 + [[4]] * 3
    for step, running in enumerate(schedule):
        if step == 12:                                          # 0 and 1 are done: their blocks go back
            ours[0].release(), ours[1].release()
        passes = [decode_pass(model, ours[i], tokens[i], positions[i], loops) for i in running]
        run_passes(model, passes)
        for i, p in zip(running, passes):
            want = plain.backend.to_host(plain.forward([tokens[i]], [positions[i]], theirs[i], loops))
            assert bits_equal(backend.to_host(p.logits), want), (step, i)
            assert p.iterations_run == loops
            tokens[i], positions[i] = int(np.argmax(want)), positions[i] + 1
    assert min(positions[0], positions[2], positions[4]) > 64
    graphs = {(key[2], key[4]): g for key, g in backend._batch_graphs.graphs.items()}   # (bucket, width)
    assert sorted(graphs) == [(1, 4), (2, 4), (4, 8)]
    assert graphs[1, 4].steps == 6 and graphs[2, 4].steps == 3 and graphs[4, 8].steps == 10
    assert all(g.replay is not None for g in graphs.values())
    assert backend._graph is None                  # the one-request decode graph was never needed
    assert ours[0].blocks_held == ours[1].blocks_held == 0
    held = sum(c.blocks_held for c in ours)
    assert pools[0].free_blocks + held + pools[0].reserved == pools[0].usable_blocks


def test_a_cache_with_a_pool_of_its_own_keeps_the_one_request_graph(tiny_files):
    """generate() without the engine's pool: its cache's pool is its own, so no batch graph (which
    would keep that pool alive) is made for it; its decode steps replay the one-request graph."""
    from tinyloop.engine.generate import GenerationRequest, generate
    backend = cuda_backend(graphs=True)
    model = load_model(tiny_files["tiny-looped"], backend).model
    plain = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=False)).model
    request = GenerationRequest([5, 17, 42, 9], max_tokens=6, loops=2, ignore_eos=True)
    assert generate(model, request).tokens == generate(plain, request).tokens
    assert not backend._batch_graphs.graphs and backend._graph.replay is not None


def test_what_a_batch_graph_does_not_take(tiny_files, prompts):
    """Graphs off, a window, mixed loop counts, a pass that is not a plain decode step, or more
    rows than the largest bucket: no runner, the step runs eagerly (a lone windowed decode step
    through the one-request decode graph)."""
    backend = cuda_backend(graphs=True)
    model = load_model(tiny_files["tiny-looped"], backend).model
    pool = KVPool.for_model(model, 32 << 20)
    caches = [model.new_cache(40, 2, pool=pool) for _ in range(3)]

    def steps(loops=(2, 2, 2), **change):
        return [Pass(**{**dict(cache=c, positions=np.array([0]), write_row=0, iterations=n, tokens=[1],
                               coda=model.coda_base(n), head="all"), **change}) for c, n in zip(caches, loops)]
    assert backend.batch_decode_runner(model, steps()) is not None
    assert backend.batch_decode_runner(model, steps(loops=(2, 3, 2))) is None
    assert backend.batch_decode_runner(model, steps(head="last")) is None
    assert backend.batch_decode_runner(model, steps()[:1]).n_rows == 1
    windowed = [model.new_cache(400, 2, window=64, pool=pool) for _ in range(2)]
    assert backend.batch_decode_runner(model, [decode_pass(model, c, 1, 0, 2) for c in windowed]) is None
    many = [decode_pass(model, caches[0], 1, 0, 2)] * (BATCH_BUCKETS[-1] + 1)
    assert backend.batch_decode_runner(model, many) is None
    backend.graphs = False
    assert backend.batch_decode_runner(model, steps()) is None


def test_rows_split_from_one_array_join_back_without_a_copy():
    """concat_rows: consecutive row ranges of one array come back as a view of it (what a batched
    forward splits per pass and stacks again); anything else is copied, as np.concatenate does."""
    from tinyloop.backends.rows import adjacent_rows, concat_rows
    base = np.arange(40, dtype=F).reshape(10, 4)
    pieces = [base[1:3], base[3:4], base[4:8]]
    joined = concat_rows(pieces)
    assert np.shares_memory(joined, base) and np.array_equal(joined, base[1:8])
    for parts in ([base[1:3], base[4:8]], [base[3:4], base[1:3]], [base[:, :2], base[:, 2:]],
                  [base[1:3], np.arange(8, dtype=F).reshape(2, 4)]):
        assert adjacent_rows(parts) is None
        assert np.array_equal(concat_rows(parts), np.concatenate(parts))


def test_one_kv_head_takes_any_stride_on_its_head_axis():
    """A model with one KV head: CuPy gives a size-1 axis the token stride, NumPy hd floats; the
    KV write takes either (a GPU run refused CuPy's before)."""
    fused = np.zeros((5, 3 * 16 + 3), F)
    keys = np.lib.stride_tricks.as_strided(fused[:, 16:32], (5, 1, 16), (fused.strides[0], fused.strides[0], 4))
    assert kv_launch._token_stride(keys, 1, 16) == fused.shape[1]
    with pytest.raises(ValueError, match="heads packed"):
        kv_launch._token_stride(np.lib.stride_tricks.as_strided(fused[:, :32], (5, 2, 16),
                                                                (fused.strides[0], 8, 4)), 2, 16)


def test_a_random_mix_with_graphs_on_gives_each_request_its_alone_tokens(tiny_files):
    """The engine's loop (test_batching.run_mix: random joins, random steps deferred, prefill
    chunks beside decode steps) on the CUDA backend with graphs on: steps of decode rows only
    replay batch graphs, the others run eagerly; every request's tokens and logprobs are what it
    gets alone, and every pool block comes back."""
    from test_batching import outcome, run_mix
    from tinyloop.engine.generate import GenerationRequest, generate
    backend = cuda_backend(graphs=True)
    model = load_model(tiny_files["tiny-looped"], backend).model
    plain = load_model(tiny_files["tiny-looped"], cuda_backend(graphs=False)).model
    rng = np.random.default_rng(11)
    requests = [GenerationRequest([int(t) for t in rng.integers(3, 200, int(rng.integers(2, 24)))],
                                  max_tokens=int(rng.integers(5, 9)), loops=2, ignore_eos=True, top_logprobs=2)
                for _ in range(4)]
    alone = [outcome(generate(plain, r, prefill_chunk=16)) for r in requests]
    together = run_mix(model, requests, None, np.random.default_rng(2), [0, 0, 1, 3], 16)
    assert together == alone
    assert any(g.replay is not None for g in backend._batch_graphs.graphs.values())
