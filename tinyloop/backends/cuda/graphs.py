"""Steps captured once as CUDA graphs and replayed: decode steps per batch-size bucket
(BatchDecodeGraph, shared by every request: the end of this file), one request's decode step
on a windowed cache (DecodeGraph), and a request's speculative draft levels (DraftGraph) and
verify pass (VerifyGraph) per node count.

A decode step launches a few hundred small kernels (34 layer instances x ~10 for
doc-407m at 8 loops): from Python each launch costs microseconds of host time, more
than the kernel itself takes on an H200. A CUDA graph records the whole step once and
replays it with one launch. What a replay may change lives in device buffers that the
step reads (StepInputs: the token, its position, its physical cache row; for a verify
pass also its draft states, its tree's path rows and where they start; and the cache's
block table, kv/cache.py, which the host updates as the cache grows); everything
else the step allocates comes from one arena kept with the graph (so the addresses the
graph recorded stay valid), and the kernels find blocks, masks and RoPE rows from the
positions on the device. Nothing in the step may copy from the host, synchronise or
call cuBLAS: the CUDA backend's kernels are all our own.

Life cycle (one cache, one loop count; for verify passes one graph per node count and
chain/tree): the first step runs as usual (compiling and loading every kernel, and
measuring what it allocates, which sizes the arena), the second is captured, and every
later one is a replay. TINYLOOP_CUDA_GRAPHS=0 turns capture off.

Every graph ends with the greedy ids of its logits (argmax_rows into a buffer of its own,
GraphArgmax): a greedy step then launches nothing after the replay but the copy of its ids.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from tinyloop.backends.cuda.batch import BatchLayout, stacked_tables
from tinyloop.backends.rows import concat_rows
from tinyloop.env import env_flag
from tinyloop.limits import ATTENTION_BLOCK, MAX_TREE_NODES
from tinyloop.model.plan import build_plan


def graphs_enabled() -> bool:
    """TINYLOOP_CUDA_GRAPHS: on unless 0/false/no/off; a typo is an error (asgi/settings.py
    checks it at start), empty means unset."""
    return env_flag(os.environ, "TINYLOOP_CUDA_GRAPHS", True)


class GraphArgmax:
    """Greedy ids computed inside a replayed graph. Each graph runs argmax_rows after its head,
    into an ids buffer of its own, and after each replay tells this memo which logits arrays it
    handed out (those very objects) and where their rows start in its ids; backend.argmax looks
    an array up here and launches its own kernel for any other. Only the latest graph step's
    arrays are known: a replay rewrites its logits and its ids together, so an array handed out
    before is either that rewritten buffer (with its ids rewritten alike) or no longer known.
    The ids cross to the host once per step, when first asked for."""

    def __init__(self, to_host):
        self._to_host = to_host
        self._known = {}             # id(array) -> (array, first row in ids)
        self._ids = None             # (rows,) int32 on the device
        self._host = None            # the same on the host, once asked for

    def remember(self, ids, views: list) -> None:
        """views: [(logits array handed out, its first row in ids)]."""
        self._ids, self._host = ids, None
        self._known = {id(view): (view, start) for view, start in views}

    def lookup(self, logits):
        """The ids of these logits' rows if a graph computed them, else None."""
        entry = self._known.get(id(logits))
        if entry is None or entry[0] is not logits:
            return None
        if self._host is None:
            self._host = self._to_host(self._ids)
        start = entry[1]
        return self._host[start:start + logits.shape[0]].copy()


def with_greedy_ids(backend, run, ids):
    """run, then argmax_rows of its logits into ids (the graph's buffer): what a graph records."""
    def step():
        logits = run()
        backend.argmax_into(logits, ids)
        return logits
    return step


