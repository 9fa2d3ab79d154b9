import random

import pytest

from tinyloop.text.stopstrings import StopStringMatcher


def run(stops, pieces):
    matcher = StopStringMatcher(stops)
    released = [matcher.feed(p) for p in pieces]
    return released, matcher.flush(), matcher.stopped


def test_match_across_token_boundaries_ends_before_the_stop():
    released, tail, stopped = run(["END"], ["Hello E", "N", "D world"])
    assert "".join(released) + tail == "Hello " and stopped


def test_holds_back_only_a_possible_prefix():
    matcher = StopStringMatcher(["\nUser:"])
    assert matcher.feed("Hi there") == "Hi there"
    assert matcher.feed("\nUs") == ""            # could become the stop
    assert matcher.feed("ually") == "\nUsually"  # could not: released
    assert matcher.feed(" ok\n") == " ok"
    assert matcher.flush() == "\n"               # ended without a stop: released


def test_earliest_of_several_stops_wins():
    released, tail, stopped = run(["cd", "b"], ["abcd"])
    assert "".join(released) == "a" and stopped


def test_no_stops_pass_through():
    released, tail, stopped = run([], ["a", "b"])
    assert released == ["a", "b"] and tail == "" and not stopped


def test_after_a_stop_nothing_more_is_released():
    matcher = StopStringMatcher(["x"])
    assert matcher.feed("abxcd") == "ab"
    assert matcher.feed("more") == "" and matcher.flush() == ""


@pytest.mark.parametrize("seed", range(200))
def test_random_splits_equal_the_whole_text_rule(seed):
    rng = random.Random(seed)
    alphabet = "ab\nU:é🙂"
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 3))]
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 8))))
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    released, tail, stopped = run(stops, pieces)
    positions = [text.find(s) for s in stops if s and text.find(s) >= 0]
    expected = text[:min(positions)] if positions else text
    assert "".join(released) + tail == expected
    assert stopped == bool(positions)


def test_holds_back_the_longest_possible_prefix_not_the_shortest():
    """Stop "aab" fed as "xaa" then "b yz": after "xaa" both "a" and "aa" could start
    the stop; holding back only "a" would release the first "a" and miss the stop."""
    matcher = StopStringMatcher(["aab"])
    assert matcher.feed("xaa") == "x"
    assert matcher.feed("b yz") == ""
    assert matcher.stopped
    assert matcher.flush() == ""


def test_a_prefix_as_long_as_the_longest_stop_minus_one_is_held_back():
    matcher = StopStringMatcher(["q", "abcdef"])
    assert matcher.feed("zzabcde") == "zz"       # "abcde" could still become "abcdef"
    assert matcher.feed("f!") == ""
    assert matcher.stopped


def test_empty_stop_strings_are_ignored():
    matcher = StopStringMatcher(["", "END"])
    assert matcher.feed("abc") == "abc"
    assert matcher.feed("xEND") == "x" and matcher.stopped
