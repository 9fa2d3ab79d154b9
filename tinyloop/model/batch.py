"""One forward for many sequences: every running request's rows of a step go through the model
together, so each weight is read once per step, not once per request.

A decoder describes the forward it needs as a Pass (its cache, the rows' positions and where
they are written, where they start and how far they go), and `run_passes` runs a list of
them:
- passes that start from token ids are embedded and run the prelude together;
- then core rounds: in each round every pass that has iterations left runs its next one.
  Passes at different iterations share the core layers' linear calls (the core's weights
  are the same at every iteration); the KV write and attention are per pass, each at its
  own slot (model.core_slot(its iteration, layer)) of its own cache, through its own plan;
- a pass that asks for the draft coda's rows ("side") runs the coda at those slots from its
  state after that many iterations;
- the final codas run together (each pass at its own slots), then the head over the rows
  whose logits were asked for.

Why no answer changes: every operation but the KV write and attention acts on each row
alone (norms, RoPE, activations, residual adds, embedding), the backend's linear gives a row
on the exact path the bits it gives that row alone (and model.linear_rows keeps a prefill
chunk's rows to themselves where the backend's bulk path is not so: backends/base.py,
`bulk_is_exact`), and the KV write and attention of a pass see only its own cache. So a
row's logits are what a forward of its pass alone computes, whatever runs beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tinyloop.backends.rows import concat_rows
from tinyloop.model.plan import ForwardPlan, LayerPart, Rows, TreeRows
from tinyloop.model.state import initial_state
from tinyloop.model.transformer import Trunk


@dataclass
class Pass:
    """One cache's rows in a batched forward, and, once run, what came out."""
    cache: object                           # KVCache
    positions: np.ndarray                   # (T,) logical positions
    write_row: int                          # the T rows are written at virtual rows write_row, write_row + 1, ...
    iterations: int                         # core iterations the rows reach
    tokens: object = None                   # (T,) ids: start from the embedding (prelude, then core from 0) ...
    trunk: Trunk | None = None              # ... or resume these states (core from trunk.iterations)
    exact: bool = True                      # the plan's form: exact (per-query blocks) or bulk (prefill)
    tree: TreeRows | None = None            # a draft tree's path rows
    side: tuple | None = None               # (n, coda base): the coda's KV rows from the state after n iterations
    coda: int | None = None                 # the final coda's slot base, or None: no coda, no head
    head: str | None = None                 # "all" or "last": the logits of those rows; None: none
    exit_check: object = None               # (n, hidden (T, D)) after each iteration n -> True: stop (adaptive depth)
    kept: list | None = None                # receives each core layer's (keys, values) of the last iteration run
    # results
    logits: object = None                   # (T, V) or (1, V) on the backend
    trunk_out: Trunk | None = None          # the states after the core iterations
    iterations_run: int = 0
    plan: ForwardPlan | None = field(default=None, repr=False)

    @property
    def n_rows(self) -> int:
        return len(self.positions)

    @property
    def is_verify(self) -> bool:
        """Draft states resumed through the deeper iterations, the coda and the head: a verify pass."""
        return (self.trunk is not None and self.exact and self.side is None and self.coda is not None
                and self.head == "all" and self.exit_check is None and self.kept is None)

    @property
    def is_draft_level(self) -> bool:
        """Tokens from their embedding through the iterations, the coda and the head, no side coda:
        a speculative draft level (any rows, a chain's or a tree's)."""
        return (self.tokens is not None and self.exact and self.side is None and self.coda is not None
                and self.head == "all" and self.exit_check is None and self.kept is None)

    @property
    def is_draft_rest(self) -> bool:
        """Tokens through the iterations, then the coda only for its cache rows (a side coda at the
        last iteration, no head): a speculative round's last level, which the draft never ran."""
        return (self.tokens is not None and self.exact and self.side is not None and self.side[0] == self.iterations
                and self.coda is None and self.head is None and self.exit_check is None and self.kept is None)

    @property
    def is_plain_decode(self) -> bool:
        """One token from its embedding through every iteration, the coda and the head: a decode step."""
        return (self.tokens is not None and self.n_rows == 1 and self.exact and self.tree is None
                and self.side is None and self.head == "all" and self.exit_check is None and self.kept is None)


def _concat(arrays):
    return concat_rows(arrays)           # a view where the rows lie together (split from one call)


