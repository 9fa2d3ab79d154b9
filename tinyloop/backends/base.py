"""The seam between the model and the hardware: a Backend owns its kernels.

The model (model/transformer.py) and the engine call these methods and nothing else
of an array library: a backend is NumPy on the CPU (backends/reference/), CuPy with CUDA
RawKernels on a GPU. Arrays passed in and out are the backend's own ("device")
arrays; the model only slices, reshapes and adds them.

What a backend decides for itself: how a linear weight is held (dense float32 on the
CPU; packed codes, scales, mins and the act-order permutation on a GPU), how the KV
cache is stored (codes, scales and mins; the int4-h rotation), how attention reads that
storage (never a float copy of the whole cache in this interface), and how greedy and
top-k candidates are found (so a step moves ids or K candidates to the host, not a
whole vocabulary of logits).

Exactness (ops doc in backends/reference/__init__.py): on the exact path a row's result must
not depend on how many rows share a call or where they came from. Every backend
states how its kernels guarantee that.
"""
from __future__ import annotations

import abc

import numpy as np

from tinyloop.errors import TinyLoopError

# The dtype of a linear layer's input (`TINYLOOP_ACTIVATIONS`): fp32, or fp16 (the norms
# feeding a linear and the MLP activation round their outputs to half; the residual stream,
# attention, the KV write and every sum stay float32).
ACTIVATIONS = ("fp32", "fp16")


def check_activations(value: str) -> str:
    value = value.lower()
    if value not in ACTIVATIONS:
        raise TinyLoopError(f"TINYLOOP_ACTIVATIONS must be one of {', '.join(ACTIVATIONS)}, got {value!r}")
    return value


