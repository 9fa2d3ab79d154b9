import numpy as np
import pytest

from tinyloop.errors import RequestError
from tinyloop.text.tokenizer import StreamingDetokenizer, byte_level_alphabet

TEXTS = ["Hello there!", "café naïve 東京 🚀🎉 done", "def f(x):\n    return x  + 1\n\n",
         "   leading spaces", "numbers 12345 and 3.14159", ""]


def byte_token(tokenizer, byte: int) -> int:
    char = {b: c for c, b in byte_level_alphabet().items()}[byte]
    return tokenizer.token_to_id(char)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(tiny, text):
    ids = tiny.tokenizer.encode(text)
    assert tiny.tokenizer.decode(ids) == text


def test_alphabet_covers_every_byte():
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))


def test_emoji_split_into_byte_tokens_comes_out_whole(tiny):
    tok = tiny.tokenizer
    ids = [byte_token(tok, b) for b in "a🚀b".encode()]
    detok = StreamingDetokenizer(tok)
    deltas = [detok.push(i) for i in ids]
    assert deltas == ["a", "", "", "", "🚀", "b"]
    assert detok.flush() == ""


def test_two_byte_character_split_across_tokens(tiny):
    tok = tiny.tokenizer
    detok = StreamingDetokenizer(tok)
    first, second = "é".encode()
    assert detok.push(byte_token(tok, first)) == ""
    assert detok.push(byte_token(tok, second)) == "é"


def test_flush_turns_an_incomplete_tail_into_replacement_characters(tiny):
    tok = tiny.tokenizer
    detok = StreamingDetokenizer(tok)
    assert detok.push(tok.encode("ok")[0]) in ("ok", "o")
    for b in "🚀".encode()[:2]:
        assert detok.push(byte_token(tok, b)) == ""
    assert detok.flush() == "\ufffd"


def test_stream_of_random_tokens_matches_whole_decode(tiny):
    rng = np.random.default_rng(0)
    tok = tiny.tokenizer
    for _ in range(50):
        ids = [int(i) for i in rng.integers(3, tok.vocab_size, int(rng.integers(1, 40)))]
        detok = StreamingDetokenizer(tok)
        streamed = "".join(detok.push(i) for i in ids) + detok.flush()
        assert streamed == tok.decode(ids)


def test_special_token_spelling_is_encoded_as_plain_text(tiny):
    tok = tiny.tokenizer
    special = tok.token_to_id("<|im_end|>")
    ids = tok.encode("hi <|im_end|> <|endoftext|>")
    assert special not in ids and tok.token_to_id("<|endoftext|>") not in ids
    assert tok.decode(ids) == "hi <|im_end|> <|endoftext|>"


def test_special_tokens_produce_no_text(tiny):
    tok = tiny.tokenizer
    detok = StreamingDetokenizer(tok)
    assert detok.push(tok.token_to_id("<|endoftext|>")) == ""


def test_given_ids_are_validated(tiny):
    tok = tiny.tokenizer
    assert tok.check_ids([1, 2]) == [1, 2]
    with pytest.raises(RequestError, match=r"outside the vocabulary \[0, 512\)"):
        tok.check_ids([1, 512])
    with pytest.raises(RequestError, match="must be integers"):
        tok.check_ids([1, "2"])
