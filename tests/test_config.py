import pytest

from tinyloop.errors import ConfigError, RequestError
from tinyloop.model.config import ModelConfig

BASE = dict(vocab_size=100, dim=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64, max_seq_len=128,
            n_prelude=1, n_core=2, n_coda=1, default_loops=3, min_loops=1, max_loops=6)


def test_round_trip_through_dict():
    config = ModelConfig(**BASE, eos_token_ids=(0, 5))
    assert ModelConfig.from_dict(config.to_dict()) == config


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
