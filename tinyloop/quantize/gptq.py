"""GPTQ: quantize a linear weight column by column, pushing each column's rounding
error onto the columns not yet quantized, weighted by the inverse Hessian of the
layer's inputs (H = 2 X^T X / n from calibration activations).

Steps (all float64): dead inputs (zero Hessian diagonal) are zeroed; with act-order
the columns are processed in order of decreasing Hessian diagonal (the permutation is
stored with the weight); the diagonal is damped by `damp` times its mean; U is the
upper Cholesky factor of H^-1. Columns are processed in blocks (lazy batch updates:
inside a block errors update the block's columns one by one; the rest of the matrix
gets the whole block's errors in one product). A group's scale and min are set from
the group's current (already error-corrected) values when its first column comes up.
Codes, scales and mins use the same `w = q * scale + min` layout as everything else.
"""
from __future__ import annotations

import numpy as np

from tinyloop.errors import TinyLoopError
from tinyloop.model.quant import QuantizedTensor, check_layout, pack_codes, pad_columns


def group_params(columns: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """columns: (out, g) -> scale, min (out,) as float16 (asymmetric min/max)."""
    low, high = columns.min(axis=1), columns.max(axis=1)
    return ((high - low) / levels).astype(np.float16), low.astype(np.float16)


def gptq_quantize(weight: np.ndarray, hessian: np.ndarray, bits: int, group_size: int,
                  act_order: bool = False, damp: float = 0.01, block: int = 128) -> QuantizedTensor:
    """weight: (out, in); hessian: (in, in) -> a QuantizedTensor (method "gptq").

    An input width that is not a multiple of group_size is padded (quant.py); the padded
    inputs have a zero Hessian, so GPTQ treats them as dead and never spreads error there."""
    in_features = weight.shape[1]
    check_layout(bits, group_size)
    W = np.array(pad_columns(np.asarray(weight, np.float32), group_size), dtype=np.float64)   # (out, in)
    out_dim, in_dim = W.shape
    H = np.zeros((in_dim, in_dim))                                    # (in, in)
    H[:in_features, :in_features] = hessian
    block = max(group_size, block // group_size * group_size)        # groups never straddle blocks
    levels = (1 << bits) - 1
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    padding = np.arange(in_dim) >= in_features
    W[:, dead & ~padding] = 0.0          # padding keeps its (edge) values: group ranges stay put
    perm = np.argsort(-np.diag(H), kind="stable") if act_order else np.arange(in_dim)
    W, H = W[:, perm], H[perm][:, perm]
    H[np.diag_indices(in_dim)] += damp * np.mean(np.diag(H))
    try:
        U = np.linalg.cholesky(np.linalg.inv(H)).T                    # H^-1 = U^T U, U upper
    except np.linalg.LinAlgError:
        raise TinyLoopError(f"GPTQ: a {out_dim}x{in_dim} weight's Hessian is not positive definite even after "
                            f"damping by {damp} x its mean diagonal: raise --damp (e.g. 0.1) or give more "
                            "calibration text") from None

    codes = np.zeros((out_dim, in_dim), np.uint8)
    groups = in_dim // group_size
    scales = np.zeros((out_dim, groups), np.float16)
    mins = np.zeros((out_dim, groups), np.float16)
    for start in range(0, in_dim, block):
        stop = min(start + block, in_dim)
        W_block = W[:, start:stop].copy()                             # (out, b)
        errors = np.zeros_like(W_block)
        for i in range(stop - start):
            column = start + i
            if column % group_size == 0:
                g = column // group_size
                scales[:, g], mins[:, g] = group_params(W_block[:, i:i + group_size], levels)
                scale = scales[:, g].astype(np.float64)
                offset = mins[:, g].astype(np.float64)
                safe = np.where(scale == 0, 1.0, scale)
            w = W_block[:, i]
            q = np.clip(np.rint((w - offset) / safe), 0, levels)
            codes[:, column] = q
            err = (w - (q * scale + offset)) / U[column, column]
            W_block[:, i + 1:] -= np.outer(err, U[column, column + 1:stop])
            errors[:, i] = err
        W[:, stop:] -= errors @ U[start:stop, stop:]
    return QuantizedTensor(pack_codes(codes, bits), scales, mins, bits, group_size, "gptq",
                           perm.astype(np.int32) if act_order else None,
                           in_features if in_features != in_dim else None)


def hessian_of(inputs: np.ndarray) -> np.ndarray:
    """inputs: (n, in) -> 2 X^T X / n, float64."""
    x = np.asarray(inputs, np.float64)
    return 2.0 * (x.T @ x) / max(len(x), 1)