@dataclass
class StepInputs:
    """The per-step values of a captured forward over T rows: one int32 device array, uploaded
    in one copy per step, and views of it per value. A decode step: token, position, row
    (T = 1). A verify pass: positions, rows, and for a tree shared_end and the path rows,
    padded to the longest tail a tree of T nodes can have; its draft states (hidden,
    injected) are float32 device buffers filled by device copies."""
    values: object                 # (n,) int32
    tokens: object                 # (T,) or None
    positions: object              # (T,)
    rows: object                   # (T,) physical rows of the new tokens
    shared_end: object = None      # (1,) first logical block read through tail (trees)
    tail: object = None            # (T, tail_len) physical rows along each node's path
    hidden: object = None          # (T, D) draft states the verify pass resumes from
    injected: object = None        # (T, D)

    @classmethod
    def allocate(cls, xp, n_rows: int = 1):
        """A forward's inputs over n_rows rows: tokens, positions, rows."""
        values = xp.zeros(3 * n_rows, np.int32)
        return cls(values, values[:n_rows], values[n_rows:2 * n_rows], values[2 * n_rows:])

    @classmethod
    def allocate_verify(cls, xp, n_rows: int, tree: bool, d_model: int):
        tail_len = tail_rows_bound(n_rows) if tree else 0
        values = xp.zeros(2 * n_rows + (1 + n_rows * tail_len if tree else 0), np.int32)
        positions, rows = values[:n_rows], values[n_rows:2 * n_rows]
        shared_end = values[2 * n_rows:2 * n_rows + 1] if tree else None
        tail = values[2 * n_rows + 1:].reshape(n_rows, tail_len) if tree else None
        return cls(values, None, positions, rows, shared_end, tail,
                   xp.zeros((n_rows, d_model), np.float32), xp.zeros((n_rows, d_model), np.float32))

    @classmethod
    def allocate_draft(cls, xp, n_rows: int, tree: bool):
        """A draft level's inputs: tokens, positions, rows, and for a tree level shared_end and the
        path rows, padded to the longest a tree of MAX_TREE_NODES nodes can need (a level's
        paths are as long as its depth, which its width does not bound)."""
        tail_len = tail_rows_bound(MAX_TREE_NODES) if tree else 0
        n = n_rows
        values = xp.zeros(3 * n + (1 + n * tail_len if tree else 0), np.int32)
        shared_end = values[3 * n:3 * n + 1] if tree else None
        tail = values[3 * n + 1:].reshape(n, tail_len) if tree else None
        return cls(values, values[:n], values[n:2 * n], values[2 * n:3 * n], shared_end, tail)

    @property
    def tail_len(self) -> int:
        return 0 if self.tail is None else self.tail.shape[1]


