"""Cost of grammar-constrained decoding on the default model, side by side with
unconstrained decoding (same prompt, same token count, alternating runs).

    python scripts/mask_cost.py [--model PATH] [--tokens 64] [--repeats 3]

Reports per generated token: unconstrained decode time, constrained decode time, the
grammar's own share (mask computation + applying it + advancing the matcher), and the
whole token-choice step of each run (logits to the host, shaping, argmax: the constrained
run takes the host path, the unconstrained one asks the backend for the argmax). The
decode times are whole-step wall clock and move with the machine's load; the two
in-process timings are the cost the grammar adds. The constrained run is forced to the same length (ignore_eos,
a schema with a long string) so both decode the same number of tokens.
"""
from __future__ import annotations

import argparse
import time

from tinyloop.engine import decode as decode_module
from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.grammar import constraint as constraint_module
from tinyloop.grammar.compile import Grammar, json_schema_grammar
from tinyloop.model.loader import load_model

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "minLength": 400},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
          "required": ["name", "tags"]}


class Timed:
    """Wraps GrammarConstraint's methods (total) and the decoder's token choice (choice)
    to add up the time spent in them."""
    total = 0.0
    choice = 0.0

    @classmethod
    def install(cls):
        original_choice = decode_module.next_tokens_with_logprobs

        def timed_choice(*args):
            start = time.perf_counter()
            try:
                return original_choice(*args)
            finally:
                cls.choice += time.perf_counter() - start
        decode_module.next_tokens_with_logprobs = timed_choice
        for name in ("apply", "advance"):
            original = getattr(constraint_module.GrammarConstraint, name)

            def timed(self, *args, _original=original):
                start = time.perf_counter()
                try:
                    return _original(self, *args)
                finally:
                    cls.total += time.perf_counter() - start
            setattr(constraint_module.GrammarConstraint, name, timed)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a .tinyloop file (default: the default model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.model is None:
        from tinyloop.convert.pull import ensure_default_model
        args.model = ensure_default_model()
    loaded = load_model(args.model)
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = loaded.with_bos(tokenizer.encode("Describe a cat as JSON:"))
    grammar = Grammar(json_schema_grammar(SCHEMA, "response_format"), tokenizer, loaded.config.eos_token_ids, "x")
    Timed.install()
    plain_s, constrained_s, grammar_s, plain_choice_s, constrained_choice_s = [], [], [], [], []
    for _ in range(args.repeats):
        Timed.choice = 0.0
        out = generate(model, GenerationRequest(prompt, args.tokens, ignore_eos=True))
        plain_s.append((out.wall_s - out.prefill_s) / (out.completion_tokens - 1))
        plain_choice_s.append(Timed.choice / out.completion_tokens)
        Timed.total = Timed.choice = 0.0
        out = generate(model, GenerationRequest(prompt, args.tokens, ignore_eos=True, grammar=grammar))
        constrained_s.append((out.wall_s - out.prefill_s) / (out.completion_tokens - 1))
        grammar_s.append(Timed.total / out.completion_tokens)
        constrained_choice_s.append(Timed.choice / out.completion_tokens)
    plain, constrained, mask = min(plain_s), min(constrained_s), min(grammar_s)
    plain_choice, constrained_choice = min(plain_choice_s), min(constrained_choice_s)
    print(f"model {args.model}, {args.tokens} tokens, best of {args.repeats}")
    print(f"unconstrained decode : {plain * 1e3:8.3f} ms/token")
    print(f"constrained decode   : {constrained * 1e3:8.3f} ms/token  ({(constrained / plain - 1) * 100:+.1f}%)")
    print(f"grammar (mask+advance): {mask * 1e3:8.3f} ms/token  ({mask / plain * 100:.1f}% of unconstrained decode)")
    print(f"token choice, unconstrained: {plain_choice * 1e3:8.3f} ms/token; constrained: "
          f"{constrained_choice * 1e3:8.3f} ms/token (+{(constrained_choice - plain_choice) / plain * 100:.1f}% of "
          "unconstrained decode)")


if __name__ == "__main__":
    main()
