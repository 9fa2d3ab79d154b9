"""The prefix cache: KV blocks of prompts already computed, reused by later requests that
start with the same tokens (a system prompt, tool declarations, a chat's earlier turns).

What a block is: 64 rows (ATTENTION_BLOCK) of one layer instance's keys and values in the KV
pool (kv/pool.py). A cached block is found by its key:
- the chain hash of every token up to the block's end (block b's hash covers tokens
  [0, 64 (b + 1)): a block is reusable only after the very same prefix), seeded with what
  else changes a block's bits: the KV cache mode, the attention window, the activation
  dtype and the recurrence's initial state (kind, seed, scale: a random initial state is a
  function of (state_seed, position), model/state.py); the model is the engine's, so is the
  pool;
- and the layer instance it holds: prelude layer i ("p", i); core layer c at iteration j
  ("c", j, c), whatever the request's loop count (an iteration's keys and values depend on
  the iterations before it, not on how many follow); coda layer q after L iterations
  ("q", L, q). A speculative request's draft coda slots hold the coda after draft_loops
  iterations, ("q", draft_loops, q): the very rows a plain request at draft_loops computes,
  so each serves the other.
A request adopts a block row (the same 64 rows in every one of its slots) only when every
slot it needs is cached: a prefix computed at L loops serves a request at L' <= L when the
coda after L' iterations is cached too (a model without a coda: always), e.g. after a
speculative request that drafted at L'. Partial rows are never shared, and at least the
prompt's last row is always computed (its logits give the first token).

Exactness: a cached row is the row a cold prefill computes, bit for bit, because on the
backends the cache runs on (backend.bulk_is_exact: the CPU kernels) a row's bits depend only
on its own inputs and position, never on its prefill chunk or what shared its forward. The
engine turns the cache off on other backends (engine/engine.py).

What is published: a request's prompt blocks once its prefill is done (so requests running
at the same time share a system prompt at once), and at its end every full block of its
prompt and committed output, except for adaptive depth (loops "auto"), whose generated
tokens' skipped iterations hold copied keys and values, not a full-depth computation: only
its prompt blocks. Ring caches (sliding windows longer than the cache) reuse their blocks in
place: they neither adopt nor publish.

Sharing: adopted blocks are read-only (every write of the request goes to rows after its
cached prefix) and reference-counted by the pool; a cached block nobody holds is idle, and
idle blocks are evicted least recently used first when the pool needs room, never refused.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from tinyloop.limits import ATTENTION_BLOCK


class PrefixCache:
    def __init__(self, pool, seed: tuple = ()):
        self.pool = pool
        self.seed = repr(seed).encode()
        self._blocks: dict = {}              # (chain hash, slot key) -> pool block
        self._keys: dict = {}                # pool block -> (chain hash, slot key)
        self._idle: OrderedDict = OrderedDict()   # cached blocks nobody holds, least recently used first
        self.hit_tokens = 0                  # prompt rows adopted
        self.miss_tokens = 0                 # prompt rows computed
        self.evictions = 0
        pool.prefix = self

    # -- what the pool asks ------------------------------------------------------------------
    @property
    def evictable(self) -> int:
        return len(self._idle)

    @property
    def idle_blocks(self) -> int:
        return len(self._idle)

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    def keeps(self, block: int) -> bool:
        """A block's last holder let go: True if it stays cached (idle, evictable)."""
        if block in self._keys:
            self._idle[block] = None
            return True
        return False

    def evict_one(self) -> bool:
        """The least recently used idle block back to the pool's free list; False if none."""
        if not self._idle:
            return False
        block, _ = self._idle.popitem(last=False)
        del self._blocks[self._keys.pop(block)]
        self.pool.free_block(block)
        self.evictions += 1
        return True

    # -- keys ------------------------------------------------------------------------------------
    def chain(self, tokens, window: int, n_blocks: int) -> list:
        """The chain hashes of the first n_blocks full blocks of `tokens`."""
        digest = hashlib.blake2b(self.seed + repr(window).encode(), digest_size=16).digest()
        out = []
        ids = np.asarray(tokens[:n_blocks * ATTENTION_BLOCK], np.int64)
        for b in range(n_blocks):
            digest = hashlib.blake2b(digest + ids[b * ATTENTION_BLOCK:(b + 1) * ATTENTION_BLOCK].tobytes(),
                                     digest_size=16).digest()
            out.append(digest)
        return out

    # -- a request's prompt ------------------------------------------------------------------
    def adopt(self, cache, tokens: list, slot_keys: list) -> int:
        """The longest run of cached block rows at the start of the prompt, taken into the cache
        (at most up to the prompt's last row, which must be computed) -> rows adopted."""
        if cache.ring:
            return 0
        usable = (len(tokens) - 1) // ATTENTION_BLOCK
        adopted = 0
        for b, digest in enumerate(self.chain(tokens, cache.window, usable)):
            ids = [self._blocks.get((digest, key)) for key in slot_keys]
            if any(block is None for block in ids):
                break
            for block in ids:
                self._idle.pop(block, None)                       # held again: not evictable
            cache.adopt(b, np.array(ids, np.int32))
            adopted = b + 1
        rows = adopted * ATTENTION_BLOCK
        self.hit_tokens += rows
        self.miss_tokens += len(tokens) - rows
        return rows

    def publish(self, cache, tokens: list, rows: int, slot_keys: list) -> None:
        """Offer the cache's full blocks of rows [0, rows) (their tokens `tokens[:rows]`) to later
        requests: each (slot, block) not cached yet becomes cached (it stays the cache's until it
        lets go of it, then idle)."""
        if cache.ring:
            return
        n_blocks = min(rows, len(tokens)) // ATTENTION_BLOCK
        for b, digest in enumerate(self.chain(tokens, cache.window, n_blocks)):
            for slot, key in enumerate(slot_keys):
                block = int(cache.table[slot, b])
                if block == 0 or (digest, key) in self._blocks or block in self._keys:
                    continue
                self._blocks[(digest, key)] = block
                self._keys[block] = (digest, key)


def slot_keys(config, loops: int, draft_loops: int | None = None) -> list:
    """What each slot of a cache at `loops` (with a speculative request's draft coda slots
    after them when draft_loops is given) holds, as prefix-cache slot keys (module docstring)."""
    keys = [("p", i) for i in range(config.n_prelude)]
    keys += [("c", j, c) for j in range(loops) for c in range(config.n_core)]
    keys += [("q", loops, q) for q in range(config.n_coda)]
    if draft_loops is not None:
        keys += [("q", draft_loops, q) for q in range(config.n_coda)]
    return keys
