"""Text <-> token ids through the `tokenizers` library, from the JSON in the model file.

Besides encode/decode, each token id gets the exact bytes it stands for, so the
streaming detokenizer can work on bytes and emit only whole UTF-8 characters.
"""
from __future__ import annotations

import codecs
import re
from functools import lru_cache

import orjson
from tokenizers import Tokenizer as _HFTokenizer

from tinyloop.errors import RequestError

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: each of the 256 bytes has a printable character.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to
    code points 256 and up, in byte order. Returns character -> byte.
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1))
                 + list(range(0xAE, 0xFF + 1)))
    mapping = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shift)
            shift += 1
    return {char: b for b, char in mapping.items()}


class Tokenizer:
    def __init__(self, tokenizer_json: str, vocab_size: int | None = None):
        self.tokenizer_json = tokenizer_json          # llguidance builds its token tables from it
        self._tok = _HFTokenizer.from_str(tokenizer_json)
        # Plain-text encoding: "<|im_end|>" typed by a user is characters, not a boundary.
        self._tok.encode_special_tokens = True
        spec = orjson.loads(tokenizer_json)
        self.vocab_size = max(self._tok.get_vocab_size(with_added_tokens=True), vocab_size or 0)
        self.special_ids = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
        self.token_bytes = self._build_token_bytes(spec)

    def _build_token_bytes(self, spec: dict) -> list[bytes]:
        """Bytes of every id; special tokens map to b"" (they never appear in text)."""
        decoder = (spec.get("decoder") or {}).get("type", "")
        decoders = {decoder} | {d.get("type") for d in (spec.get("decoder") or {}).get("decoders", [])}
        added = {t["id"]: t for t in spec.get("added_tokens", [])}
        alphabet = byte_level_alphabet()
        table = []
        for token_id in range(self.vocab_size):
            piece = self._tok.id_to_token(token_id)
            if piece is None or token_id in self.special_ids:
                table.append(b"")
            elif token_id in added:
                table.append(added[token_id]["content"].encode())
            elif "ByteLevel" in decoders:
                table.append(bytes(alphabet[ch] for ch in piece))
            else:
                match = _BYTE_FALLBACK.match(piece)
                if match and "ByteFallback" in decoders:
                    table.append(bytes([int(match.group(1), 16)]))
                else:
                    table.append(piece.replace("\u2581", " ").encode())
        return table

    def encode(self, text: str) -> list[int]:
        """Plain text -> ids. No BOS is added here; chat templates decide that."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def check_ids(self, ids, param: str = "prompt") -> list[int]:
        """Validate given token ids (the "prompt as ids" form)."""
        out = []
        for token_id in ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise RequestError(f"{param} token ids must be integers, got {token_id!r}", param)
            if not 0 <= token_id < self.vocab_size:
                raise RequestError(f"{param} token id {token_id} is outside the vocabulary "
                                   f"[0, {self.vocab_size})", param)
            out.append(token_id)
        return out

    def decode(self, ids, skip_special: bool = True) -> str:
        """Ids -> text. Special tokens are dropped unless skip_special is False."""
        if not skip_special:
            return self._tok.decode(list(ids), skip_special_tokens=False)
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)


class StreamingDetokenizer:
    """Turns a stream of token ids into text deltas made of whole UTF-8 characters.

    A character whose bytes are split across tokens (an emoji from two byte tokens)
    is held back until complete. `flush()` ends the stream: an incomplete tail comes
    out as U+FFFD replacement characters.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._bytes = tokenizer.token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._decoder.decode(self._bytes[token_id], final=False)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