def tail_rows_bound(n_nodes: int) -> int:
    """The most tail rows a query of a T-node tree reads: its path spans positions base..base
    + T - 1, so its tail blocks run from base // 64 to (base + T - 1) // 64, at most
    (63 + T - 1) // 64 + 1 blocks (plan.py: shared_end is base's block or later)."""
    return ((62 + n_nodes) // ATTENTION_BLOCK + 1) * ATTENTION_BLOCK


class ForwardGraph:
    """model.forward(tokens, positions, cache, loops) over T consecutive rows, as a replayed
    graph: the exact path at full depth for any T, with each replay's tokens, positions and
    physical rows in StepInputs. A decode step is one row (DecodeGraph); scripts/bench_gpu.py
    times a 16-row step against a 1-row one with it, as graph replays on the same cache."""

    def __init__(self, backend, model, cache, loops: int, n_rows: int):
        self.backend, self.model, self.cache, self.loops, self.n_rows = backend, model, cache, loops, n_rows
        self.inputs = StepInputs.allocate(backend.xp, n_rows)
        self.ids = backend.xp.zeros(n_rows, np.int32)      # each replay's greedy ids
        self.steps = 0
        self.replay = None
        self.logits = None                   # (T, V): where every replay leaves its logits
        self.arena_bytes = None

    def __call__(self, tokens, positions):
        """tokens, positions: (T,) ints, positions consecutive. -> (T, V) logits (the graph's
        buffer after the first step: each replay rewrites it)."""
        if len(tokens) != self.n_rows or len(positions) != self.n_rows:
            raise ValueError(f"a forward graph of {self.n_rows} rows cannot run {len(positions)}")
        self.steps += 1
        device = self.backend.device
        # the closure's tokens and positions are frozen, as in a recorded graph: only the
        # host-side checks see them; the kernels read self.inputs
        run = with_greedy_ids(self.backend, lambda: self.model.forward(list(tokens), list(positions), self.cache,
                                                                       self.loops), self.ids)
        if self.steps == 1:                  # warm-up: compile and load every kernel, set attributes
            logits, self.arena_bytes = device.measure(run)
            return logits
        # a new pool block lands in the device table, which the graph reads
        self.cache.ensure_rows(int(positions[0]), self.n_rows)
        rows = self.cache.geometry.physical(np.asarray(positions, np.int64))
        device.upload_ints(self.inputs.values, np.concatenate([np.asarray(tokens), np.asarray(positions), rows]))
        with self.backend.static_inputs(self.inputs):
            if self.replay is None:
                self.replay, self.logits = device.capture(run, self.arena_bytes)
            else:
                self.replay()
        self.backend.graph_argmax.remember(self.ids, [(self.logits, 0)])
        return self.logits


class DecodeGraph(ForwardGraph):
    """model.forward([token], [position], cache, loops) for one request, as a replayed graph."""

    def __init__(self, backend, model, cache, loops: int):
        super().__init__(backend, model, cache, loops, 1)

    def __call__(self, token: int, position: int):
        return super().__call__([token], [position])


class VerifyGraph:
    """model.verify_pass(...) over T draft nodes (a chain or a tree) for one request, as a
    replayed graph: the speculative verify resumes the draft states at `from_iterations`
    to `loops` core iterations, runs the coda at coda_base and the head. -> (T, V) logits."""

    def __init__(self, backend, model, cache, from_iterations: int, loops: int, coda_base: int,
                 n_rows: int, tree: bool):
        self.backend, self.model, self.cache = backend, model, cache
        self.from_iterations, self.loops, self.coda_base = from_iterations, loops, coda_base
        self.n_rows, self.tree = n_rows, tree
        self.inputs = StepInputs.allocate_verify(backend.xp, n_rows, tree, model.config.dim)
        self.ids = backend.xp.zeros(n_rows, np.int32)      # each replay's greedy ids
        self.steps, self.replay, self.logits, self.arena_bytes = 0, None, None, None

    def _run(self, trunk, positions, write_row, tree_rows):
        return self.model.verify_pass(trunk, positions, write_row, tree_rows, self.cache, self.loops,
                                      self.coda_base)

    def __call__(self, trunk, positions, write_row: int, tree_rows):
        """trunk: the draft states (T, D) at from_iterations; positions (T,); tree_rows:
        TreeRows or None (a chain), as the plan takes them."""
        if (tree_rows is not None) != self.tree or len(positions) != self.n_rows:
            raise ValueError(f"a verify graph of {self.n_rows} {'tree' if self.tree else 'chain'} rows "
                             f"cannot run {len(positions)} {'tree' if tree_rows is not None else 'chain'} rows")
        self.steps += 1
        device = self.backend.device
        if self.steps == 1:
            logits, self.arena_bytes = device.measure(lambda: self._run(trunk, positions, write_row, tree_rows))
            return logits
        self.cache.ensure_rows(write_row, self.n_rows)
        device.upload_ints(self.inputs.values, self._step_values(positions, write_row, tree_rows))
        device.copy_into(self.inputs.hidden, trunk.hidden)
        device.copy_into(self.inputs.injected, trunk.injected)
        static = type(trunk)(self.inputs.hidden, self.inputs.injected, trunk.iterations)
        with self.backend.static_inputs(self.inputs):
            if self.replay is None:
                # positions, rows and the tree are frozen in the closure, as in a recorded
                # graph; the kernels read self.inputs
                self.replay, self.logits = device.capture(
                    with_greedy_ids(self.backend, lambda: self._run(static, positions, write_row, tree_rows),
                                    self.ids), self.arena_bytes)
            else:
                self.replay()
        self.backend.graph_argmax.remember(self.ids, [(self.logits, 0)])
        return self.logits

    def _step_values(self, positions, write_row: int, tree_rows) -> np.ndarray:
        """The int32 values of StepInputs.values for this round, from the host plan."""
        return step_values(self.cache, self.inputs, self.n_rows, self.tree, positions, write_row, tree_rows)


def step_values(cache, inputs: StepInputs, n_rows: int, tree: bool, positions, write_row: int, tree_rows,
                tokens=None) -> np.ndarray:
    """StepInputs.values of a verify pass or a draft level (tokens first) from the host plan:
    positions, physical rows, and for a tree shared_end and the path rows, padded."""
    positions = np.asarray(positions, np.int64)
    plan = build_plan(positions, write_row, cache.geometry, True, tree_rows)
    parts = ([] if tokens is None else [np.asarray(tokens, np.int64)]) + [positions, plan.write_row_ids()]
    if tree:
        a = plan.attention
        tail = np.zeros((n_rows, inputs.tail_len), np.int64)
        if a.n_tail:
            if a.tail_rows.shape[1] > tail.shape[1]:
                raise AssertionError(f"a tail of {a.tail_rows.shape[1]} rows past the inputs' {tail.shape[1]}")
            tail[:, :a.tail_rows.shape[1]] = a.tail_rows
        parts += [np.array([a.shared_end]), tail.ravel()]
    return np.concatenate(parts)


class DraftGraph:
    """A lone draft level of speculative decoding (engine/speculative: a chain's next node, or a
    tree level's frontier) as a replayed graph, one per node count, chain/tree and head:
    model.draft_pass, the nodes' tokens through the embedding, the prelude and the draft's `loops`
    core iterations, the draft coda at coda_base and (head) the head. -> (logits (T, V) or None,
    the states after the core iterations). Without the head it is the round's last level, which
    the draft never ran: its coda only writes the draft coda's cache rows, and its states go to
    the verify. The states are the graph's buffers copied out: the next level of a chain replays
    the same graph, and the verify still needs this level's."""

    def __init__(self, backend, model, cache, loops: int, coda_base: int, n_rows: int, tree: bool,
                 head: bool = True):
        self.backend, self.model, self.cache = backend, model, cache
        self.loops, self.coda_base, self.n_rows, self.tree, self.head = loops, coda_base, n_rows, tree, head
        self.inputs = StepInputs.allocate_draft(backend.xp, n_rows, tree)
        d = model.config.dim
        self.hidden = backend.xp.zeros((n_rows, d), np.float32)      # the states each replay leaves
        self.injected = backend.xp.zeros((n_rows, d), np.float32)
        self.ids = backend.xp.zeros(n_rows, np.int32)                # each replay's greedy ids
        self.steps, self.replay, self.logits, self.arena_bytes = 0, None, None, None

    def _run(self, tokens, positions, write_row, tree_rows):
        logits, trunk = self.model.draft_pass(tokens, positions, write_row, tree_rows, self.cache, self.loops,
                                              self.coda_base, self.head)
        self.hidden[...] = trunk.hidden          # recorded in the graph: a copy on the device
        self.injected[...] = trunk.injected
        return logits if self.head else self.hidden     # a step's result is one array

    def __call__(self, tokens, positions, write_row: int, tree_rows):
        if (tree_rows is not None) != self.tree or len(positions) != self.n_rows or len(tokens) != self.n_rows:
            raise ValueError(f"a draft graph of {self.n_rows} {'tree' if self.tree else 'chain'} rows cannot "
                             f"run {len(positions)} {'tree' if tree_rows is not None else 'chain'} rows")
        from tinyloop.model.transformer import Trunk
        self.steps += 1
        device = self.backend.device
        run = lambda: self._run(tokens, positions, write_row, tree_rows)      # noqa: E731
        if self.head:
            run = with_greedy_ids(self.backend, run, self.ids)
        if self.steps == 1:                      # warm-up: compile and load, size the arena
            logits, self.arena_bytes = device.measure(run)
        else:
            self.cache.ensure_rows(write_row, self.n_rows)
            device.upload_ints(self.inputs.values, step_values(self.cache, self.inputs, self.n_rows, self.tree,
                                                               positions, write_row, tree_rows, tokens))
            with self.backend.static_inputs(self.inputs):
                if self.replay is None:
                    # tokens, positions, rows and the tree are frozen in the closure, as in a
                    # recorded graph; the kernels read self.inputs
                    self.replay, self.logits = device.capture(run, self.arena_bytes)
                else:
                    self.replay()
            logits = self.logits
            if self.head:
                self.backend.graph_argmax.remember(self.ids, [(logits, 0)])
        return (logits if self.head else None), Trunk(self.hidden.copy(), self.injected.copy(), self.loops)


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)  # batch sizes a graph is captured for; a batch runs in the smallest that holds it
MAX_BATCH_GRAPHS = 16                 # kept at once, least recently used dropped (each holds its arena)


