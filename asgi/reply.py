"""One chat reply's text -> reasoning, content and tool calls, streamed or whole.

The engine produces one text stream. A template with a thinking section sends what comes
before its closing tag to `reasoning_content`; with tools, what follows the first call's
opening line is held back, and at the end every call is parsed and validated before any
is published (asgi/structured.py). Text that may still be the start of a tag is never
shown early, so the streamed pieces always add up to the whole reply.
"""
from __future__ import annotations

from tinyloop.text import toolformat
from tinyloop.text.splitter import MarkerSplitter
from tinyloop.text.thinking import ThinkingSplitter

from .structured import tool_calls_of


class Reply:
    def __init__(self, thinking_tags: tuple | None, tools: list):
        self.thinking = ThinkingSplitter(*thinking_tags) if thinking_tags else None
        self.tools = tools
        self.calls = MarkerSplitter("\n" + toolformat.OPEN + "\n", toolformat.OPEN + "\n") if tools else None
        self.reasoning: list[str] = []
        self.content: list[str] = []

    def feed(self, text: str) -> list[dict]:
        """Deltas to publish now: [{"reasoning_content": ...}, {"content": ...}], empty ones left out."""
        reasoning, content = self.thinking.feed(text) if self.thinking is not None else ("", text)
        return self._deltas(reasoning, content)

    def finish(self) -> tuple[list[dict], list[dict] | None]:
        """(the last deltas, the validated whole tool calls or None)."""
        reasoning, content = self.thinking.finish() if self.thinking is not None else ("", "")
        deltas = self._deltas(reasoning, content)
        if self.calls is None:
            return deltas, None
        tail = self.calls.finish()
        if not self.calls.split:
            return deltas + self._record({"content": tail}), None
        # A call cut short by max_tokens is dropped; the whole ones before it are returned.
        return deltas, tool_calls_of(toolformat.OPEN + "\n" + self.calls.second, self.tools) or None

    def message(self, calls) -> dict:
        message = {"role": "assistant", "content": "".join(self.content) or (None if calls else "")}
        if self.thinking is not None and self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if calls:
            message["tool_calls"] = calls
        return message

    def _deltas(self, reasoning: str, content: str) -> list[dict]:
        out = self._record({"reasoning_content": reasoning})
        if self.calls is not None:
            content, _ = self.calls.feed(content)
        return out + self._record({"content": content})

    def _record(self, delta: dict) -> list[dict]:
        (key, text), = delta.items()
        if not text:
            return []
        (self.reasoning if key == "reasoning_content" else self.content).append(text)
        return [delta]
