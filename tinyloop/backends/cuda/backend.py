"""The CUDA backend: the Backend interface (backends/base.py) on the kernels of cuda/*.cu.

Weights stay packed on the device (launch/packing.py); the KV cache is stored in its
mode's layout (launch/kv.py) and attention reads it in place; greedy ids and top-k
candidates are found on the device, so a step moves ids or K candidates to the host.

Everything goes through `self.device` (device.py): CuPy on a GPU, or, in the test suite,
NumPy arrays and the CPU harness that runs the same .cu sources, so this whole file runs
end to end on the CPU (tests/test_cuda_backend.py).

Exactness (the rule of backends/reference/__init__.py) holds by construction of the kernels:
the row kernels of the linear, the norms, the KV write and attention give each row
(query, token) bits that depend on that row's inputs alone — fixed reduction orders,
no split that depends on the number of rows, no atomics (cuda/README.md). So a verify
over T rows equals T decode steps bit for bit, on the GPU as in the harness. With
TINYLOOP_CUDA_MMA_ROWS=1 the exact path's int4 linears run on tensor cores instead
(cuda/linear_mma.cu): other bits than the float32 rows kernels, row-invariant the same way
(its split is a function of the weight's shape alone).

Per forward, the plan's positions, write rows and draft-tree path rows are uploaded once
(DevicePlan, cached on the plan) and every layer's kernels read them on the device. A batched
step's KV writes and attention take every request's rows in one launch each (batch.py), and a
batch of plain decode steps replays one CUDA graph per batch-size bucket (graphs.py).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np

from tinyloop.backends.base import Backend, check_activations
from tinyloop.backends.rows import concat_rows
from tinyloop.backends.reference.positions import rope_table
from tinyloop.backends.reference.topk import log_normalizer, top_k_ids
from tinyloop.backends.cuda.batch import BatchLayout, batchable, build_layout, geometry_of
from tinyloop.backends.cuda.graphs import (BatchDecodeGraphs, DecodeGraph, DraftGraph, GraphArgmax, VerifyGraph,
                                           graphs_enabled)
from tinyloop.backends.cuda.launch import attention as attention_launch
from tinyloop.backends.cuda.launch import elementwise, kv, linear, sampling
from tinyloop.backends.cuda.launch.kv import DeviceKV, DeviceView
from tinyloop.backends.cuda.launch.linear import MmaPath
from tinyloop.backends.cuda.launch.packing import pack_linear
from tinyloop.backends.cuda.launch.sampling import TOPK_MAX
from tinyloop.env import env_flag
from tinyloop.kv.modes import packed_bytes_per_row
from tinyloop.limits import ATTENTION_BLOCK, MAX_FORWARD_ROWS
from tinyloop.model.quant import QuantizedTensor, dequantize

NO_TREE = attention_launch.NO_TREE


def mma_rows_enabled() -> bool:
    """TINYLOOP_CUDA_MMA_ROWS: the exact path's int4 linears on tensor cores (cuda/linear_mma.cu);
    off by default until a GPU has run scripts/gpu_check.sh's invariance test (README, "On a
    GPU"); a typo is an error (asgi/settings.py checks it at start)."""
    return env_flag(os.environ, "TINYLOOP_CUDA_MMA_ROWS", False)


def pair_enabled() -> bool:
    """TINYLOOP_CUDA_PAIR: the out projection and the MLP's norm-linear after it in one launch
    (cuda/linear_pair.cu linear_rows_pair_int4: its second call's blocks wait on the first's, which
    only a GPU shows hold no deadlock and no stale read); off by default until scripts/gpu_check.sh
    has run it on a device and bench_gpu.py's pair_1k stage has timed it (README, "On a GPU"); a
    typo is an error (asgi/settings.py checks it at start)."""
    return env_flag(os.environ, "TINYLOOP_CUDA_PAIR", False)


