"""Prompt texts for the serving scenarios: lines of the shipped English text
(tinyloop/data/bpe_corpus.txt), shuffled by a seed and joined until the model's tokenizer
counts the tokens asked for. Each text starts with a label of its own, so two prompts
never share more than the chat template's opening with each other (a prefix cache must
not turn one prompt into a cache hit on another; each round uses fresh seeds)."""
from __future__ import annotations

import random
from importlib import resources

QUESTIONS = [
    "In two sentences, what does the text above say about loops and depth?",
    "Summarize the part about speculative decoding for a beginner.",
    "Which foods were on sale at the market, according to the text?",
    "What did the text say about the train and the snow?",
    "List three of the programming examples that appear in the text.",
    "Which languages and scripts are mentioned in the text?",
    "What is the capital of France, and how many legs does a spider have?",
    "Write one sentence about the weather described in the text.",
    "Why does the text say that whitespace matters to a tokenizer?",
    "What does the text say happens when the deep pass disagrees with the draft?",
    "Give a title for the text above, in five words or fewer.",
    "Which numbers in the text look like dates or times?",
]


def _lines() -> list:
    text = resources.files("tinyloop.data").joinpath("bpe_corpus.txt").read_text("utf-8")
    return [line.strip() for line in text.splitlines() if len(line.strip()) > 20]


class Texts:
    """Texts of about N tokens for one model's tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.lines = _lines()
        sample = " ".join(self.lines)
        self.chars_per_token = max(len(sample) / max(len(tokenizer.encode(sample)), 1), 1.0)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def text(self, tokens: int, seed: int, label: str = "Document") -> str:
        """About `tokens` tokens (the tokenizer's count of the text alone, within a few
        tokens): a label with the seed, then shuffled lines, cut at a token boundary."""
        rng = random.Random(seed)
        head = f"{label} {seed}.\n"
        pieces, length = [head], len(head)
        target = int(tokens * self.chars_per_token * 1.3) + 64
        while length < target:
            lines = list(self.lines)
            rng.shuffle(lines)
            for line in lines:
                pieces.append(line + "\n")
                length += len(line) + 1
        ids = self.tokenizer.encode("".join(pieces))[:tokens]
        return self.tokenizer.decode(ids)

    def question(self, index: int) -> str:
        return QUESTIONS[index % len(QUESTIONS)] + ("" if index < len(QUESTIONS) else f" (variant {index})")