@dataclass
class BatchInputs:
    """The per-step values of a captured batch of B decode steps: one int32 device array, uploaded
    in one copy per step (tokens, positions, physical write rows, then the stacked block table
    (S, B, W) of batch.py), and the constant token offsets of each slot, (S, B): row s is the
    offsets of a layer call whose parts are all at slot s (batch.py's (s B + p) W)."""
    values: object                 # (3 B + S B W,) int32
    tokens: object                 # (B,)
    positions: object              # (B,)
    rows: object                   # (B,)
    table: object                  # (S B W,)
    offsets: object                # (S, B) int32, constant
    n_slots: int
    width: int

    @classmethod
    def allocate(cls, device, n_rows: int, n_slots: int, width: int):
        values = device.xp.zeros(3 * n_rows + n_slots * n_rows * width, np.int32)
        offsets = (np.arange(n_slots)[:, None] * n_rows + np.arange(n_rows)[None, :]) * width
        return cls(values, values[:n_rows], values[n_rows:2 * n_rows], values[2 * n_rows:3 * n_rows],
                   values[3 * n_rows:], device.asarray(offsets.astype(np.int32)), n_slots, width)

    @property
    def n_rows(self) -> int:
        return self.tokens.shape[0]

    def layout(self, n_parts: int):
        """batch.py's layout of a forward over these inputs (every layer call has all B parts,
        each at the same slot)."""
        if n_parts != self.n_rows:
            raise ValueError(f"a captured batch of {self.n_rows} rows cannot run a layer over {n_parts} parts")
        offsets = {(s,) * self.n_rows: self.offsets[s] for s in range(self.n_slots)}
        return BatchLayout(self.n_rows, self.n_slots, self.width, 0, 0, self.positions, self.rows, self.table,
                           np.arange(self.n_rows), None, offsets)


