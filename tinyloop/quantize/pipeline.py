"""`tinyloop quantize`: re-quantize a model's linear weights, RTN or GPTQ.

GPTQ calibrates layer by layer, in execution order, each layer on the outputs of the
layers before it *as already quantized*: within a layer, q|k|v first, then the
attention output (its input recomputed with quantized q|k|v), then gate|up, then
down. Prelude and coda layers (and every layer of a one-loop model) run block by
block from cached hidden states. A shared core layer of a looped model sees its
inputs from every loop iteration, so for it the core stack is re-run from the
prelude's output, collecting that layer's inputs across all iterations.

Embeddings and the head are kept as stored unless --quantize-embeddings (RTN).
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.reference import NumpyBackend
from tinyloop.errors import TinyLoopError
from tinyloop.model.loader import load_model
from tinyloop.model.modelfile import write_model_file
from tinyloop.model.quant import QuantizedTensor, check_layout, dequantize, quantize_rtn
from tinyloop.model.transformer import Trunk
from tinyloop.model.weights import SUBLAYERS, expected_tensors, linear_parts
from tinyloop.progress import Progress
from tinyloop.quantize.gptq import gptq_quantize

DEFAULT_SEQ_LEN = 512           # calibration sequence length, capped at the model's context


def split_rows(tensor: QuantizedTensor, sizes: list[int]) -> list[QuantizedTensor]:
    out, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        out.append(QuantizedTensor(tensor.codes[rows], tensor.scale[rows], tensor.min[rows], tensor.bits,
                                   tensor.group_size, tensor.method, tensor.perm, tensor.in_features))
        start += size
    return out


class HessianCollector:
    """A capture hook that accumulates 2 X^T X / n over one linear's inputs."""

    def __init__(self, sublayer: str):
        self.sublayer = sublayer
        self.sum = None
        self.count = 0

    def __call__(self, name: str, x) -> None:
        if name != self.sublayer:
            return
        x = np.asarray(x, np.float64)
        self.sum = x.T @ x if self.sum is None else self.sum + x.T @ x
        self.count += len(x)

    @property
    def hessian(self) -> np.ndarray:
        return 2.0 * self.sum / max(self.count, 1)


