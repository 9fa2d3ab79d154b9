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
from .reply import Reply
from .schema import validate
from .structured import (
    active_tools,
    chat_logprobs,
    check_logit_bias,
    completion_logprobs,
    grammar_of,
    top_logprobs_of,
)


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
            "total_tokens": prompt + outcome.completion_tokens,
            # OpenAI's field: the prompt tokens whose keys and values came from the prefix cache
            "prompt_tokens_details": {"cached_tokens": outcome.result.cached_tokens}}


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
           else round(outcome.time_to_first_token_ms, 3),
           "queue_ms": round(result.queue_s * 1000, 3),                  # waiting for a running place
           "cached_tokens": result.cached_tokens}                        # prompt tokens from the prefix cache
    if result.speculative is not None:
        out.update(result.speculative.to_dict())
    return out


def extras(request, outcome: Outcome) -> dict:
    return {"stats": stats(outcome), "model_info": request.state.model_info(),
            "runtime": request.state.runtime()}


def _chat_prompt(request, values, tools):
    state = request.state
    prompt_ids = state.loaded.with_bos(state.template.render(values["messages"], state.loaded.tokenizer, tools))
    stop_strings = list(values["stop"] or []) + list(state.template.stop_strings)
    stop_ids = state.template.end_of_turn_ids(state.loaded.tokenizer)
    return prompt_ids, stop_strings, stop_ids


def _completion_prompt(request, values, tools):
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
    tools, choice = active_tools(values) if chat else ([], "none")
    prompt_ids, stop_strings, stop_ids = (_chat_prompt if chat else _completion_prompt)(request, values, tools)
    grammar = grammar_of(request.state, values, tools, choice, chat)
    engine_request = prepare_openai(request.state, values, prompt_ids, stop_strings, stop_ids, extended,
                                    grammar, top_logprobs_of(values, chat),
                                    check_logit_bias(request.state, values.get("logit_bias")),
                                    thinking=chat and request.state.template.thinking is not None)
    generation = Generation(request, engine_request)
    generation.submit()
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    model = values["model"]
    if values["stream"]:
        await _stream(request, generation, ident, created, model, chat, extended,
                      bool((values["stream_options"] or {}).get("include_usage")), tools)
        return
    _, text = await generation.text()
    outcome = generation.outcome
    tokenizer = request.state.loaded.tokenizer
    wants_logprobs = engine_request.top_logprobs is not None
    if chat:
        reply = Reply(request.state.template.thinking, tools)
        reply.feed(text)
        _, calls = reply.finish()
        choice = {"index": 0, "message": reply.message(calls),
                  "finish_reason": "tool_calls" if calls and outcome.finish_reason == "stop" else outcome.finish_reason,
                  "logprobs": chat_logprobs(tokenizer, generation.logprobs) if wants_logprobs else None}
    else:
        choice = {"index": 0, "text": text, "finish_reason": outcome.finish_reason,
                  "logprobs": completion_logprobs(tokenizer, generation.logprobs) if wants_logprobs else None}
    body = {"id": ident, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage(outcome)}
    if extended:
        body.update(extras(request, outcome))
    await send_json(request.send, 200, body)


async def _stream(request, generation, ident, created, model, chat, extended, include_usage, tools):
    """Deltas as they come (reasoning_content, then content). With tools, everything from
    the first call's opening line is held back: at the end every call is validated, then
    each goes out whole in its own delta.tool_calls chunk (index, id, name, complete
    arguments), then finish_reason tool_calls. Logprobs ride on the chunk that publishes
    their token's text (held-back tokens: on the next chunk that goes out)."""
    stream = EventStream(request.send)
    request.stream = stream
    kind = "chat.completion.chunk" if chat else "text_completion"
    tokenizer = request.state.loaded.tokenizer
    wants_logprobs = generation.request.top_logprobs is not None
    shape_logprobs = chat_logprobs if chat else completion_logprobs
    reply = Reply(request.state.template.thinking, tools) if chat else None
    seen = reported = 0                     # tokens seen / tokens whose logprobs went out

    def chunk(delta_or_text, finish=None):
        nonlocal reported
        if chat:
            choice = {"index": 0, "delta": delta_or_text, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta_or_text, "finish_reason": finish}
        if wants_logprobs:
            pending = generation.logprobs[reported:seen]
            choice["logprobs"] = shape_logprobs(tokenizer, pending) if pending else None
            reported = seen
        return {"id": ident, "object": kind, "created": created, "model": model, "choices": [choice]}

    await stream.start()
    if chat:
        await stream.event(chunk({"role": "assistant"}))
    async for batch in generation.batches():
        events = []
        for token_id, text in batch:
            seen += token_id is not None
            if not text:
                continue
            events += [chunk(delta) for delta in reply.feed(text)] if chat else [chunk(text)]
        await stream.events(events)
    outcome = generation.outcome
    finish = outcome.finish_reason
    if chat:
        deltas, calls = reply.finish()
        events = [chunk(delta) for delta in deltas]
        if calls:
            events += [chunk({"tool_calls": [{"index": index, **call}]}) for index, call in enumerate(calls)]
            finish = "tool_calls" if finish == "stop" else finish         # "length": the last call was cut
        await stream.events(events)
    final = chunk({} if chat else "", finish)
    if extended:
        final.update(extras(request, outcome))
    await stream.event(final)
    if include_usage:
        await stream.event({"id": ident, "object": kind, "created": created, "model": model, "choices": [],
                            "usage": usage(outcome)})
    await stream.done()
