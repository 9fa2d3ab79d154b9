// Shared device helpers for every TinyLoop kernel.
//
// Exact arithmetic: kernels whose NumPy twin must agree bit for bit write their
// float arithmetic with the round-to-nearest intrinsics below (never a*b+c, which
// nvcc contracts into an FMA; g++ in the CPU harness runs with -ffp-contract=off),
// in the order the twin (tinyloop/backends/reference/twins/) spells out.
//
// Only <cuda_fp16.h> is included: NVRTC has no libc headers, and the CPU harness
// supplies its own cuda_fp16.h. Integer types are the built-in ones.
#pragma once
#include <cuda_fp16.h>

#define TL_BLOCK 64          // keys are reduced in fixed blocks of this many logical positions
#define TL_FULL_MASK 0xffffffffu

// 16 bytes loaded or stored as one vector (LDG.128 / STS.128): the pointer must be 16-byte
// aligned, which the launcher checks before it picks a kernel path that uses it.
struct alignas(16) TlWords4 {
    unsigned int w[4];
};

__device__ __forceinline__ float tl_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float tl_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float tl_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float tl_div(float a, float b) { return __fdiv_rn(a, b); }
// a * b + c rounded once (FFMA): the rows path's multiply-accumulate (twins/arith.py fma_f32)
__device__ __forceinline__ float tl_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }

// out[i] = v, as float, or (out_half, fp16 activations) rounded to the nearest half (ties
// to even, as NumPy's astype(float16)); the flag is uniform over a launch.
__device__ __forceinline__ void tl_store(void* out, long long i, float v, int out_half) {
    if (out_half) static_cast<__half*>(out)[i] = __float2half_rn(v);
    else static_cast<float*>(out)[i] = v;
}

__device__ __forceinline__ float tl_inf() { return __int_as_float(0x7f800000); }

// Programmatic dependent launch (sm_90 and later; TINYLOOP_CUDA_PDL=1,
// tinyloop/backends/cuda/dependent_launch.py): a kernel launched with it may be scheduled while
// the kernel before it in the stream still runs. So every entry point's first statement is this
// call: it waits until the previous grid has finished and its writes are visible
// (griddepcontrol.wait), before the kernel reads or writes any global memory, then lets the next
// kernel's blocks be scheduled (griddepcontrol.launch_dependents; they in turn wait here for this
// grid to finish). A kernel thus sees exactly what it sees when launched alone, and none of its
// writes can reach a kernel still running. Launched without the attribute, below sm_90 and in the
// CPU harness, both instructions do nothing. tests/test_dependent_launch.py checks every entry point.
__device__ __forceinline__ void tl_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// (a & mask) | c in one LOP3: nvcc splits it in two where mask and c are both constants (an
// instruction takes one immediate), so c goes in as a register operand of the PTX lop3.
__device__ __forceinline__ unsigned int and_or(unsigned int a, unsigned int mask, unsigned int c) {
#ifdef __CUDA_ARCH__
    unsigned int d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(c));   // 0xEA: (a & b) | c
    return d;
#else
    return (a & mask) | c;
#endif
}

// The code of BITS bits at bit `pos` of a word, as a float (pos is a constant once unrolled):
// how the linear kernels (linear_kinds.cuh) and attention's stager (attention_load.cuh) decode.
// No integer-to-float conversion (I2FP: 16 a clock per SM on sm_90, an eighth of the FP32
// rate) and no shift per code: the code is masked in place into the mantissa of 2^23
// (code 2^k < 2^23 for k = pos, or k = pos - 16 in `high`, the word shifted down 16 once),
// which gives the float 2^23 + code 2^k exactly; code = that 2^-k - 2^(23-k), exact (every
// step is exact: power-of-two scaling, and a difference that is representable).
// The same value as (float)((word >> pos) & mask), bit for bit.
template <int BITS>
__device__ __forceinline__ float code_at(unsigned int word, unsigned int high, int pos) {
    const unsigned int mask = (1u << BITS) - 1u;
    const bool low = pos + BITS <= 23;
    const int k = low ? pos : pos - 16;
    const unsigned int bits = and_or((low ? word : high), mask << k, 0x4B000000u);   // 2^23 + code 2^k
    // int4: one FFMA (its two constants a pair of registers per k, 5 pairs); int2 and int8
    // subtract 2^23 first, then scale: an instruction more where k > 0, but one constant a k,
    // which keeps their rows kernels within 128 registers (the FFMA form spills them on sm_90)
    if (BITS == 4) return __fmaf_rn(__uint_as_float(bits), 1.0f / (float)(1u << k), -(float)(1u << (23 - k)));
    const float scaled = tl_add(__uint_as_float(bits), -8388608.0f);                  // code 2^k
    return k == 0 ? scaled : tl_mul(scaled, 1.0f / (float)(1u << k));
}

