"""Self-speculative decoding: the same weights draft at draft_loops and verify at
verify_loops. One function serves chains (K_branches = 1) and trees.

Each round:
1. draft: from the last accepted token (the root), run the model at draft_loops one
   tree level at a time; a chain adds the draft's best (or sampled) token, a tree
   keeps the K best continuations by cumulative draft log-probability (greedy) or K
   independently sampled chains (sampling);
2. verify: one forward at verify_loops over every node. The prelude and the first
   draft_loops iterations of the nodes the draft already ran are reused, not
   recomputed: their hidden states and cache rows are bitwise what the verifier would
   compute (the forward is row-invariant), so the verify logits equal plain decode's;
3. accept the longest agreeing path, add the verifier's own next token, move the
   accepted nodes' cache rows to their positions, and forget the rest.

Cache slots: prelude, core iterations 0..verify_loops-1 and the verify coda, laid out
as for plain decoding at verify_loops, plus the draft's own coda slots after them.
"""
from __future__ import annotations

import time

import numpy as np

from tinyloop.engine.generate import (GenerationRequest, GenerationResult, cancel_check, check_cache_budget, check_request,
                        stop_ids)
from tinyloop.model.transformer import LoopedTransformer, Span, Trunk
from tinyloop.engine.output import TokenSink
from tinyloop.engine.sampling import Sampler, top_k_ids
from tinyloop.engine.speculative.acceptance import accept_greedy, accept_sampled
from tinyloop.engine.speculative.params import MAX_TREE_NODES, SpeculativeParams, SpeculativeStats
from tinyloop.engine.speculative.tree import DraftTree


def speculative_generate(model: LoopedTransformer, request: GenerationRequest, params: SpeculativeParams,
                         on_token=None, cancel=None, mode: str | None = None) -> GenerationResult:
    """Generate like generate(loops=verify_loops), drafting with fewer loops.

    Greedy output is token for token that of plain generation at verify_loops;
    sampled output has the same distribution. `mode` only labels the result
    (default: "speculative" for a chain, "tree_speculative" for K_branches > 1).
    """
    start = time.perf_counter()
    params.check(model.config)
    check_request(model, request, loops=params.verify_loops)
    decoder = SpeculativeDecoder(model, request, params, on_token, start)
    is_cancelled = cancel_check(cancel)
    if is_cancelled():
        decoder.sink.cancel()
    else:
        decoder.prefill()
        while decoder.sink.finish_reason is None:
            if is_cancelled():
                decoder.sink.cancel()
                break
            decoder.round()
    result = decoder.result(start)
    result.mode = mode or ("speculative" if params.branches == 1 else "tree_speculative")
    return result