class Quantizer:
    def __init__(self, source, bits: int, group_size: int, method: str, act_order: bool = False,
                 damp: float = 0.01, quantize_embeddings: bool = False, progress: bool = True):
        if method not in ("rtn", "gptq"):
            raise TinyLoopError(f"method must be rtn or gptq, got {method!r}")
        if act_order and method != "gptq":
            raise TinyLoopError("--act-order applies to --method gptq only")
        # Calibration runs on the NumPy reference backend: it needs the dense float32 weights
        # (GPTQ updates them column by column), and no exactness is claimed for it.
        self.loaded = load_model(source, device=NumpyBackend("cpu (quantization: numpy reference kernels)"),
                                 kv_mode="fp32")
        self.config = self.loaded.config
        self.bits, self.group_size, self.method = bits, group_size, method
        self.act_order, self.damp = act_order, damp
        self.quantize_embeddings = quantize_embeddings
        self.progress = progress
        try:
            check_layout(bits, group_size)
        except ValueError as exc:
            raise TinyLoopError(f"cannot quantize with bits {bits}, group size {group_size}: {exc}") from None
        self.results: dict[str, QuantizedTensor] = {}

    # -- one fused matrix ----------------------------------------------------------------
    def quantize_sublayer(self, stage: str, index: int, sublayer: str, hessian=None) -> None:
        weights = self.loaded.model.weights.layers[stage][index]
        fused = getattr(weights, sublayer)                            # the CPU backend's dense handle
        weight = np.ascontiguousarray(fused.weight.T)                 # (out, in)
        if hessian is None:
            tensor = quantize_rtn(weight, self.bits, self.group_size)
        else:
            tensor = gptq_quantize(weight, hessian, self.bits, self.group_size, self.act_order, self.damp)
        # later layers see the quantized weight
        setattr(weights, sublayer, self.loaded.backend.prepare_linear([tensor], fused.bias))
        names = linear_parts(self.config, sublayer)
        sizes = [self.loaded.file.weight_shape(f"{stage}.{index}.{n}.weight")[0] for n in names]
        for name, part in zip(names, split_rows(tensor, sizes)):
            self.results[f"{stage}.{index}.{name}.weight"] = part

    # -- RTN -----------------------------------------------------------------------------
    def run_rtn(self) -> None:
        blocks = [(s, i) for s, layers in self.loaded.model.weights.layers.items() for i in range(len(layers))]
        bar = Progress("quantizing layers (rtn)", len(blocks), self.progress)
        for done, (stage, index) in enumerate(blocks, 1):
            for sublayer in SUBLAYERS:
                self.quantize_sublayer(stage, index, sublayer)
            bar.update(done, f"{stage}.{index}")
        bar.finish("quantized every linear layer")

    # -- GPTQ ----------------------------------------------------------------------------
    def run_gptq(self, token_ids: list[int], seq_len: int | None, loops: int | None) -> None:
        model, c = self.loaded.model, self.config
        loops = c.check_loops(c.default_loops if loops is None else loops)
        if seq_len is None:                   # the default: 512 tokens, or the whole context if shorter
            seq_len = min(DEFAULT_SEQ_LEN, c.max_seq_len)
        elif not 2 <= seq_len <= c.max_seq_len:
            raise TinyLoopError(f"--seq-len must be between 2 and the model's context ({c.max_seq_len}), "
                                f"got {seq_len}")
        sequences = [token_ids[i:i + seq_len] for i in range(0, len(token_ids) - 1, seq_len)]
        sequences = [s for s in sequences if len(s) >= 2]
        if not sequences:
            raise TinyLoopError("the calibration text is too short (need at least 2 tokens)")
        spans = [np.arange(len(s)) for s in sequences]
        states = []
        for tokens, positions in zip(sequences, spans):
            h = model.backend.embed(model.weights.embed, np.asarray(tokens))
            if model.weights.pos_embed is not None:
                h = h + model.backend.embed(model.weights.pos_embed, positions)
            states.append(h)
        n_blocks = c.n_prelude + c.n_core + c.n_coda
        bar = Progress("quantizing layers (gptq)", n_blocks, self.progress)
        self._done = 0
        for index in range(c.n_prelude):
            states = self._sequential_block("prelude", index, states, spans, bar)
        if loops == 1:
            for index in range(c.n_core):
                states = self._sequential_block("core", index, states, spans, bar)
        else:
            states = self._looped_core(states, spans, loops, bar)
        for index in range(c.n_coda):
            states = self._sequential_block("coda", index, states, spans, bar)
        bar.finish(f"quantized {n_blocks} layers on {sum(len(s) for s in sequences)} calibration tokens")

    def _run_layer(self, weights, h, positions, capture=None):
        model = self.loaded.model
        cache = model.new_cache(len(positions), 1)
        return model.layer(weights, h, model.contiguous_plan(0, len(positions), cache, exact=False), cache, 0,
                           capture=capture)

    def _sequential_block(self, stage, index, states, spans, bar):
        weights = self.loaded.model.weights.layers[stage][index]
        for sublayer in SUBLAYERS:
            collector = HessianCollector(sublayer)
            for h, span in zip(states, spans):
                self._run_layer(weights, h, span, collector)
            self.quantize_sublayer(stage, index, sublayer, collector.hessian)
        self._done += 1
        bar.update(self._done, f"{stage}.{index}")
        return [self._run_layer(weights, h, span) for h, span in zip(states, spans)]

    def _core_pass(self, states, spans, loops, capture_layer=None, capture=None):
        """The model's own core loop over each calibration sequence (from the prelude's
        output); capture sees the inputs of core layer `capture_layer` in every iteration."""
        model = self.loaded.model
        hook = None
        if capture is not None:
            def hook(stage, index, name, x):
                if stage == "core" and index == capture_layer:
                    capture(name, x)
        outputs = []
        for h, positions in zip(states, spans):
            cache = model.new_cache(len(positions), loops)
            plan = model.contiguous_plan(0, len(positions), cache, exact=False)
            outputs.append(model.resume(Trunk(h, h, 0), plan, cache, loops, hook).hidden)
        return outputs

    def _looped_core(self, states, spans, loops, bar):
        for index in range(self.config.n_core):
            for sublayer in SUBLAYERS:
                collector = HessianCollector(sublayer)
                self._core_pass(states, spans, loops, index, collector)
                self.quantize_sublayer("core", index, sublayer, collector.hessian)
            self._done += 1
            bar.update(self._done, f"core.{index} ({loops} loops)")
        return self._core_pass(states, spans, loops)

    # -- output --------------------------------------------------------------------------
    def write(self, target) -> None:
        source = self.loaded.file
        tensors = {}
        for name in expected_tensors(self.config):
            tensors[name] = self.results.get(name, source.get(name))
        if self.quantize_embeddings:
            for name in ("embed.weight", "head.weight"):
                if name in tensors:
                    value = tensors[name]
                    dense = dequantize(value) if isinstance(value, QuantizedTensor) else np.asarray(value, np.float32)
                    tensors[name] = quantize_rtn(dense, self.bits, self.group_size)
        method = f"{self.method}{'+act-order' if self.act_order else ''}"
        write_model_file(target, self.config, tensors, source.tokenizer_json, source.chat_template,
                         extra_metadata={"quantized_from": source.path.name, "quantize_method": method})


def quantize_file(source, target, bits: int, group_size: int, method: str = "gptq", act_order: bool = False,
                  calibration_text: str | None = None, calibration_tokens: int = 4096, seq_len: int | None = None,
                  loops: int | None = None, damp: float = 0.01, quantize_embeddings: bool = False,
                  progress: bool = True) -> None:
    quantizer = Quantizer(source, bits, group_size, method, act_order, damp, quantize_embeddings, progress)
    if method == "gptq":
        if not calibration_text:
            raise TinyLoopError("GPTQ needs calibration text: pass --calibration TEXTFILE")
        ids = quantizer.loaded.encode_prompt(calibration_text)[:calibration_tokens]
        quantizer.run_gptq(ids, seq_len, loops)
    else:
        quantizer.run_rtn()
    quantizer.write(target)
