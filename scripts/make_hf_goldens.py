"""Write the tiny Hugging Face checkpoints under tests/data/hf/ and their golden logits,
computed by each architecture's own public modeling code (not by TinyLoop).

Run once, in a separate environment with PyTorch and transformers (never the project's
venv), with the public modeling files fetched beside it (tests/data/README.md says
exactly which and how):

    /tmp/refvenv/bin/python scripts/make_hf_goldens.py --ouro-ref /tmp/ouro_ref \
        --raven-ref /tmp/raven_ref --retrofit-ref /tmp/retro_ref --out tests/data/hf

Per layout it writes DIR/{config.json, tokenizer.json, tokenizer_config.json,
safetensors...} and DIR/golden.npz: the prompt ids, the reference's logits of the
whole prompt at each loop count, greedy continuations, and (Ouro) the exit gate's
sigmoid after every loop. TinyLoop code is used only for the tokenizer (trained on the
package's corpus) and, for Huginn, for the seeded initial state, which the reference
draws from torch's global generator; here it is handed to the reference as
`input_states` so both sides start from the same state.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tinyloop.model.state import initial_state  # noqa: E402
from tinyloop.model.testmodels import train_tokenizer  # noqa: E402

PROMPT = "The looped transformer thinks again and"
GREEDY_TOKENS = 12
LAYOUTS = ("llama", "ouro", "huginn", "retrofit", "llama_llama3", "retrofit_llama3")
# Llama 3's RoPE scaling on the tiny checkpoints: head_dim 8 at theta 10000 has wavelengths
# 6.3, 63, 628 and 6283 positions, so with these bands (original / high_freq_factor = 32,
# original / low_freq_factor = 128) the first pair is kept, the second blended and the last two
# slowed by the factor: every branch of the rule changes something within the prompt.
# The plain Llama's uses other low/high factors than Llama 3's 1 and 4 (so a converter that
# assumed those would fail); the retrofit's is what convert_llama.py writes (factor from the
# Llama-3.2 config, low 1, high 4), with a tiny original length instead of 8192.
LLAMA_LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                        "original_max_position_embeddings": 256}
RETROFIT_LLAMA3_SCALING = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 128, "rope_type": "llama3"}
HUGINN_SPECIALS = ["<|begin_text|>", "<|begin_header|>", "<|end_header|>", "<|end_turn|>", "<|end_text|>"]


def load_package(name: str, directory: Path, module: str):
    """Import directory/module.py as name.module, so its relative imports resolve."""
    spec = importlib.util.spec_from_file_location(name, directory / "__init__.py",
                                                  submodule_search_locations=[str(directory)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return importlib.import_module(f"{name}.{module}")


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Weights that make the logits depend on every layer: 1/sqrt(fan_in) linears,
    norms near 1, small biases (the libraries' own inits give near-uniform logits)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("ln_f.weight"):
                value = 1.0 + 0.1 * torch.randn(param.shape, generator=generator)
            elif name.endswith("bias"):
                value = 0.3 * torch.randn(param.shape, generator=generator)
            elif param.dim() == 2 and ("embed" in name or "wte" in name):
                value = torch.randn(param.shape, generator=generator) * 0.5
            else:
                value = torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5
            param.copy_(value)


def round_to(model: torch.nn.Module, dtype) -> None:
    """Round every weight to the stored precision, so the reference computes (in float32)
    with exactly the values the checkpoint holds."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(dtype).to(torch.float32))


def write_tokenizer(out: Path, template: str | None, specials=(), bos: str | None = None,
                    eos: str = "<|endoftext|>"):
    """template None: no chat_template key at all (a base model's tokenizer)."""
    tokenizer = train_tokenizer()
    if specials:
        tokenizer.add_special_tokens(list(specials))
    (out / "tokenizer.json").write_text(tokenizer.to_str())
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos,
              "add_bos_token": bos is not None, "bos_token": bos}
    if template is not None:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return tokenizer


