"""One reply, streamed or whole, as the Responses and Messages APIs shape it.

asgi/reply.py splits the generated text into reasoning and content deltas (a thinking
template's section first, then the answer) and, with tools, holds back everything from
the first call on; at the end every call is validated before any is published (the
chat completions guarantee). Here those deltas become an API's blocks: each kind of
text is one block (opened at its first delta, closed when the next kind starts or the
reply ends), then each tool call is one whole block. A subclass says what opening,
extending and closing a block means in its API; the same object, its events ignored,
builds the non-streamed reply, so both forms carry the same content.
"""
from __future__ import annotations

from .reply import Reply
from .typed_events import TypedEventStream


class ReplyEvents:
    def __init__(self):
        self.open_kind: str | None = None          # "reasoning" | "text" while a block is open
        self._pieces: list[str] = []
        self.released: list[str] = []              # every released piece of text, for stop sequences

    # --- what a subclass implements (each returns the events to send)
    def open_block(self, kind: str) -> list:
        raise NotImplementedError

    def block_delta(self, kind: str, text: str) -> list:
        raise NotImplementedError

    def close_block(self, kind: str, text: str) -> list:
        raise NotImplementedError

    def keeps(self, kind: str) -> bool:
        """Whether this kind of text is part of the reply (Messages drops reasoning unless asked)."""
        return True

    # --- shared
    def feed(self, deltas: list[dict]) -> list:
        events = []
        for delta in deltas:
            (key, text), = delta.items()
            kind = "reasoning" if key == "reasoning_content" else "text"
            if not self.keeps(kind):
                continue
            if kind != self.open_kind:
                events += self.close()
                events += self.open_block(kind)
                self.open_kind, self._pieces = kind, []
            self._pieces.append(text)
            events += self.block_delta(kind, text)
        return events

    def close(self) -> list:
        if self.open_kind is None:
            return []
        kind, self.open_kind = self.open_kind, None
        return self.close_block(kind, "".join(self._pieces))


async def run_reply(request, generation, writer, tools: list, stream: TypedEventStream | None) -> list:
    """Drive one generation through Reply and `writer`; send events as they come when
    streaming. Returns the validated tool calls (chat shape), [] if none."""
    reply = Reply(request.state.template.thinking, tools)
    if stream is None:
        _, text = await generation.text()
        writer.released.append(text)
        writer.feed(reply.feed(text))
    else:
        async for batch in generation.batches():
            events = []
            for _, text in batch:
                if text:
                    writer.released.append(text)
                    events += writer.feed(reply.feed(text))
            await stream.events(events)
    deltas, calls = reply.finish()
    events = writer.feed(deltas)
    if stream is not None:
        await stream.events(events)
    return calls or []
