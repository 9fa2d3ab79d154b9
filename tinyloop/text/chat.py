"""Chat templates: messages -> prompt token ids.

Message text is always encoded as plain text, so a user who writes "<|im_end|>" gets
those characters, never a conversation boundary; only the template itself inserts
control tokens, by id.

Templates (the model file's `chat_template` names one, optionally as JSON with options):
- "plain":  "System: ...\\nUser: ...\\nAssistant:" for raw-BPE models with no chat
            tokens; generation also stops at a new "\\nUser:" turn.
- "chatml": <|im_start|>role\\ncontent<|im_end|>\\n ... <|im_start|>assistant\\n, with a
            default system message when the conversation has none (if the model has
            one); generation stops at <|im_end|>. Ouro's checkpoints ship this form; a
            -Thinking model opens its own <think> block inside the assistant turn (a
            request that turns thinking off gets it written empty and closed there).
- "huginn": Huginn-0125's turns: [<|begin_text|>] <|begin_header|>role<|end_header|>\n\n
            content (trimmed) <|end_turn|> ..., the assistant called "Huginn", ending with
            <|begin_header|>Huginn<|end_header|>\n\n; generation stops at <|end_turn|>.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from tinyloop.errors import TinyLoopError
from tinyloop.text import toolformat
from tinyloop.text.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")  # what a message may be from (asgi/chat_messages.py checks)
TEMPLATES = ("plain", "chatml", "huginn")
THINK_TAGS = ("<think>", "</think>")


@dataclass(frozen=True)
class ChatTemplate:
    name: str = "plain"
    default_system: str | None = None
    stop_strings: tuple = field(default=())
    thinking: tuple | None = None              # (open tag, close tag) of a thinking section

    @classmethod
    def from_metadata(cls, text: str) -> "ChatTemplate":
        """Parse the model file's chat_template entry ("" means plain)."""
        text = (text or "plain").strip()
        thinking = None
        if text.startswith("{"):
            spec = orjson.loads(text)
            name = spec.get("name", "plain")
            default_system = spec.get("default_system")
            thinking = spec.get("thinking")
            thinking = THINK_TAGS if thinking is True else (tuple(thinking) if thinking else None)
            if thinking is not None and (len(thinking) != 2 or not all(isinstance(t, str) and t for t in thinking)):
                raise TinyLoopError("chat template option 'thinking' must be true or [open tag, close tag]")
        else:
            name, default_system = text, None
        if name not in TEMPLATES:
            raise TinyLoopError(f"unknown chat template {name!r}; known: {', '.join(TEMPLATES)}")
        return cls(name, default_system, ("\nUser:",) if name == "plain" else (), thinking)

    def to_metadata(self) -> str:
        if self.default_system is None and self.thinking is None:
            return self.name
        spec = {"name": self.name, "default_system": self.default_system}
        if self.thinking is not None:
            spec["thinking"] = list(self.thinking)
        return orjson.dumps(spec).decode()

    def end_of_turn_ids(self, tokenizer: Tokenizer) -> tuple:
        if self.name == "chatml":
            return (_special_id(tokenizer, "<|im_end|>"),)
        if self.name == "huginn":
            return (_special_id(tokenizer, "<|end_turn|>"),)
        return ()

    def render(self, messages: list[dict], tokenizer: Tokenizer, tools: list | None = None,
               think: bool = True) -> list[int]:
        """Messages ({role, content, tool_calls?}) -> prompt ids ending where the assistant
        speaks. tools: function declarations, written at the end of the system turn
        (text/toolformat.py); they count against the context like any prompt text.
        think False (a request that turns thinking off): a template with a thinking
        section writes that section empty and closed after the assistant header, so the
        model starts on its answer at once; a template without one ignores it."""
        messages = self._with_system(messages, tools)
        answer_start = "" if think else self._empty_thinking()
        if self.name == "chatml":
            return self._render_chatml(messages, tokenizer, answer_start)
        if self.name == "huginn":
            return self._render_huginn(messages, tokenizer, answer_start)
        return self._render_plain(messages, tokenizer, answer_start)

    def _empty_thinking(self) -> str:
        """A thinking section with nothing in it, written as a past turn's section is
        (_text), so the model reads it as thinking already done."""
        if self.thinking is None:
            return ""
        open_tag, close_tag = self.thinking
        return f"{open_tag}\n\n{close_tag}\n\n"

    def _render_huginn(self, messages, tokenizer, answer_start=""):
        begin, end_header = _special_id(tokenizer, "<|begin_header|>"), _special_id(tokenizer, "<|end_header|>")
        end_turn = _special_id(tokenizer, "<|end_turn|>")
        bos = tokenizer.token_to_id("<|begin_text|>")
        ids: list[int] = [] if bos is None else [bos]
        for message in messages:             # the default system turn is already in (_with_system)
            role = "Huginn" if message["role"] == "assistant" else message["role"]
            ids += ([begin] + tokenizer.encode(role) + [end_header] + tokenizer.encode("\n\n")
                    + tokenizer.encode(self._text(message).strip()) + [end_turn])
        return (ids + [begin] + tokenizer.encode("Huginn") + [end_header] + tokenizer.encode("\n\n")
                + (tokenizer.encode(answer_start) if answer_start else []))

    def _with_system(self, messages, tools):
        messages = list(messages)
        if self.default_system and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.default_system})
        if tools:
            if messages[0]["role"] != "system":
                messages.insert(0, {"role": "system", "content": ""})
            declared = toolformat.declarations(tools)
            messages[0] = {**messages[0], "content": messages[0]["content"] + declared}
        return messages

    def _text(self, message) -> str:
        text = message["content"]
        if self.thinking is not None and message.get("reasoning_content"):
            open_tag, close_tag = self.thinking
            text = f"{open_tag}\n{message['reasoning_content']}\n{close_tag}\n\n{text}"
        if message.get("tool_calls"):
            text = (text + "\n" if text else "") + toolformat.calls_text(message["tool_calls"])
        return text

    def _render_plain(self, messages, tokenizer, answer_start=""):
        parts = [f"{message['role'].capitalize()}: {self._text(message)}\n" for message in messages]
        parts.append("Assistant:" + (" " + answer_start if answer_start else ""))   # "Role: text", as above
        return tokenizer.encode("".join(parts))

    def _render_chatml(self, messages, tokenizer, answer_start=""):
        start, end = _special_id(tokenizer, "<|im_start|>"), _special_id(tokenizer, "<|im_end|>")
        newline = tokenizer.encode("\n")
        ids: list[int] = []
        for message in messages:
            ids += [start] + tokenizer.encode(f"{message['role']}\n{self._text(message)}") + [end] + newline
        return ids + [start] + tokenizer.encode("assistant\n" + answer_start)


def _special_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise TinyLoopError(f"the chat template needs the token {token!r}, which this tokenizer lacks")
    return token_id
