"""Grammars for llguidance: JSON output (any object, or a schema) and tool-call replies.

llguidance builds its token tables from the model's own tokenizer.json (kept in the
model file) once per tokenizer; a grammar compiles in about a millisecond per request.
A grammar that llguidance refuses (an unimplemented keyword, a bad pattern) is a
RequestError with llguidance's reason.
"""
from __future__ import annotations

import threading
import weakref

import orjson

from tinyloop.errors import RequestError
from tinyloop.grammar.constraint import GrammarConstraint
from tinyloop.grammar.schema_check import check_schema, closed_objects

# Compact JSON: the model writes what the client will parse, no free whitespace to wander in.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_tables_lock = threading.Lock()


def token_tables(tokenizer, eos_ids):
    """The llguidance tokenizer for our Tokenizer (built once, ~0.3 s for a 49k vocabulary)."""
    import llguidance

    with _tables_lock:
        tables = _tables.get(tokenizer)
        if tables is None:
            tables = llguidance.LLTokenizer(tokenizer.tokenizer_json, n_vocab=tokenizer.vocab_size,
                                            eos_token=sorted(eos_ids))
            _tables[tokenizer] = tables
        return tables


def json_schema_grammar(schema, param: str) -> str:
    check_schema(schema, param)
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(closed_objects(schema), overrides=JSON_OPTIONS)


def json_object_grammar() -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)


def lark_grammar(text: str) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_lark(text)


def with_thinking(lark: str, tags: tuple) -> str:
    """A lark grammar whose reply may first hold a thinking section (open tag, anything
    without the close tag, close tag, blank lines), as a thinking template's model writes."""
    open_tag, close_tag = (_regex_literal(tag) for tag in tags)
    body = lark.replace("start:", "answer:", 1)
    return (f"start: thinking BLANK? answer | answer\n"
            f"thinking[lazy]: /{open_tag}[\\s\\S]*{close_tag}/\n"
            "BLANK: /\\n+/\n" + body)


def _regex_literal(text: str) -> str:
    return "".join("\\" + ch if ch in "\\/.^$|?*+()[]{}-" else ch for ch in text)


def schema_lark(schema, param: str) -> str:
    """json_schema_grammar's language as a lark grammar (to combine with other rules)."""
    check_schema(schema, param)
    return f"start: {json_in_lark(closed_objects(schema))}\n"


def json_in_lark(schema) -> str:
    """A schema as a lark rule body (llguidance's %json extension), compact like JSON_OPTIONS."""
    schema = {**schema, "x-guidance": JSON_OPTIONS}
    return "%json " + orjson.dumps(schema).decode()


class Grammar:
    """A checked grammar for one tokenizer; start() gives each generation its own state."""

    def __init__(self, grammar: str, tokenizer, eos_ids, param: str):
        """RequestError (naming `param`) if llguidance refuses the grammar."""
        import llguidance

        self.tables = token_tables(tokenizer, eos_ids)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tables)
        if failed or messages:
            raise RequestError(f"'{param}' cannot be used for constrained output: {'; '.join(messages)}", param)
        self.grammar, self.vocab_size, self.eos_ids, self.param = grammar, tokenizer.vocab_size, eos_ids, param

    def start(self) -> GrammarConstraint:
        import llguidance

        matcher = llguidance.LLMatcher(self.tables, self.grammar, log_level=0)
        if matcher.is_error():
            raise RequestError(f"'{self.param}' cannot be used for constrained output: {matcher.get_error()}",
                               self.param)
        return GrammarConstraint(matcher, self.vocab_size, self.eos_ids)