class SpeculativeDecoder:
    def __init__(self, model: LoopedTransformer, request: GenerationRequest, params: SpeculativeParams,
                 on_token, start: float):
        c = model.config
        self.model = model
        self.params = params
        self.prompt = list(request.prompt_ids)
        self.sampler = Sampler(request.sampling, c.vocab_size, self.prompt)
        # The draft draws its proposals from its own stream, so the verifier's stream
        # (acceptance tests and corrections) is not disturbed by how much was drafted.
        self.draft_rng = np.random.Generator(np.random.PCG64(self.sampler.rng.integers(2**63)))
        self.sink = TokenSink(request.max_tokens, stop_ids(model, request), self.sampler, on_token, start)
        self.stats = SpeculativeStats()
        self.verify_coda = model.coda_base(params.verify_loops)
        self.draft_coda = c.n_layer_instances(params.verify_loops)        # the extra slots
        capacity = len(self.prompt) + request.max_tokens + MAX_TREE_NODES  # tree rows may overhang
        check_cache_budget(model, capacity, params.verify_loops, request.cache_window, c.n_coda)
        self.cache = model.new_cache(capacity, params.verify_loops, extra_slots=c.n_coda,
                                     window=request.cache_window)
        self.next_token: int | None = None     # accepted, not yet run through the model
        self.prefill_s = 0.0

    # -- prefill ---------------------------------------------------------------------------
    def prefill(self) -> None:
        """The prompt at verify_loops, exactly as plain generation runs it, plus the
        draft coda's cache rows for the prompt (from the same pass's state at draft_loops)."""
        model, d, v = self.model, self.params.draft_loops, self.params.verify_loops
        n_prompt = len(self.prompt)
        step = self.cache.max_rows_per_forward        # the same pieces as plain prefill
        for start in range(0, n_prompt, step):
            stop = min(start + step, n_prompt)
            span = Span.contiguous(start, stop - start)
            trunk = model.trunk(self.prompt[start:stop], span, self.cache, d, exact=False)
            model.coda(trunk.hidden, span, self.cache, self.draft_coda, exact=False)
            trunk = model.resume(trunk, span, self.cache, v, exact=False)
            hidden = model.coda(trunk.hidden, span, self.cache, self.verify_coda, exact=False)
        logits = model.to_host(model.head(hidden[-1:], exact=False))[0]
        self.cache.length = n_prompt
        self.prefill_s = time.perf_counter() - self.sink.start
        token = self.sampler.sample(logits)
        if self.sink.push(token):
            self.next_token = token

    # -- one round -------------------------------------------------------------------------
    def round(self) -> None:
        p = self.params
        tree = DraftTree(self.next_token, self.cache.length)
        draft_depth = min(p.draft_ahead, self.sink.remaining - 1)
        fed: list[Trunk] = []                         # draft states, node order
        for _ in range(draft_depth):
            fed.append(self._draft_level(tree))
        logits = self._verify(tree, fed)              # (n_nodes, V)
        accepted, next_token = self._accept(tree, logits)
        self.stats.record(tree.depth, len(tree.nodes) - 1, len(accepted))
        self._commit(tree, accepted)
        for node in accepted:
            if not self.sink.push(tree.nodes[node].token):
                return
        if self.sink.push(next_token):
            self.next_token = next_token

    def _draft_level(self, tree: DraftTree) -> Trunk:
        """Run the deepest level through the draft; add the next level; return its state."""
        model = self.model
        frontier = tree.levels[-1]
        span = tree.span(frontier)
        trunk = model.trunk(tree.tokens(frontier), span, self.cache, self.params.draft_loops)
        hidden = model.coda(trunk.hidden, span, self.cache, self.draft_coda)
        logits = model.to_host(model.head(hidden))                        # (len(frontier), V)
        if self.sampler.params.greedy:
            tree.add_level(self._best_children(tree, frontier, logits))
        else:
            tree.add_level(self._sampled_children(tree, frontier, logits))
        return trunk

    def _best_children(self, tree, frontier, logits):
        """Greedy tree: the K best (parent, token) by cumulative draft log-probability."""
        k = self.params.branches
        candidates = []
        for row, node in enumerate(frontier):
            with self.sampler.assuming(tree.path_tokens(node)):
                scores = self.sampler.penalized(logits[row])
            log_probs = scores - (scores.max() + np.log(np.exp(scores - scores.max()).sum()))
            top = top_k_ids(scores, k)[:k]                                 # best first, low id on ties
            base = tree.nodes[node].score
            candidates += [(-(base + log_probs[t]), row, int(t), node) for t in top]
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
        """Verify logits of every node: (n_nodes, V) on the host."""
        model, d, v = self.model, self.params.draft_loops, self.params.verify_loops
        xp = model.xp
        unfed = tree.levels[-1]                       # never run by the draft
        span = tree.span(unfed)
        trunk = model.trunk(tree.tokens(unfed), span, self.cache, d)
        model.coda(trunk.hidden, span, self.cache, self.draft_coda)   # draft rows, for the next round
        hidden = xp.concatenate([t.hidden for t in fed] + [trunk.hidden])
        injected = xp.concatenate([t.injected for t in fed] + [trunk.injected])
        all_nodes = list(range(len(tree.nodes)))
        span = tree.span(all_nodes)
        trunk = model.resume(Trunk(hidden, injected, d), span, self.cache, v)
        hidden = model.coda(trunk.hidden, span, self.cache, self.verify_coda)
        return model.to_host(model.head(hidden))

    def _accept(self, tree: DraftTree, logits) -> tuple[list[int], int]:
        """Walk from the root: accepted node indexes, and the verifier's next token."""
        sampler = self.sampler
        accepted: list[int] = []
        node = 0
        while True:
            children = tree.nodes[node].children
            child_tokens = tree.tokens(children)
            with sampler.assuming(tree.path_tokens(node)):
                if sampler.params.greedy:
                    target = sampler.greedy_token(logits[node])
                    choice = accept_greedy(target, child_tokens)
                else:
                    target_probs = sampler.probabilities(logits[node])
                    choice, residual = accept_sampled(target_probs, tree.draft_probs.get(node),
                                                      child_tokens, sampler.rng)
            if choice is None:
                next_token = target if sampler.params.greedy else sampler.draw(residual)
                return accepted, next_token
            node = children[choice]
            accepted.append(node)

    def _commit(self, tree: DraftTree, accepted: list[int]) -> None:
        """Move accepted nodes' rows to their positions; the root is already in place."""
        base = tree.base
        for depth, node in enumerate(accepted, start=1):
            if node != depth:                     # chains are laid out in place already
                self.cache.copy_row(base + node, base + depth)
        self.cache.length = base + len(accepted) + 1

    def result(self, start: float) -> GenerationResult:
        sink = self.sink
        return GenerationResult(
            tokens=sink.tokens, finish_reason=sink.finish_reason, prompt_tokens=len(self.prompt),
            completion_tokens=sink.completion_tokens, loops=self.params.verify_loops,
            wall_s=time.perf_counter() - start, prefill_s=self.prefill_s,
            time_to_first_token_s=sink.first_token_s, stop_token_id=sink.stop_token_id,
            speculative=self.stats)

