"""Run one request to completion on the calling thread (the command line, tools, tests).

The server runs the same Sequence objects from its engine thread (engine.py).
"""
from __future__ import annotations

from dataclasses import replace

from tinyloop.engine.request import GenerationRequest, GenerationResult
from tinyloop.engine.sequence import Sequence, run
from tinyloop.limits import DEFAULT_PREFILL_CHUNK

__all__ = ["GenerationRequest", "GenerationResult", "generate", "speculative_generate"]


def generate(model, request: GenerationRequest, on_token=None, cancel=None, tokenizer=None,
             pool=None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> GenerationResult:
    """on_token(token_id, text or None) for each generated token (not the stop token);
    cancel is checked before every step. request.mode picks plain or speculative decoding.
    prefill_chunk: prompt rows per prefill forward (the server's TINYLOOP_PREFILL_CHUNK)."""
    return run(Sequence(model, request, tokenizer, pool, on_token, prefill_chunk=prefill_chunk), cancel)


def speculative_generate(model, request: GenerationRequest, params, on_token=None, cancel=None,
                         mode: str | None = None, tokenizer=None, pool=None) -> GenerationResult:
    """Generate like generate(loops=verify_loops), drafting with fewer loops. Greedy output
    is token for token that of plain generation at verify_loops; sampled output has the
    same distribution. mode: "speculative" (default for a chain) or "tree_speculative"
    (default for K_branches > 1)."""
    mode = mode or ("speculative" if params.branches == 1 else "tree_speculative")
    return generate(model, replace(request, mode=mode, speculative=params), on_token, cancel, tokenizer, pool)