@dataclass
class DevicePlan:
    """A forward's per-step values on the device (int32), uploaded once per forward."""
    positions: object              # (T,)
    write_rows: object             # (T,) physical rows of the new tokens
    window: int
    ring_blocks: int               # 0: no ring
    shared_end: int                # logical block where tail_rows start (NO_TREE: none), on the host
    shared_end_dev: object | None  # (1,) the same on the device (what the kernels read)
    tail_rows: object | None       # (T, tail_len) physical rows, or None
    tail_len: int


class CudaBackend(Backend):
    name = "cuda"
    fuses_rope = True        # kv_write rotates the keys, attention the queries: no rope_rows launch
    fuses_norm = True        # an exact linear's rows kernels (tensor-core rows: up to 4 rows) stage norm(h)
    fuses_kv_write = True    # the qkv rows kernels store the keys and values: no kv_write launch
    fuses_swiglu = True      # an exact down projection's rows kernels stage swiglu(up): no swiglu launch
    # Generations stepped together by default: a batch-1 decode step leaves most of a GPU's
    # compute idle (it is bound by reading the weights), so rows of other requests ride along
    # nearly free. On an H200 (doc-407m, 1k context) 16 requests in one batch graph gave 4.3x one's
    # tokens/s (cuda/README.md, "Measured on an H200").
    default_max_running = 32

    def __init__(self, device, graphs: bool | None = None, activations: str = "fp32", mma_rows: bool | None = None,
                 pair: bool | None = None):
        self.device = device
        self.xp = device.xp
        self.description = "cuda"
        self.activations = check_activations(activations)
        self.tensor_cores = bool(getattr(device, "tensor_cores", False))   # sm_80+: the fp16 prefill's mma path
        self.graphs = graphs_enabled() if graphs is None else graphs
        # exact int4 linears on tensor cores: asked for (TINYLOOP_CUDA_MMA_ROWS), and sm_80+
        self.mma_rows = (mma_rows_enabled() if mma_rows is None else mma_rows) and self.tensor_cores
        # the out projection and the MLP's norm-linear in one launch (int4 weights): asked for
        self.fuses_pair = pair_enabled() if pair is None else pair
        self._mma_path = None            # the MmaPath every exact linear call takes, made once
        # the rows linear's decode calls on at most this many column blocks (the blocks the device
        # holds at once: launch/linear.py column_block_cap); None: a block per 8 columns
        self.column_block_cap = getattr(device, "column_block_cap", None)
        self._static = None              # StepInputs while a decode step is being captured
        self._static_batch = None        # BatchInputs while a batch of decode steps is run as a graph
        self._static_part = None         # the part whose plan is being made under _static_batch
        self._batch_graphs = BatchDecodeGraphs(self)     # by (model, loops, bucket, slots, width)
        self._graph = None               # the current request's DecodeGraph
        self.graph_argmax = GraphArgmax(self.to_host)     # greedy ids the latest graph step computed
        self._verify_graphs = {}         # the current request's VerifyGraphs by (rows, tree)
        self._verify_key = None          # (model, cache, from_iterations, loops, coda_base) they serve
        self._draft_graphs = {}          # the current request's DraftGraphs by (rows, tree)
        self._draft_key = None           # (model, cache, loops, coda_base) they serve
        # scratch kept for the backend's life, by name (_kept): attention's chunk partials and its
        # fused merge's counters, linear_mma's split partials and counters; replaced ones stay in
        # _retired_scratch, since captured graphs may still write them
        self._buffers = {}
        self._retired_scratch = []

    def _module(self, name: str):
        return self.device.module(name)

    def _empty(self, shape, dtype=np.float32):
        return self.xp.empty(shape, dtype)

    def _ints(self, host) -> object:
        return self.device.asarray(np.ascontiguousarray(host, dtype=np.int32))

    # -- memory ------------------------------------------------------------------------------
    def asarray(self, host, dtype=None):
        return self.device.asarray(host, dtype)

    def to_host(self, array) -> np.ndarray:
        return self.device.to_host(array)

    # -- weights -------------------------------------------------------------------------------
    def prepare_linear(self, parts, bias=None):
        return pack_linear(parts, bias, self.xp)

    def prepare_vector(self, host):
        return None if host is None else self.device.asarray(np.asarray(host, np.float32))

    def prepare_embedding(self, table):
        host = dequantize(table, np.float32) if isinstance(table, QuantizedTensor) else table
        return self.device.asarray(np.ascontiguousarray(host, dtype=np.float32))      # (V, D)

    def rope_table(self, max_positions, inv_freq):
        return self.device.asarray(rope_table(max_positions, inv_freq))         # (P, hd/2) complex64

    # -- per forward ---------------------------------------------------------------------------
    def rope_rows(self, table, plan):
        return table[self.device_plan(plan).positions]                                 # (T, hd/2)

    @contextlib.contextmanager
    def static_inputs(self, inputs):
        """While a one-token step is captured, its token, position and cache row come from
        these device buffers (graphs.py) instead of uploads recorded into the graph."""
        self._static = inputs
        try:
            yield
        finally:
            self._static = None

    @contextlib.contextmanager
    def static_batch(self, inputs):
        """While a batch of decode steps runs as a graph (graphs.py BatchDecodeGraph), its tokens,
        positions, write rows and stacked block tables come from these device buffers."""
        self._static_batch = inputs
        try:
            yield
        finally:
            self._static_batch = self._static_part = None

    @contextlib.contextmanager
    def static_part(self, index: int):
        """The plan made inside is part `index` of the static batch: its device plan is a view of
        the batch's inputs (what rope_rows gathers from)."""
        self._static_part = index
        try:
            yield
        finally:
            self._static_part = None

    def batch_decode_runner(self, model, passes):
        """The captured graph for these plain decode passes (one row each, one loop count, the
        same pool, full caches), replayed with padding rows up to its batch-size bucket; None
        where graphs are off or the passes do not fit one (they then run eagerly)."""
        if not self.graphs:
            return None
        return self._batch_graphs.runner(model, passes)

    def decode_runner(self, model, cache, loops):
        """The captured decode step of this cache and loop count (graphs.py), or None."""
        if not self.graphs:
            return None
        graph = self._graph
        if graph is None or graph.cache is not cache or graph.loops != loops or graph.model is not model:
            graph = self._graph = DecodeGraph(self, model, cache, loops)     # one request at a time
        return graph

    def draft_runner(self, model, cache, loops, coda_base, n_rows, tree, head=True):
        """The captured draft level of this request for n_rows nodes (chain or tree; head=False:
        the round's last level, its coda's cache rows only), or None."""
        if not self.graphs:
            return None
        key = (model, cache, loops, coda_base)
        last = self._draft_key
        if last is None or key[0] is not last[0] or key[1] is not last[1] or key[2:] != last[2:]:
            self._draft_graphs, self._draft_key = {}, key                   # one request at a time
        graph = self._draft_graphs.get((n_rows, tree, head))
        if graph is None:
            graph = DraftGraph(self, model, cache, loops, coda_base, n_rows, tree, head)
            self._draft_graphs[(n_rows, tree, head)] = graph
        return graph

    def verify_runner(self, model, cache, from_iterations, loops, coda_base, n_rows, tree):
        """The captured verify pass of this request for n_rows nodes (chain or tree), or None."""
        if not self.graphs:
            return None
        key = (model, cache, from_iterations, loops, coda_base)
        if self._verify_key is None or any(a is not b for a, b in zip(key, self._verify_key)):
            self._verify_graphs, self._verify_key = {}, key                 # one request at a time
        graph = self._verify_graphs.get((n_rows, tree))
        if graph is None:
            graph = VerifyGraph(self, model, cache, from_iterations, loops, coda_base, n_rows, tree)
            self._verify_graphs[(n_rows, tree)] = graph
        return graph

    def device_plan(self, plan) -> DevicePlan:
        """The plan's per-step values on the device, uploaded on first use in the forward."""
        cached = getattr(plan, "device_values", None)
        if cached is not None:
            return cached
        if self._static_batch is not None:
            if self._static_part is None:
                raise ValueError("a plan made in a captured batch must belong to one of its parts")
            s, p = self._static_batch, self._static_part
            values = DevicePlan(s.positions[p:p + 1], s.rows[p:p + 1], *geometry_of(plan), NO_TREE, None, None, 0)
            plan.device_values = values
            return values
        if self._static is not None:
            s, a = self._static, plan.attention
            if s.tail is not None:                  # a captured tree verify: its tree is on the device
                shared_end = a.shared_end if a is not None else NO_TREE
                values = DevicePlan(s.positions, s.rows, *geometry_of(plan), shared_end, s.shared_end,
                                    s.tail, s.tail_len)
            else:
                values = DevicePlan(s.positions, s.rows, *geometry_of(plan), NO_TREE, None, None, 0)
            plan.device_values = values
            return values
        n = plan.n_tokens
        window, ring_blocks = geometry_of(plan)
        tail, tail_len, shared_end, shared_end_dev = None, 0, NO_TREE, None
        a = plan.attention
        if a is not None and a.n_tail:
            tail_len = a.n_tail * ATTENTION_BLOCK
            shared_end = a.shared_end
            # one upload: shared_end, then the (T, tail_len) path rows
            both = self._ints(np.concatenate([[shared_end], np.asarray(a.tail_rows).ravel()]))
            shared_end_dev, tail = both[:1], both[1:].reshape(n, tail_len)
        values = DevicePlan(self._ints(plan.positions), self._ints(plan.write_row_ids()), window, ring_blocks,
                            shared_end, shared_end_dev, tail, tail_len)
        plan.device_values = values
        return values

    def embed(self, table, ids):
        return self._embed(table, ids, "tokens")

    def embed_positions(self, table, positions):
        return self._embed(table, positions, "positions")

    def _embed(self, table, ids, name: str):
        """name: which of a captured step's inputs the ids are (its tokens or its positions)."""
        ids = np.asarray(ids)
        out = self._empty((ids.shape[0], table.shape[1]))
        static = self._static_batch if self._static_batch is not None else self._static
        if static is not None:
            device_ids = getattr(static, name)
            if device_ids.shape[0] != ids.shape[0]:
                raise ValueError(f"a captured step of {device_ids.shape[0]} rows cannot embed {ids.shape[0]}")
        else:
            device_ids = self._ints(ids)
        return elementwise.embed(self._module("elementwise"), table, device_ids, out)

    def norm_linear(self, h, norm, norm_weight, norm_bias, eps, weight, exact, gelu=False, kv=None):
        # the bulk kernels take no norm; the tensor-core rows take it for up to MMA_NORM_FOLD_MAX_ROWS
        # rows (the same bits either way: which launches compute them is a question of speed)
        if not exact or (self.mma_rows and h.shape[0] > linear.MMA_NORM_FOLD_MAX_ROWS):
            if kv is None or gelu:
                return super().norm_linear(h, norm, norm_weight, norm_bias, eps, weight, exact, gelu, kv)
            # the norm kernel first, the KV write still inside the linear (the qkv call)
            x = (self.rms_norm(h, norm_weight, eps, True) if norm == "rmsnorm"
                 else self.layer_norm(h, norm_weight, norm_bias, eps, True))
            return self.linear(x, weight, exact, kv=kv)
        return self.linear(h, weight, exact, activation="gelu" if gelu else None,
                           norm=self._norm_fold(norm, norm_weight, norm_bias, eps), kv=kv)

    def _norm_fold(self, norm, norm_weight, norm_bias, eps) -> linear.NormFold:
        """The model's pre-norm ("rmsnorm" or "layernorm") as the rows kernels stage it, rounded to
        half where the norm kernel's output would be (fp16 activations)."""
        return linear.NormFold("rms" if norm == "rmsnorm" else "layer", norm_weight,
                               None if norm == "rmsnorm" else norm_bias, eps, self.linear_input_dtype == np.float16)

    def residual_norm_linear(self, x, projection, h, norm, norm_weight, norm_bias, eps, weight, exact, gelu=False):
        if self.mma_rows or not (exact and self.fuses_pair and linear.pair_supported(projection, weight)):
            return super().residual_norm_linear(x, projection, h, norm, norm_weight, norm_bias, eps, weight, exact,
                                                gelu)
        h2 = self._empty((x.shape[0], projection.out_features), np.float32)
        out = self._empty((x.shape[0], weight.out_features), self.linear_input_dtype if gelu else np.float32)
        fold = self._norm_fold(norm, norm_weight, norm_bias, eps)
        chain = self._kept("pair counters", linear.PAIR_COUNTERS, np.uint32, zeros=True)
        return linear.linear_pair(self._module("linear_pair"), linear.PairCall(x, projection, h2, residual=h),
                                  linear.PairCall(h2, weight, out, activation="gelu" if gelu else None, norm=fold),
                                  chain, self.column_block_cap)

    def kv_fold(self, parts, holder, rope, k_offset, v_offset):
        storage = parts[0][2]
        if not self.fuses_kv_write or storage.head_dim > kv.KV_FOLD_MAX_HD:
            return None                      # larger heads keep kv_write
        n_rows = max(stop for _, stop, *_ in parts)
        counters = self._kept("kv fold counters", n_rows * storage.n_kv, np.uint32, 4096, zeros=True)
        if len(parts) == 1:                                     # kv_write's arguments
            _, _, storage, slot, plan = parts[0]
            if self._static_batch is None:
                return kv.kv_fold(storage, slot, self.device_plan(plan).write_rows, k_offset, v_offset, counters,
                                  plan.rotation if rope else None)
            holder = plan.prepared          # a captured batch of one: kv_write's holder
        layout = self._batch_layout(parts, holder)              # kv_write_parts'
        if layout is None:
            return None
        return kv.kv_fold(storage, 0, layout.rows, k_offset, v_offset, counters,
                          self._stacked_rotation(layout, parts) if rope else None,
                          tables=layout.tables([slot for _, _, _, slot, _ in parts]))

    def linear(self, x, weight, exact: bool, residual=None, activation=None, norm=None, kv=None):
        # with an activation (the MLP's up projection) the output is the down projection's
        # input: half under fp16 activations, as the separate activation kernel would write it
        out = self._empty((x.shape[0], weight.out_features),
                          self.linear_input_dtype if activation else np.float32)
        # prefill with fp16 activations: tensor cores where the device has them (the launcher
        # still sends short calls to the row kernels)
        tensor_cores = not exact and x.dtype == np.float16 and self.tensor_cores
        return linear.linear(self._module("linear"), x, weight, out, exact,
                             self._module("linear_tc") if tensor_cores else None, residual, activation,
                             self._mma() if exact and self.mma_rows else None, self.column_block_cap, norm, kv)

    def _mma(self) -> MmaPath:
        """What linear_mma needs, made on first use: its module, its split partials and its
        counters (zeros that every launch leaves zero), each one buffer for every launch."""
        if self._mma_path is None:
            self._mma_path = MmaPath(self._module("linear_mma"),
                                     lambda n: self._kept("mma partials", n, np.float32, 1 << 16)[:n],
                                     lambda n: self._kept("mma counters", n, np.uint32, 4096, zeros=True)[:n])
        return self._mma_path

    def _kept(self, name: str, n: int, dtype, floor: int = 0, zeros: bool = False):
        """Scratch `name` of at least n elements (max(n, floor) when made): one buffer reused by
        every launch (one stream orders them) and recorded by captured graphs, so a buffer that
        grows is replaced and the old one kept alive (sizes only grow: a request retires a few
        at most). zeros: made zero (counters, which every launch leaves zero)."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < n:
            if buffer is not None:
                self._retired_scratch.append(buffer)
            buffer = self._buffers[name] = (self.xp.zeros if zeros else self.xp.empty)(max(n, floor), dtype)
        return buffer

    def _norm_out(self, shape, feeds_linear: bool):
        return self._empty(shape, self.linear_input_dtype if feeds_linear else np.float32)

    def rms_norm(self, x, weight, eps, feeds_linear=False):
        return elementwise.rms_norm(self._module("elementwise"), x, weight, eps,
                                    self._norm_out(x.shape, feeds_linear))

    def layer_norm(self, x, weight, bias, eps, feeds_linear=False):
        return elementwise.layer_norm(self._module("elementwise"), x, weight, bias, eps,
                                      self._norm_out(x.shape, feeds_linear))

    def rope(self, x, plan):
        """Rotates x in place (a view of the fused qkv output) and returns it."""
        return elementwise.rope(self._module("elementwise"), x, plan.rotation)

    def swiglu(self, up, ffn_dim):
        up = self.xp.ascontiguousarray(up)
        return elementwise.swiglu(self._module("elementwise"), up,
                                  self._empty((up.shape[0], ffn_dim), self.linear_input_dtype))

    def swiglu_linear(self, up, ffn_dim, weight, exact, residual=None):
        if self.mma_rows or not (exact and self.fuses_swiglu and linear.swiglu_fold_supported(weight)):
            # the bulk and tensor-core kernels take no fold, nor the float32-scale rows kernels
            return super().swiglu_linear(up, ffn_dim, weight, exact, residual)
        fold = linear.NormFold("swiglu", None, None, 0.0, self.linear_input_dtype == np.float16)
        return self.linear(up, weight, exact, residual=residual, norm=fold)   # cuda/linear.cu LIN_STAGE_SWIGLU

    def linear_gelu(self, x, weight, exact: bool):
        return self.linear(x, weight, exact, activation="gelu")          # fused: cuda/linear_kinds.cuh

    def gelu(self, x):
        x = self.xp.ascontiguousarray(x)
        return elementwise.gelu(self._module("elementwise"), x, self._empty(x.shape, self.linear_input_dtype))

    # -- the KV cache --------------------------------------------------------------------------
    def kv_pool(self, mode, n_kv, rows, head_dim) -> DeviceKV:
        return DeviceKV.allocate(mode, n_kv, rows, head_dim, self.xp)

    def kv_init_blocks(self, pool_storage, blocks) -> None:
        """Nothing: the attention kernel never reads a row no query of its launch may see (the
        stager skips rows past the highest position and before the lowest among the queries it
        serves, all of one cache, whose rows below them are written), and each query masks the
        rows it may not see, so what a block held before cannot reach a new holder's results."""

    def kv_view(self, pool_storage: DeviceKV, table) -> DeviceView:
        return DeviceView(pool_storage, table, self.xp.zeros(table.shape, np.int32), self.device.upload_ints)

    def kv_table_changed(self, storage: DeviceView) -> None:
        storage.sync()

    def kv_pool_bytes(self) -> int | None:
        return getattr(self.device, "kv_pool_bytes", lambda: None)()

    @staticmethod
    def kv_bytes_per_row(mode, n_kv, head_dim) -> int:
        """The packed layout; needs no device, so `tinyloop info --device cuda` sizes without a GPU."""
        return packed_bytes_per_row(mode, n_kv, head_dim)

    def kv_write(self, storage: DeviceView, slot, plan, keys, values, rope=False):
        if self._static_batch is not None:   # a captured batch (of one): every table from its inputs
            return self.kv_write_parts(keys, values, [(0, keys.shape[0], storage, slot, plan)], plan.prepared, rope)
        kv.kv_write(self._module("kv"), storage, slot, self.device_plan(plan).write_rows, keys, values,
                    plan.rotation if rope else None)

    def attention(self, q, storage: DeviceView, slot, plan, scale, rope=False):
        if self._static_batch is not None:
            return self.attention_parts(q, [(0, q.shape[0], storage, slot, plan)], scale, plan.prepared, rope)
        d = self.device_plan(plan)
        out = self._empty(q.shape)
        scratch = counters = None            # a prefill's partials: the launcher sizes them, two launches
        chunks = attention_launch.max_chunks(storage.rows, d.window, d.ring_blocks, d.shared_end, d.tail_len)
        if q.shape[0] <= MAX_FORWARD_ROWS:   # decode, verify, trees: one launch, pass 1 merges
            scratch = self._scratch(attention_launch.scratch_floats(q.shape[0], q.shape[1], q.shape[2], chunks))
            counters = self._counters(q.shape[0] * storage.n_kv, storage.n_kv)
        return attention_launch.attention(self._module("attention"), storage, q, slot, d.positions, d.window,
                                          d.ring_blocks, d.shared_end_dev, d.tail_rows, d.tail_len, scale, out,
                                          scratch=scratch, chunks=chunks, counters=counters,
                                          rotation=plan.rotation if rope else None)

    # -- several caches in one launch (batch.py) ------------------------------------------------
    def kv_write_parts(self, keys, values, parts: list, holder: dict, rope: bool = False) -> None:
        layout = self._batch_layout(parts, holder)
        if layout is None:
            return super().kv_write_parts(keys, values, parts, holder, rope)
        kv.kv_write(self._module("kv"), parts[0][2], 0, layout.rows, keys, values,
                    self._stacked_rotation(layout, parts) if rope else None,
                    tables=layout.tables([slot for _, _, _, slot, _ in parts]))

    def attention_parts(self, q, parts: list, scale: float, holder: dict, rope: bool = False):
        # a part of several rows (a prefill chunk, a verify) keeps its own launch, whose blocks
        # serve up to 16 of its queries each; per-token tables serve one query a block
        several = any(stop - start > 1 for start, stop, *_ in parts)
        layout = None if several and self._static_batch is None else self._batch_layout(parts, holder)
        if layout is None:
            return super().attention_parts(q, parts, scale, holder, rope)
        storage = parts[0][2]
        out = self._empty(q.shape)
        chunks = attention_launch.max_chunks(layout.rows_per_slot, layout.window, layout.ring_blocks)
        scratch = counters = None
        if q.shape[0] <= MAX_FORWARD_ROWS:
            scratch = self._scratch(attention_launch.scratch_floats(q.shape[0], q.shape[1], q.shape[2], chunks))
            counters = self._counters(q.shape[0] * storage.n_kv, storage.n_kv)
        return attention_launch.attention(self._module("attention"), storage, q, 0, layout.positions, layout.window,
                                          layout.ring_blocks, None, None, 0, scale, out, scratch=scratch,
                                          chunks=chunks, counters=counters,
                                          rotation=self._stacked_rotation(layout, parts) if rope else None,
                                          tables=layout.tables([slot for _, _, _, slot, _ in parts]))

    def _batch_layout(self, parts: list, holder: dict) -> BatchLayout | None:
        """The stacked rows of these parts (batch.py), made once per forward; None: launch each
        part on its own."""
        key = ("batch layout", tuple(id(plan) for *_, plan in parts))
        if key in holder:                           # asked by the KV write and attention of every layer
            return holder[key]
        if not batchable(parts, alone=self._static_batch is not None):
            if self._static_batch is not None:      # kv_write / attention would come back here
                raise ValueError("a captured batch's layer call cannot be launched part by part")
            layout = None
        elif self._static_batch is not None:
            layout = self._static_batch.layout(len(parts))
        else:
            layout = build_layout(parts, self._ints)
        holder[key] = layout
        return layout

    def _stacked_rotation(self, layout: BatchLayout, parts: list):
        """Every part's RoPE rows (T, hd/2), stacked once per layout."""
        if layout.rotation is None:
            layout.rotation = self.xp.ascontiguousarray(concat_rows([plan.rotation for *_, plan in parts]))
        return layout.rotation

    def _counters(self, n: int, n_kv: int):
        """The fused merge's counters: MAX_FORWARD_ROWS x the most kv heads seen at least, so a
        model's steps never outgrow them."""
        return self._kept("attention counters", n, np.uint32, MAX_FORWARD_ROWS * n_kv, zeros=True)

    def _scratch(self, n_floats: int):
        """The chunk partials of a step's attention (allocated before a graph captures them, in
        the warm-up step)."""
        return self._kept("attention partials", n_floats, np.float32)[:n_floats]

    def kv_copy_rows(self, storage: DeviceView, source, target):
        source, target = np.asarray(source), np.asarray(target)
        if not source.size:
            return
        source, target = storage.pool_rows(source), storage.pool_rows(target)     # every slot's
        scratch = self.xp.empty(storage.pool.scratch_bytes(source.shape[0]), np.uint8)
        kv.copy_rows(self._module("kv"), storage.pool.arrays(), self._ints(source), self._ints(target), scratch)

    def kv_stored(self, storage: DeviceView, rows) -> dict:
        """The stored arrays of physical rows on the host, (n_slots, n_kv, n, ...); fp16 widened
        to float32 as the NumPy backend keeps it (without its column of ones), so tests compare
        caches directly."""
        if isinstance(rows, slice):
            rows = np.arange(rows.start, rows.stop)
        rows = np.asarray(rows).reshape(-1)
        index = self._ints(storage.pool_rows(rows))
        out = {}
        for side, arrays in (("keys", storage.keys), ("values", storage.values)):
            for name, array in arrays.items():
                host = self.to_host(array[:, index])                                    # (n_kv, slots * n, ..)
                host = host.reshape(host.shape[0], storage.n_slots, rows.size, *host.shape[2:]).swapaxes(0, 1)
                out[f"{side}.{name}"] = host.astype(np.float32) if name == "data" else host
        return out

    # -- sampling support ----------------------------------------------------------------------
    def argmax(self, logits) -> np.ndarray:
        known = self.graph_argmax.lookup(logits)          # a replayed graph's logits: its ids came along
        if known is not None:
            return known
        ids = self.xp.empty(logits.shape[0], np.int32)
        return self.to_host(self.argmax_into(logits, ids))

    def argmax_into(self, logits, ids):
        """ids (T,) int32 on the device <- each row's argmax (graphs.py records it after the head)."""
        return sampling.argmax(self._module("sampling"), self.xp.ascontiguousarray(logits), ids)

    def top_k(self, logits, k):
        logits = self.xp.ascontiguousarray(logits)
        rows, vocab = logits.shape
        if not 1 <= k <= min(vocab - 1, TOPK_MAX):
            # every id (k 0 or >= V) or more than the kernel's bound: the CPU backend's way, on the host
            host = [np.asarray(row, np.float64) for row in self.to_host(logits)]
            ids = np.stack([top_k_ids(row, k)[:k] for row in host])
            values = np.stack([row[i] for row, i in zip(host, ids)])
            return ids, values, np.array([log_normalizer(row) for row in host])
        module = self._module("sampling")
        ids, values = self.xp.empty((rows, k), np.int32), self.xp.empty((rows, k), np.float32)
        sampling.top_k(module, logits, k, ids, values)
        normalizers = sampling.logsumexp(module, logits, self.xp.empty(rows, np.float64))
        return (self.to_host(ids).astype(np.int64), self.to_host(values).astype(np.float64),
                self.to_host(normalizers))
