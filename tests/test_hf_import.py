"""Hugging Face checkpoints (Llama, Ouro, Huginn and retrofitted-recurrence layouts; Llama and
the retrofit also with Llama 3's RoPE scaling) convert and compute what their own public
modeling code computes: golden logits in
tests/data/hf/*/golden.npz were produced once by that code on these tiny checkpoints
(tests/data/README.md)."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors_writer import save_file

from tinyloop.convert.from_hf import convert_hf
from tinyloop.convert.safetensors_dir import CheckpointError, SafetensorsDir
from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import RequestError
from tinyloop.model.loader import load_model

DATA = Path(__file__).parent / "data" / "hf"
LAYOUTS = ("llama", "ouro", "huginn", "retrofit", "llama_llama3", "retrofit_llama3")
LLAMA3_LAYOUTS = ("llama_llama3", "retrofit_llama3")       # the same weights as "llama" and "retrofit"
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    paths = {}
    for layout in LAYOUTS:
        paths[layout] = folder / f"{layout}.tinyloop"
        convert_hf(DATA / layout, paths[layout], progress=False)
    return paths


def golden(layout):
    return np.load(DATA / layout / "golden.npz")


def prompt_logits(model, prompt, loops):
    cache = model.new_cache(len(prompt) + 1, loops)
    return model.backend.to_host(model.forward(prompt, np.arange(len(prompt)), cache, loops))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_match_the_reference_at_every_loop_count(converted, layout):
    model = load_model(converted[layout], "cpu", kv_mode="fp32").model
    data = golden(layout)
    prompt = [int(t) for t in data["prompt"]]
    for loops, reference in zip(data["loops"], data["logits"]):
        ours = prompt_logits(model, prompt, int(loops))
        assert np.abs(ours - reference).max() <= TOLERANCE, (layout, loops, np.abs(ours - reference).max())
        assert np.array_equal(ours.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_tokens_equal_the_reference(converted, layout):
    loaded = load_model(converted[layout], "cpu", kv_mode="fp32")
    data = golden(layout)
    loops = int(data["greedy_loops"][0]) if "greedy_loops" in data else 1
    expected = [int(t) for t in data["greedy"][0]]
    result = generate(loaded.model, GenerationRequest([int(t) for t in data["prompt"]], len(expected),
                                                      loops=loops, ignore_eos=True))
    assert result.tokens == expected


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_cuda_backend_matches_the_reference_too(converted, layout):
    """The CUDA kernels on each layout (run by the CPU harness here, on the GPU under
    TINYLOOP_TEST_DEVICE=cuda): within 1e-4 of the reference at the first two loop counts."""
    from test_cuda_backend import cuda_backend
    model = load_model(converted[layout], cuda_backend(), kv_mode="fp32").model
    data = golden(layout)
    prompt = [int(t) for t in data["prompt"]]
    for loops, reference in list(zip(data["loops"], data["logits"]))[:2]:
        ours = prompt_logits(model, prompt, int(loops))
        assert np.abs(ours - reference).max() <= TOLERANCE, (layout, loops, np.abs(ours - reference).max())
        assert np.array_equal(ours.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("layout", ("huginn", "retrofit", "retrofit_llama3"))
def test_a_zero_initial_state_matches_too(converted, layout):
    """The random initial state is ours (seeded per position); from a zero state the
    reference needs no state handed over at all."""
    model = load_model(converted[layout], "cpu", kv_mode="fp32").model
    data = golden(layout)
    prompt = [int(t) for t in data["prompt"]]
    # the state must matter on this checkpoint, or the noise checks above would prove nothing about it
    assert np.abs(prompt_logits(model, prompt, 4) - data["logits_zero_state"][0]).max() > 100 * TOLERANCE
    model.config = replace(model.config, state_std=0.0)
    assert np.abs(prompt_logits(model, prompt, 4) - data["logits_zero_state"][0]).max() <= TOLERANCE


@pytest.mark.parametrize("layout", LLAMA3_LAYOUTS)
def test_llama3_rope_scaling_is_what_makes_the_goldens(tmp_path, layout):
    """The scaling matters on these checkpoints: the reference's logits without it (same
    weights) are far from the goldens; the checkpoint converted without its rope_scaling
    matches those unscaled logits instead, and misses the goldens."""
    data = golden(layout)
    assert np.abs(data["logits"] - data["logits_unscaled"]).max(axis=(1, 2)).min() > 100 * TOLERANCE
    directory = copy_layout(tmp_path, layout)
    edit_config(directory, rope_scaling=None)
    convert_hf(directory, tmp_path / "unscaled.tinyloop", progress=False)
    model = load_model(tmp_path / "unscaled.tinyloop", "cpu", kv_mode="fp32").model
    assert model.config.rope_scaling == "none"
    prompt = [int(t) for t in data["prompt"]]
    for loops, scaled, unscaled in zip(data["loops"], data["logits"], data["logits_unscaled"]):
        ours = prompt_logits(model, prompt, int(loops))
        assert np.abs(ours - unscaled).max() <= TOLERANCE
        assert np.abs(ours - scaled).max() > 100 * TOLERANCE


def test_converted_llama3_rope_scaling(converted):
    """config.json's rope_scaling lands in the model config (and the file's header) as given."""
    llama = load_model(converted["llama_llama3"], "cpu").config
    assert (llama.rope_scaling, llama.rope_factor, llama.rope_low_freq_factor, llama.rope_high_freq_factor,
            llama.rope_original_max_positions) == ("llama3", 8.0, 2.0, 8.0, 256)
    retrofit = load_model(converted["retrofit_llama3"], "cpu").config
    assert (retrofit.rope_scaling, retrofit.rope_factor, retrofit.rope_low_freq_factor,
            retrofit.rope_high_freq_factor, retrofit.rope_original_max_positions) == ("llama3", 32.0, 1.0, 4.0, 128)
    assert load_model(converted["llama"], "cpu").config.rope_scaling == "none"


def test_ouro_exit_gate_matches_the_reference(converted):
    model = load_model(converted["ouro"], "cpu", kv_mode="fp32").model
    data = golden("ouro")
    prompt = [int(t) for t in data["prompt"]]
    cache = model.new_cache(len(prompt), 4)
    plan = model.contiguous_plan(0, len(prompt), cache)
    trunk = model.trunk(prompt, plan, cache, 0)
    lambdas = []
    for loops in range(1, 5):
        trunk = model.resume(trunk, plan, cache, loops)
        lambdas.append(model.exit_lambda(trunk.hidden))
    assert np.abs(np.stack(lambdas, axis=1) - data["exit_lambda"]).max() <= 1e-5


def test_converted_configs(converted):
    ouro = load_model(converted["ouro"], "cpu").config
    assert (ouro.n_prelude, ouro.n_core, ouro.n_coda, ouro.max_loops, ouro.default_loops) == (0, 2, 0, 4, 4)
    assert (ouro.post_norm, ouro.loop_norm, ouro.exit_gate) == ("branch", "between", True)
    huginn = load_model(converted["huginn"], "cpu")
    c = huginn.config
    assert (c.n_prelude, c.n_core, c.n_coda, c.default_loops, c.max_loops) == (2, 2, 2, 4, 64)
    assert (c.input_injection, c.post_norm, c.loop_norm, c.initial_state) == ("concat", "sum", "after", "random")
    assert c.embed_scale == pytest.approx(32 ** 0.5) and c.tied_head and c.qk_bias
    assert huginn.file.stored_dtype("core.0.attn.q.weight") == "F16"
    assert load_model(converted["ouro"], "cpu").file.stored_dtype("core.0.attn.q.weight") == "BF16"
    assert huginn.file.chat_template == "huginn"


def test_converted_retrofit_config(converted):
    """What the retrofitted layout's config.json and tensors say, in our terms."""
    loaded = load_model(converted["retrofit"], "cpu")
    c = loaded.config
    assert (c.n_prelude, c.n_core, c.n_coda, c.default_loops, c.max_loops) == (1, 2, 2, 32, 64)
    assert (c.n_heads, c.n_kv_heads, c.head_dim, c.rope_theta, c.norm_eps) == (4, 2, 8, 10000.0, 1e-5)
    assert (c.input_injection, c.post_norm, c.loop_norm, c.initial_state) == ("concat", "none", "none", "random")
    assert c.embed_scale == 1.0 and not c.tied_head and not c.qk_bias
    assert c.state_std == pytest.approx((2 / (5 * 5280)) ** 0.5)       # Huginn's std, kept by the conversion
    assert loaded.file.stored_dtype("core.0.attn.q.weight") == "BF16"
    tokenizer = loaded.tokenizer
    assert (c.bos_token_id, c.eos_token_ids) == (tokenizer.token_to_id("<s>"), (tokenizer.token_to_id("</s>"),))
    assert loaded.file.chat_template == "plain"          # TinyLlama's base tokenizer ships no template


