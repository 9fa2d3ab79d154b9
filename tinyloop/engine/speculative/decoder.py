"""Self-speculative decoding: the same weights draft at draft_loops and verify at
verify_loops. One function serves chains (K_branches = 1) and trees.

Each round:
1. draft: from the last accepted token (the root), run the model at draft_loops one
   tree level at a time; a chain adds the draft's best (or sampled) token, a tree
   keeps the K best continuations by cumulative draft log-probability (greedy) or K
   independently sampled chains (sampling);
2. verify: the last level through the draft's iterations (it was never drafted from),
   then one forward at verify_loops over every node. The prelude and the first
   draft_loops iterations of the nodes the draft already ran are reused, not
   recomputed: their hidden states and cache rows are bitwise what the verifier would
   compute (the forward is row-invariant), so the verify logits equal plain decode's;
3. accept the longest agreeing path, add the verifier's own next token, move the
   accepted nodes' cache rows to their positions, and forget the rest.

Cache slots: prelude, core iterations 0..verify_loops-1 and the verify coda, laid out
as for plain decoding at verify_loops, plus the draft's own coda slots after them.

Each forward is a Pass yielded to the engine (model/batch.py), so a round's draft levels
and verify run in the engine's steps beside other requests' forwards.
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.reference.topk import log_normalizer, top_k_ids
from tinyloop.engine.decode import CachedPrompt, prefill_passes
from tinyloop.engine.sampling import next_tokens_with_logprobs
from tinyloop.engine.speculative.acceptance import accept_greedy, accept_sampled
from tinyloop.engine.speculative.params import SpeculativeStats
from tinyloop.engine.speculative.tree import DraftTree
from tinyloop.kv.prefix import slot_keys
from tinyloop.limits import DEFAULT_PREFILL_CHUNK, MAX_TREE_NODES
from tinyloop.model.batch import Pass
from tinyloop.model.transformer import Trunk


class SpeculativeDecoder:
    def __init__(self, model, request, loops: int, sampler, sink, pool=None, chunk: int = DEFAULT_PREFILL_CHUNK):
        c = model.config
        self.model = model
        self.params = request.speculative
        self.prompt = list(request.prompt_ids)
        self.sampler, self.sink = sampler, sink
        self.chunk = chunk
        self.prefilled = None                   # called once the prompt is in the cache
        # The draft draws its proposals from its own stream, so the verifier's stream
        # (acceptance tests and corrections) is not disturbed by how much was drafted.
        self.draft_rng = np.random.Generator(np.random.PCG64(self.sampler.rng.integers(2**63)))
        self.stats = SpeculativeStats()
        self.verify_coda = model.coda_base(self.params.verify_loops)
        self.draft_coda = c.n_layer_instances(self.params.verify_loops)        # the extra slots
        capacity, extra = self.capacity(model, request)
        self.cache = model.new_cache(capacity, self.params.verify_loops, extra_slots=extra,
                                     window=request.cache_window, pool=pool)
        self.cached = CachedPrompt(pool, self.cache, self.prompt,
                                   slot_keys(c, self.params.verify_loops, self.params.draft_loops))
        self.next_token: int | None = None     # accepted, not yet run through the model

    def publish(self) -> None:
        """Every committed full block to the prefix cache (at the end)."""
        self.cached.publish(self.sink.tokens)

    @staticmethod
    def capacity(model, request) -> tuple[int, int]:
        """(cache rows, extra slots): tree rows may overhang the output; the draft's coda
        has slots of its own."""
        return len(request.prompt_ids) + request.max_tokens + MAX_TREE_NODES, model.config.n_coda

    def passes(self):
        """Generator of the forwards this request needs, to its end: the prompt at verify_loops
        exactly as plain generation runs it, plus the draft coda's cache rows for the prompt
        (from the same pass's state at draft_loops); then rounds."""
        p = self.params
        logits = yield from prefill_passes(self.model, self.prompt, self.cache, p.verify_loops, self.chunk,
                                           p.draft_loops, self.draft_coda, start=self.cached.rows)
        self.cached.publish()
        if self.prefilled is not None:
            self.prefilled()
        token, logprobs = next_tokens_with_logprobs(self.sampler, self.model.backend, logits)[0]
        if not self.sink.push(token, logprobs):
            return
        self.next_token = token
        while (yield from self._round()):
            pass

    # -- one round -------------------------------------------------------------------------
    def _round(self):
        """Generator: one draft-and-verify round (a pass per draft level, then the verify's
        two); returns False once the generation has ended."""
        p = self.params
        tree = DraftTree(self.next_token, self.cache.length)
        draft_depth = min(p.draft_ahead, self.sink.remaining - 1)
        fed: list[Trunk] = []                         # draft states, node order
        for _ in range(draft_depth):
            fed.append((yield from self._draft_level(tree)))
        logits = yield from self._verify(tree, fed)   # (n_nodes, V) on the backend
        accepted, next_token, logprobs = self._accept(tree, logits)
        self.stats.record(tree.depth, len(tree.nodes) - 1, len(accepted))
        self._commit(tree, accepted)
        for index, node in enumerate(accepted):
            if not self.sink.push(tree.nodes[node].token, logprobs[index]):
                return False
        if not self.sink.push(next_token, logprobs[-1]):
            return False
        self.next_token = next_token
        return True

    def _pass(self, tree: DraftTree, nodes: list[int], iterations: int, **what) -> Pass:
        positions, write_row, tree_rows = tree.placement(nodes)
        return Pass(self.cache, positions, write_row, iterations, tree=tree_rows, **what)

    def _draft_level(self, tree: DraftTree):
        """Generator: run the deepest level through the draft; add the next level; return its state."""
        frontier = tree.levels[-1]
        level = self._pass(tree, frontier, self.params.draft_loops, tokens=tree.tokens(frontier),
                           coda=self.draft_coda, head="all")
        yield level
        if self.sampler.params.greedy:
            tree.add_level(self._best_children(tree, frontier, level.logits))
        else:
            tree.add_level(self._sampled_children(tree, frontier, self.model.backend.to_host(level.logits)))
        return level.trunk_out

    def _best_children(self, tree, frontier, logits):
        """Greedy tree: the K best (parent, token) by cumulative draft log-probability.
        Without penalties the backend finds each row's K best (only they reach the host)."""
        k = self.params.branches
        if k == 1 and len(frontier) == 1 and not self.sampler.needs_host:
            # a chain: the one child is the argmax (top_k's first, ties to the lower id alike;
            # on a row with a NaN the first NaN, where the reference top_k finds none: the verify
            # decides either way), which a replayed draft graph brings along; a chain never
            # ranks, so no score
            return [(frontier[0], int(self.model.backend.argmax(logits)[0]), tree.nodes[frontier[0]].score)]
        if not self.sampler.needs_host:
            ids, values, normalizers = self.model.backend.top_k(logits, k)
            rows = [(ids[r], values[r] - normalizers[r]) for r in range(len(frontier))]
        else:
            host = self.model.backend.to_host(logits)
            rows = []
            for row, node in enumerate(frontier):
                with self.sampler.assuming(tree.path_tokens(node)):
                    scores = self.sampler.shaped(host[row])
                top = top_k_ids(scores, k)[:k]                                # best first, low id on ties
                rows.append((top, scores[top] - log_normalizer(scores)))
        candidates = []
        for row, node in enumerate(frontier):
            top, log_probs = rows[row]
            base = tree.nodes[node].score
            candidates += [(-(base + lp), row, int(t), node) for t, lp in zip(top, log_probs)]
        candidates.sort()
        return [(node, token, -neg_score) for neg_score, _, token, node in candidates[:k]]

    def _sampled_children(self, tree, frontier, logits):
        """Sampling tree: K independent chains; the root gets K children drawn from q."""
        children = []
        for row, node in enumerate(frontier):
            with self.sampler.assuming(tree.path_tokens(node)):
                q = self.sampler.probabilities(logits[row])
            tree.draft_probs[node] = q
            draws = self.params.branches if node == 0 else 1
            for _ in range(draws):
                children.append((node, self.sampler.draw(q, self.draft_rng), 0.0))
        return children

    def _verify(self, tree: DraftTree, fed: list[Trunk]):
        """Generator: verify logits of every node, (n_nodes, V) on the backend. The last level,
        which the draft never ran, goes through the draft's iterations first (and its coda rows,
        for the next round); then every node resumes from the draft's state to verify_loops."""
        d, v = self.params.draft_loops, self.params.verify_loops
        unfed = tree.levels[-1]
        rest = self._pass(tree, unfed, d, tokens=tree.tokens(unfed), side=(d, self.draft_coda))
        yield rest
        xp = self.model.backend.xp
        states = fed + [rest.trunk_out]
        trunk = Trunk(xp.concatenate([t.hidden for t in states]), xp.concatenate([t.injected for t in states]), d)
        verify = self._pass(tree, list(range(len(tree.nodes))), v, trunk=trunk, coda=self.verify_coda, head="all")
        yield verify
        return verify.logits

    def _accept(self, tree: DraftTree, logits) -> tuple[list[int], int, list]:
        """Walk from the root: accepted node indexes, the verifier's next token, and the
        logprobs of each emitted token (None entries unless the request asked for them)."""
        sampler = self.sampler
        fast_greedy = sampler.params.greedy and not sampler.needs_host
        targets = self.model.backend.argmax(logits) if fast_greedy else None     # (n_nodes,) ids only
        host = None if fast_greedy else self.model.backend.to_host(logits)
        report = sampler.top_logprobs is not None
        accepted: list[int] = []
        logprobs: list = []
        node = 0
        while True:
            children = tree.nodes[node].children
            child_tokens = tree.tokens(children)
            with sampler.assuming(tree.path_tokens(node)):
                scores = None if fast_greedy else sampler.shaped(host[node])      # (V,) float64
                kept = scores.copy() if report else None
                if fast_greedy:
                    target = int(targets[node])
                    choice = accept_greedy(target, child_tokens)
                elif sampler.params.greedy:
                    target = int(np.argmax(scores))
                    choice = accept_greedy(target, child_tokens)
                else:
                    target_probs = sampler.distribution(scores)
                    choice, residual = accept_sampled(target_probs, tree.draft_probs.get(node),
                                                      child_tokens, sampler.rng)
            if choice is None:
                next_token = target if sampler.params.greedy else sampler.draw(residual)
                logprobs.append(sampler.logprobs_of(kept, next_token) if report else None)
                return accepted, next_token, logprobs
            node = children[choice]
            accepted.append(node)
            logprobs.append(sampler.logprobs_of(kept, child_tokens[choice]) if report else None)

    def _commit(self, tree: DraftTree, accepted: list[int]) -> None:
        """Move accepted nodes' rows to their positions (one gather/scatter); the root is
        already in place, and so are the nodes of a chain."""
        base = tree.base
        moves = [(base + node, base + depth) for depth, node in enumerate(accepted, start=1) if node != depth]
        if moves:
            source, target = zip(*moves)
            self.cache.copy_rows(np.array(source), np.array(target))
        self.cache.length = base + len(accepted) + 1
