"""A Messages API reply as its typed events, and as the final message object.

Order (Anthropic's streaming reference): message_start (the message with empty content),
ping, then per content block content_block_start, content_block_delta... (text_delta,
thinking_delta, input_json_delta), content_block_stop; then message_delta (stop_reason,
stop_sequence, usage) and message_stop. An error after the stream began is an `error`
event in the API's error shape.
"""
from __future__ import annotations

import copy
import uuid

import orjson

from .anthropic_errors import anthropic_error_body
from .reply_events import ReplyEvents

DELTAS = {"text": ("text_delta", "text"), "reasoning": ("thinking_delta", "thinking")}


def _empty_block(kind: str) -> dict:
    # A thinking template's section comes back unsigned: nothing here can verify a signature.
    if kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "text", "text": ""}


class MessageEvents(ReplyEvents):
    def __init__(self, model: str, prompt_tokens: int, thinking: bool):
        super().__init__()
        self.thinking = thinking                # thinking enabled: a thinking template's section is a block
        self.message = {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                        "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0,
                                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}

    def keeps(self, kind: str) -> bool:
        return kind == "text" or self.thinking

    def started(self) -> list:
        return [{"type": "message_start", "message": copy.deepcopy(self.message)}, {"type": "ping"}]

    def open_block(self, kind: str) -> list:
        return [{"type": "content_block_start", "index": len(self.message["content"]),
                 "content_block": _empty_block(kind)}]

    def block_delta(self, kind: str, text: str) -> list:
        delta_type, key = DELTAS[kind]
        return [{"type": "content_block_delta", "index": len(self.message["content"]),
                 "delta": {"type": delta_type, key: text}}]

    def close_block(self, kind: str, text: str) -> list:
        block = _empty_block(kind)
        block["thinking" if kind == "reasoning" else "text"] = text
        index = len(self.message["content"])
        self.message["content"].append(block)
        return [{"type": "content_block_stop", "index": index}]

    def _tool_use(self, call: dict) -> list:
        index = len(self.message["content"])
        function = call["function"]
        block = {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": function["name"],
                 "input": {}}
        events = [{"type": "content_block_start", "index": index, "content_block": copy.deepcopy(block)},
                  {"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta", "partial_json": function["arguments"]}},
                  {"type": "content_block_stop", "index": index}]
        block["input"] = orjson.loads(function["arguments"])
        self.message["content"].append(block)
        return events

    def finish(self, calls: list, outcome, stop_sequence: str | None) -> list:
        events = self.close()
        for call in calls:
            events += self._tool_use(call)
        if outcome.finish_reason == "length":
            reason = "max_tokens"
        elif calls:
            reason = "tool_use"
        elif stop_sequence is not None:
            reason = "stop_sequence"
        else:
            reason = "end_turn"
        stop_sequence = stop_sequence if reason == "stop_sequence" else None
        self.message.update(stop_reason=reason, stop_sequence=stop_sequence)
        # Anthropic's accounting: input_tokens counts the prompt tokens after the cached prefix,
        # cache_read_input_tokens the prefix the cache served (their sum is count_tokens'); caching
        # is automatic here, so nothing is a cache write
        cached = outcome.result.cached_tokens
        counts = {"input_tokens": outcome.result.prompt_tokens - cached, "cache_read_input_tokens": cached,
                  "output_tokens": outcome.completion_tokens}
        self.message["usage"].update(counts)
        usage = dict(counts)
        return events + [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
                          "usage": usage}, {"type": "message_stop"}]

    def failed(self, error) -> list:
        return [anthropic_error_body(error)]