def test_retrofit_ids_outside_the_vocabulary_fall_back_to_the_tokenizer(tmp_path):
    """Huginn's config ids (its own 65536-entry vocabulary) left in a converted model's
    config.json give way to the tokenizer's <s> and </s>, whether outside the vocabulary or not."""
    directory = copy_layout(tmp_path, "retrofit")
    edit_config(directory, bos_token_id=65504, eos_token_id=65505)
    config = convert_hf(directory, tmp_path / "out.tinyloop", progress=False)
    vocab = json.loads((directory / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in vocab}
    assert (config.bos_token_id, config.eos_token_ids) == (ids["<s>"], (ids["</s>"],))
    # inside a vocabulary as large as Llama 3's, Huginn's ids would be other tokens: the tokenizer's win there too
    edit_config(directory, bos_token_id=100, eos_token_id=101)
    config = convert_hf(directory, tmp_path / "in.tinyloop", progress=False)
    assert (config.bos_token_id, config.eos_token_ids) == (ids["<s>"], (ids["</s>"],))


def test_a_bos_added_by_the_tokenizers_post_processor_counts(tmp_path):
    """Llama 3's tokenizer_config.json has no add_bos_token: its tokenizer.json's post-processor
    (ByteLevel, then a TemplateProcessing starting with <|begin_of_text|>) adds the bos."""
    directory = copy_layout(tmp_path, "llama_llama3")
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    del tokenizer_config["add_bos_token"]
    tokenizer_config["bos_token"] = "<|endoftext|>"
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert convert_hf(directory, tmp_path / "plain.tinyloop", progress=False).bos_token_id is None
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    bos = {"id": "<|endoftext|>", "type_id": 0}
    tokenizer["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}]}
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    convert_hf(directory, tmp_path / "bos.tinyloop", progress=False)
    loaded = load_model(tmp_path / "bos.tinyloop", "cpu")
    assert loaded.config.bos_token_id == 0
    # our encoding still adds nothing itself: the bos comes from the config, once
    plain = load_model(tmp_path / "plain.tinyloop", "cpu").tokenizer
    assert loaded.tokenizer.encode("The loop") == plain.encode("The loop")


def test_ouro_refuses_loops_beyond_what_it_was_trained_for(converted):
    model = load_model(converted["ouro"], "cpu").model
    with pytest.raises(RequestError, match=r"loops must be in \[1, 4\]"):
        generate(model, GenerationRequest([1, 2, 3], 4, loops=5))


@pytest.mark.exactness
# huginn and retrofit_llama3 (~10 s each) run with -m slow and in scripts/exactness_matrix.py
@pytest.mark.parametrize("layout", ("ouro", pytest.param("huginn", marks=pytest.mark.slow), "retrofit",
                                    pytest.param("retrofit_llama3", marks=pytest.mark.slow)))
def test_speculative_and_tree_equal_plain_greedy(converted, layout):
    model = load_model(converted[layout], "cpu").model
    rng = np.random.default_rng(13)
    top = min(model.config.max_loops, 6)
    for _ in range(12):
        prompt = [int(t) for t in rng.integers(0, model.config.vocab_size, int(rng.integers(1, 30)))]
        verify = int(rng.integers(2, top + 1))
        draft = int(rng.integers(1, verify))
        max_tokens = int(rng.integers(1, 30))
        plain = generate(model, GenerationRequest(prompt, max_tokens, loops=verify))
        for branches in (1, int(rng.integers(2, 5))):
            params = SpeculativeParams(draft, verify, int(rng.integers(1, 9)), branches)
            spec = speculative_generate(model, GenerationRequest(prompt, max_tokens), params)
            assert spec.tokens == plain.tokens, (layout, prompt, params)


@pytest.mark.exactness
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_are_batch_invariant(converted, layout):
    """A token's logits are bitwise the same whether it runs alone or with others."""
    model = load_model(converted[layout], "cpu").model
    rng = np.random.default_rng(5)
    prompt = [int(t) for t in rng.integers(0, model.config.vocab_size, 20)]
    loops = model.config.default_loops
    cache = model.new_cache(len(prompt), loops)
    together = model.backend.to_host(model.forward(prompt, np.arange(len(prompt)), cache, loops))
    cache = model.new_cache(len(prompt), loops)
    alone = np.concatenate([model.backend.to_host(model.forward([t], [i], cache, loops))
                            for i, t in enumerate(prompt)])
    assert np.array_equal(together, alone)


# ------------------------------------------------------------------------------ refusals
def copy_layout(tmp_path, layout) -> Path:
    target = tmp_path / layout
    shutil.copytree(DATA / layout, target)
    return target


def add_tensor(directory: Path, name: str, value: np.ndarray):
    """Rewrite a one-file checkpoint copy with one more tensor."""
    stored = SafetensorsDir(directory)
    tensors = {n: np.array(stored.get(n)) for n in stored.tensors}
    save_file({**tensors, name: value}, str(directory / "model.safetensors"))


def edit_config(directory: Path, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("layout, changes, message", [
    ("llama", {"architectures": ["Qwen2ForCausalLM"]}, "architecture Qwen2ForCausalLM is not supported"),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling of type 'linear'"),
    ("llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling of type 'dynamic'"),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
     "rope_scaling of type 'yarn'"),
    ("llama", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}},
     "rope_scaling of type 'longrope'"),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "llama3 rope_scaling lacks low_freq_factor, high_freq_factor, original_max_position_embeddings"),
    ("llama", {"rope_scaling": "llama3"}, "rope_scaling must be an object"),
    ("llama_llama3", {"rope_scaling": {"rope_type": "llama3", "factor": 0.5, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
     "rope_factor must be >= 1"),
    ("llama_llama3", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
     r"rope_high_freq_factor \(4.0\) must be greater than rope_low_freq_factor \(4.0\)"),
    ("llama_llama3", {"rope_scaling": {"rope_type": "llama3", "factor": "8", "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
     "rope_scaling factor must be a number, got '8'"),
    ("llama_llama3", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 0}},
     "rope_original_max_positions must be >= 1"),
    ("ouro", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "RoPE scaling in Ouro"),
    ("ouro", {"use_sliding_window": True}, "sliding-window"),
    ("ouro", {"kv_cache_policy": "last_available"}, "KV sharing"),
    ("huginn", {"lookup_strategy": "latest-m4"}, "KV sharing"),
    ("huginn", {"injection_type": "add"}, "injection_type"),
    ("retrofit", {"rope_scaling": {"rope_type": "yarn", "factor": 32.0}}, "rope_scaling of type 'yarn'"),
    ("retrofit_llama3", {"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0}}, "lacks original_max_position_embeddings"),
    ("retrofit", {"initial_state_mode": "skip-adapter"}, "initial_state_mode"),
    ("retrofit", {"injection_type": "add"}, "injection_type"),
    ("retrofit", {"lookup_strategy": "latest-m4"}, "KV sharing"),
    ("retrofit", {"head_dim": 16}, "head_dim 16"),
    ("retrofit", {"qk_bias": True}, "qk_bias with grouped-query attention"),
    ("retrofit", {"test_time_noise": 0.1}, "test_time_noise"),
    ("retrofit", {"rope_theta": None}, "lacks rope_theta"),
    ("llama", {"num_hidden_layers": 3}, "is missing"),
])
def test_unsupported_layouts_are_refused_by_name(tmp_path, layout, changes, message):
    directory = copy_layout(tmp_path, layout)
    edit_config(directory, **changes)
    output = tmp_path / "out.tinyloop"
    with pytest.raises(CheckpointError, match=message):
        convert_hf(directory, output, progress=False)
    assert not output.exists() and not (tmp_path / "out.tinyloop.partial").exists()


def test_a_failed_conversion_leaves_no_output(tmp_path):
    """The shape mismatch shows up while tensors are being written: nothing is left."""
    directory = copy_layout(tmp_path, "llama")
    edit_config(directory, intermediate_size=48)
    output = tmp_path / "out.tinyloop"
    with pytest.raises(CheckpointError, match="shape"):
        convert_hf(directory, output, progress=False)
    assert list(tmp_path.glob("out.tinyloop*")) == []


def test_extra_tensors_are_refused(tmp_path):
    directory = copy_layout(tmp_path, "ouro")
    add_tensor(directory, "model.layers.0.self_attn.q_norm.weight", np.ones(8, np.float32))
    with pytest.raises(CheckpointError, match="q_norm"):
        convert_hf(directory, tmp_path / "out.tinyloop", progress=False)


def test_retrofit_qk_norm_is_refused(tmp_path):
    """The authors' OLMo-2 variant stores q_norm / k_norm in the same layout: refused by name."""
    directory = copy_layout(tmp_path, "retrofit")
    add_tensor(directory, "transformer.core_block.0.attn.q_norm.weight", np.ones(32, np.float32))
    with pytest.raises(CheckpointError, match="QK-norm .*q_norm"):
        convert_hf(directory, tmp_path / "out.tinyloop", progress=False)


def test_missing_shard_and_pickles(tmp_path):
    directory = copy_layout(tmp_path, "huginn")
    (directory / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        convert_hf(directory, tmp_path / "out.tinyloop", progress=False)
    for file in directory.glob("model*"):
        file.unlink()
    (directory / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointError, match="only safetensors"):
        convert_hf(directory, tmp_path / "out.tinyloop", progress=False)


def test_cli_converts_a_directory(tmp_path, capsys):
    from tinyloop.cli import main
    assert main(["convert", str(DATA / "ouro"), str(tmp_path / "o.tinyloop"), "--quiet"]) == 0
    assert "loops 1-4" in capsys.readouterr().out
    assert main(["convert", str(DATA / "llama") + "-nope", str(tmp_path / "x.tinyloop")]) != 0


# ---------------------------------------------------------------------------------- chat
def test_shipped_chat_templates_are_recognised():
    from tinyloop.convert.hf_chat import chat_template_from_hf
    names = {layout: chat_template_from_hf(json.loads((DATA / layout / "tokenizer_config.json").read_text())
                                           .get("chat_template")).name for layout in LAYOUTS}
    assert names == {"llama": "chatml", "ouro": "chatml", "huginn": "huginn", "retrofit": "plain",
                     "llama_llama3": "chatml", "retrofit_llama3": "plain"}
    listed = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "<|im_start|>{{ x }}"}]
    assert chat_template_from_hf(listed).name == "chatml"
    assert chat_template_from_hf(None).name == "plain"
    system = "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM<|im_end|>\\n' }}<|im_start|>"
    assert chat_template_from_hf(system).default_system == "You are a helpful AI assistant named SmolLM"
    assert chat_template_from_hf(system).thinking is None
    # a thinking checkpoint's template (Ouro-Thinking: ChatML writing <think>...</think>): the
    # reply's thinking section goes to reasoning_content, and the option survives the model file
    from tinyloop.text.chat import ChatTemplate
    thinking = chat_template_from_hf("<|im_start|>assistant\n<think>\n{{ r }}\n</think>\n{{ c }}<|im_end|>")
    assert thinking.name == "chatml" and thinking.thinking == ("<think>", "</think>")
    assert ChatTemplate.from_metadata(thinking.to_metadata()).thinking == ("<think>", "</think>")


def test_huginn_turns_render_with_message_text_kept_as_text(converted):
    from tokenizers import Tokenizer as HFTokenizer

    from tinyloop.text.chat import ChatTemplate
    loaded = load_model(converted["huginn"], "cpu")
    template = ChatTemplate.from_metadata(loaded.file.chat_template)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi <|end_turn|> there\n"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}]
    ids = loaded.with_bos(template.render(messages, loaded.tokenizer))
    raw = HFTokenizer.from_file(str(DATA / "huginn" / "tokenizer.json"))
    # the text Huginn's own template gives for these messages (contents trimmed, the
    # assistant named Huginn, a generation prompt at the end)
    expected = ("<|begin_text|><|begin_header|>system<|end_header|>\n\nBe brief.<|end_turn|>"
                "<|begin_header|>user<|end_header|>\n\nHi <|end_turn|> there<|end_turn|>"
                "<|begin_header|>Huginn<|end_header|>\n\nHello.<|end_turn|>"
                "<|begin_header|>user<|end_header|>\n\nAgain<|end_turn|>"
                "<|begin_header|>Huginn<|end_header|>\n\n")
    assert raw.decode(ids, skip_special_tokens=False) == expected
    end_turn = raw.token_to_id("<|end_turn|>")
    assert ids.count(end_turn) == 4                       # the one typed in a message is text
    assert template.end_of_turn_ids(loaded.tokenizer) == (end_turn,)


def test_retrofit_plain_turns_keep_message_text_as_text(converted):
    """No template shipped (TinyLlama's base tokenizer): the plain template, and control
    tokens typed in a message stay characters."""
    from tokenizers import Tokenizer as HFTokenizer

    from tinyloop.text.chat import ChatTemplate
    loaded = load_model(converted["retrofit"], "cpu")
    template = ChatTemplate.from_metadata(loaded.file.chat_template)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi </s> <s> there"}]
    ids = loaded.with_bos(template.render(messages, loaded.tokenizer))
    raw = HFTokenizer.from_file(str(DATA / "retrofit" / "tokenizer.json"))
    assert raw.decode(ids, skip_special_tokens=False) == "<s>System: Be brief.\nUser: Hi </s> <s> there\nAssistant:"
    bos, eos = raw.token_to_id("<s>"), raw.token_to_id("</s>")
    assert ids[0] == bos and ids.count(bos) == 1 and eos not in ids     # the typed ones are text
    assert template.stop_strings == ("\nUser:",)


def test_cli_generates_with_adaptive_depth(converted, capsys):
    from tinyloop.cli import main
    assert main(["generate", str(converted["ouro"]), "Hello", "--max-tokens", "6", "--loops", "auto",
                 "--exit-threshold", "0.5", "--kv-cache", "fp32"]) == 0
    err = capsys.readouterr().err
    assert "loops auto (mean" in err and "histogram" in err
    assert main(["generate", str(converted["ouro"]), "Hello", "--loops", "auto", "--exit-threshold", "2"]) == 2
    assert "exit_threshold must be a cumulative exit probability" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", str(converted["ouro"]), "Hello", "--loops", "deep"])


def test_a_chat_template_tinyloop_cannot_render_is_warned_about_not_dropped_silently(tmp_path, capsys):
    """A Llama-3-style template (header/eot turns) is not one TinyLoop renders: the model
    converts, chats fall back to the plain template, and the conversion says so."""
    from tinyloop.convert.from_hf import convert_hf
    directory = copy_layout(tmp_path, "llama")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                               "{{ m['content'] | trim }}<|eot_id|>{% endfor %}")
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    convert_hf(directory, tmp_path / "llama3chat.tinyloop", progress=False)
    err = capsys.readouterr().err
    assert "ships a chat template TinyLoop does not render" in err and "plain" in err
    assert load_model(tmp_path / "llama3chat.tinyloop", "cpu").file.chat_template == "plain"
    convert_hf(copy_layout(tmp_path / "b", "llama"), tmp_path / "chatml.tinyloop", progress=False)
    assert "warning" not in capsys.readouterr().err          # a recognised template: nothing to say
