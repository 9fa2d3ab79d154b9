"""OpenAI-compatible routes (/v1/*) and their LM Studio-style superset (/api/v0/*)."""
from __future__ import annotations

import time
import uuid

from tinyloop.engine.adaptive import loops_summary

from .fields import (
    CHAT,
    COMPLETION,
    COMPLETIONS_UNSUPPORTED,
    ELSEWHERE,
    LMSTUDIO_EXTRAS,
    OPENAI_UNSUPPORTED,
)
from .generation import Generation, Outcome
from .http import EventStream, send_json
from .prepare import prepare_openai, prompt_ids_of
from .schema import validate


async def list_models(request, extended: bool = False):
    state = request.state
    entry = {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "tinyloop"}
    if extended:
        info = state.model_info()
        entry.update({"type": "llm", "publisher": "tinyloop", "arch": info["arch"],
                      "compatibility_type": "tinyloop", "quantization": info["quant"], "state": "loaded",
                      "max_context_length": info["max_seq_len"], "loops": {
                          "default": info["default_loops"], "min": info["min_loops"], "max": info["max_loops"],
                          # what loops "auto" does on this model, and its default exit_threshold
                          "auto": {"criterion": "exit_gate" if state.loaded.config.exit_gate else "kl",
                                   "exit_threshold": state.loaded.config.exit_threshold}}})
    await send_json(request.send, 200, {"object": "list", "data": [entry]})


def usage(outcome: Outcome) -> dict:
    prompt = outcome.result.prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": outcome.completion_tokens,
            "total_tokens": prompt + outcome.completion_tokens}


def stats(outcome: Outcome) -> dict:
    result = outcome.result
    wall_ms = result.wall_s * 1000
    out = {"wall_ms": round(wall_ms, 3),
           "tokens_per_second": round(outcome.completion_tokens / result.wall_s, 3) if result.wall_s else 0.0,
           "prompt_tokens": result.prompt_tokens, "completion_tokens": outcome.completion_tokens,
           "mode": result.mode,
           # adaptive depth: {mean, histogram} of the generated tokens' depths; else the loop count
           "loops_used": result.loops if result.loops_used is None else loops_summary(result.loops_used),
           "time_to_first_token_ms": None if outcome.time_to_first_token_ms is None
           else round(outcome.time_to_first_token_ms, 3)}
    if result.speculative is not None:
        out.update(result.speculative.to_dict())
    return out


def extras(request, outcome: Outcome) -> dict:
    return {"stats": stats(outcome), "model_info": request.state.model_info(),
            "runtime": request.state.runtime()}


def _chat_prompt(request, values):
    state = request.state
    prompt_ids = state.loaded.with_bos(state.template.render(values["messages"], state.loaded.tokenizer))
    stop_strings = list(values["stop"] or []) + list(state.template.stop_strings)
    stop_ids = state.template.end_of_turn_ids(state.loaded.tokenizer)
    return prompt_ids, stop_strings, stop_ids


def _completion_prompt(request, values):
    return prompt_ids_of(request.state, values["prompt"]), list(values["stop"] or []), ()


async def chat_completions(request, extended: bool = False):
    await _complete(request, extended, chat=True)


async def completions(request, extended: bool = False):
    await _complete(request, extended, chat=False)


async def _complete(request, extended: bool, chat: bool):
    fields = dict(CHAT if chat else COMPLETION)
    if extended:
        fields.update(LMSTUDIO_EXTRAS)
    unsupported = OPENAI_UNSUPPORTED if chat else {**OPENAI_UNSUPPORTED, **COMPLETIONS_UNSUPPORTED}
    values = validate(await request.json(), fields, unsupported, None if extended else ELSEWHERE)
    prompt_ids, stop_strings, stop_ids = (_chat_prompt if chat else _completion_prompt)(request, values)
    engine_request = prepare_openai(request.state, values, prompt_ids, stop_strings, stop_ids, extended)
    generation = Generation(request, engine_request)
    generation.submit()
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    model = values["model"]
    if values["stream"]:
        await _stream(request, generation, ident, created, model, chat, extended,
                      bool((values["stream_options"] or {}).get("include_usage")))
        return
    _, text = await generation.text()
    outcome = generation.outcome
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": outcome.finish_reason}
    else:
        choice = {"index": 0, "text": text, "finish_reason": outcome.finish_reason}
    body = {"id": ident, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage(outcome)}
    if extended:
        body.update(extras(request, outcome))
    await send_json(request.send, 200, body)


async def _stream(request, generation, ident, created, model, chat, extended, include_usage):
    stream = EventStream(request.send)
    request.stream = stream
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta_or_text, finish=None):
        if chat:
            choice = {"index": 0, "delta": delta_or_text, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta_or_text, "finish_reason": finish}
        return {"id": ident, "object": kind, "created": created, "model": model, "choices": [choice]}

    await stream.start()
    if chat:
        await stream.event(chunk({"role": "assistant"}))
    async for batch in generation.batches():
        await stream.events([chunk({"content": text} if chat else text) for _, text in batch if text])
    outcome = generation.outcome
    final = chunk({} if chat else "", outcome.finish_reason)
    if extended:
        final.update(extras(request, outcome))
    await stream.event(final)
    if include_usage:
        await stream.event({"id": ident, "object": kind, "created": created, "model": model, "choices": [],
                            "usage": usage(outcome)})
    await stream.done()
