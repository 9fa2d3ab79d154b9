"""A Responses API reply as its typed events, and as the final response object.

Order (OpenAI's Responses streaming reference): response.created, response.in_progress;
per output item: response.output_item.added, then for a message
response.content_part.added, response.output_text.delta..., response.output_text.done,
response.content_part.done (a reasoning item the same with reasoning_text events), for
a function call response.function_call_arguments.delta and .done; then
response.output_item.done; at the end response.completed, or response.incomplete
(max_output_tokens reached: the item it cut short, message or reasoning, is incomplete),
or response.failed (an error after the stream began).
TypedEventStream numbers them (sequence_number).
"""
from __future__ import annotations

import copy
import time
import uuid

from .reply_events import ReplyEvents

TEXT_EVENTS = {"text": "response.output_text", "reasoning": "response.reasoning_text"}


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _part(kind: str, text: str) -> dict:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponseEvents(ReplyEvents):
    def __init__(self, response: dict):
        super().__init__()
        self.response = response                  # the response object, output filled in as items finish
        self._item: dict | None = None            # the message or reasoning item being streamed

    def _snapshot(self) -> dict:
        return copy.deepcopy(self.response)

    def _where(self) -> dict:
        return {"item_id": self._item["id"], "output_index": len(self.response["output"])}

    def created(self) -> list:
        return [{"type": "response.created", "response": self._snapshot()},
                {"type": "response.in_progress", "response": self._snapshot()}]

    def open_block(self, kind: str) -> list:
        if kind == "reasoning":
            self._item = {"id": _new_id("rs_"), "type": "reasoning", "summary": [], "content": [],
                          "status": "in_progress"}
        else:
            self._item = {"id": _new_id("msg_"), "type": "message", "status": "in_progress", "role": "assistant",
                          "content": []}
        where = self._where()
        return [{"type": "response.output_item.added", "output_index": where["output_index"],
                 "item": copy.deepcopy(self._item)},
                {"type": "response.content_part.added", **where, "content_index": 0, "part": _part(kind, "")}]

    def block_delta(self, kind: str, text: str) -> list:
        event = {"type": TEXT_EVENTS[kind] + ".delta", **self._where(), "content_index": 0, "delta": text}
        if kind == "text":
            event["logprobs"] = []
        return [event]

    def close_block(self, kind: str, text: str) -> list:
        where = self._where()
        done = {"type": TEXT_EVENTS[kind] + ".done", **where, "content_index": 0, "text": text}
        if kind == "text":
            done["logprobs"] = []
        item = self._item
        item["content"] = [_part(kind, text)]
        # Only finish() closes a block after the status is set: the item the limit cut short.
        item["status"] = "incomplete" if self.response["status"] == "incomplete" else "completed"
        self.response["output"].append(item)
        self._item = None
        return [done, {"type": "response.content_part.done", **where, "content_index": 0, "part": _part(kind, text)},
                {"type": "response.output_item.done", "output_index": where["output_index"],
                 "item": copy.deepcopy(item)}]

    def _call(self, call: dict) -> list:
        function = call["function"]
        item = {"id": _new_id("fc_"), "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": call["id"], "name": function["name"]}
        index = len(self.response["output"])
        where = {"item_id": item["id"], "output_index": index}
        events = [{"type": "response.output_item.added", "output_index": index, "item": copy.deepcopy(item)},
                  {"type": "response.function_call_arguments.delta", **where, "delta": function["arguments"]},
                  {"type": "response.function_call_arguments.done", **where, "name": function["name"],
                   "arguments": function["arguments"]}]
        item.update(arguments=function["arguments"], status="completed")
        self.response["output"].append(item)
        return events + [{"type": "response.output_item.done", "output_index": index, "item": copy.deepcopy(item)}]

    def finish(self, calls: list, outcome, reasoning_tokens: int = 0) -> list:
        """The last events: open text closed, the calls, then completed or incomplete.
        reasoning_tokens: how many generated tokens were a thinking section's."""
        if outcome.finish_reason == "length":
            self.response.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
        else:
            self.response.update(status="completed", completed_at=int(time.time()))
        events = self.close()
        if not calls and not any(item["type"] == "message" for item in self.response["output"]):
            events += self.open_block("text") + self.close_block("text", "")   # output_text is "" rather than absent
        for call in calls:
            events += self._call(call)
        prompt, generated = outcome.result.prompt_tokens, outcome.completion_tokens
        # cached_tokens: prompt tokens the prefix cache served; cache_write_tokens: 0, as caching is
        # automatic and costs nothing extra (the SDK's type requires the field).
        self.response["usage"] = {"input_tokens": prompt,
                                  "input_tokens_details": {"cached_tokens": outcome.result.cached_tokens,
                                                           "cache_write_tokens": 0},
                                  "output_tokens": generated,
                                  "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                                  "total_tokens": prompt + generated}
        kind = "response.incomplete" if self.response["status"] == "incomplete" else "response.completed"
        return events + [{"type": kind, "response": self._snapshot()}]

    def failed(self, error) -> list:
        """An error once the stream began (the server stopping, the worker failing). The
        API's error.code is a fixed list (the SDK's ResponseError) that has none of our
        own codes, so it says server_error and the message keeps ours."""
        message = f"{error.message} ({error.code})" if error.code else error.message
        self.response.update(status="failed", error={"code": "server_error", "message": message})
        return [{"type": "response.failed", "response": self._snapshot()}]
