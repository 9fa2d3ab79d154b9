"""The weight-shared looped transformer: one forward for prefill, decode, draft and verify.

    h = embed(tokens) (+ learned positions)
    h = prelude layers (once)
    repeat loops times: h = core layers (shared weights)      [+ input injection]
    h = coda layers (once)
    logits = head(final_norm(h))

Every executed layer instance owns one KV cache slot: prelude i -> i, core layer c at
iteration l -> P + l*C + c, coda layer q -> coda_base + q (P + C*loops by default).
A core slot does not depend on the total loop count, so a draft at few loops and a
verify at more loops share the prelude and the first draft_loops iterations' slots.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyloop.backends import cpu as ops
from tinyloop.model.config import ModelConfig
from tinyloop.kv.cache import KVCache, cache_bytes
from tinyloop.backends.cpu import TreeRows
from tinyloop.model.weights import LayerWeights, ModelWeights


@dataclass
class Span:
    """Where a forward's T new tokens sit.

    positions: (T,) logical positions (RoPE / learned embeddings, causal visibility);
    write_row: the cache row of the first token (the T tokens take consecutive rows);
    tree: for draft-tree nodes, the rows of each node's path (None: row = position).
    """
    positions: np.ndarray
    write_row: int
    tree: TreeRows | None = None

    @classmethod
    def contiguous(cls, start: int, count: int) -> "Span":
        return cls(np.arange(start, start + count), start)


@dataclass
class Trunk:
    """Hidden states after the prelude and some core iterations, to resume later."""
    hidden: object          # (T, D) after `iterations` core iterations
    injected: object        # (T, D) the prelude output (input injection)
    iterations: int


class LoopedTransformer:
    def __init__(self, config: ModelConfig, weights: ModelWeights, xp=np, kv_mode: str = "fp16"):
        self.config = config
        self.weights = weights
        self.xp = xp
        self.kv_mode = kv_mode          # how every request's KV cache stores keys and values
        self.kv_budget_bytes: int | None = None   # refuse requests whose cache would exceed it
        self.scale = 1.0 / float(np.sqrt(config.head_dim))
        if config.positions == "rope":
            # (max_seq, hd/2) complex64
            self.rope = xp.asarray(ops.rope_table(config.max_seq_len, config.head_dim, config.rope_theta))

    def to_host(self, array) -> np.ndarray:
        return array if self.xp is np else self.xp.asnumpy(array)

    # -- cache bookkeeping ------------------------------------------------------------
    def new_cache(self, capacity: int, loops: int, extra_slots: int = 0, window: int = 0) -> KVCache:
        c = self.config
        return KVCache(c.n_layer_instances(loops) + extra_slots, c.n_kv_heads, c.head_dim,
                       capacity, self.kv_mode, window, xp=self.xp)

    def cache_bytes(self, capacity: int, loops: int, extra_slots: int = 0, window: int = 0) -> int:
        c = self.config
        return cache_bytes(c.n_layer_instances(loops) + extra_slots, c.n_kv_heads, c.head_dim, capacity,
                           self.kv_mode, window)

    def core_slot(self, iteration: int, index: int) -> int:
        return self.config.n_prelude + iteration * self.config.n_core + index

    def coda_base(self, loops: int) -> int:
        return self.config.n_prelude + self.config.n_core * loops

    # -- one layer ----------------------------------------------------------------------
    def layer(self, weights: LayerWeights, h, span: Span, cache: KVCache, slot: int, exact: bool,
              capture=None):
        """One pre-norm transformer layer; writes this instance's keys/values. h: (T, D).

        capture(name, x), if given, sees the input of each linear: "qkv", "out", "up",
        "down" (the quantizer's calibration hook)."""
        c = self.config
        n_tokens = h.shape[0]
        x = self._norm(h, weights.attn_norm)
        if capture:
            capture("qkv", x)
        qkv = ops.linear(x, weights.qkv, weights.qkv_bias, exact)          # (T, q_dim + 2 kv_dim)
        q = qkv[:, :c.q_dim].reshape(n_tokens, c.n_heads, c.head_dim)
        k = qkv[:, c.q_dim:c.q_dim + c.kv_dim].reshape(n_tokens, c.n_kv_heads, c.head_dim)
        v = qkv[:, c.q_dim + c.kv_dim:].reshape(n_tokens, c.n_kv_heads, c.head_dim)
        if c.positions == "rope":
            rotation = self.rope[span.positions]                          # (T, hd/2)
            q = ops.apply_rope(q, rotation)
            k = ops.apply_rope(k, rotation)
        cache.write(slot, span.write_row, k, v)
        q = cache.rotate_queries(q)
        if exact:
            attn = ops.attention_exact(q, cache.reader(slot), span.positions, self.scale, span.tree, cache.window)
        else:
            if span.tree is not None:
                raise ValueError("draft trees need the exact attention path")
            attn = ops.attention_bulk(q, cache.reader(slot), span.positions, self.scale, cache.window)
        attn = cache.restore_output(attn).reshape(n_tokens, c.q_dim)
        if capture:
            capture("out", attn)
        h = h + ops.linear(attn, weights.out, weights.out_bias, exact)

        x = self._norm(h, weights.mlp_norm)
        if capture:
            capture("up", x)
        up = ops.linear(x, weights.up, weights.up_bias, exact)              # (T, ffn) or (T, 2 ffn)
        if c.mlp == "swiglu":
            act = ops.silu(up[:, :c.ffn_dim]) * up[:, c.ffn_dim:]
        else:
            act = ops.gelu_tanh(up)
        if capture:
            capture("down", act)
        return h + ops.linear(act, weights.down, weights.down_bias, exact)

    # -- the pieces of the forward -------------------------------------------------------
    def trunk(self, tokens, span: Span, cache: KVCache, iterations: int, exact: bool = True) -> Trunk:
        """Embed, prelude, and core iterations [0, iterations)."""
        tokens = self.xp.asarray(tokens)
        h = self.weights.embed[tokens]                                      # (T, D)
        if self.weights.pos_embed is not None:
            h = h + self.weights.pos_embed[span.positions]
        for i, weights in enumerate(self.weights.layers["prelude"]):
            h = self.layer(weights, h, span, cache, i, exact)
        return self.resume(Trunk(h, h, 0), span, cache, iterations, exact)

    def resume(self, trunk: Trunk, span: Span, cache: KVCache, iterations: int,
               exact: bool = True) -> Trunk:
        """Continue core iterations from trunk.iterations up to `iterations`."""
        h = trunk.hidden
        for iteration in range(trunk.iterations, iterations):
            if iteration > 0 and self.config.input_injection == "add":
                h = h + trunk.injected
            for i, weights in enumerate(self.weights.layers["core"]):
                h = self.layer(weights, h, span, cache, self.core_slot(iteration, i), exact)
        return Trunk(h, trunk.injected, max(iterations, trunk.iterations))

    def coda(self, h, span: Span, cache: KVCache, coda_base: int, exact: bool = True):
        for i, weights in enumerate(self.weights.layers["coda"]):
            h = self.layer(weights, h, span, cache, coda_base + i, exact)
        return h

    def head(self, h, exact: bool = True):
        """h: (T, D) -> logits (T, vocab) float32."""
        x = self._norm(h, self.weights.final_norm)
        return ops.linear(x, self.weights.head, None, exact)

    # -- the whole forward ---------------------------------------------------------------
    def forward(self, tokens, positions, cache: KVCache, loops: int, *, exact: bool = True,
                last_only: bool = False, coda_base: int | None = None):
        """Run new tokens at consecutive `positions` (rows = positions) through the model.

        tokens, positions: (T,) int. Returns logits (T, vocab), or (1, vocab) for the
        last position with last_only. With exact=True the result for each position is
        bitwise independent of T (see ops/__init__.py).
        """
        positions = np.asarray(positions)
        span = Span(positions, int(positions[0]))
        trunk = self.trunk(tokens, span, cache, loops, exact)
        base = self.coda_base(loops) if coda_base is None else coda_base
        h = self.coda(trunk.hidden, span, cache, base, exact)
        if last_only:
            h = h[-1:]
        return self.head(h, exact)

    def _norm(self, h, norm_weights):
        weight, bias = norm_weights
        if self.config.norm == "rmsnorm":
            return ops.rms_norm(h, weight, self.config.norm_eps)
        return ops.layer_norm(h, weight, bias, self.config.norm_eps)