class BatchDecodeGraph:
    """B plain decode steps of different requests (each on its own cache, one loop count) as one
    replayed graph: run_passes' batched forward (one linear call per weight for every row, one
    KV write and one attention launch per layer for every cache: batch.py). Reused from step to
    step and across requests: the requests' tokens, positions, write rows and block tables are
    the graph's inputs. A batch of fewer than B requests is padded with decode steps at position
    0 of a PaddingCache (its one row is rewritten every step and read by nobody else); the
    padding's logits are dropped. Rows are row-invariant, so padding changes no bit of a
    request's row (tests/test_cuda_batch.py)."""

    def __init__(self, backend, model, loops: int, n_rows: int, n_slots: int, width: int, padding):
        self.backend, self.model, self.loops, self.n_rows = backend, model, loops, n_rows
        self.inputs = BatchInputs.allocate(backend.device, n_rows, n_slots, width)
        self.padding = padding                # PaddingCache: the padding rows' cache
        self.ids = backend.xp.zeros(n_rows, np.int32)      # each replay's greedy ids
        self.steps, self.replay, self.logits, self.arena_bytes = 0, None, None, None

    def __call__(self, passes: list) -> None:
        """passes: at most B plain decode passes (model/batch.py Pass) of this loop count; each
        gets its logits (1, V) (a copy: the graph's buffer is rewritten by the next step) and
        iterations_run."""
        n, pad = len(passes), self.n_rows - len(passes)
        if not 0 < n <= self.n_rows:
            raise ValueError(f"a batch graph of {self.n_rows} rows cannot run {n} passes")
        caches = [p.cache for p in passes] + [self.padding] * pad
        tokens = [int(np.asarray(p.tokens)[0]) for p in passes] + [0] * pad
        positions = [int(p.positions[0]) for p in passes] + [0] * pad
        write_rows = [int(p.write_row) for p in passes] + [0] * pad
        for cache, row in zip(caches, write_rows):
            cache.check_rows(row, 1)
            cache.ensure_rows(row, 1)            # a new pool block lands in the stacked table
        physical = [int(c.geometry.physical(np.array([r]))[0]) for c, r in zip(caches, write_rows)]
        table = stacked_tables([c.table for c in caches], self.inputs.n_slots, self.inputs.width)
        self.steps += 1
        device = self.backend.device
        device.upload_ints(self.inputs.values, np.concatenate([tokens, positions, physical, table.reshape(-1)]))
        # the closure's tokens, positions and caches are frozen, as in a recorded graph: the
        # kernels read self.inputs
        run = with_greedy_ids(self.backend, lambda: self._forward(caches, tokens, positions, write_rows), self.ids)
        with self.backend.static_batch(self.inputs):
            if self.steps == 1:                  # warm-up: compile and load, size the arena
                device.wait_for_uploads()        # it runs on the current stream, the inputs came on the graph's
                logits, self.arena_bytes = device.measure(run)
            elif self.replay is None:
                self.replay, self.logits = device.capture(run, self.arena_bytes)
                logits = self.logits
            else:
                self.replay()
                logits = self.logits
        logits = logits[:n].copy()
        for i, p in enumerate(passes):
            p.logits, p.iterations_run = logits[i:i + 1], self.loops
        if self.steps > 1:                       # the rows' ids came with the replay
            self.backend.graph_argmax.remember(self.ids, [(p.logits, i) for i, p in enumerate(passes)])

    def _forward(self, caches, tokens, positions, write_rows):
        """The batched forward over the B rows, its plans made as views of the inputs. -> (B, V)."""
        from tinyloop.model.batch import Pass, run_passes
        model, backend = self.model, self.backend
        coda = model.coda_base(self.loops)
        passes = [Pass(cache, np.array([position]), row, self.loops, tokens=np.array([token]), coda=coda, head="all")
                  for cache, token, position, row in zip(caches, tokens, positions, write_rows)]
        for i, p in enumerate(passes):
            with backend.static_part(i):         # blocks were allocated in __call__, not on a replay
                p.plan = model.plan(p.positions, p.write_row, p.cache, True, None, step_buffers=False,
                                    allocate=False)
        run_passes(model, passes, planned=True)
        return concat_rows([p.logits for p in passes])      # the head's one output, split per pass


