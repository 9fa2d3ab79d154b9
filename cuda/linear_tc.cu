// The bulk (prefill) linear on tensor cores: y[t, o] = sum_i x[t, i] * W[o, i] (+ bias[o])
// with x and the dequantized W rounded to half and the products summed in float32, by
// mma.sync m16n8k16 (sm_80 and later). Same arguments and weight layout as linear.cu
// (linear_kinds.cuh), except that x must be half (x_half = 1: fp16 activations; the launcher
// only picks these kernels for a float16 x) and rows_per_block is unused.
// Not row-invariant (prefill only, like linear_bulk_*); the launcher picks it for bulk calls
// when the activations are fp16 (tinyloop/backends/cuda/launch/linear.py).
//
// Tiling: a 64-row x 64-column output tile per 256-thread block; warp w computes rows
// 16 (w % 4) .. +15 and columns 32 (w / 4) .. +31 as four 16 x 8 mma tiles (16 float
// accumulators per thread). Stored columns go through in steps of 32 (two k16 mma steps):
// the step's inputs (64 rows x 32, half) and dequantized weights (64 columns x 32, half,
// each column's k contiguous: the "col" B operand) are staged in shared memory, rows padded
// to 40 halves so the fragment loads of a warp hit 32 different banks.
//
// Fragments: cuda/mma.cuh (the m16n8k16 layout, and its stand-in on the CPU harness).
#include "linear_kinds.cuh"
#include "mma.cuh"

// __launch_bounds__(256, 4) as linear.cu's rows kernels: a 64-register budget ptxas keeps without spills.
#define TC_ROWS 64                          // rows per tile
#define TC_COLS 64                          // output columns per tile
#define TC_K 32                             // stored columns per step
#define TC_PITCH (TC_K + 8)                 // halves per staged row: conflict-free fragment loads
#define TC_THREADS 256

template <class Kind>
__device__ __forceinline__ void linear_tc_tiles(const LinearArgs& a, __half (*xs)[TC_PITCH], __half (*ws)[TC_PITCH]) {
    const int CPW = Kind::CPW;
    const int WORDS = TC_K / CPW;                    // words per weight row per step
    const int o0 = blockIdx.x * TC_COLS, t0 = blockIdx.y * TC_ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int wr = (warp & 3) * 16, wc = (warp >> 2) * 32;      // the warp's rows and columns in the tile
    float acc[4][4];                                 // [n8 tile][fragment element]
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;

    const int stored_cols = a.words_per_row * CPW;
    for (int k0 = 0; k0 < stored_cols; k0 += TC_K) {
#pragma unroll 1
        for (int i = threadIdx.x; i < TC_ROWS * TC_K; i += TC_THREADS) {
            int r = i / TC_K, k = i % TC_K;          // a warp stages one row's 32 columns
            int t = t0 + r;
            xs[r][k] = __float2half_rn(t < a.n_rows ? stored_input<__half>(a, t, k0 + k) : 0.0f);   // exact
        }
#pragma unroll 1
        for (int i = threadIdx.x; i < TC_COLS * WORDS; i += TC_THREADS) {
            int q = i % WORDS, n = i / WORDS;        // consecutive threads, one column's consecutive words
            float weight[CPW];
            word_weights<Kind>(a, o0 + n, k0 / CPW + q, weight);
#pragma unroll
            for (int s = 0; s < CPW; s++) ws[n][q * CPW + s] = __float2half_rn(weight[s]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TC_K; kk += 16) {
            unsigned int af[4];
            af[0] = pack_halves(xs[wr + g][kk + 2 * c], xs[wr + g][kk + 2 * c + 1]);
            af[1] = pack_halves(xs[wr + g + 8][kk + 2 * c], xs[wr + g + 8][kk + 2 * c + 1]);
            af[2] = pack_halves(xs[wr + g][kk + 2 * c + 8], xs[wr + g][kk + 2 * c + 9]);
            af[3] = pack_halves(xs[wr + g + 8][kk + 2 * c + 8], xs[wr + g + 8][kk + 2 * c + 9]);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const __half* column = ws[wc + 8 * j + g];
                unsigned int bf[2] = {pack_halves(column[kk + 2 * c], column[kk + 2 * c + 1]),
                                      pack_halves(column[kk + 2 * c + 8], column[kk + 2 * c + 9])};
                tl_mma_16816(acc[j], af, bf, acc[j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int t = t0 + wr + g + (i >= 2 ? 8 : 0);
            int o = o0 + wc + 8 * j + 2 * c + (i & 1);
            if (t < a.n_rows && o < a.n_out) store_output(a, t, o, acc[j][i]);
        }
}

// One m16n8k16 product, for tests: lane l's fragments are a[4l..4l+3], b[2l, 2l+1],
// c[4l..4l+3] (the layout above) and its result goes to d[4l..4l+3]. One warp: block (32,).
// On a GPU this checks the instruction against the layout the tests write down from the
// PTX ISA; on the harness, tl_mma_16816's stand-in against the same.
extern "C" __global__ void mma_16816_lanes(const unsigned int* a, const unsigned int* b, const float* c, float* d) {
    tl_dependent_launch();
    int lane = threadIdx.x & 31;
    unsigned int af[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};
    unsigned int bf[2] = {b[2 * lane], b[2 * lane + 1]};
    float cf[4] = {c[4 * lane], c[4 * lane + 1], c[4 * lane + 2], c[4 * lane + 3]};
    float df[4];
    tl_mma_16816(df, af, bf, cf);
    for (int i = 0; i < 4; i++) d[4 * lane + i] = df[i];
}

// Launch: block (256,), grid (ceil(n_out / 64), ceil(n_rows / 64)).
template <class Kind>
__device__ __forceinline__ void linear_tc(const LinearArgs& a) {
    __shared__ __half xs[TC_ROWS][TC_PITCH];        // 5 KiB
    __shared__ __half ws[TC_COLS][TC_PITCH];        // 5 KiB
    linear_tc_tiles<Kind>(a, xs, ws);
}

// -- entry points (each declared by name: the CPU harness finds kernels by their declarations) --
extern "C" __global__ void __launch_bounds__(256, 4)
linear_tc_int2(LINEAR_PARAMS(__half)) { tl_dependent_launch(); linear_tc<QuantKind<2, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_tc_int2_f32s(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_tc<QuantKind<2, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_tc_int4(LINEAR_PARAMS(__half)) { tl_dependent_launch(); linear_tc<QuantKind<4, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_tc_int4_f32s(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_tc<QuantKind<4, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_tc_int8(LINEAR_PARAMS(__half)) { tl_dependent_launch(); linear_tc<QuantKind<8, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_tc_int8_f32s(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_tc<QuantKind<8, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_tc_f16(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_tc<F16Kind>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_tc_f32(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_tc<F32Kind>(LINEAR_ARGS); }
