"""The model config: a validated dataclass, stored as JSON in the model file's header."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tinyloop.errors import ConfigError

MAX_LOOPS_LIMIT = 64
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rope")
INJECTIONS = ("none", "add", "concat")
POST_NORMS = ("none", "branch", "sum")
LOOP_NORMS = ("none", "between", "after")
INITIAL_STATES = ("prelude", "random")
ROPE_SCALINGS = ("none", "llama3")
# the RoPE scaling parameters and their values without scaling (files written before they
# existed, and unscaled models, carry none of them)
ROPE_SCALING_DEFAULTS = {"rope_factor": 1.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
                         "rope_original_max_positions": 0}


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
    # RoPE frequency scaling (backends/reference/positions.inv_frequencies): "llama3" (Llama 3.1 and
    # later) slows the pairs whose wavelength exceeds rope_original_max_positions /
    # rope_low_freq_factor by rope_factor, keeps those shorter than rope_original_max_positions /
    # rope_high_freq_factor, and blends the band between.
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 0
    bias: bool = False
    tied_head: bool = True
    # "add": each core iteration starts from h + e, e being the prelude's output, so
    # later iterations keep seeing the input (input injection of recurrent-depth models).
    # "concat": every iteration (the first too) starts from adapter([h | e]), a learned
    # (D, 2D) linear `adapter` (Huginn / retrofitted recurrence).
    input_injection: str = "none"
    # Sandwich norms: "branch" normalises each sublayer's output before the residual add,
    # h + post(f(pre(h))) (Ouro); "sum" normalises the sum, post(h + f(pre(h))) (Huginn).
    post_norm: str = "none"
    # The final norm applied to the recurrent state: "between" core iterations, so each
    # iteration reads the normalised state (Ouro); "after" the last one, before the coda
    # (Huginn). The head always applies it once more to its own input.
    loop_norm: str = "none"
    # Where the recurrence starts: the prelude's output, or seeded noise (a truncated
    # normal of std `state_std`, cut at 3 std, drawn per position from `state_seed`, so a
    # token's state never depends on which forward or batch computed it).
    initial_state: str = "prelude"
    state_std: float = 0.0
    state_seed: int = 0
    qk_bias: bool = False           # biases on the q and k projections only (per head)
    embed_scale: float = 1.0        # token embeddings are multiplied by this
    exit_gate: bool = False         # a learned early-exit gate `exit_gate` (D -> 1) read after every iteration
    # the default threshold of adaptive depth (loops "auto"): with an exit gate, the cumulative
    # exit probability at which a token stops (1.0: never early); without one, the KL divergence
    # between successive iterations' outputs below which it stops (Huginn's default, 1e-3)
    exit_threshold: float = 1e-3
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
        _require_choice("post_norm", self.post_norm, POST_NORMS)
        _require_choice("loop_norm", self.loop_norm, LOOP_NORMS)
        _require_choice("initial_state", self.initial_state, INITIAL_STATES)
        _require_int("state_seed", self.state_seed, low=0)
        for name in ("state_std", "embed_scale"):
            _require_positive_float(name, self.state_std if name == "state_std" else self.embed_scale,
                                    allow_zero=name == "state_std")
        _require_positive_float("exit_threshold", self.exit_threshold, allow_zero=True)
        if self.exit_gate and self.exit_threshold > 1:
            raise ConfigError(f"exit_threshold of a gated model is a probability in [0, 1], got {self.exit_threshold}")
        for name in ("bias", "tied_head", "qk_bias", "exit_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        _require_positive_float("norm_eps", self.norm_eps)
        _require_positive_float("rope_theta", self.rope_theta)
        self._check_rope_scaling()
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

    def _check_rope_scaling(self):
        _require_choice("rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        if self.rope_scaling == "none":
            stray = [name for name, value in ROPE_SCALING_DEFAULTS.items() if getattr(self, name) != value]
            if stray:
                raise ConfigError(f"{', '.join(stray)} only apply with a rope_scaling; rope_scaling is 'none'")
            return
        if self.positions != "rope":
            raise ConfigError(f"rope_scaling {self.rope_scaling!r} needs positions 'rope', got {self.positions!r}")
        for name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
            _require_positive_float(name, getattr(self, name))
        if self.rope_factor < 1:
            raise ConfigError(f"rope_factor must be >= 1 (it slows the long wavelengths), got {self.rope_factor}")
        if not self.rope_high_freq_factor > self.rope_low_freq_factor:
            raise ConfigError(f"rope_high_freq_factor ({self.rope_high_freq_factor}) must be greater than "
                              f"rope_low_freq_factor ({self.rope_low_freq_factor})")
        _require_int("rope_original_max_positions", self.rope_original_max_positions, low=1)

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
        if self.rope_scaling == "none":     # an unscaled model's header stays as before these fields
            for name in ("rope_scaling", *ROPE_SCALING_DEFAULTS):
                del data[name]
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


def _require_positive_float(name, value, allow_zero: bool = False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value == float("inf") \
            or not (value >= 0 if allow_zero else value > 0):
        kind = "non-negative" if allow_zero else "positive"
        raise ConfigError(f"{name} must be a {kind} finite number, got {value!r}")
