"""Array kernels of the forward pass, NumPy versions.

These are the reference implementations and the CPU path. A GPU backend provides the
same functions with the same signatures (CUDA sources live in `cuda/`).

Two flavours of the row-wise products exist:
- `exact` (row-invariant): the result for one position does not depend on how many
  positions share the call. Used by decode, draft and verify, so that a verify pass
  over T positions equals T decode steps bit for bit.
- `bulk`: full GEMM, fastest for the prompt's prefill, which every mode shares.
"""
from .activations import gelu_tanh, silu
from .attention import ATTENTION_BLOCK, TreeRows, attention_bulk, attention_exact
from .linear import linear
from .norms import layer_norm, rms_norm
from .positions import apply_rope, rope_table

__all__ = ["ATTENTION_BLOCK", "TreeRows", "apply_rope", "attention_bulk", "attention_exact", "gelu_tanh",
           "layer_norm", "linear", "rms_norm", "rope_table", "silu"]
