// The norms' arithmetic, shared by elementwise.cu's rms_norm and layer_norm kernels and the
// rows linear's fused norm (linear.cu): one function, so the two give the same bits. A row's
// statistics come from TL_NORM_THREADS threads, thread t summing elements t, t + 256, ... in
// order, then norm_block_sum's fixed tree; they depend only on the row and D.
#pragma once
#include "common.cuh"

#define TL_NORM_THREADS 256                   // the norms' block size: part of their sum order
#define TL_NORM_WARPS (TL_NORM_THREADS / 32)
// Elements a thread loads before it uses any: a pass over a 2,048-wide row is one round trip
// (a loop that loads, then adds, waits a round trip per element: the H200 timed layer_norm
// at 8 us, three passes of 8). Only the loads move: each thread still adds its elements
// t, t + 256, ... in order.
#define TL_NORM_BATCH 8
#define TL_NORM_STEP (TL_NORM_BATCH * TL_NORM_THREADS)

// This thread's elements base, base + 256, ..., TL_NORM_BATCH of them, of a row (0 past D).
__device__ __forceinline__ void norm_batch(const float* v, int base, int D, float* out) {
#pragma unroll
    for (int k = 0; k < TL_NORM_BATCH; k++) {
        int i = base + k * TL_NORM_THREADS;
        out[k] = i < D ? v[i] : 0.0f;
    }
}

// Sum of one value per thread in a fixed tree: the xor butterfly inside each warp
// (tl_warp_sum), then the 8 warp totals in a halving tree (4, 2, 1) in warp 0.
// Every thread gets the total. `slots` is TL_NORM_WARPS shared floats.
__device__ float norm_block_sum(float v, float* slots) {
    v = tl_warp_sum(v);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) slots[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < TL_NORM_WARPS ? slots[lane] : 0.0f;
        for (int offset = TL_NORM_WARPS / 2; offset > 0; offset >>= 1)   // lanes >= 8 never reach lane 0
            w = tl_add(w, __shfl_xor_sync(TL_FULL_MASK, w, offset));
        if (lane == 0) slots[TL_NORM_WARPS] = w;
    }
    __syncthreads();
    // No barrier needed before the slots are reused: the next sum writes slots[warp] only
    // after every thread has passed this call's second barrier (warp 0 read them before
    // it), and slots[8] only after its own first barrier (every thread read it before).
    return slots[TL_NORM_WARPS];
}

// The kinds (launch flags): RMS, or layer norm without or with a bias.
#define TL_NORM_RMS 1
#define TL_NORM_LAYER 2
#define TL_NORM_LAYER_BIAS 3

struct NormStats {
    float mean, inv;                        // mean: 0 for RMS
};

// A row's statistics (every thread of the block calls it: it holds barriers; every thread gets
// them). RMS: inv = 1 / sqrt(sum(x^2) / D + eps). Layer: mean = sum(x) / D, inv = 1 /
// sqrt(sum((x - mean)^2) / D + eps), as norms.py orders it.
__device__ __forceinline__ NormStats norm_stats(int kind, const float* xr, int D, float eps, float* slots) {
    NormStats st = {0.0f, 0.0f};
    float partial = 0.0f;
    if (kind == TL_NORM_RMS) {
        for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
            float v[TL_NORM_BATCH];
            norm_batch(xr, base, D, v);
#pragma unroll
            for (int k = 0; k < TL_NORM_BATCH; k++)
                if (base + k * TL_NORM_THREADS < D) partial = tl_add(partial, tl_mul(v[k], v[k]));
        }
        float mean_square = tl_div(norm_block_sum(partial, slots), (float)D);
        st.inv = tl_div(1.0f, __fsqrt_rn(tl_add(mean_square, eps)));
        return st;
    }
    for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
        float v[TL_NORM_BATCH];
        norm_batch(xr, base, D, v);
#pragma unroll
        for (int k = 0; k < TL_NORM_BATCH; k++)
            if (base + k * TL_NORM_THREADS < D) partial = tl_add(partial, v[k]);
    }
    st.mean = tl_div(norm_block_sum(partial, slots), (float)D);
    partial = 0.0f;
    for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
        float v[TL_NORM_BATCH];
        norm_batch(xr, base, D, v);
#pragma unroll
        for (int k = 0; k < TL_NORM_BATCH; k++) {
            float c = tl_sub(v[k], st.mean);
            if (base + k * TL_NORM_THREADS < D) partial = tl_add(partial, tl_mul(c, c));
        }
    }
    float variance = tl_div(norm_block_sum(partial, slots), (float)D);
    st.inv = tl_div(1.0f, __fsqrt_rn(tl_add(variance, eps)));
    return st;
}

// One normalized element: RMS (x * inv) * w; layer ((x - mean) * inv) * w (+ b).
__device__ __forceinline__ float norm_apply(int kind, float x, const NormStats& st, float w, float b) {
    if (kind == TL_NORM_RMS) return tl_mul(tl_mul(x, st.inv), w);
    float y = tl_mul(tl_mul(tl_sub(x, st.mean), st.inv), w);
    return kind == TL_NORM_LAYER_BIAS ? tl_add(y, b) : y;
}
