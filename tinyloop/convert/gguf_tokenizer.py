"""A `tokenizers` tokenizer.json built from a GGUF vocabulary (byte-level BPE models).

llama.cpp's "smollm" pre-tokenizer (also "starcoder", "refact") first isolates every
digit, then applies the GPT-2 split; "gpt2" applies the GPT-2 split only. Control
tokens (token type 3) become special added tokens, user-defined ones (type 4) plain
added tokens; all keep their ids.
"""
from __future__ import annotations

import orjson

from tinyloop.convert.gguf import GGUFError

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4
DIGITS_FIRST = ("smollm", "starcoder", "refact")
PRE_TOKENIZERS = DIGITS_FIRST + ("gpt2", "default")


def _byte_level():
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def tokenizer_json_from_gguf(path, metadata: dict) -> str:
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFError(path, f"tokenizer model {model!r} is not supported (only byte-level BPE, 'gpt2')")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(path, f"pre-tokenizer {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})")
    tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
    merges = metadata.get("tokenizer.ggml.merges", [])
    if pre in DIGITS_FIRST:
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, _byte_level()]}
    else:
        pre_tokenizer = _byte_level()
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": kind == TOKEN_CONTROL}
             for i, (tok, kind) in enumerate(zip(tokens, types)) if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": pre_tokenizer, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": {tok: i for i, tok in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }
    return orjson.dumps(spec).decode()