def _split(x, sizes):
    out, start = [], 0
    for n in sizes:
        out.append(x[start:start + n])
        start += n
    return out


def plan_passes(model, passes: list) -> None:
    """Each pass's plan (and its cache's blocks for the rows it writes), each with arrays of its
    own (a lone pass plans into the model's step buffers instead, as a forward of its own does)."""
    for p in passes:
        p.plan = model.plan(p.positions, p.write_row, p.cache, p.exact, p.tree, step_buffers=False)


def run_passes(model, passes: list, planned: bool = False) -> None:
    """Run every pass, their rows together where the layers allow; results land on the passes.
    planned: every pass has its plan already (a captured batch makes them: backends/cuda/graphs.py),
    and runs through the batched code even alone. Plain decode steps go through the backend's
    batch runner where it has one (a CUDA graph replayed per batch-size bucket, one request's
    step too: the same kernels, the same bits)."""
    if not passes:
        return
    if not planned:
        runner = model.backend.batch_decode_runner(model, passes)
        if runner is not None:
            runner(passes)
            return
        if len(passes) == 1:
            _run_alone(model, passes[0])
            return
        plan_passes(model, passes)
    states = {}                                       # id(pass) -> [hidden, injected, iterations run]
    starting = [p for p in passes if p.tokens is not None]
    if starting:
        for p, (hidden, injected) in zip(starting, _prelude(model, starting)):
            states[id(p)] = [hidden, injected, 0]
    for p in passes:
        if p.tokens is None:
            states[id(p)] = [p.trunk.hidden, p.trunk.injected, p.trunk.iterations]
    _sides(model, passes, states)                     # a side coda due before any iteration
    active = [p for p in passes if states[id(p)][2] < p.iterations]
    while active:
        _core_round(model, active, states)
        _sides(model, active, states)
        going = []
        for p in active:
            n, hidden = states[id(p)][2], states[id(p)][0]
            exits = p.exit_check is not None and p.exit_check(n, hidden)     # asked after every iteration
            if not exits and n < p.iterations:
                going.append(p)
        active = going
    for p in passes:
        hidden, injected, iterations = states[id(p)]
        p.trunk_out, p.iterations_run = Trunk(hidden, injected, iterations), iterations
    finishing = [p for p in passes if p.coda is not None]
    if not finishing:
        return
    outputs = _codas(model, [(p, states[id(p)][0], p.coda) for p in finishing])
    heads = [(p, h[-1:] if p.head == "last" else h) for p, h in zip(finishing, outputs) if p.head is not None]
    if heads:
        sizes = [h.shape[0] for _, h in heads]
        logits = model.head(_concat([h for _, h in heads]), rows=_rows([p for p, _ in heads], sizes))
        for (p, _), part in zip(heads, _split(logits, sizes)):
            p.logits = part


def _run_alone(model, p: Pass) -> None:
    """One pass by itself, through the model's own forward pieces (trunk, resume, coda, head),
    as a forward of its own runs: the straight-line form the batched code above must agree
    with bit for bit (the tests' oracle runs requests alone). A lone decode step goes through
    model.decode, a lone verify through model.verify, a lone draft level through model.draft:
    their backend may replay a captured GPU graph of them (the same kernels, the same bits)."""
    if p.is_plain_decode and p.coda == model.coda_base(p.iterations):
        p.logits = model.decode(int(np.asarray(p.tokens)[0]), int(p.positions[0]), p.cache, p.iterations)
        p.iterations_run = p.iterations
        return
    if p.is_verify:
        p.logits = model.verify(p.trunk, p.positions, p.write_row, p.tree, p.cache, p.iterations, p.coda)
        p.iterations_run = p.iterations
        return
    if p.is_draft_level or p.is_draft_rest:
        head = p.is_draft_level
        p.logits, p.trunk_out = model.draft(p.tokens, p.positions, p.write_row, p.tree, p.cache, p.iterations,
                                            p.coda if head else p.side[1], head)
        p.iterations_run = p.iterations
        return
    plan = p.plan = model.plan(p.positions, p.write_row, p.cache, p.exact, p.tree)
    trunk = model.trunk(p.tokens, plan, p.cache, 0) if p.tokens is not None else p.trunk
    stops = sorted({p.iterations} | ({p.side[0]} if p.side is not None else set()))
    while True:
        if p.side is not None and p.side[0] == trunk.iterations:
            model.coda(trunk.hidden, plan, p.cache, p.side[1])
        if trunk.iterations >= p.iterations:
            break
        target = trunk.iterations + 1 if p.exit_check is not None else min(s for s in stops if s > trunk.iterations)
        trunk = model.resume(trunk, plan, p.cache, target, kept=p.kept)
        if p.exit_check is not None and p.exit_check(trunk.iterations, trunk.hidden):
            break
    p.trunk_out, p.iterations_run = trunk, trunk.iterations
    if p.coda is not None:
        hidden = model.coda(trunk.hidden, plan, p.cache, p.coda)
        if p.head is not None:
            p.logits = model.head(hidden[-1:] if p.head == "last" else hidden, exact=p.exact)


