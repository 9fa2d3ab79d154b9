"""Open a .tinyloop file and build everything needed to run it."""
from __future__ import annotations

import time
from dataclasses import dataclass

from tinyloop.backends.base import Backend
from tinyloop.backends.select import select_backend
from tinyloop.errors import TinyLoopError
from tinyloop.kv.config import kv_mode_from_env
from tinyloop.kv.modes import KV_MODES
from tinyloop.model.modelfile import ModelFile
from tinyloop.model.transformer import LoopedTransformer
from tinyloop.model.weights import load_weights
from tinyloop.text.tokenizer import Tokenizer


@dataclass
class LoadedModel:
    model: LoopedTransformer
    tokenizer: Tokenizer
    file: ModelFile
    backend: Backend
    load_s: float

    @property
    def config(self):
        return self.model.config

    def with_bos(self, ids: list) -> list:
        """Prompt ids as the model expects them: BOS first if the model uses one."""
        bos = self.config.bos_token_id
        return ids if bos is None or (ids and ids[0] == bos) else [bos] + list(ids)

    def encode_prompt(self, text: str) -> list:
        return self.with_bos(self.tokenizer.encode(text))


def load_model(path, device=None, kv_mode: str | None = None, activations: str | None = None) -> LoadedModel:
    """device: "auto" / "cpu" / "cuda" (None: $TINYLOOP_DEVICE), or a Backend instance
    (tests run the CUDA backend on the CPU harness so). kv_mode None: from TINYLOOP_KV_*
    (default fp16). activations: "fp32" / "fp16" (None: $TINYLOOP_ACTIVATIONS, default fp32)."""
    start = time.perf_counter()
    if isinstance(device, Backend) and activations is not None and activations != device.activations:
        raise TinyLoopError(f"activations {activations!r} asked of a backend made with {device.activations!r}")
    backend = device if isinstance(device, Backend) else select_backend(device, activations)
    mode = kv_mode or kv_mode_from_env()
    if mode not in KV_MODES:
        raise TinyLoopError(f"KV cache mode must be one of {', '.join(KV_MODES)}, got {mode!r}")
    model_file = ModelFile(path)
    model_file.verify_data()              # a bit flipped on disk is refused here, not served
    if mode == "int4-h" and model_file.config.head_dim & (model_file.config.head_dim - 1):
        raise TinyLoopError(f"the int4-h KV cache needs a power-of-two head_dim; this model has "
                            f"{model_file.config.head_dim}")
    weights = load_weights(model_file, backend)
    model_file.release_pages()            # the backend holds its own layout now; the map is read rarely
    tokenizer = Tokenizer(model_file.tokenizer_json, model_file.config.vocab_size)
    model = LoopedTransformer(model_file.config, weights, backend, kv_mode=mode)
    return LoadedModel(model, tokenizer, model_file, backend, time.perf_counter() - start)