class Backend(abc.ABC):
    name: str                     # "cpu" or "cuda"
    description: str              # which device and why it was chosen (the startup log)
    xp: object                    # the array module (numpy, cupy), for allocation only
    activations: str = "fp32"     # ACTIVATIONS: the dtype of what `linear` is fed
    # True when the bulk (prefill) path gives every row the bits the exact path gives it alone,
    # whatever rows share the call: then a prefill chunk's rows may share a linear call with
    # other requests' rows (model/batch.py), and a row computed in any prefill chunk, or in a
    # decode step, is the same row (what chunked prefill and the prefix cache rely on).
    bulk_is_exact: bool = False
    # RoPE inside kv_write and attention (rope=True; the CUDA backend: one launch fewer a layer);
    # else the model calls rope() on q and k first
    fuses_rope: bool = False
    # the pre-norm inside an exact linear call (norm_linear: the CUDA rows kernels stage norm(h):
    # one launch fewer per norm); else the model calls the norm, then the linear
    fuses_norm: bool = False
    # the KV write inside the exact qkv linear that makes the keys and values (kv_fold, then
    # norm_linear(kv=...): the CUDA rows kernels store each row once its columns are summed: one
    # launch fewer per layer); else the model calls kv_write after the linear
    fuses_kv_write: bool = False
    # the SwiGLU inside the exact down projection that reads it (swiglu_linear: the CUDA rows
    # kernels stage swiglu(up): one launch fewer per layer); else swiglu, then the linear
    fuses_swiglu: bool = False
    # the out projection's residual add and the MLP's norm-linear after it in one launch
    # (residual_norm_linear: the CUDA rows pair, whose second call waits for the first's blocks);
    # else the two calls
    fuses_pair: bool = False

    @property
    def linear_input_dtype(self):
        """What the norms (feeds_linear=True), swiglu and gelu return: float32, or float16
        under fp16 activations. Rounding is per element, so exactness is unaffected."""
        return np.float16 if self.activations == "fp16" else np.float32

    # -- memory ------------------------------------------------------------------------------
    @abc.abstractmethod
    def asarray(self, host: np.ndarray, dtype=None):
        """A host array on the device."""

    @abc.abstractmethod
    def to_host(self, array) -> np.ndarray:
        """A device array on the host."""

    # -- weights, once at load -----------------------------------------------------------------
    @abc.abstractmethod
    def prepare_linear(self, parts: list, bias: np.ndarray | None = None):
        """parts: host weights stored (out, in), each a float array or a QuantizedTensor, fused
        along `out` in order (q|k|v, gate|up); bias: (sum out,) or None. -> a handle that
        `linear` multiplies with. A GPU backend keeps quantized parts packed."""

    @abc.abstractmethod
    def prepare_vector(self, host: np.ndarray | None):
        """A norm weight or bias (or None) as a device vector."""

    @abc.abstractmethod
    def prepare_embedding(self, table) -> object:
        """(vocab or positions, D) table (float or QuantizedTensor) -> a handle `embed` reads."""

    @abc.abstractmethod
    def rope_table(self, max_positions: int, inv_freq: np.ndarray):
        """(max_positions, hd / 2) rotations on the device for the (hd / 2,) float64 frequencies
        the host worked out (positions.model_frequencies: theta and any RoPE scaling);
        `rope_rows` picks a forward's rows."""

    # -- per forward ---------------------------------------------------------------------------
    @abc.abstractmethod
    def rope_rows(self, table, plan):
        """The rotations of the plan's positions (once per forward; a GPU backend reads the
        positions it uploads for the plan's other kernels)."""

    @abc.abstractmethod
    def embed(self, table, ids: np.ndarray):
        """ids: (T,) host ints -> (T, D)."""

    def embed_positions(self, table, positions: np.ndarray):
        """Learned position embeddings: positions (T,) host ints -> (T, D). A backend replaying
        a captured step reads the step's positions here, not its token ids."""
        return self.embed(table, positions)

    @abc.abstractmethod
    def linear(self, x, weight, exact: bool, residual=None):
        """x: (T, in) float32 or float16 -> (T, out) float32 = x @ W (+ bias) (+ residual, a (T, out)
        float32 array: the residual add, fused into the kernel on a GPU; the bits of
        residual + (x @ W + bias)), a float16 x widened exactly. exact: each row's result
        independent of T."""

    @abc.abstractmethod
    def rms_norm(self, x, weight, eps: float, feeds_linear: bool = False):
        """x: (T, D) -> (T, D), float32, or linear_input_dtype when feeds_linear (the output
        is only a linear layer's input)."""

    @abc.abstractmethod
    def layer_norm(self, x, weight, bias, eps: float, feeds_linear: bool = False):
        """x: (T, D) -> (T, D), as rms_norm's."""

    @abc.abstractmethod
    def rope(self, x, plan):
        """x: (T, heads, hd) -> rotated by plan.rotation (interleaved pairs)."""

    @abc.abstractmethod
    def swiglu(self, up, ffn_dim: int):
        """up: (T, 2 ffn) = [gate | up] -> silu(gate) * up, (T, ffn) linear_input_dtype (the down
        projection's input)."""

    @abc.abstractmethod
    def gelu(self, x):
        """GELU, tanh approximation; linear_input_dtype (the down projection's input)."""

    def swiglu_linear(self, up, ffn_dim: int, weight, exact: bool, residual=None):
        """linear(swiglu(up, ffn_dim), weight, exact, residual): the down projection of a SwiGLU
        MLP, the bits of the two calls. Backends with fuses_swiglu do it in one launch for exact
        calls."""
        return self.linear(self.swiglu(up, ffn_dim), weight, exact, residual=residual)

    def linear_gelu(self, x, weight, exact: bool):
        """gelu(linear(x, weight, exact)), the bits of the two calls: a GPU backend fuses the
        activation into the linear's epilogue (one launch fewer per layer)."""
        return self.gelu(self.linear(x, weight, exact))

    def norm_linear(self, h, norm: str, norm_weight, norm_bias, eps: float, weight, exact: bool,
                    gelu: bool = False, kv=None):
        """linear(norm(h)) (norm "rmsnorm" or "layernorm", its output feeding the linear), GELU'd
        where `gelu`: the bits of the separate calls. Backends with fuses_norm do it in one
        launch for exact calls. kv: what kv_fold returned (backends with fuses_kv_write): the
        output's keys and values are also stored in the cache, as kv_write would."""
        if kv is not None:
            raise ValueError(f"the {self.name} backend does not fold the KV write into a linear")
        x = (self.rms_norm(h, norm_weight, eps, True) if norm == "rmsnorm"
             else self.layer_norm(h, norm_weight, norm_bias, eps, True))
        return self.linear_gelu(x, weight, exact) if gelu else self.linear(x, weight, exact)

    def residual_norm_linear(self, x, projection, h, norm: str, norm_weight, norm_bias, eps: float, weight,
                             exact: bool, gelu: bool = False):
        """(h2, y) with h2 = linear(x, projection, exact, residual=h) and y = norm_linear(h2, norm,
        norm_weight, norm_bias, eps, weight, exact, gelu): a sublayer's residual add and the
        norm-linear that opens the next, the bits of the two calls. Backends with fuses_pair do
        it in one launch for exact calls."""
        h2 = self.linear(x, projection, exact, residual=h)
        return h2, self.norm_linear(h2, norm, norm_weight, norm_bias, eps, weight, exact, gelu)

    # -- the KV cache --------------------------------------------------------------------------
    @abc.abstractmethod
    def kv_pool(self, mode: str, n_kv: int, rows: int, head_dim: int):
        """The KV pool's storage (kv/pool.py): `rows` rows (a whole number of 64-row blocks) of
        keys and values for n_kv heads, in this backend's layout for the mode."""

    @abc.abstractmethod
    def kv_init_blocks(self, pool_storage, blocks: np.ndarray) -> None:
        """Make pool blocks (their 64-row ranges) ready for a new holder: what the backend's
        kernels need of rows that held an earlier request's keys (nothing, for kernels that
        never read a row a query may not see)."""

    @abc.abstractmethod
    def kv_view(self, pool_storage, table: np.ndarray):
        """One cache's storage: the pool seen through its block table, (n_slots, blocks) int32
        host array (kv/cache.py), which the cache changes in place as it grows (then it calls
        kv_table_changed). kv_write, attention, kv_copy_rows and kv_stored take this view, and
        address physical row r of slot s at pool row table[s, r // 64] * 64 + r % 64."""

    def kv_table_changed(self, storage) -> None:
        """The view's block table changed (blocks allocated or adopted): a backend that keeps
        a copy of it (on a device) refreshes it here."""

    def kv_pool_bytes(self) -> int | None:
        """The default KV pool size for this backend's memory (a device's), or None: the host rule
        of kv/pool.py."""
        return None

    @abc.abstractmethod
    def kv_bytes_per_row(self, mode: str, n_kv: int, head_dim: int) -> int:
        """Bytes one token's keys and values together take in this backend's storage."""

    @abc.abstractmethod
    def kv_write(self, storage, slot: int, plan, keys, values, rope: bool = False) -> None:
        """keys, values: (T, n_kv, hd): quantize and store them at plan.write_rows. RoPE applied
        already, or (rope=True, backends with fuses_rope) applied here from plan.rotation, the
        keys left rotated in place as rope() would leave them."""

    @abc.abstractmethod
    def attention(self, q, storage, slot: int, plan, scale: float, rope: bool = False):
        """q: (T, H, hd) -> (T, H, hd), reading the storage directly as the plan says. rope=True
        (backends with fuses_rope): q is rotated by plan.rotation first (q itself unchanged)."""

    def kv_fold(self, parts: list, holder: dict, rope: bool, k_offset: int, v_offset: int):
        """What norm_linear(kv=...) needs to store the keys and values of its output (columns
        [k_offset, + kv dim) and [v_offset, + kv dim)) as kv_write_parts(keys, values, parts,
        holder, rope) would, or None where the write keeps its own call. Backends with
        fuses_kv_write only."""
        return None

    def kv_write_parts(self, keys, values, parts: list, holder: dict, rope: bool = False) -> None:
        """kv_write for several caches' rows of one layer call: parts [(start, stop, storage, slot,
        plan)] own rows [start, stop) of keys and values (T, n_kv, hd). holder: a dict the
        forward's layers share (what a backend works out once). By default one call per part."""
        for start, stop, storage, slot, plan in parts:
            self.kv_write(storage, slot, plan, keys[start:stop], values[start:stop], rope)

    def attention_parts(self, q, parts: list, scale: float, holder: dict, rope: bool = False):
        """attention for several caches' queries of one layer call (parts as kv_write_parts'):
        -> (T, H, hd), each query's bits those of attention() over its own cache alone. By
        default one call per part."""
        outputs = [self.attention(q[start:stop], storage, slot, plan, scale, rope)
                   for start, stop, storage, slot, plan in parts]
        return outputs[0] if len(outputs) == 1 else self.xp.concatenate(outputs)

    @staticmethod
    def _refuse_fused_rope(rope: bool) -> None:
        if rope:
            raise ValueError("this backend does not fuse RoPE into the KV write and attention "
                             "(fuses_rope is False): rotate with rope() first")

    @abc.abstractmethod
    def kv_copy_rows(self, storage, source: np.ndarray, target: np.ndarray) -> None:
        """Copy physical rows source[i] -> target[i] in every slot, keys and values (one
        gather/scatter: moving a round's accepted tree nodes to their positions); every
        source is read before any target is written."""

    @abc.abstractmethod
    def kv_stored(self, storage, rows) -> dict:
        """Raw stored arrays of physical rows in every slot, on the host (for tests): name ->
        (n_slots, n_kv, len(rows), ...)."""

    def decode_runner(self, model, cache, loops):
        """A callable (token, position) -> logits (1, V) that runs one decode step faster
        than model.forward (a captured CUDA graph), or None: the model then runs forward."""
        return None

    def batch_decode_runner(self, model, passes: list):
        """A callable (passes) that runs several requests' plain decode passes (model/batch.py)
        faster than run_passes' eager forward (a CUDA graph per batch-size bucket) and sets
        each pass's logits and iterations_run, or None: run_passes runs them."""
        return None

    def draft_runner(self, model, cache, loops, coda_base, n_rows, tree, head=True):
        """A faster speculative draft level, callable as (tokens, positions, write_row, tree_rows)
        -> (logits (T, V), or None without the head, Trunk) with model.draft_pass's results bit
        for bit, or None (run it as usual). The CUDA backend replays a captured graph per node
        count."""
        return None

    def verify_runner(self, model, cache, from_iterations, loops, coda_base, n_rows, tree):
        """A callable (trunk, positions, write_row, tree_rows) -> logits (T, V) that runs
        model.verify_pass for n_rows draft nodes faster (a captured CUDA graph), or None."""
        return None

    # -- sampling support ----------------------------------------------------------------------
    @abc.abstractmethod
    def argmax(self, logits) -> np.ndarray:
        """logits: (T, V) -> (T,) host ints, the lowest id on ties."""

    @abc.abstractmethod
    def top_k(self, logits, k: int) -> tuple:
        """logits: (T, V) -> host (ids (T, k) best first with ties to the lower id,
        values (T, k) float64, logsumexp (T,) float64)."""
