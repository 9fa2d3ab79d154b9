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

// The partial sums of the TL_NORM_THREADS summing threads this thread stands for: V of them,
// threads first, first + 32, ... (the block's: V = 1, first = threadIdx.x; one warp's: V = 8,
// first its lane). Each adds f(x) of its elements t, t + 256, ... in order; a step's loads of
// all V are issued before any is used. SQUARE: x^2 (RMS), CENTER: (x - mean)^2, neither: x.
template <int V, bool SQUARE, bool CENTER>
__device__ __forceinline__ void norm_partials(const float* xr, int D, float mean, int first, float (&partial)[V]) {
#pragma unroll
    for (int i = 0; i < V; i++) partial[i] = 0.0f;
    for (int step = 0; step < D; step += TL_NORM_STEP) {
        float v[V][TL_NORM_BATCH];
#pragma unroll
        for (int i = 0; i < V; i++) norm_batch(xr, step + first + i * 32, D, v[i]);
#pragma unroll
        for (int i = 0; i < V; i++)
#pragma unroll
            for (int k = 0; k < TL_NORM_BATCH; k++) {
                const float c = CENTER ? tl_sub(v[i][k], mean) : v[i][k];
                if (step + first + i * 32 + k * TL_NORM_THREADS < D)
                    partial[i] = tl_add(partial[i], SQUARE || CENTER ? tl_mul(c, c) : c);
            }
    }
}

// norm_block_sum's total by one warp, no barrier: lane l holds the values of threads l, l + 32,
// ..., l + 224 (v[i]: thread l + 32 i, of warp i). Each warp's butterfly, then the same halving
// tree (a float add is commutative, so w[i] + w[i + offset] is lane i's tl_add of its own and
// lane i + offset's value). Every lane gets the total.
__device__ __forceinline__ float norm_warp_sum(const float (&v)[TL_NORM_WARPS]) {
    float w[TL_NORM_WARPS];
#pragma unroll
    for (int i = 0; i < TL_NORM_WARPS; i++) w[i] = tl_warp_sum(v[i]);
#pragma unroll
    for (int offset = TL_NORM_WARPS / 2; offset > 0; offset >>= 1)
#pragma unroll
        for (int i = 0; i < offset; i++) w[i] = tl_add(w[i], w[i + offset]);
    return w[0];
}

// The 256 partials' total: by the block (one a thread), or by one warp (eight a lane).
__device__ __forceinline__ float norm_sum(const float (&partial)[1], float* slots) {
    return norm_block_sum(partial[0], slots);
}
__device__ __forceinline__ float norm_sum(const float (&partial)[TL_NORM_WARPS], float*) {
    return norm_warp_sum(partial);
}

// A row's statistics from the 256 summing threads' partials (norm_partials), summed by the block
// (WARP false: every thread of the block calls it, it holds barriers; slots: norm_block_sum's)
// or by one warp alone (WARP true: every lane of the warp calls it, slots unused): the same bits.
// RMS: inv = 1 / sqrt(sum(x^2) / D + eps). Layer: mean = sum(x) / D, inv = 1 /
// sqrt(sum((x - mean)^2) / D + eps), as norms.py orders it.
template <bool WARP>
__device__ __forceinline__ NormStats norm_stats_by(int kind, const float* xr, int D, float eps, float* slots) {
    constexpr int V = WARP ? TL_NORM_WARPS : 1;
    const int first = WARP ? (threadIdx.x & 31) : threadIdx.x;
    float partial[V];
    NormStats st = {0.0f, 0.0f};
    if (kind == TL_NORM_RMS) {
        norm_partials<V, true, false>(xr, D, 0.0f, first, partial);
        const float total = norm_sum(partial, slots);
        st.inv = tl_div(1.0f, __fsqrt_rn(tl_add(tl_div(total, (float)D), eps)));
        return st;
    }
    norm_partials<V, false, false>(xr, D, 0.0f, first, partial);
    const float sum = norm_sum(partial, slots);
    st.mean = tl_div(sum, (float)D);
    norm_partials<V, false, true>(xr, D, st.mean, first, partial);
    const float squares = norm_sum(partial, slots);
    st.inv = tl_div(1.0f, __fsqrt_rn(tl_add(tl_div(squares, (float)D), eps)));
    return st;
}

// The norm kernels' (and the rows linear's) statistics: every thread of a TL_NORM_THREADS block.
__device__ __forceinline__ NormStats norm_stats(int kind, const float* xr, int D, float eps, float* slots) {
    return norm_stats_by<false>(kind, xr, D, eps, slots);
}

// The same statistics by one warp (linear_mma.cu and the rows kernels' fused norm: each warp a
// row, in parallel). Not inlined: its 64 loads a lane and their sums, copied into each of the
// rows kernels' instantiations, made linear.cu's cubin half as large again and its compile twice
// as long (NVRTC 165 -> 300 s); it is called once a chunk, so the call's few instructions are
// small beside its loads (not timed: no GPU yet), and ptxas gives it and its callers no stack
// frame (cuda/RESOURCES.md, checked in CI).
__device__ __noinline__ NormStats norm_stats_warp(int kind, const float* xr, int D, float eps) {
    return norm_stats_by<true>(kind, xr, D, eps, nullptr);
}

// One normalized element: RMS (x * inv) * w; layer ((x - mean) * inv) * w (+ b). One form for
// both, without a branch on the kind: RMS's mean is +0 (NormStats), and x - +0 is x exactly
// (-0 - +0 = -0), so RMS's (x - 0) * inv is its x * inv bit for bit. The bias is added only
// with one (y + 0 would turn -0 into +0).
__device__ __forceinline__ float norm_apply(int kind, float x, const NormStats& st, float w, float b) {
    const float y = tl_mul(tl_mul(tl_sub(x, st.mean), st.inv), w);
    return kind == TL_NORM_LAYER_BIAS ? tl_add(y, b) : y;
}
