// The pre-norm (or SwiGLU) folded into a linear's staging: the value that feeds a stored column,
// the norm kernel's own (norm.cuh). Included by linear_rows.cuh (the rows kernels, the pair)
// and linear_mma.cu (the tensor-core rows), so every exact path stages the same values.
#pragma once

#include "linear_kinds.cuh"
#include "norm.cuh"

// a.norm's value for the SwiGLU fold (launch/linear.py NormFold kind "swiglu"): no norm and no
// statistics; x is the up projection's float32 output (T, 2 in) = [gate | up], and the input
// feeding column j is tl_swiglu(gate j, up j), the swiglu kernel's value: one launch fewer a layer.
#define LIN_STAGE_SWIGLU 8

// The statistics of rows row0 .. row0 + rows - 1 of the residual stream x (a.norm), warp w of
// WARPS taking rows w, w + WARPS, ..., each by norm.cuh's norm_stats_warp (the rms_norm /
// layer_norm kernels' own arithmetic and 256-thread sum order, in one warp's registers: no
// barrier), into st (each warp's lane 0 writes its rows'; the staging after the caller's next
// barrier reads them). The rows kernels' chunks and linear_mma's tiles both call it.
template <int WARPS>
__device__ __forceinline__ void tile_norm_stats(const LinearArgs& a, int row0, int rows, NormStats* st) {
    for (int r = threadIdx.x >> 5; r < rows; r += WARPS) {
        const float* xr = static_cast<const float*>(a.x) + (long long)(row0 + r) * a.x_stride;
        const NormStats row = norm_stats_warp(a.norm, xr, a.in_features, a.norm_eps);
        if ((threadIdx.x & 31) == 0) st[r] = row;
    }
}

// The norm kernel's output for one element x of a row (st: the row's statistics; w, b: the
// element's norm weight and bias), rounded to half and back where that output would be half.
__device__ __forceinline__ float normed_value(const LinearArgs& a, float x, const NormStats& st, float w, float b) {
    const float v = norm_apply(a.norm, x, st, w, b);
    return a.norm_half ? __half2float(__float2half_rn(v)) : v;
}

// The input feeding stored column j of row t under the fused norm: the norm kernel's output
// element, or under the SwiGLU fold the swiglu kernel's (either rounded to half and widened
// back where that output would be half), 0 for padding.
// GATE: the kernel takes the SwiGLU fold at all (linear_rows.cuh TakesSwiglu; linear_mma.cu never:
// its calls keep the swiglu launch).
template <bool GATE>
__device__ __forceinline__ float normed_input(const LinearArgs& a, int t, int j, const NormStats& st) {
    int source = j < a.stored_in ? (TL_HAS_PERM(a) ? a.perm[j] : j) : a.in_features;
    if (source >= a.in_features) return 0.0f;
    const float* xr = static_cast<const float*>(a.x) + (long long)t * a.x_stride;
    if (GATE && a.norm == LIN_STAGE_SWIGLU) {
        const float v = tl_swiglu(xr[source], xr[a.in_features + source]);
        return a.norm_half ? __half2float(__float2half_rn(v)) : v;
    }
    return normed_value(a, xr[source], st, a.norm_weight[source],
                        a.norm == TL_NORM_LAYER_BIAS ? a.norm_bias[source] : 0.0f);
}

