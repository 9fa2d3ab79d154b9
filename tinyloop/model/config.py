"""The model config: a validated dataclass, stored as JSON in the model file's header."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tinyloop.errors import ConfigError

MAX_LOOPS_LIMIT = 64
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rope")
INJECTIONS = ("none", "add")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a weight-shared looped transformer.

    The forward pass runs the `n_prelude` layers once, the `n_core` layers `loops`
    times (shared weights), the `n_coda` layers once, then the final norm and head.
    A standard transformer is `n_prelude = n_coda = 0, max_loops = 1`.
    """

    vocab_size: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    max_seq_len: int
    n_prelude: int = 0
    n_core: int = 1
    n_coda: int = 0
    default_loops: int = 1
    min_loops: int = 1
    max_loops: int = 1
    norm: str = "rmsnorm"
    norm_eps: float = 1e-5
    mlp: str = "swiglu"
    positions: str = "rope"
    rope_theta: float = 10000.0
    bias: bool = False
    tied_head: bool = True
    # "add": each core iteration starts from h + e, e being the prelude's output, so
    # later iterations keep seeing the input (input injection of recurrent-depth models).
    input_injection: str = "none"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = "tinyloop-model"
    arch: str = "weight-shared-looped-transformer"

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                     "max_seq_len", "n_core", "default_loops", "min_loops", "max_loops"):
            _require_int(name, getattr(self, name), low=1)
        for name in ("n_prelude", "n_coda"):
            _require_int(name, getattr(self, name), low=0)
        _require_choice("norm", self.norm, NORMS)
        _require_choice("mlp", self.mlp, MLPS)
        _require_choice("positions", self.positions, POSITIONS)
        _require_choice("input_injection", self.input_injection, INJECTIONS)
        for name in ("bias", "tied_head"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        _require_positive_float("norm_eps", self.norm_eps)
        _require_positive_float("rope_theta", self.rope_theta)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.positions == "rope" and self.head_dim % 2:
            raise ConfigError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.max_loops > MAX_LOOPS_LIMIT:
            raise ConfigError(f"max_loops must be at most {MAX_LOOPS_LIMIT}, got {self.max_loops}")
        if not self.min_loops <= self.default_loops <= self.max_loops:
            raise ConfigError(
                f"need min_loops <= default_loops <= max_loops, got "
                f"{self.min_loops} <= {self.default_loops} <= {self.max_loops}")
        if self.bos_token_id is not None:
            _require_int("bos_token_id", self.bos_token_id, low=0, high=self.vocab_size - 1)
        eos = tuple(self.eos_token_ids)
        object.__setattr__(self, "eos_token_ids", eos)
        for token_id in eos:
            _require_int("eos_token_ids[]", token_id, low=0, high=self.vocab_size - 1)
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("name must be a non-empty string")

    # --- derived quantities -------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def n_layer_instances(self, loops: int) -> int:
        """Executed layers per token at `loops`: one KV cache slot each."""
        return self.n_prelude + self.n_core * loops + self.n_coda

    def check_loops(self, loops: int, param: str = "loops") -> int:
        """Return `loops` if the model supports it, else raise naming the range."""
        from tinyloop.errors import RequestError
        if isinstance(loops, bool) or not isinstance(loops, int):
            raise RequestError(f"{param} must be an integer, got {loops!r}", param=param)
        if not self.min_loops <= loops <= self.max_loops:
            raise RequestError(
                f"{param} must be in [{self.min_loops}, {self.max_loops}] for this model, got {loops}",
                param=param)
        return loops

    # --- (de)serialisation --------------------------------------------------------
    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"model config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown model config fields: {', '.join(unknown)}")
        required = {f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise ConfigError(f"model config is missing: {', '.join(missing)}")
        data = dict(data)
        if "eos_token_ids" in data:
            if not isinstance(data["eos_token_ids"], (list, tuple)):
                raise ConfigError("eos_token_ids must be a list of token ids")
            data["eos_token_ids"] = tuple(data["eos_token_ids"])
        return cls(**data)


def _require_int(name, value, low=None, high=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ConfigError(f"{name} must be <= {high}, got {value}")


def _require_choice(name, value, choices):
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _require_positive_float(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        raise ConfigError(f"{name} must be a positive finite number, got {value!r}")
