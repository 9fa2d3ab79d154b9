"""The serving scenarios' settings, checked against the model before anything is measured,
and the run of the scenarios asked for (--concurrency, --chat-turns)."""
from __future__ import annotations

from dataclasses import dataclass

from tinyloop.bench.serving import llama_server
from tinyloop.bench.serving.chat import needed_context
from tinyloop.bench.serving.concurrency import TEMPLATE_ROOM
from tinyloop.errors import TinyLoopError

ANSWER_TOKENS = 32              # tokens per chat answer
INTERFERENCE_BUDGET = 2048      # most tokens a running stream of the interference measurement may take
MAX_LEVEL = 256


@dataclass
class ServingPlan:
    model: str
    concurrency: dict | None    # the sweep's settings, or None when not asked for
    chat: dict | None
    llama: dict                 # llama_server.locate()'s answer
    eos_ids: tuple
    tokenizer: object
    device: str | None

    def llama_status(self, report: dict) -> dict:
        """llama-server over both sections: measured if either measured it, else why not."""
        states = [report[name].get("llama_server") for name in ("concurrency", "chat") if name in report]
        states = [s for s in states if s]
        for state in states:
            if state.get("status") == "measured":
                return {"status": "measured", "path": state.get("path"), "version": state.get("version")}
        for state in states:
            if state.get("status") == "failed":
                return {"status": "failed", "reason": state.get("reason")}
        return {"status": "skipped", "reason": self.llama.get("reason", "not run")}


def serving_plan(args, model: str) -> ServingPlan:
    from tinyloop.model.modelfile import ModelFile
    from tinyloop.text.tokenizer import Tokenizer
    quick = args.quick
    model_file = ModelFile(model)
    try:
        config = model_file.config
        tokenizer = Tokenizer(model_file.tokenizer_json, config.vocab_size)
    finally:
        model_file.close()
    room = config.max_seq_len
    common = {"model": model, "gguf": args.gguf, "threads": args.threads,
              "rounds": args.rounds or (3 if quick else 5),
              "settle": args.settle if args.settle is not None else (0.05 if quick else 0.3)}
    concurrency = chat = None
    if args.concurrency:
        levels = list(dict.fromkeys(args.concurrency))
        if max(levels) > MAX_LEVEL:
            raise TinyLoopError(f"--concurrency {max(levels)}: at most {MAX_LEVEL}")
        prompt = args.context or (64 if quick else 128)
        decode = args.decode_tokens or (16 if quick else 64)
        if prompt + decode + TEMPLATE_ROOM > room:
            raise TinyLoopError(f"--context {prompt} + --decode-tokens {decode} (+ {TEMPLATE_ROOM} for the chat "
                                f"template) must fit the model's context of {room} tokens")
        streams = args.interference_streams
        if streams and args.long_prompt + 4 + TEMPLATE_ROOM > room:
            raise TinyLoopError(f"--long-prompt {args.long_prompt} (+ {TEMPLATE_ROOM + 4} for the chat template "
                                f"and the answer) must fit the model's context of {room} tokens")
        if streams and streams + 1 > MAX_LEVEL:
            raise TinyLoopError(f"--interference-streams {streams}: at most {MAX_LEVEL - 1}")
        concurrency = {**common, "levels": levels, "prompt_tokens": prompt, "decode_tokens": decode,
                       "interference_streams": streams, "long_prompt": args.long_prompt,
                       "interference_budget": min(INTERFERENCE_BUDGET, room - prompt - TEMPLATE_ROOM),
                       "before_s": 0.3 if quick else 2.0, "route": "POST /v1/chat/completions, streamed",
                       "sampling": "greedy (temperature 0), end of sequence ignored"}
    if args.chat_turns:
        need = needed_context(args.system_tokens, args.chat_turns, ANSWER_TOKENS)
        if need > room:
            raise TinyLoopError(f"--system-tokens {args.system_tokens} and --chat-turns {args.chat_turns} need about "
                                f"{need} tokens of context ({ANSWER_TOKENS}-token answers); the model has {room}")
        chat = {**common, "turns": args.chat_turns, "system_tokens": args.system_tokens,
                "answer_tokens": ANSWER_TOKENS, "route": "POST /v1/chat/completions, streamed",
                "sampling": "greedy (temperature 0), end of sequence ignored"}
    llama = llama_server.locate(args.llama_server, args.gguf)
    return ServingPlan(model, concurrency, chat, llama, tuple(config.eos_token_ids), tokenizer, args.device)


def run_serving(plan: ServingPlan) -> dict:
    from tinyloop.bench.serving.chat import chat_section
    from tinyloop.bench.serving.concurrency import concurrency_section
    out = {}
    if plan.concurrency is not None:
        out["concurrency"] = concurrency_section(plan.model, plan.concurrency, plan.llama, plan.eos_ids,
                                                 plan.tokenizer, device=plan.device)
    if plan.chat is not None:
        out["chat"] = chat_section(plan.model, plan.chat, plan.llama, plan.eos_ids, plan.tokenizer,
                                   device=plan.device)
    return out