def greedy(forward, prompt: list, steps: int) -> list:
    """Greedy continuation by re-running the whole sequence each step (no cache)."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(forward(ids)[-1].argmax()))
    return ids[len(prompt):]


def save_safetensors(state: dict, out: Path, shards: int = 1) -> None:
    from safetensors.torch import save_file
    names = sorted(state)
    if shards == 1:
        save_file({n: state[n].contiguous() for n in names}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})
        return
    weight_map = {}
    for index in range(shards):
        part = names[index::shards]
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n].contiguous() for n in part}, str(out / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


# ------------------------------------------------------------------------------- llama
def make_llama(out: Path, rope_scaling: dict | None = None) -> None:
    """rope_scaling: Llama 3's (the same weights as the unscaled folder: same seed and shapes);
    golden.npz then also holds the reference's logits with the scaling left out."""
    from transformers import LlamaConfig, LlamaForCausalLM
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(out, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    def build(scaling):
        config = LlamaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             max_position_embeddings=512 if scaling else 256, rms_norm_eps=1e-5,
                             rope_theta=10000.0, rope_scaling=dict(scaling) if scaling else None,
                             tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, hidden_act="silu")
        config._attn_implementation = "eager"
        return LlamaForCausalLM(config).eval()
    model = build(rope_scaling)
    randomise(model, 1)
    model.save_pretrained(out, safe_serialization=True)       # fp32, one file, the library's own names
    prompt = tokenizer.encode(PROMPT).ids

    def forward(ids, model=model):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float().numpy()
    extra = {}
    if rope_scaling:
        assert model.model.rotary_emb.rope_type == "llama3"
        unscaled = build(None)
        unscaled.load_state_dict(model.state_dict())
        extra["logits_unscaled"] = forward(prompt, unscaled)[None]
    np.savez_compressed(out / "golden.npz", prompt=np.array(prompt), loops=np.array([1]),
                        logits=forward(prompt)[None], greedy=np.array([greedy(forward, prompt, GREEDY_TOKENS)]),
                        **extra)


# -------------------------------------------------------------------------------- ouro
OURO_CONFIG_SHIM = '''
from transformers import PretrainedConfig


class OuroConfig(PretrainedConfig):
    """The fields modeling_ouro.py reads (the checkpoint's own configuration file is not public on GitHub)."""
    model_type = "ouro"

    def __init__(self, vocab_size=49152, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=16, head_dim=None, hidden_act="silu",
                 max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
                 total_ut_steps=4, early_exit_threshold=1.0, tie_word_embeddings=False, attention_dropout=0.0,
                 sliding_window=None, use_sliding_window=False, layer_types=None, use_cache=True, **kwargs):
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act, self.max_position_embeddings = hidden_act, max_position_embeddings
        self.rms_norm_eps, self.rope_theta, self.rope_scaling = rms_norm_eps, rope_theta, rope_scaling
        self.total_ut_steps, self.early_exit_threshold = total_ut_steps, early_exit_threshold
        self.attention_dropout, self.sliding_window = attention_dropout, sliding_window
        self.use_sliding_window, self.use_cache = use_sliding_window, use_cache
        self.layer_types = layer_types or ["full_attention"] * num_hidden_layers
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
'''


