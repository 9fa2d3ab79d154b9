// Per-row and elementwise kernels: embedding gather, residual add, RMSNorm, LayerNorm,
// interleaved RoPE, SwiGLU, GELU (tanh). Twin: tinyloop/backends/reference/twins/elementwise.py.
// Launch geometry: tinyloop/backends/cuda/launch/elementwise.py.
//
// Every float operation is an explicit round-to-nearest intrinsic (common.cuh) in the
// order the twin spells out, so kernel, harness and twin agree bit for bit. The norms'
// row reductions depend only on D and the fixed block size, never on T: a row's result
// is the same alone or in a 65-row call.
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

// table: (V, D), ids: (T,), out: (T, D). One block per row; ids are trusted (< V).
extern "C" __global__ void embed_rows(const float* table, const int* ids, float* out, int T, int D) {
    int row = blockIdx.x;
    const float* src = table + (long long)ids[row] * D;    // V * D may pass 2^31
    float* dst = out + (long long)row * D;
    // 4 loads in flight a thread, then their stores (a copy, in any order)
    for (int base = threadIdx.x; base < D; base += 4 * blockDim.x) {
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int i = base + k * blockDim.x;
            v[k] = i < D ? src[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int i = base + k * blockDim.x;
            if (i < D) dst[i] = v[k];
        }
    }
}

// out = a + b over n floats (the residual add); out may alias a or b. Grid-stride loop.
extern "C" __global__ void add_rows(const float* a, const float* b, float* out, int n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = tl_add(a[i], b[i]);
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

// x: (T, D) with row stride x_stride floats, weight: (D,), out: (T, D) contiguous, float or
// (out_half: a linear's input under fp16 activations) half; a float out may be x itself
// when x_stride == D (each thread reads its elements before writing them).
// One block of TL_NORM_THREADS per row; thread t sums elements t, t + 256, ... in order.
// out = (x * inv) * weight with inv = 1 / sqrt(sum(x^2) / D + eps), as norms.py orders it.
extern "C" __global__ void __launch_bounds__(TL_NORM_THREADS)
rms_norm(const float* x, int x_stride, const float* weight, void* out, int out_half, int T, int D, float eps) {
    __shared__ float slots[TL_NORM_WARPS + 1];
    const float* xr = x + (long long)blockIdx.x * x_stride;
    long long row = (long long)blockIdx.x * D;
    float partial = 0.0f;
    for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
        float v[TL_NORM_BATCH];
        norm_batch(xr, base, D, v);
#pragma unroll
        for (int k = 0; k < TL_NORM_BATCH; k++)
            if (base + k * TL_NORM_THREADS < D) partial = tl_add(partial, tl_mul(v[k], v[k]));
    }
    float mean_square = tl_div(norm_block_sum(partial, slots), (float)D);
    float inv = tl_div(1.0f, __fsqrt_rn(tl_add(mean_square, eps)));
    for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
        float v[TL_NORM_BATCH], w[TL_NORM_BATCH];
        norm_batch(xr, base, D, v);
        norm_batch(weight, base, D, w);
#pragma unroll
        for (int k = 0; k < TL_NORM_BATCH; k++) {
            int i = base + k * TL_NORM_THREADS;
            if (i < D) tl_store(out, row + i, tl_mul(tl_mul(v[k], inv), w[k]), out_half);
        }
    }
}

// As rms_norm, with the mean removed first: c = x - sum(x) / D, inv = 1 / sqrt(sum(c^2) / D
// + eps), out = (c * inv) * weight (+ bias when has_bias; bias is never read otherwise);
// out as rms_norm's.
extern "C" __global__ void __launch_bounds__(TL_NORM_THREADS)
layer_norm(const float* x, int x_stride, const float* weight, const float* bias, int has_bias,
           void* out, int out_half, int T, int D, float eps) {
    __shared__ float slots[TL_NORM_WARPS + 1];
    const float* xr = x + (long long)blockIdx.x * x_stride;
    long long row = (long long)blockIdx.x * D;
    float partial = 0.0f;
    for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
        float v[TL_NORM_BATCH];
        norm_batch(xr, base, D, v);
#pragma unroll
        for (int k = 0; k < TL_NORM_BATCH; k++)
            if (base + k * TL_NORM_THREADS < D) partial = tl_add(partial, v[k]);
    }
    float mean = tl_div(norm_block_sum(partial, slots), (float)D);
    partial = 0.0f;
    for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
        float v[TL_NORM_BATCH];
        norm_batch(xr, base, D, v);
