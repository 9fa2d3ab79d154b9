// Per-row and elementwise kernels: embedding gather, residual add, RMSNorm, LayerNorm,
// interleaved RoPE, SwiGLU, GELU (tanh). Twin: tinyloop/backends/reference/twins/elementwise.py.
// Launch geometry: tinyloop/backends/cuda/launch/elementwise.py.
//
// Every float operation is an explicit round-to-nearest intrinsic (common.cuh) in the
// order the twin spells out, so kernel, harness and twin agree bit for bit. The norms'
// row reductions depend only on D and the fixed block size, never on T: a row's result
// is the same alone or in a 65-row call.
#include "norm.cuh"

// table: (V, D), ids: (T,), out: (T, D). One block per row; ids are trusted (< V).
extern "C" __global__ void embed_rows(const float* table, const int* ids, float* out, int T, int D) {
    tl_dependent_launch();
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
    tl_dependent_launch();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = tl_add(a[i], b[i]);
}

// x: (T, D) with row stride x_stride floats, weight: (D,), out: (T, D) contiguous, float or
// (out_half: a linear's input under fp16 activations) half; a float out may be x itself
// when x_stride == D (each thread reads its elements before writing them).
// One block of TL_NORM_THREADS per row; thread t sums elements t, t + 256, ... in order.
// out = (x * inv) * weight with inv = 1 / sqrt(sum(x^2) / D + eps), as norms.py orders it.
extern "C" __global__ void __launch_bounds__(TL_NORM_THREADS)
rms_norm(const float* x, int x_stride, const float* weight, void* out, int out_half, int T, int D, float eps) {
    tl_dependent_launch();
    __shared__ float slots[TL_NORM_WARPS + 1];
    const float* xr = x + (long long)blockIdx.x * x_stride;
    long long row = (long long)blockIdx.x * D;
    const NormStats stats = norm_stats(TL_NORM_RMS, xr, D, eps, slots);
    for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
        float v[TL_NORM_BATCH], w[TL_NORM_BATCH];
        norm_batch(xr, base, D, v);
        norm_batch(weight, base, D, w);
#pragma unroll
        for (int k = 0; k < TL_NORM_BATCH; k++) {
            int i = base + k * TL_NORM_THREADS;
            if (i < D) tl_store(out, row + i, norm_apply(TL_NORM_RMS, v[k], stats, w[k], 0.0f), out_half);
        }
    }
}

// As rms_norm, with the mean removed first: c = x - sum(x) / D, inv = 1 / sqrt(sum(c^2) / D
// + eps), out = (c * inv) * weight (+ bias when has_bias; bias is never read otherwise);
// out as rms_norm's.
extern "C" __global__ void __launch_bounds__(TL_NORM_THREADS)
layer_norm(const float* x, int x_stride, const float* weight, const float* bias, int has_bias,
           void* out, int out_half, int T, int D, float eps) {
    tl_dependent_launch();
    __shared__ float slots[TL_NORM_WARPS + 1];
    const float* xr = x + (long long)blockIdx.x * x_stride;
    long long row = (long long)blockIdx.x * D;
    const int kind = has_bias ? TL_NORM_LAYER_BIAS : TL_NORM_LAYER;
    const NormStats stats = norm_stats(kind, xr, D, eps, slots);
    for (int base = threadIdx.x; base < D; base += TL_NORM_STEP) {
        float v[TL_NORM_BATCH], w[TL_NORM_BATCH], b[TL_NORM_BATCH];
        norm_batch(xr, base, D, v);
        norm_batch(weight, base, D, w);
        if (has_bias) norm_batch(bias, base, D, b);
#pragma unroll
        for (int k = 0; k < TL_NORM_BATCH; k++) {
            int i = base + k * TL_NORM_THREADS;
            if (i < D) tl_store(out, row + i, norm_apply(kind, v[k], stats, w[k], has_bias ? b[k] : 0.0f), out_half);
        }
    }
}

// x: (T, heads, hd) in place, token row stride x_stride floats, heads hd floats apart
// (q and k are column ranges of the fused qkv output). rotation: (T, hd/2) pairs
// (cos, sin), the complex64 table viewed as float32. Pair (a, b) = x[2i], x[2i+1] becomes
// (a c - b d, a d + b c): two products then one add each, never an FMA.
// One block per token; threads walk the heads * hd/2 pairs.
extern "C" __global__ void rope_rows(float* x, int x_stride, const float* rotation, int T, int heads, int hd) {
    tl_dependent_launch();
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
    tl_dependent_launch();
    long long n = (long long)T * F;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long row = i / F;
        int col = (int)(i - row * F);
        tl_store(out, i, tl_swiglu(up[row * 2 * F + col], up[row * 2 * F + F + col]), out_half);
    }
}

// out = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), over n floats; out is float
// (and may alias x) or, with out_half, half. tanh(u) = sign(u) (1 - e) / (1 + e) with
// e = exp(-2|u|): e is in [0, 1], so nothing overflows; for large |u| e underflows to 0 and
// tanh is exactly +-1; u = +-inf gives +-1 (as np.tanh), NaN stays NaN.
extern "C" __global__ void gelu_tanh(const float* x, void* out, int out_half, int n) {
    tl_dependent_launch();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        tl_store(out, i, tl_gelu_tanh(x[i]), out_half);
}
