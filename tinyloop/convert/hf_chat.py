"""Recognise the chat template a Hugging Face checkpoint ships (a Jinja text in
tokenizer_config.json) as one of TinyLoop's templates. Rendering is ours
(text/chat.py), never the Jinja: message text stays text."""
from __future__ import annotations

import re

from tinyloop.text.chat import THINK_TAGS, ChatTemplate

_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system\\?n(.*?)<\|im_end\|>", re.S)


def chat_template_from_hf(template) -> ChatTemplate:
    if isinstance(template, list):          # [{"name": "default", "template": ...}, ...]
        chosen = next((t for t in template if t.get("name") == "default"), template[0] if template else {})
        template = chosen.get("template", "")
    template = template or ""
    if "<|begin_header|>" in template and "<|end_turn|>" in template:
        return ChatTemplate("huginn")
    if "<|im_start|>" in template:
        match = _DEFAULT_SYSTEM.search(template)
        default = match.group(1).replace("\\n", "\n") if match and "{" not in match.group(1) else None
        # a template that writes <think>...</think> (Ouro-Thinking) has a thinking section:
        # the reply's thinking goes to reasoning_content (README "Agents")
        thinking = THINK_TAGS if all(tag in template for tag in THINK_TAGS) else None
        return ChatTemplate("chatml", default, thinking=thinking)
    return ChatTemplate("plain")
