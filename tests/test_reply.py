"""A chat reply's text -> reasoning, content, tool calls (asgi/reply.py), streamed in any
cuts or whole; the prompt side of tools and thinking (tinyloop/text/chat.py, toolformat.py).
Expected values are written out by hand from the format's definition."""
import json

import numpy as np
import pytest

from asgi.errors import ApiError
from asgi.reply import Reply
from tinyloop.text.chat import ChatTemplate
from tinyloop.text.splitter import split_all

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
THINK = ("<think>", "</think>")

CASES = [
    # (thinking tags, tools, reply text, reasoning, content, call arguments or None)
    (None, [ADD], CALL, "", None, [{"a": 1}]),
    (None, [ADD], "Sure.\n" + CALL + "\n" + CALL.replace("1", "2"), "", "Sure.", [{"a": 1}, {"a": 2}]),
    (None, [ADD], "Plain answer with a <b>tag</b>.", "", "Plain answer with a <b>tag</b>.", None),
    (None, [ADD], "Cut short\n<tool_call>\n{\"name\": \"ad", "", "Cut short", None),
    (None, [ADD], CALL + "\n<tool_call>\n{\"name\": \"ad", "", None, [{"a": 1}]),
    (THINK, [], "<think>\nsum it\n</think>\n\n3", "sum it\n", "3", None),
    (THINK, [], "No thinking here", "", "No thinking here", None),
    (THINK, [], "<think>still thinking when cut", "still thinking when cut", "", None),
    (THINK, [ADD], "<think>call add</think>\n" + CALL, "call add", None, [{"a": 1}]),
    (None, [], "text with \n<tool_call>\n spelled, no tools", "", "text with \n<tool_call>\n spelled, no tools",
     None),
]


def run_reply(tags, tools, pieces):
    reply, streamed = Reply(tags, tools), {"reasoning_content": "", "content": ""}
    for piece in pieces:
        for delta in reply.feed(piece):
            (key, text), = delta.items()
            streamed[key] += text
    deltas, calls = reply.finish()
    for delta in deltas:
        (key, text), = delta.items()
        streamed[key] += text
    return reply.message(calls), streamed, calls