def _rows(passes: list, sizes: list, keep: bool = False) -> Rows:
    """The passes' rows, stacked in order; keep: the parts are the passes themselves, so a pass's
    `kept` list receives the layers' keys and values (core layers only). Every Rows of one
    forward shares the backend's prepared work (kept on the first pass's plan)."""
    parts, start = [], 0
    for p, n in zip(passes, sizes):
        parts.append((start, start + n, p if keep else LayerPart(p.plan, p.cache)))
        start += n
    return Rows(parts, passes[0].plan.prepared)


def _prelude(model, passes: list) -> list:
    """Embedding and prelude of the passes that start from tokens -> [(hidden, injected)] per pass."""
    c, b = model.config, model.backend
    sizes = [p.n_rows for p in passes]
    ids = np.concatenate([np.asarray(p.tokens) for p in passes])
    h = b.embed(model.weights.embed, ids)                                     # (T, D)
    if c.embed_scale != 1.0:
        h = h * np.float32(c.embed_scale)
    if model.weights.pos_embed is not None:
        positions = np.concatenate([p.plan.positions for p in passes])
        h = h + b.embed_positions(model.weights.pos_embed, positions)
    rows = _rows(passes, sizes)
    for i, weights in enumerate(model.weights.layers["prelude"]):
        h = model.layer_rows(weights, h, rows, [i] * len(passes))
    out = []
    for p, injected in zip(passes, _split(h, sizes)):
        hidden = injected
        if c.initial_state == "random":
            hidden = b.asarray(initial_state(c.state_std, c.state_seed, p.plan.positions, c.dim))
        out.append((hidden, injected))
    return out


def _core_round(model, active: list, states: dict) -> None:
    """Every active pass's next core iteration, the passes' rows stacked for the linear calls."""
    entered = {}
    for first in (True, False):                 # the first iteration enters without the norm and the injection
        group = [p for p in active if (states[id(p)][2] == 0) == first]
        if not group:
            continue
        sizes = [p.n_rows for p in group]
        h = model.enter_iteration(_concat([states[id(p)][0] for p in group]),
                                  _concat([states[id(p)][1] for p in group]), 0 if first else 1,
                                  _rows(group, sizes))
        entered.update(zip((id(p) for p in group), _split(h, sizes)))
    sizes = [p.n_rows for p in active]
    h = _concat([entered[id(p)] for p in active])
    rows = _rows(active, sizes, keep=True)
    for p in active:
        if p.kept is not None:
            p.kept.clear()
    for index, weights in enumerate(model.weights.layers["core"]):
        h = model.layer_rows(weights, h, rows, [model.core_slot(states[id(p)][2], index) for p in active])
    for p, part in zip(active, _split(h, sizes)):
        states[id(p)][0] = part
        states[id(p)][2] += 1


def _sides(model, passes: list, states: dict) -> None:
    """The side codas due now: passes whose state has just reached their side's iteration count."""
    due = [(p, states[id(p)][0], p.side[1]) for p in passes if p.side is not None and p.side[0] == states[id(p)][2]]
    if due:
        _codas(model, due)


def _codas(model, items: list) -> list:
    """The coda over each (pass, hidden, slot base), their rows stacked -> each pass's output."""
    passes = [p for p, _, _ in items]
    sizes = [p.n_rows for p in passes]
    h = _concat([hidden for _, hidden, _ in items])
    if model.config.loop_norm == "after":
        h = model.final_norm(h)
    rows = _rows(passes, sizes)
    for i, weights in enumerate(model.weights.layers["coda"]):
        h = model.layer_rows(weights, h, rows, [base + i for _, _, base in items])
    return _split(h, sizes)
