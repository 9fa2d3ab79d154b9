"""A thinking section at the start of a reply: <think>reasoning</think> then the answer.

Templates that have one (ChatTemplate.thinking = (open, close)) produce replies whose
reasoning goes to `reasoning_content`, separate from `content`. A reply that does not
open with the tag has no reasoning. Streamed: nothing that may still be a tag is shown.
thinking_tokens counts the generated tokens that belong to the section (usage's
reasoning_tokens).
"""
from __future__ import annotations

from tinyloop.text.splitter import MarkerSplitter


class ThinkingSplitter:
    def __init__(self, open_tag: str, close_tag: str):
        self.open_tag, self.close_tag = open_tag, close_tag
        self.undecided = ""                       # the reply so far, while it may still open with the tag
        self.thinking: MarkerSplitter | None = None
        self.content_started = False
        self.reasoning_started = False
        self.decided = False

    @property
    def closed(self) -> bool:
        """The reply opened a thinking section and its closing tag has come."""
        return self.thinking is not None and self.thinking.split

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning delta, content delta)."""
        if not self.decided:
            self.undecided += text
            head = self.undecided.lstrip()
            if self.open_tag.startswith(head):
                return "", ""
            self.decided = True
            text, self.undecided = self.undecided, ""
            if head.startswith(self.open_tag):
                self.thinking = MarkerSplitter(self.close_tag)
                text = head[len(self.open_tag):]
        if self.thinking is None:
            return "", text
        reasoning, content = self.thinking.feed(text)
        if not self.reasoning_started:
            reasoning = reasoning.lstrip("\n")
            self.reasoning_started = bool(reasoning)
        return reasoning, self._content(content)

    def finish(self) -> tuple[str, str]:
        if not self.decided:
            return "", self.undecided
        if self.thinking is None:
            return "", ""
        return self.thinking.finish(), ""

    def _content(self, text: str) -> str:
        """The answer without the blank lines that separate it from the thinking."""
        if not self.content_started:
            text = text.lstrip("\n")
            self.content_started = bool(text)
        return text


def split_thinking(text: str, open_tag: str, close_tag: str) -> tuple[str, str]:
    """A whole reply -> (reasoning, content)."""
    splitter = ThinkingSplitter(open_tag, close_tag)
    reasoning, content = splitter.feed(text)
    tail_reasoning, tail_content = splitter.finish()
    return reasoning + tail_reasoning, content + tail_content


def thinking_tokens(token_ids: list, decode, open_tag: str, close_tag: str) -> int:
    """How many of a reply's generated tokens belong to its thinking section: those up to
    and including the one that completes the closing tag; all of them when the section
    never closes (the reply was cut short); none when the reply does not open with the
    tag. The real tokens are counted, not the section's text re-encoded (which could
    tokenize differently): the shortest prefix of token_ids whose text closes the
    section, found by bisection (a prefix that closes it stays closed as it grows)."""
    def section(count: int) -> ThinkingSplitter:
        splitter = ThinkingSplitter(open_tag, close_tag)
        splitter.feed(decode(token_ids[:count]))
        return splitter

    whole = section(len(token_ids))
    if whole.thinking is None:
        return 0
    if not whole.closed:
        return len(token_ids)
    low, high = 1, len(token_ids)           # section(high) is closed; find the first count that is
    while low < high:
        middle = (low + high) // 2
        if section(middle).closed:
            high = middle
        else:
            low = middle + 1
    return high