// A load that skips the SM's L1: what other blocks (other SMs) wrote during this launch, read by
// the block a counter elected (attention's fused merge, linear_mma's split reduction). The
// harness has one memory: a plain load.
__device__ __forceinline__ float tl_load_from_other_blocks(const float* p) {
#ifdef __CUDA_ARCH__
    return __ldcg(p);
#else
    return *p;
#endif
}

// exp(x) from +, *, rint and exact power-of-two scaling only, so the harness, the twin
// (twins/arith.py: exp_f32) and the GPU agree bit for bit (expf differs per platform in
// the last ulp). Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then a degree-7
// Taylor polynomial in Horner form: about 2 ulp over the float range.
// exp(-inf) = 0, exp(+inf) = inf, exp(nan) = nan; x < -104 gives 0, x > 88.8 gives inf.
__device__ __forceinline__ float tl_exp(float x) {
    if (x != x) return x;
    if (x < -104.0f) return 0.0f;
    if (x > 88.8f) return tl_inf();
    const float log2e = 1.44269502f;
    const float ln2_hi = 0.693359375f;          // few mantissa bits: n * ln2_hi is exact
    const float ln2_lo = -2.12194440e-4f;
    float n = rintf(tl_mul(x, log2e));
    float r = tl_sub(x, tl_mul(n, ln2_hi));
    r = tl_sub(r, tl_mul(n, ln2_lo));
    float p = 1.98412698e-4f;                   // 1/5040
    p = tl_add(tl_mul(p, r), 1.38888889e-3f);   // 1/720
    p = tl_add(tl_mul(p, r), 8.33333333e-3f);   // 1/120
    p = tl_add(tl_mul(p, r), 4.16666667e-2f);   // 1/24
    p = tl_add(tl_mul(p, r), 1.66666667e-1f);   // 1/6
    p = tl_add(tl_mul(p, r), 0.5f);
    p = tl_add(tl_mul(p, r), 1.0f);
    p = tl_add(tl_mul(p, r), 1.0f);
    // 2^n as two exact factors (n in [-150, 128]): one rounding at most, in the last product
    int e = (int)n;
    int e1 = e / 2, e2 = e - e1;
    float s1 = __int_as_float((e1 + 127) << 23);
    float s2 = __int_as_float((e2 + 127) << 23);
    return tl_mul(tl_mul(p, s1), s2);
}

// GELU, tanh form: 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))), tanh from tl_exp, in the
// twin's order (twins/elementwise.py gelu_tanh). The gelu_tanh kernel and the linear kernels'
// fused activation (linear_kinds.cuh store_output) both call this: the same bits.
__device__ __forceinline__ float tl_gelu_tanh(float v) {
    const float sqrt_2_over_pi = 0.7978845608028654f;
    const float cubic = 0.044715f;
    float u = tl_mul(sqrt_2_over_pi, tl_add(v, tl_mul(tl_mul(tl_mul(cubic, v), v), v)));
    float e = tl_exp(tl_mul(-2.0f, fabsf(u)));
    float t = tl_div(tl_sub(1.0f, e), tl_add(1.0f, e));
    t = u < 0.0f ? -t : t;
    return tl_mul(tl_mul(0.5f, v), tl_add(1.0f, t));
}

// SwiGLU of one gate value g and up value u: silu(g) u, silu(g) = g / (1 + exp(-g)), in this
// order (twins/elementwise.py swiglu). The swiglu kernel (elementwise.cu) and the down
// projection's folded staging (linear.cu LIN_STAGE_SWIGLU) both call this: the same bits.
__device__ __forceinline__ float tl_swiglu(float g, float u) {
    return tl_mul(tl_div(g, tl_add(1.0f, tl_exp(-g))), u);
}

// Sum over the 32 lanes of a warp in a fixed butterfly (xor 16, 8, 4, 2, 1): every lane
// gets the same bits (IEEE addition commutes), whatever the order lanes arrive in.
__device__ __forceinline__ float tl_warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v = tl_add(v, __shfl_xor_sync(TL_FULL_MASK, v, offset));
    return v;
}

__device__ __forceinline__ float tl_warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor_sync(TL_FULL_MASK, v, offset));
    return v;
}
