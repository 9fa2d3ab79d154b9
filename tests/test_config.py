import pytest

from tinyloop.errors import ConfigError, RequestError
from tinyloop.model.config import ModelConfig

LLAMA3 = dict(rope_scaling="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
              rope_original_max_positions=64)
BASE = dict(vocab_size=100, dim=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64, max_seq_len=128,
            n_prelude=1, n_core=2, n_coda=1, default_loops=3, min_loops=1, max_loops=6)


def test_round_trip_through_dict():
    config = ModelConfig(**BASE, eos_token_ids=(0, 5))
    assert ModelConfig.from_dict(config.to_dict()) == config


def test_rope_scaling_round_trips_and_old_headers_mean_none():
    scaled = ModelConfig(**BASE, **LLAMA3)
    assert ModelConfig.from_dict(scaled.to_dict()) == scaled and scaled.to_dict()["rope_factor"] == 8.0
    # an unscaled model's header is what it was before RoPE scaling existed, and such headers load unscaled
    plain = ModelConfig(**BASE).to_dict()
    assert not any(key.startswith("rope_") and key != "rope_theta" for key in plain)
    assert ModelConfig.from_dict(plain).rope_scaling == "none"


def test_layer_instances_count_prelude_core_loops_and_coda():
    config = ModelConfig(**BASE)
    assert config.n_layer_instances(1) == 1 + 2 + 1
    assert config.n_layer_instances(6) == 1 + 12 + 1


@pytest.mark.parametrize("change, message", [
    (dict(n_heads=5), "multiple of n_kv_heads"),
    (dict(max_loops=65), "at most 64"),
    (dict(default_loops=7), "min_loops <= default_loops <= max_loops"),
    (dict(norm="batchnorm"), "norm must be one of layernorm, rmsnorm"),
    (dict(mlp="relu"), "mlp must be one of"),
    (dict(positions="alibi"), "positions must be one of"),
    (dict(dim=0), "dim must be >= 1"),
    (dict(dim=32.0), "dim must be an integer"),
    (dict(head_dim=7), "even head_dim"),
    (dict(norm_eps=-1.0), "norm_eps must be a positive"),
    (dict(eos_token_ids=(100,)), "eos_token_ids[] must be <= 99"),
    (dict(bias="yes"), "bias must be true or false"),
    (dict(rope_scaling="yarn"), "rope_scaling must be one of none, llama3; got 'yarn'"),
    (dict(rope_factor=8.0), "rope_factor only apply with a rope_scaling; rope_scaling is 'none'"),
    (dict(LLAMA3, rope_factor=0.5), "rope_factor must be >= 1"),
    (dict(LLAMA3, rope_factor=float("nan")), "rope_factor must be a positive finite number"),
    (dict(LLAMA3, rope_low_freq_factor=0.0), "rope_low_freq_factor must be a positive finite number"),
    (dict(LLAMA3, rope_high_freq_factor=1.0), "rope_high_freq_factor (1.0) must be greater than rope_low_freq_factor"),
    (dict(LLAMA3, rope_original_max_positions=0), "rope_original_max_positions must be >= 1"),
    (dict(LLAMA3, rope_original_max_positions=64.0), "rope_original_max_positions must be an integer"),
    (dict(LLAMA3, positions="learned"), "rope_scaling 'llama3' needs positions 'rope'"),
])
def test_invalid_fields_are_named(change, message):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**{**BASE, **change})
    assert message in str(err.value)


def test_unknown_and_missing_fields_are_named():
    with pytest.raises(ConfigError, match="unknown model config fields: colour"):
        ModelConfig.from_dict({**BASE, "colour": "red"})
    data = dict(BASE)
    del data["dim"]
    with pytest.raises(ConfigError, match="missing: dim"):
        ModelConfig.from_dict(data)


def test_loops_outside_range_name_the_range():
    config = ModelConfig(**BASE)
    assert config.check_loops(6) == 6
    with pytest.raises(RequestError, match=r"loops must be in \[1, 6\] for this model, got 7"):
        config.check_loops(7)
    with pytest.raises(RequestError, match="must be an integer"):
        config.check_loops(2.5)