class PaddingCache:
    """Where a batch graph's padding rows go: a cache of one 64-row block per slot, every slot's
    block the pool's null block (kv/pool.py), so it takes no block from anyone. Each padding row
    writes pool row 0 of the null block in every layer and its attention reads that row back in
    the same layer. Nothing else reads the null block on this backend: its kernels never read a
    row no query may see (CudaBackend.kv_init_blocks), and an unallocated table entry is all that
    points there."""
    window, ring, capacity = 0, None, 1

    def __init__(self, backend, pool, n_slots: int):
        from tinyloop.kv.pool import NULL_BLOCK
        from tinyloop.model.plan import Geometry
        self.pool, self.n_slots = pool, n_slots
        self.table = np.full((n_slots, 1), NULL_BLOCK, np.int32)
        self.storage = backend.kv_view(pool.storage, self.table)
        self.geometry = Geometry(ATTENTION_BLOCK, None, 0)

    def check_rows(self, start: int, count: int) -> None:
        if start != 0 or count != 1:
            raise IndexError(f"a padding cache holds row 0 only, not [{start}, {start + count})")

    def ensure_rows(self, start: int, count: int) -> None:
        self.check_rows(start, count)


class BatchDecodeGraphs:
    """The backend's batch graphs, by (model, loop count, bucket, slots, table width, pool), and a
    padding cache per (pool, slots)."""

    def __init__(self, backend):
        self.backend = backend
        self.graphs = {}                     # key -> BatchDecodeGraph, least recently used first
        self.padding = {}                    # (id(pool), slots) -> PaddingCache

    def runner(self, model, passes: list):
        """The graph for these passes, or None: they are not all plain decode steps of one loop
        count on full caches of one shared pool, or more than the largest bucket (they then run
        eagerly). A cache with a pool of its own (model.new_cache without the engine's pool: the
        Python API's generate) is left to the one-request decode graph, which goes with its cache:
        a graph here keeps its pool alive until it is dropped."""
        if not 1 <= len(passes) <= BATCH_BUCKETS[-1] or model.config.initial_state == "random":
            return None
        loops = passes[0].iterations
        pool = passes[0].cache.pool
        if pool.private:
            return None
        for p in passes:
            if not (p.is_plain_decode and p.iterations == loops and p.coda == model.coda_base(loops)
                    and p.cache.pool is pool and p.cache.window == 0 and p.cache.ring is None):
                return None
        n_slots = max(p.cache.n_slots for p in passes)
        width = 1 << (max(p.cache.table.shape[1] for p in passes) - 1).bit_length()
        bucket = next(b for b in BATCH_BUCKETS if b >= len(passes))
        key = (id(model), loops, bucket, n_slots, width, id(pool))
        graph = self.graphs.pop(key, None)
        if graph is None or graph.model is not model or graph.padding.pool is not pool:
            padding = self.padding.get((id(pool), n_slots))
            if padding is None or padding.pool is not pool:
                padding = self.padding[(id(pool), n_slots)] = PaddingCache(self.backend, pool, n_slots)
            graph = BatchDecodeGraph(self.backend, model, loops, bucket, n_slots, width, padding)
            if len(self.graphs) >= MAX_BATCH_GRAPHS:
                self.graphs.pop(next(iter(self.graphs)))
        self.graphs[key] = graph             # the most recently used last
        return graph
