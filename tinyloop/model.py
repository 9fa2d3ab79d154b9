"""The weight-shared looped transformer: one forward for prefill, decode, draft and verify.

    h = embed(tokens) (+ learned positions)
    h = prelude layers (once)
    repeat loops times: h = core layers (shared weights)      [+ input injection]
    h = coda layers (once)
    logits = head(final_norm(h))

Every executed layer instance owns one KV cache slot: prelude i -> i, core layer c at
iteration l -> P + l*C + c, coda layer q -> coda_base + q (P + C*loops by default).
"""
from __future__ import annotations

import numpy as np

from . import ops
from .config import ModelConfig
from .kvcache import KVCache
from .weights import LayerWeights, ModelWeights


class LoopedTransformer:
    def __init__(self, config: ModelConfig, weights: ModelWeights, xp=np):
        self.config = config
        self.weights = weights
        self.xp = xp
        self.scale = 1.0 / float(np.sqrt(config.head_dim))
        if config.positions == "rope":
            cos, sin = ops.rope_tables(config.max_seq_len, config.head_dim, config.rope_theta)
            self.rope_cos, self.rope_sin = xp.asarray(cos), xp.asarray(sin)   # (max_seq, hd/2)

    def to_host(self, array) -> np.ndarray:
        return array if self.xp is np else self.xp.asnumpy(array)

    # -- cache bookkeeping ------------------------------------------------------------
    def new_cache(self, capacity: int, loops: int, extra_slots: int = 0) -> KVCache:
        c = self.config
        return KVCache(c.n_layer_instances(loops) + extra_slots, c.n_kv_heads, c.head_dim,
                       capacity, xp=self.xp)

    def core_slot(self, iteration: int, index: int) -> int:
        return self.config.n_prelude + iteration * self.config.n_core + index

    # -- the pieces of the forward -----------------------------------------------------
    def embed(self, tokens, positions):
        """tokens, positions: (T,) int -> h: (T, D)."""
        h = self.weights.embed[tokens]
        if self.weights.pos_embed is not None:
            h = h + self.weights.pos_embed[positions]
        return h

    def layer(self, weights: LayerWeights, h, positions, cache: KVCache, slot: int, exact: bool):
        """One pre-norm transformer layer; writes this instance's keys/values. h: (T, D)."""
        c = self.config
        n_tokens = h.shape[0]
        x = self._norm(h, weights.attn_norm)
        qkv = ops.linear(x, weights.qkv, weights.qkv_bias, exact)          # (T, q_dim + 2 kv_dim)
        q = qkv[:, :c.q_dim].reshape(n_tokens, c.n_heads, c.head_dim)
        k = qkv[:, c.q_dim:c.q_dim + c.kv_dim].reshape(n_tokens, c.n_kv_heads, c.head_dim)
        v = qkv[:, c.q_dim + c.kv_dim:].reshape(n_tokens, c.n_kv_heads, c.head_dim)
        if c.positions == "rope":
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (T, hd/2)
            q = ops.apply_rope(q, cos, sin)
            k = ops.apply_rope(k, cos, sin)
        cache.write(slot, int(positions[0]), k, v)
        keys, values = cache.slot(slot)
        attend = ops.attention_exact if exact else ops.attention_bulk
        attn = attend(q, keys, values, positions, self.scale)               # (T, H, hd)
        h = h + ops.linear(attn.reshape(n_tokens, c.q_dim), weights.out, weights.out_bias, exact)

        x = self._norm(h, weights.mlp_norm)
        up = ops.linear(x, weights.up, weights.up_bias, exact)              # (T, ffn) or (T, 2 ffn)
        if c.mlp == "swiglu":
            act = ops.silu(up[:, :c.ffn_dim]) * up[:, c.ffn_dim:]
        else:
            act = ops.gelu_tanh(up)
        return h + ops.linear(act, weights.down, weights.down_bias, exact)

    def run_prelude(self, h, positions, cache, exact):
        for i, weights in enumerate(self.weights.layers["prelude"]):
            h = self.layer(weights, h, positions, cache, i, exact)
        return h

    def run_core(self, h, injected, positions, cache, first_iteration, last_iteration, exact):
        """Core iterations [first_iteration, last_iteration). `injected` is the prelude output."""
        for iteration in range(first_iteration, last_iteration):
            if iteration > 0 and self.config.input_injection == "add":
                h = h + injected
            for i, weights in enumerate(self.weights.layers["core"]):
                h = self.layer(weights, h, positions, cache, self.core_slot(iteration, i), exact)
        return h

    def run_coda(self, h, positions, cache, coda_base, exact):
        for i, weights in enumerate(self.weights.layers["coda"]):
            h = self.layer(weights, h, positions, cache, coda_base + i, exact)
        return h

    def head(self, h, exact=True):
        """h: (T, D) -> logits (T, vocab) float32."""
        x = self._norm(h, self.weights.final_norm)
        return ops.linear(x, self.weights.head, None, exact)

    # -- the whole forward -------------------------------------------------------------
    def forward(self, tokens, positions, cache: KVCache, loops: int, *, exact: bool = True,
                last_only: bool = False, coda_base: int | None = None):
        """Run new tokens at `positions` through the model, writing their keys/values.

        tokens, positions: (T,) int, positions consecutive. Returns logits (T, vocab),
        or (1, vocab) for the last position with last_only. With exact=True the
        result for each position is bitwise independent of T (see ops/__init__.py).
        """
        c = self.config
        tokens = self.xp.asarray(tokens)
        positions = np.asarray(positions)
        h = self.embed(tokens, positions)
        h = self.run_prelude(h, positions, cache, exact)
        h = self.run_core(h, h, positions, cache, 0, loops, exact)
        if coda_base is None:
            coda_base = c.n_prelude + c.n_core * loops
        h = self.run_coda(h, positions, cache, coda_base, exact)
        if last_only:
            h = h[-1:]
        return self.head(h, exact)

    def _norm(self, h, norm_weights):
        weight, bias = norm_weights
        if self.config.norm == "rmsnorm":
            return ops.rms_norm(h, weight, self.config.norm_eps)
        return ops.layer_norm(h, weight, bias, self.config.norm_eps)
