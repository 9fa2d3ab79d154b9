"""The weight-shared looped transformer: one forward for prefill, decode, draft and verify.

    e = prelude layers (once) of embed(tokens) * embed_scale (+ learned positions)
    s = e, or seeded noise (initial_state)
    repeat loops times: s = core layers (shared weights) of     [input injection:
        s, s + e (after the first), or adapter([s | e])          none, add, concat]
        (final_norm between iterations with loop_norm "between")
    h = coda layers (once) of s (final_norm first with loop_norm "after")
    logits = head(final_norm(h))

A layer is pre-norm, h + f(norm(h)), or a sandwich (post_norm): h + norm2(f(norm(h)))
("branch") or norm2(h + f(norm(h))) ("sum"), for attention and the MLP each.

Every executed layer instance owns one KV cache slot: prelude i -> i, core layer c at
iteration l -> P + l*C + c, coda layer q -> coda_base + q (P + C*loops by default).
A core slot does not depend on the total loop count, so a draft at few loops and a
verify at more loops share the prelude and the first draft_loops iterations' slots.

All arithmetic goes through self.backend (backends/base.py); a forward's positions,
rows, masks and rotations are worked out once, in its plan (model/plan.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyloop.backends.reference.positions import model_frequencies
from tinyloop.kv.cache import KVCache, cache_bytes, physical_rows_needed
from tinyloop.limits import ATTENTION_BLOCK, MAX_FORWARD_ROWS
from tinyloop.model.config import ModelConfig
from tinyloop.model.plan import ForwardPlan, LayerPart, Rows, StepBuffers, TreeRows, build_plan
from tinyloop.model.state import initial_state
from tinyloop.model.weights import LayerWeights, ModelWeights


@dataclass
class Trunk:
    """Hidden states after the prelude and some core iterations, to resume later."""
    hidden: object          # (T, D) after `iterations` core iterations
    injected: object        # (T, D) the prelude output (input injection)
    iterations: int


class LoopedTransformer:
    def __init__(self, config: ModelConfig, weights: ModelWeights, backend, kv_mode: str = "fp16"):
        self.config = config
        self.weights = weights
        self.backend = backend
        self.kv_mode = kv_mode          # how every request's KV cache stores keys and values
        self.scale = 1.0 / float(np.sqrt(config.head_dim))
        self.rope = (backend.rope_table(config.max_seq_len, model_frequencies(config))
                     if config.positions == "rope" else None)
        self.buffers = StepBuffers()    # per-step inputs of the exact path

    # -- cache bookkeeping ------------------------------------------------------------
    def new_cache(self, capacity: int, loops: int, extra_slots: int = 0, window: int = 0, pool=None) -> KVCache:
        """pool: the engine's KV pool (kv/pool.py) the cache reserves its blocks in; None: its own."""
        c = self.config
        return KVCache(self.backend, c.n_layer_instances(loops) + extra_slots, c.n_kv_heads, c.head_dim,
                       capacity, self.kv_mode, window, pool=pool)

    def cache_blocks(self, capacity: int, loops: int, extra_slots: int = 0, window: int = 0) -> int:
        """Pool blocks a cache of this shape reserves: its slots times its 64-row blocks per slot."""
        slots = self.config.n_layer_instances(loops) + extra_slots
        return slots * (physical_rows_needed(capacity, window) // ATTENTION_BLOCK)

    def cache_bytes(self, capacity: int, loops: int, extra_slots: int = 0, window: int = 0) -> int:
        c = self.config
        return cache_bytes(self.backend, c.n_layer_instances(loops) + extra_slots, c.n_kv_heads, c.head_dim,
                           capacity, self.kv_mode, window)

    def worst_case_cache_bytes(self) -> int:
        """The largest cache a request can need: full context at max loops, speculative slots included."""
        c = self.config
        return self.cache_bytes(c.max_seq_len + MAX_FORWARD_ROWS, c.max_loops, c.n_coda)

    def core_slot(self, iteration: int, index: int) -> int:
        return self.config.n_prelude + iteration * self.config.n_core + index

    def coda_base(self, loops: int) -> int:
        return self.config.n_prelude + self.config.n_core * loops

    # -- the plan of a forward ----------------------------------------------------------
    def plan(self, positions, write_row: int, cache: KVCache, exact: bool = True,
             tree: TreeRows | None = None, step_buffers: bool = True, allocate: bool = True) -> ForwardPlan:
        """Where T new tokens at `positions` go (consecutive virtual rows from write_row),
        what their queries read, and their RoPE rotations: once per forward. The cache takes
        pool blocks for the rows written. step_buffers: the exact plan's arrays are views of
        the model's StepBuffers (what a captured GPU step reads); False: arrays of its own
        (several plans alive at once: model/batch.py). allocate=False: the caller has taken the
        blocks (a captured step, whose recorded plan must not allocate again)."""
        positions = np.asarray(positions, np.int64)
        cache.check_rows(write_row, positions.shape[0])
        if allocate:
            cache.ensure_rows(write_row, positions.shape[0])
        plan = build_plan(positions, write_row, cache.geometry, exact, tree,
                          buffers=self.buffers if step_buffers else None)
        if self.rope is not None:
            plan.rotation = self.backend.rope_rows(self.rope, plan)
        return plan

    def contiguous_plan(self, start: int, count: int, cache: KVCache, exact: bool = True) -> ForwardPlan:
        return self.plan(np.arange(start, start + count), start, cache, exact)

    # -- one layer ----------------------------------------------------------------------
    def layer(self, weights: LayerWeights, h, plan: ForwardPlan, cache: KVCache, slot: int, capture=None,
              kept=None):
        """One transformer layer over one cache's rows; writes this instance's keys/values. h: (T, D).

        capture(name, x), if given, sees the input of each linear: "qkv", "out", "up",
        "down" (the quantizer's calibration hook). kept, a list, receives (keys, values)
        as written (adaptive depth copies them into the slots of skipped iterations)."""
        return self.layer_rows(weights, h, Rows([(0, h.shape[0], LayerPart(plan, cache, kept))]), [slot], capture)

    def layer_rows(self, weights: LayerWeights, h, rows: Rows, slots: list, capture=None):
        """One transformer layer over the stacked rows of several caches (model/batch.py): every
        operation but the KV write and attention runs on all rows at once; those two run per
        part, at its slot (slots[i] for rows.parts[i]) of its cache, through its plan. h: (T, D)."""
        c, b = self.config, self.backend
        n_tokens = h.shape[0]
        # RoPE: inside the KV write (keys) and attention (queries) where the backend fuses it,
        # else queries and keys in one go first; either way the KV write leaves k rotated
        has_rope = rows.parts[0][2].plan.rotation is not None              # (rows.rotation would stack them)
        fused_rope = has_rope and b.fuses_rope
        parts = [(start, stop, part.cache.storage, slot, part.plan)
                 for (start, stop, part), slot in zip(rows.parts, slots)]
        # the KV write inside the qkv call where the backend folds it (after RoPE, so only with
        # RoPE fused or none): the call stores k and v as kv_write would
        kv_fold = None
        if b.fuses_kv_write and has_rope == fused_rope and self._fuses_norm_call(rows, capture):
            kv_fold = b.kv_fold(parts, rows.prepared, fused_rope, c.q_dim, c.q_dim + c.kv_dim)
        qkv = self.norm_linear_rows(h, weights.attn_norm, weights.qkv, rows, capture, "qkv",
                                    kv=kv_fold)                        # (T, q + 2 kv)
        qk = qkv[:, :c.q_dim + c.kv_dim].reshape(n_tokens, c.n_heads + c.n_kv_heads, c.head_dim)
        if has_rope and not fused_rope:
            qk = b.rope(qk, rows)
        q, k = qk[:, :c.n_heads], qk[:, c.n_heads:]
        v = qkv[:, c.q_dim + c.kv_dim:].reshape(n_tokens, c.n_kv_heads, c.head_dim)
        if len(rows.parts) == 1:                                           # one cache: the plain calls
            (_, _, part), slot = rows.parts[0], slots[0]
            if kv_fold is None:
                b.kv_write(part.cache.storage, slot, part.plan, k, v, fused_rope)
            attn = b.attention(q, part.cache.storage, slot, part.plan, self.scale, fused_rope)
        else:                                                              # each part on its own cache
            if kv_fold is None:
                b.kv_write_parts(k, v, parts, rows.prepared, fused_rope)
            attn = b.attention_parts(q, parts, self.scale, rows.prepared, fused_rope)
        for start, stop, part in rows.parts:
            if part.kept is not None:
                part.kept.append((k[start:stop], v[start:stop]))
        attn = attn.reshape(n_tokens, c.q_dim)
        if capture:
            capture("out", attn)
        gelu = c.mlp != "swiglu"                                           # GELU in the up projection's call
        if self._fuses_pair_call(rows, capture):     # h + out(attn) and the MLP's norm-linear in one launch
            weight_n, bias_n = weights.mlp_norm
            h, up = b.residual_norm_linear(attn, weights.out, h, c.norm, weight_n, bias_n, c.norm_eps, weights.up,
                                           True, gelu)
        else:
            h = self._residual(h, attn, weights.out, weights.attn_post_norm, rows)
            up = self.norm_linear_rows(h, weights.mlp_norm, weights.up, rows, capture, "up", gelu=gelu)

        if gelu:
            act = up
        else:                                                              # up: (T, 2 ffn) = [gate | up]
            if self._fuses_swiglu_call(rows, capture):      # h + down(swiglu(up)) in one launch
                return b.swiglu_linear(up, c.ffn_dim, weights.down, True, residual=h)
            act = b.swiglu(up, c.ffn_dim)
        if capture:
            capture("down", act)
        return self._residual(h, act, weights.down, weights.mlp_post_norm, rows)

    def linear_rows(self, x, weight, rows: Rows, residual=None, gelu: bool = False):
        """x (T, in) @ weight for stacked rows: one call where the backend gives every row its
        exact-path bits in any company (backend.bulk_is_exact, or every part exact); else the
        exact parts' rows together and each bulk (prefill) part on its own, as a forward of
        its own would run them. gelu: GELU of the result (backend.linear_gelu; no residual)."""
        b = self.backend
        if gelu and residual is not None:
            raise ValueError("a GELU linear takes no residual (the MLP's up projection has none)")

        def call(x, exact, residual):
            return b.linear_gelu(x, weight, exact) if gelu else b.linear(x, weight, exact, residual=residual)
        groups = rows.linear_groups(b.bulk_is_exact)
        if len(groups) == 1:
            return call(x, groups[0][0], residual)
        pieces = [None] * len(rows.parts)
        for exact, members in groups:
            xs = [x[rows.parts[i][0]:rows.parts[i][1]] for i in members]
            res = None if residual is None else [residual[rows.parts[i][0]:rows.parts[i][1]] for i in members]
            out = call(xs[0] if len(xs) == 1 else b.xp.concatenate(xs), exact,
                       None if res is None else res[0] if len(res) == 1 else b.xp.concatenate(res))
            start = 0
            for i, piece in zip(members, xs):
                pieces[i] = out[start:start + piece.shape[0]]
                start += piece.shape[0]
        return b.xp.concatenate(pieces)

    def _fuses_norm_call(self, rows: Rows, capture=None) -> bool:
        """Whether norm_linear_rows makes one fused backend call for these rows."""
        return self.backend.fuses_norm and self._one_exact_call(rows, capture)

    def _one_exact_call(self, rows: Rows, capture=None) -> bool:
        """Whether these rows' linears are one exact backend call, with no capture of its input
        (the quantizer's hook): what every fold into a linear needs."""
        groups = rows.linear_groups(self.backend.bulk_is_exact)
        return not capture and len(groups) == 1 and groups[0][0]

    def _fuses_swiglu_call(self, rows: Rows, capture=None) -> bool:
        """Whether the down projection takes the SwiGLU inside one exact call (fuses_swiglu), its
        residual add with it: no sandwich norm after it, no capture of its input (the quantizer)."""
        return self.backend.fuses_swiglu and self._one_exact_call(rows, capture) and self._residual_in_linear()

    def _fuses_pair_call(self, rows: Rows, capture=None) -> bool:
        """Whether the out projection's residual add and the MLP's norm-linear are one backend call
        (fuses_pair): both fused calls one exact call, no sandwich norm between them."""
        return self.backend.fuses_pair and self._fuses_norm_call(rows, capture) and self._residual_in_linear()

    def _residual_in_linear(self) -> bool:
        """Whether a sublayer's residual add goes into its projection's call (_residual): no
        sandwich norm around it."""
        return self.config.post_norm not in ("branch", "sum")

    def norm_linear_rows(self, h, norm_weights, weight, rows: Rows, capture=None, stage: str = "",
                         gelu: bool = False, kv=None):
        """linear_rows(norm(h)): one backend call where the backend fuses the norm into an exact
        linear (fuses_norm) and the rows make one exact call; else the norm, then linear_rows.
        capture (the quantizer's hook) sees the norm's output, so it takes the separate calls.
        kv: the backend's kv_fold for this call (only where the call is fused)."""
        b = self.backend
        if self._fuses_norm_call(rows, capture):
            weight_n, bias_n = norm_weights
            return b.norm_linear(h, self.config.norm, weight_n, bias_n, self.config.norm_eps, weight, True, gelu,
                                 kv=kv)
        if kv is not None:
            raise ValueError("a folded KV write needs the fused norm-linear call")
        x = self._norm(h, norm_weights, feeds_linear=True)
        if capture:
            capture(stage, x)
        return self.linear_rows(x, weight, rows, gelu=gelu)

    def _residual(self, h, x, projection, post_norm, rows: Rows):
        """h + projection(x), with the sandwich norm where the config puts one. Without one,
        the add goes into the linear (fused into its kernel on a GPU: one launch fewer)."""
        mode = self.config.post_norm
        if mode == "branch":
            return h + self._norm(self.linear_rows(x, projection, rows), post_norm)
        if mode == "sum":
            return self._norm(h + self.linear_rows(x, projection, rows), post_norm)
        return self.linear_rows(x, projection, rows, residual=h)

    # -- the pieces of the forward -------------------------------------------------------
    def trunk(self, tokens, plan: ForwardPlan, cache: KVCache, iterations: int, capture=None) -> Trunk:
        """Embed, prelude, and core iterations [0, iterations).

        capture(stage, index, name, x), if given, sees every linear's input (the quantizer)."""
        c = self.config
        ids = self.buffers.hold("tokens", tokens) if plan.exact else np.asarray(tokens)
        h = self.backend.embed(self.weights.embed, ids)                           # (T, D)
        if c.embed_scale != 1.0:
            h = h * np.float32(c.embed_scale)
        if self.weights.pos_embed is not None:
            h = h + self.backend.embed_positions(self.weights.pos_embed, plan.positions)
        for i, weights in enumerate(self.weights.layers["prelude"]):
            h = self.layer(weights, h, plan, cache, i, _bind(capture, "prelude", i))
        state = h
        if c.initial_state == "random":
            state = self.backend.asarray(initial_state(c.state_std, c.state_seed, plan.positions, c.dim))
        return self.resume(Trunk(state, h, 0), plan, cache, iterations, capture)

    def resume(self, trunk: Trunk, plan: ForwardPlan, cache: KVCache, iterations: int, capture=None,
               kept=None) -> Trunk:
        """Continue core iterations from trunk.iterations up to `iterations`. kept, a
        list, receives each core layer's (keys, values) of the last iteration run."""
        h = trunk.hidden
        for iteration in range(trunk.iterations, iterations):
            h = self.enter_iteration(h, trunk.injected, iteration, plan.exact)
            if kept is not None:
                kept.clear()
            for i, weights in enumerate(self.weights.layers["core"]):
                h = self.layer(weights, h, plan, cache, self.core_slot(iteration, i), _bind(capture, "core", i),
                               kept)
        return Trunk(h, trunk.injected, max(iterations, trunk.iterations))

    def enter_iteration(self, h, injected, iteration: int, exact=True):
        """The state an iteration's first core layer reads: the norm between iterations,
        then the input injection. exact: the plan's form, or the Rows of stacked caches."""
        c, b = self.config, self.backend
        if iteration > 0 and c.loop_norm == "between":
            h = self._norm(h, self.weights.final_norm)
        if c.input_injection == "concat":
            w = self.weights
            if isinstance(exact, Rows):
                return self.linear_rows(h, w.adapter_state, exact) + self.linear_rows(injected, w.adapter_input, exact)
            return b.linear(h, w.adapter_state, exact) + b.linear(injected, w.adapter_input, exact)
        if c.input_injection == "add" and iteration > 0:
            return h + injected
        return h

    def exit_lambda(self, h) -> np.ndarray:
        """The early-exit gate after an iteration: sigmoid(gate(final_norm(h))), (T,) on the host."""
        x = self._norm(h, self.weights.final_norm, feeds_linear=True)
        gate = self.backend.to_host(self.backend.linear(x, self.weights.exit_gate, True))[:, 0]
        return 1.0 / (1.0 + np.exp(-gate.astype(np.float64)))

    def coda(self, h, plan: ForwardPlan, cache: KVCache, coda_base: int, capture=None):
        if self.config.loop_norm == "after":
            h = self._norm(h, self.weights.final_norm)
        for i, weights in enumerate(self.weights.layers["coda"]):
            h = self.layer(weights, h, plan, cache, coda_base + i, _bind(capture, "coda", i))
        return h

    def head(self, h, exact: bool = True, rows: Rows | None = None):
        """h: (T, D) -> logits (T, vocab) float32, on the backend. rows: the stacked rows of
        several caches (model/batch.py), whose linear groups decide the calls."""
        if rows is not None:
            return self.norm_linear_rows(h, self.weights.final_norm, self.weights.head, rows)
        if exact and self.backend.fuses_norm:
            weight_n, bias_n = self.weights.final_norm
            return self.backend.norm_linear(h, self.config.norm, weight_n, bias_n, self.config.norm_eps,
                                            self.weights.head, True)
        x = self._norm(h, self.weights.final_norm, feeds_linear=True)
        return self.backend.linear(x, self.weights.head, exact)

    def final_norm(self, h):
        return self._norm(h, self.weights.final_norm)

    # -- the whole forward ---------------------------------------------------------------
    def forward(self, tokens, positions, cache: KVCache, loops: int, *, exact: bool = True,
                last_only: bool = False, coda_base: int | None = None):
        """Run new tokens at consecutive `positions` (rows = positions) through the model.

        tokens, positions: (T,) int. Returns logits (T, vocab), or (1, vocab) for the
        last position with last_only, on the backend. With exact=True the result for
        each position is bitwise independent of T (backends/reference/__init__.py).
        """
        positions = np.asarray(positions, np.int64)
        plan = self.plan(positions, int(positions[0]), cache, exact)
        trunk = self.trunk(tokens, plan, cache, loops)
        base = self.coda_base(loops) if coda_base is None else coda_base
        h = self.coda(trunk.hidden, plan, cache, base)
        if last_only:
            h = h[-1:]
        return self.head(h, exact)

    def decode(self, token: int, position: int, cache: KVCache, loops: int):
        """One token at `position`: forward([token], [position]), through the backend's
        decode runner where it has one (a CUDA graph replayed per token). -> logits (1, V)."""
        # a captured step would freeze the first position's random initial state
        runner = None if self.config.initial_state == "random" else self.backend.decode_runner(self, cache, loops)
        if runner is None:
            return self.forward([token], [position], cache, loops)
        return runner(token, position)

    def draft(self, tokens, positions, write_row: int, tree: TreeRows | None, cache: KVCache, loops: int,
              coda_base: int, head: bool = True):
        """A speculative draft level: T nodes' tokens at `positions` from virtual row write_row
        (tree: their path rows, None for a chain) through `loops` core iterations, the coda at
        coda_base, the head (head=False: the coda only writes its cache rows: the round's last
        level). Through the backend's draft runner where it has one (a CUDA graph per node count).
        -> (logits (T, V) or None, the states after the core iterations: a Trunk)."""
        runner = None if self.config.initial_state == "random" else \
            self.backend.draft_runner(self, cache, loops, coda_base, len(positions), tree is not None, head)
        if runner is None:
            return self.draft_pass(tokens, positions, write_row, tree, cache, loops, coda_base, head)
        return runner(tokens, positions, write_row, tree)

    def draft_pass(self, tokens, positions, write_row: int, tree: TreeRows | None, cache: KVCache, loops: int,
                   coda_base: int, head: bool = True):
        plan = self.plan(positions, write_row, cache, tree=tree)
        trunk = self.resume(self.trunk(tokens, plan, cache, 0), plan, cache, loops)
        hidden = self.coda(trunk.hidden, plan, cache, coda_base)
        return (self.head(hidden) if head else None), trunk

    def verify(self, trunk: Trunk, positions, write_row: int, tree: TreeRows | None, cache: KVCache, loops: int,
               coda_base: int):
        """A speculative verify pass: draft states `trunk` (T, D) at trunk.iterations, for T
        draft nodes at `positions` from virtual row write_row (tree: their path rows, None for a
        chain), resumed to `loops` core iterations, the coda at coda_base, the head. Through
        the backend's verify runner where it has one (a CUDA graph per node count). -> (T, V)."""
        runner = self.backend.verify_runner(self, cache, trunk.iterations, loops, coda_base, len(positions),
                                            tree is not None)
        if runner is None:
            return self.verify_pass(trunk, positions, write_row, tree, cache, loops, coda_base)
        return runner(trunk, positions, write_row, tree)

    def verify_pass(self, trunk: Trunk, positions, write_row: int, tree: TreeRows | None, cache: KVCache,
                    loops: int, coda_base: int):
        plan = self.plan(positions, write_row, cache, tree=tree)
        resumed = self.resume(trunk, plan, cache, loops)
        return self.head(self.coda(resumed.hidden, plan, cache, coda_base))

    def _norm(self, h, norm_weights, feeds_linear: bool = False):
        """feeds_linear: the result is only a linear layer's input (fp16 under fp16 activations)."""
        weight, bias = norm_weights
        if self.config.norm == "rmsnorm":
            return self.backend.rms_norm(h, weight, self.config.norm_eps, feeds_linear)
        return self.backend.layer_norm(h, weight, bias, self.config.norm_eps, feeds_linear)


def _bind(capture, stage: str, index: int):
    """A per-layer view of a model-wide capture hook."""
    if capture is None:
        return None
    return lambda name, x: capture(stage, index, name, x)
