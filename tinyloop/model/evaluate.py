"""Perplexity of a model over a text, with a sliding window.

The text is tokenized once (with the model's BOS first, if it uses one). Windows of
`window` tokens start every `stride` tokens; each window scores only the tokens it
adds past the previous window (all of them for the first), each predicted from up to
`window - 1` tokens of left context. Perplexity = exp(mean negative log-likelihood).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyloop.model.loader import LoadedModel
from tinyloop.progress import Progress


@dataclass
class PerplexityResult:
    perplexity: float
    tokens_scored: int
    mean_nll: float
    window: int
    stride: int


def log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """logits: (T, V), targets: (T,) -> log p(target) per row, in float64."""
    logits = logits.astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return logits[np.arange(len(targets)), targets] - log_norm


def perplexity(loaded: LoadedModel, text: str, window: int = 512, stride: int = 256, loops: int | None = None,
               max_tokens: int | None = None, progress: bool = True) -> PerplexityResult:
    config = loaded.config
    loops = config.check_loops(config.default_loops if loops is None else loops)
    if not 1 <= stride <= window - 1:
        raise ValueError(f"stride must be in [1, window - 1], got stride {stride}, window {window}")
    window = min(window, config.max_seq_len)
    ids = loaded.tokenizer.encode(text)
    if config.bos_token_id is not None:
        ids = [config.bos_token_id] + ids
    if max_tokens is not None:
        ids = ids[:max_tokens]
    if len(ids) < 2:
        raise ValueError("the text must be at least 2 tokens long")
    model = loaded.model
    tokens = np.asarray(ids)
    total_nll, scored, scored_until = 0.0, 0, 1      # position 0 is never predicted
    starts = list(range(0, max(len(ids) - window, 0) + 1, stride))
    if starts[-1] + window < len(ids):
        starts.append(len(ids) - window)
    bar = Progress("eval-ppl windows", len(starts), enabled=progress)
    for index, start in enumerate(starts, 1):
        stop = min(start + window, len(ids))
        chunk = tokens[start:stop]
        first_new = max(scored_until, start + 1)     # first position this window scores
        cache = model.new_cache(stop - start, loops)
        # Run the whole window; the head only for the rows whose next token is scored.
        plan = model.contiguous_plan(0, stop - start, cache, exact=False)
        trunk = model.trunk(chunk, plan, cache, loops)
        hidden = model.coda(trunk.hidden, plan, cache, model.coda_base(loops))
        rows = slice(first_new - 1 - start, stop - 1 - start)             # predict first_new .. stop-1
        logits = model.backend.to_host(model.head(hidden[rows], exact=False))
        nll = -log_softmax_at(logits, tokens[first_new:stop])
        total_nll += float(nll.sum())
        scored += len(nll)
        scored_until = stop
        bar.update(index, f"ppl so far {math.exp(total_nll / scored):.3f}")
    bar.finish(f"scored {scored} tokens")
    mean = total_nll / scored
    return PerplexityResult(math.exp(mean), scored, mean, window, stride)