#pragma unroll
        for (int k = 0; k < TL_NORM_BATCH; k++) {
            float c = tl_sub(v[k], mean);
            if (base + k * TL_NORM_THREADS < D) partial = tl_add(partial, tl_mul(c, c));
        }
    }
    float variance = tl_div(norm_block_sum(partial, slots), (float)D);
    float inv = tl_div(1.0f, __fsqrt_rn(tl_add(variance, eps)));
    for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
        float v[TL_NORM_BATCH], w[TL_NORM_BATCH], b[TL_NORM_BATCH];
        norm_batch(xr, base, D, v);
        norm_batch(weight, base, D, w);
        if (has_bias) norm_batch(bias, base, D, b);
#pragma unroll
        for (int k = 0; k < TL_NORM_BATCH; k++) {
            int i = base + k * TL_NORM_THREADS;
            if (i >= D) continue;
            float y = tl_mul(tl_mul(tl_sub(v[k], mean), inv), w[k]);
            tl_store(out, row + i, has_bias ? tl_add(y, b[k]) : y, out_half);
        }
    }
}

// x: (T, heads, hd) in place, token row stride x_stride floats, heads hd floats apart
// (q and k are column ranges of the fused qkv output). rotation: (T, hd/2) pairs
// (cos, sin), the complex64 table viewed as float32. Pair (a, b) = x[2i], x[2i+1] becomes
// (a c - b d, a d + b c): two products then one add each, never an FMA.
// One block per token; threads walk the heads * hd/2 pairs.
extern "C" __global__ void rope_rows(float* x, int x_stride, const float* rotation, int T, int heads, int hd) {
    int half = hd >> 1;
    float* xr = x + (long long)blockIdx.x * x_stride;
    const float* rot = rotation + (long long)blockIdx.x * hd;
    for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
        int head = p / half, i = p - head * half;
        float* pair = xr + head * hd + 2 * i;
        float a = pair[0], b = pair[1], c = rot[2 * i], d = rot[2 * i + 1];
        pair[0] = tl_sub(tl_mul(a, c), tl_mul(b, d));
        pair[1] = tl_add(tl_mul(a, d), tl_mul(b, c));
    }
}

// up: (T, 2F) = [gate | up], out: (T, F) = silu(gate) * up, silu(g) = g / (1 + exp(-g)),
// float or (out_half: the down projection's input under fp16 activations) half.
// Grid-stride over the T * F outputs.
extern "C" __global__ void swiglu(const float* up, void* out, int out_half, int T, int F) {
    long long n = (long long)T * F;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long row = i / F;
        int col = (int)(i - row * F);
        float g = up[row * 2 * F + col];
        float silu = tl_div(g, tl_add(1.0f, tl_exp(-g)));
        tl_store(out, i, tl_mul(silu, up[row * 2 * F + F + col]), out_half);
    }
}

// out = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), over n floats; out is float
// (and may alias x) or, with out_half, half. tanh(u) = sign(u) (1 - e) / (1 + e) with
// e = exp(-2|u|): e is in [0, 1], so nothing overflows; for large |u| e underflows to 0 and
// tanh is exactly +-1; u = +-inf gives +-1 (as np.tanh), NaN stays NaN.
extern "C" __global__ void gelu_tanh(const float* x, void* out, int out_half, int n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        tl_store(out, i, tl_gelu_tanh(x[i]), out_half);
}