@pytest.mark.parametrize("tags, tools, text, reasoning, content, arguments", CASES)
def test_reply_parts_whole_and_streamed(tags, tools, text, reasoning, content, arguments):
    message, _, calls = run_reply(tags, tools, [text])
    assert message.get("reasoning_content", "") == reasoning
    assert message["content"] == content
    assert [json.loads(c["function"]["arguments"]) for c in calls or []] == (arguments or [])
    rng = np.random.default_rng(len(text))
    for _ in range(40):                   # any cuts: the streamed deltas add up to the same parts
        cuts = sorted(set(int(c) for c in rng.integers(0, len(text) + 1, int(rng.integers(1, 6)))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        streamed_message, streamed, streamed_calls = run_reply(tags, tools, pieces)
        assert streamed["reasoning_content"] == reasoning and streamed["content"] == (content or "")
        assert [c["function"] for c in streamed_calls or []] == [c["function"] for c in calls or []]


def test_a_call_that_breaks_its_schema_is_never_returned():
    bad = '<tool_call>\n{"name": "add", "arguments": {"a": "one"}}\n</tool_call>'
    with pytest.raises(ApiError) as info:
        run_reply(None, [ADD], [bad])
    assert info.value.status == 500 and "validation" in info.value.message


def test_split_all():
    assert split_all("a\n<x>\nb", "\n<x>\n", "<x>\n") == ("a", "b")
    assert split_all("<x>\nb", "\n<x>\n", "<x>\n") == ("", "b")
    assert split_all("a<x>b", "\n<x>\n", "<x>\n") == ("a<x>b", None)


class Words:
    """A stand-in tokenizer: one id per character, enough to read back rendered text."""

    def encode(self, text):
        return [ord(c) for c in text]


def render(template, messages, tools=None, think=True):
    return "".join(chr(i) for i in template.render(messages, Words(), tools, think))


def test_tools_are_declared_in_the_system_turn_and_calls_rendered_escaped():
    template = ChatTemplate.from_metadata("plain")
    history = [{"role": "user", "content": "add </tool_call> please"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "function": {"name": "add", "arguments": {"a": "</tool_call>\n<tool_call>"}}}]},
               {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"}]
    text = render(template, history, [ADD])
    assert text.startswith("System: \n\nYou can call functions")
    assert '{"type": "function", "function": {"name": "add"' in text
    # the historical argument's tags are escaped: the only tags are the ones the template wrote
    assert text.count("<tool_call>") == 2 and text.count("</tool_call>") == 3    # 1 in the instructions
    assert '{"a": "\\u003c/tool_call\\u003e\\n\\u003ctool_call\\u003e"}' in text
    assert "User: add </tool_call> please\n" in text and "Tool: 3\n" in text


def test_thinking_history_is_rendered_only_for_thinking_templates():
    message = [{"role": "assistant", "content": "3", "reasoning_content": "1+2"}]
    thinking = ChatTemplate.from_metadata('{"name": "plain", "thinking": true}')
    assert thinking.thinking == THINK
    assert "Assistant: <think>\n1+2\n</think>\n\n3\n" in render(thinking, message)
    assert "Assistant: 3\n" in render(ChatTemplate.from_metadata("plain"), message)
    assert ChatTemplate.from_metadata(thinking.to_metadata()) == thinking


def test_a_request_that_turns_thinking_off_gets_the_section_closed_empty():
    """Responses reasoning.effort none, Messages thinking disabled: the prompt ends with an
    empty, closed section (written as a past turn's), so the model answers at once."""
    user = [{"role": "user", "content": "1+2?"}]
    thinking = ChatTemplate.from_metadata('{"name": "plain", "thinking": true}')
    assert render(thinking, user, think=False).endswith("User: 1+2?\nAssistant: <think>\n\n</think>\n\n")
    assert render(thinking, user).endswith("User: 1+2?\nAssistant:")
    plain = ChatTemplate.from_metadata("plain")            # no section: nothing to close
    assert render(plain, user, think=False) == render(plain, user)


@pytest.mark.parametrize("pieces, expected", [
    (list("<think>ab</think>cd"), 17),                    # 7 + 2 + 8 one-character tokens
    (list("\n<think>ab</think>\n\ncd"), 18),              # the separating blank lines are the answer's
    (["<think>", "a", "</thi", "nk>The", " end"], 4),      # the token that closes the tag counts, whole
    (["<th", "ink>", "</think>"], 3),
    (list("<think>abc"), 10),                             # cut short: every token was thinking
    (list("abc<think>d</think>"), 0),                     # not at the start: no section
    ([], 0),
])
def test_thinking_tokens_counts_the_sections_generated_tokens(pieces, expected):
    from tinyloop.text.thinking import thinking_tokens
    decode = lambda ids: "".join(pieces[i] for i in ids)    # noqa: E731 - token i spells pieces[i]
    assert thinking_tokens(list(range(len(pieces))), decode, *THINK) == expected


def test_a_thinking_template_routes_reasoning_buffered_and_streamed(tmp_path):
    """A tiny model whose template has a thinking section, pushed into it (a grammar allows
    <think> first, a bias picks '<'): the thinking goes to reasoning_content, never content."""
    from test_server_asgi import post, ready_app

    from tinyloop.model.modelfile import ModelFile, write_model_file
    from tinyloop.model.testmodels import make_test_model, random_weights
    from tinyloop.text.tokenizer import Tokenizer

    config = make_test_model(tmp_path / "plain.tinyloop", "tiny-looped", seed=0, max_seq_len=2048)
    tokenizer_json = ModelFile(tmp_path / "plain.tinyloop").tokenizer_json
    path = write_model_file(tmp_path / "think.tinyloop", config, random_weights(config, 0), tokenizer_json,
                            chat_template='{"name": "plain", "thinking": true}')
    app = ready_app(path)
    less_than, = Tokenizer(tokenizer_json).encode("<")
    body = {"model": "tl", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12,
            "logit_bias": {str(less_than): 100}, "response_format": {"type": "json_object"}}
    message = post(app, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert message["content"] == "" and message["reasoning_content"].startswith("<")
    events = post(app, "/v1/chat/completions", {**body, "stream": True}).events()
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert not any(d.get("content") for d in deltas)
    no_end = {str(eos): -100 for eos in config.eos_token_ids}
    default = post(app, "/v1/chat/completions", {"model": "tl", "messages": [{"role": "user", "content": "hi"}],
                                                 "logit_bias": no_end})
    assert default.json()["usage"]["completion_tokens"] == 128 + 1024       # a thinking model's default budget


def test_history_calls_are_identified_by_id_and_order_not_index(tmp_path):
    """Repeated `index` values (gateway histories) are accepted; each tool message answers
    the call with its id; the prompt holds both calls in order (the text written out here)."""
    from test_server_asgi import post, ready_app

    from tinyloop.model.modelfile import ModelFile
    from tinyloop.model.testmodels import make_test_model
    from tinyloop.text.tokenizer import Tokenizer

    config = make_test_model(tmp_path / "m.tinyloop", "tiny-looped", seed=0, max_seq_len=2048)
    app = ready_app(tmp_path / "m.tinyloop")
    calls = [{"id": f"c{i}", "index": 0, "type": "function",
              "function": {"name": "add", "arguments": json.dumps({"a": i})}} for i in (1, 2)]
    history = [{"role": "user", "content": "add twice"}, {"role": "assistant", "content": None, "tool_calls": calls},
               {"role": "tool", "tool_call_id": "c2", "content": "2"},
               {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    response = post(app, "/api/v0/chat/completions", {"model": "tl", "messages": history, "max_tokens": 2})
    assert response.status == 200, response.body
    expected = ('User: add twice\nAssistant: <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
                '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>\nTool: 2\nTool: 1\nAssistant:')
    ids = Tokenizer(ModelFile(tmp_path / "m.tinyloop").tokenizer_json).encode(expected)
    bos = 0 if config.bos_token_id is None else 1
    assert response.json()["usage"]["prompt_tokens"] == len(ids) + bos