def make_ouro(out: Path, reference: Path) -> None:
    (reference / "configuration_ouro.py").write_text(OURO_CONFIG_SHIM)
    modeling = load_package("ouro_ref", reference, "modeling_ouro")
    config_module = importlib.import_module("ouro_ref.configuration_ouro")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(out, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
                                     "{% endif %}")
    hf = dict(architectures=["OuroForCausalLM"], model_type="ouro", vocab_size=tokenizer.get_vocab_size(),
              hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, head_dim=8, hidden_act="silu", max_position_embeddings=256,
              rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None, total_ut_steps=4,
              early_exit_threshold=1.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
              use_sliding_window=False, sliding_window=None, attention_dropout=0.0)
    config = config_module.OuroConfig(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "eager"
    model = modeling.OuroForCausalLM(config).eval()
    randomise(model, 2)
    round_to(model, torch.bfloat16)
    state = {n: p.detach().to(torch.bfloat16) for n, p in model.state_dict().items()}
    save_safetensors(state, out)
    (out / "config.json").write_text(json.dumps(hf, indent=1))
    prompt = tokenizer.encode(PROMPT).ids

    def forward(ids, step=3):
        with torch.no_grad():
            return model(torch.tensor([ids]), use_cache=False, exit_at_step=step).logits[0].float().numpy()
    with torch.no_grad():
        _, _, gates = model.model(input_ids=torch.tensor([prompt]), use_cache=False)
    lambdas = np.stack([torch.sigmoid(g[0, :, 0]).numpy() for g in gates], axis=1)      # (T, steps)
    np.savez_compressed(out / "golden.npz", prompt=np.array(prompt), loops=np.arange(1, 5),
                        logits=np.stack([forward(prompt, step) for step in range(4)]),
                        greedy=np.array([greedy(lambda ids: forward(ids, 3), prompt, GREEDY_TOKENS)]),
                        greedy_loops=np.array([4]), exit_lambda=lambdas)


# ------------------------------------------------------------------------------ huginn
def make_huginn(out: Path, reference: Path) -> None:
    modeling = load_package("raven_ref", reference, "raven_modeling_minimal")
    config_module = importlib.import_module("raven_ref.raven_config_minimal")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(
        out, "{% for m in messages %}<|begin_header|>{{ m.role }}<|end_header|>\n\n{{ m.content | trim }}"
             "<|end_turn|>{% endfor %}{% if add_generation_prompt %}<|begin_header|>Huginn<|end_header|>\n\n"
             "{% endif %}", specials=HUGINN_SPECIALS, bos="<|begin_text|>", eos="<|end_text|>")
    hf = dict(architectures=["RavenForCausalLM"], model_type="huginn_raven", n_embd=32, n_heads=4, n_layers=6,
              block_size=256, vocab_size=520, padding_multiple=8, tie_embeddings=True, intermediate_size=64,
              bias=False, architecture_class_name="RecurrentGPT", block_class_name="SandwichBlock",
              norm_class_name="RMSNorm_llama", norm_eps=1e-6, mlp_class_name="GatedMLP", nonlin_name="SiLU",
              init_strategy="takase", init_orthogonal=False, state_init="like-init", injection_type="linear",
              n_layers_in_recurrent_block=2, mean_recurrence=4, sampling_scheme="poisson-lognormal-filling",
              mean_backprop_depth=2, n_layers_in_prelude=2, n_layers_in_coda=2, qk_bias=True,
              activation_checkpoint_impl="per-iteration", rope_base=50000.0, torch_dtype="float16",
              bos_token_id=tokenizer.token_to_id("<|begin_text|>"),
              eos_token_id=tokenizer.token_to_id("<|end_text|>"))
    config = config_module.RavenConfig(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")})
    model = modeling.RavenForCausalLM(config).eval()
    randomise(model, 3)
    round_to(model, torch.float16)
    state = {n: p.detach().to(torch.float16) for n, p in model.state_dict().items() if n != "lm_head.weight"}
    state["freqs_cis"] = model.freqs_cis.detach().clone()        # a persistent buffer real checkpoints carry
    save_safetensors(state, out, shards=3)
    (out / "config.json").write_text(json.dumps(hf, indent=1))
    prompt = tokenizer.encode(PROMPT).ids
    std = (2 / (5 * hf["n_embd"])) ** 0.5 * hf["n_embd"] ** 0.5

    def forward(ids, steps=4, seed=0, noise=True):
        state0 = initial_state(std if noise else 0.0, seed, np.arange(len(ids)), hf["n_embd"])
        with torch.no_grad():
            result = model(torch.tensor([ids]), input_states=torch.from_numpy(state0)[None], num_steps=steps)
        return result.logits[0].float().numpy()
    loops = np.array([1, 2, 4, 8])
    np.savez_compressed(out / "golden.npz", prompt=np.array(prompt), loops=loops,
                        logits=np.stack([forward(prompt, int(n)) for n in loops]),
                        logits_zero_state=forward(prompt, 4, noise=False)[None],
                        greedy=np.array([greedy(lambda ids: forward(ids, 4), prompt, GREEDY_TOKENS)]),
                        greedy_loops=np.array([4]), state_seed=np.array([0]))


# -------------------------------------------------------------------------- retrofitted
RETROFIT_SPECIALS = ["<unk>", "<s>", "</s>"]        # TinyLlama's (Llama 2's) special tokens


def retrofit_config_json(tokenizer) -> dict:
    """config.json as the authors' convert_llama.py leaves it: Huginn-0125's config with the
    Llama's shapes written over it (GQA, head_dim, rope_theta, untied head, init_values'
    embed_scale set to 1 while std stays Huginn's), saved under Huginn's class names. The
    tiny model: prelude 1, core 2, coda 2; rope_base is left at a value the Llama modeling
    never reads, so a converter reading it instead of rope_theta fails the goldens."""
    huginn_std = (2 / (5 * 5280)) ** 0.5
    return dict(
        architectures=["RavenForCausalLM"], model_type="huginn_raven",
        auto_map={"AutoConfig": "raven_config_minimal.RavenConfig",
                  "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM"},
        n_embd=32, n_heads=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, n_layers=5,
        block_size=4096, vocab_size=tokenizer.get_vocab_size(), padded_vocab_size=tokenizer.get_vocab_size(),
        padding_multiple=4096, tie_embeddings=False, tie_word_embeddings=False, intermediate_size=64,
        bias=False, architecture_class_name="RecurrentGPT", block_class_name="SandwichBlock",
        norm_class_name="RMSNorm_llama", norm_eps=1e-5, mlp_class_name="GatedMLP", nonlin_name="SiLU",
        init_strategy="takase", init_orthogonal=False, state_init="like-init", injection_type="linear",
        n_layers_in_recurrent_block=2, mean_recurrence=32, sampling_scheme="poisson-lognormal-filling",
        mean_backprop_depth=8, n_layers_in_prelude=1, n_layers_in_coda=2, qk_bias=False,
        activation_checkpoint_impl="per-iteration", rope_base=500000.0, rope_theta=10000.0,
        max_position_embeddings=256, torch_dtype="bfloat16", test_time_noise=0, test_time_noise_type="fixed",
        init_values={"std": huginn_std, "out_proj": huginn_std / (2 * 132) ** 0.5, "embedding": huginn_std,
                     "embed_scale": 1.0},
        bos_token_id=tokenizer.token_to_id("<s>"), eos_token_id=tokenizer.token_to_id("</s>"))


def make_retrofit(out: Path, reference: Path, rope_scaling: dict | None = None) -> None:
    """rope_scaling: as convert_llama.py writes it for a Llama-3.2 (the weights are the same as
    the unscaled folder's: same seed and shapes); golden.npz then also holds the reference's
    logits with the scaling left out."""
    modeling = load_package("retro_ref", reference, "raven_modeling_minimal")
    config_module = importlib.import_module("retro_ref.raven_config_minimal")
    out.mkdir(parents=True, exist_ok=True)
    # TinyLlama's base tokenizer ships no chat template
    tokenizer = write_tokenizer(out, None, specials=RETROFIT_SPECIALS, bos="<s>", eos="</s>")
    hf = retrofit_config_json(tokenizer)
    if rope_scaling:
        hf["rope_scaling"] = dict(rope_scaling)
    # Huginn's config class takes tie_embeddings only (the authors' README: drop tie_word_embeddings)
    skip = ("architectures", "model_type", "auto_map", "tie_word_embeddings")
    config = config_module.RavenConfig(**{k: v for k, v in hf.items() if k not in skip})
    model = modeling.RavenForCausalLM(config).eval()
    if rope_scaling:
        assert model.rotary_emb.rope_type == "llama3"
    assert model.emb_scale == 1.0 and config.num_key_value_heads == 2     # the saved values won
    randomise(model, 10)       # a seed whose greedy continuation varies (others repeat one token)
    round_to(model, torch.bfloat16)
    state = {n: p.detach().to(torch.bfloat16) for n, p in model.state_dict().items()}
    save_safetensors(state, out)
    (out / "config.json").write_text(json.dumps(hf, indent=1))
    prompt = [tokenizer.token_to_id("<s>")] + tokenizer.encode(PROMPT).ids
    std = hf["init_values"]["std"] * hf["init_values"]["embed_scale"]

    def forward(ids, steps=4, noise=True, model=model):
        state0 = initial_state(std if noise else 0.0, 0, np.arange(len(ids)), hf["n_embd"])
        with torch.no_grad():
            result = model(torch.tensor([ids]), input_states=torch.from_numpy(state0)[None], num_steps=steps)
        return result.logits[0].float().numpy()
    loops = np.array([1, 2, 4, 8, 32])
    extra = {}
    if rope_scaling:
        unscaled = modeling.RavenForCausalLM(config_module.RavenConfig(
            **{k: v for k, v in hf.items() if k not in skip + ("rope_scaling",)})).eval()
        unscaled.load_state_dict(model.state_dict())
        extra["logits_unscaled"] = np.stack([forward(prompt, int(n), model=unscaled) for n in loops])
    np.savez_compressed(out / "golden.npz", prompt=np.array(prompt), loops=loops,
                        logits=np.stack([forward(prompt, int(n)) for n in loops]),
                        logits_zero_state=forward(prompt, 4, noise=False)[None],
                        greedy=np.array([greedy(lambda ids: forward(ids, 4), prompt, GREEDY_TOKENS)]),
                        greedy_loops=np.array([4]), state_seed=np.array([0]), **extra)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ouro-ref", type=Path, help="folder with Ouro's modeling_ouro.py")
    parser.add_argument("--raven-ref", "--huginn-ref", dest="raven_ref", type=Path,
                        help="folder with raven_modeling_minimal.py and raven_config_minimal.py")
    parser.add_argument("--retrofit-ref", type=Path,
                        help="folder with the retrofitted-recurrence raven_modeling_minimal.py (the Llama one) "
                             "and Huginn's raven_config_minimal.py")
    parser.add_argument("--out", type=Path, default=ROOT / "tests/data/hf")
    parser.add_argument("--only", choices=LAYOUTS, action="append",
                        help="write only these layouts (repeatable); default: all")
    args = parser.parse_args()
    torch.manual_seed(0)
    only = set(args.only or LAYOUTS)
    for layout, folder in (("ouro", args.ouro_ref), ("huginn", args.raven_ref), ("retrofit", args.retrofit_ref),
                           ("retrofit_llama3", args.retrofit_ref)):
        if layout in only and folder is None:
            parser.error(f"the {layout} layout needs its reference folder (--{layout.split('_')[0]}-ref)")
    if "llama" in only:
        make_llama(args.out / "llama")
    if "ouro" in only:
        make_ouro(args.out / "ouro", args.ouro_ref)
    if "huginn" in only:
        make_huginn(args.out / "huginn", args.raven_ref)
    if "retrofit" in only:
        make_retrofit(args.out / "retrofit", args.retrofit_ref)
    if "llama_llama3" in only:
        make_llama(args.out / "llama_llama3", LLAMA_LLAMA3_SCALING)
    if "retrofit_llama3" in only:
        make_retrofit(args.out / "retrofit_llama3", args.retrofit_ref, RETROFIT_LLAMA3_SCALING)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
