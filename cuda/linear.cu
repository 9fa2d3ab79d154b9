// The linear layer on packed weights: y[t, o] = sum_i x[t, i] * W[o, i] (+ bias[o])
// (+ residual[t, o]: the residual add fused into the epilogue, linear_kinds.cuh).
//
// One weight segment per launch (tinyloop/backends/cuda/launch/packing.py): `weights` is
// (n_out, words_per_row) 32-bit words: packed int2/int4/int8 codes, or f16 pairs, or f32,
// little end first. Stored column j of a row is word j / CPW, slot j % CPW (CPW: columns
// per word). It multiplies input column perm[j] (or j) when that is < in_features; other
// stored columns are padding and multiply 0.0f. Columns j >= stored_in (the zero bytes
// that pad a code row to whole words) use the last group's scale and min, so every weight
// is finite and its product with 0.0f adds nothing.
// Quantized weight = tl_add(tl_mul((float)code, scale[o, j / group_size]), min[o, ...]).
// Scale and min stay in the tensor's own dtype: half (linear_*_int{2,4,8}, the common case:
// 4 bytes a group instead of 8, and decode is bound by weight bytes) or float
// (linear_*_int{2,4,8}_f32s); __half2float is exact, so the weight is the same float either way.
// The output lands at y[t * y_stride + y_offset + o], so several segments (q|k|v with
// different layouts) fill one fused output.
//
// Activations x are float (x_half = 0) or half (x_half = 1: fp16 activations, half the
// bytes); either way they are widened to float (exact) as they are staged, so the half
// path's result is the float path's for the widened inputs, bit for bit. x_stride counts
// elements of x's own type.
//
// Every kernel here takes the same arguments (scale and min typed as above; dense kinds
// ignore scale/min/groups/group_size and get has_perm = 0):
//   x, x_half, x_stride, n_rows, rows_per_block, weights, words_per_row, n_out, scale, min, groups,
//   group_size, perm, has_perm, stored_in, in_features, bias, has_bias, residual, has_residual,
//   residual_stride, y, y_stride, y_offset
//
// linear_rows_*: the exact path (decode, verify: 1..65 rows). One warp per output column;
// lane l owns, in each stripe of 128 stored words of the row, the chunk of 4 words from
// 128 s + 4 l on (one 16-byte load: packing.py pads every row to whole 16-byte lines), and
// accumulates its words in increasing order, within a word its columns in order, each
// product and sum one tl_fma (rounded once; one accumulator per row); then tl_warp_sum; then
// the bias, then the residual. None of this depends on the number of rows, the row chunk a
// row falls in, or the block: a row's result is the same bits in every launch.
// Rows go through in register chunks of 4 (then 2, 1 for the rest): the weights are
// read from DRAM by the first chunk, and the later chunks' re-reads of the same column
// (a few KiB per block) hit L1/L2. A chunk's inputs are staged in shared memory already
// permuted and zero-padded, LIN_STAGE_FLOATS (8,192) at a time: a decode row of up to 8,192
// stored columns at once (one barrier pair for the whole call), a 4-row chunk 2,048 columns
// a tile; a word's inputs of a row 4 at a time side by side (int4: two such planes), so a lane
// reads them with one (int4: two) 16-byte shared loads, the lanes of a warp consecutive
// vectors (no bank conflicts). The weights stream in batches of two chunks a lane for a decode
// row (one for more rows), each with its scale and min where the chunk is one group
// (Kind::chunk_uniform; otherwise each word's is loaded as it is summed): a tile's first batch
// is issued before the barrier, every later one while the batch before it is summed, so a warp
// always has a batch in flight. A word's group comes from a high multiply (linear_kinds.cuh group_magic), not a
// division.
// A launch may carry the pre-norm (a.norm, launch/linear.py NormFold): x is then the residual
// stream h, each chunk's rows get their statistics from norm.cuh (the norm kernels' code) and
// are staged as norm(h): the bits of the norm launch followed by this one. Or (a.norm ==
// LIN_STAGE_SWIGLU) the SwiGLU before a down projection: x is the up projection's output and the
// rows are staged as swiglu(x): the bits of the swiglu launch followed by this one.
// Launch: block (256,), grid (ceil(n_out / 8), ceil(n_rows / rows_per_block)).
//
// linear_bulk_*: prefill, any number of rows, not row-invariant. A 64-row x 64-column
// output tile per 256-thread block, 4x4 per thread, stepping through 32 stored columns at
// a time: inputs (permuted) and dequantized weights both go through shared memory.
// Launch: block (256,), grid (ceil(n_out / 64), ceil(n_rows / 64)).
#include "linear_rows.cuh"

#define BULK_ROWS 64                        // rows per bulk tile
#define BULK_COLS 64                        // output columns per bulk tile
#define BULK_K 32                           // stored columns per bulk step
#define BULK_THREADS 256

// -- the bulk path ------------------------------------------------------------------------------
template <class Kind>
__device__ __forceinline__ void linear_bulk(const LinearArgs& a) {
    const int CPW = Kind::CPW;
    const int WORDS = BULK_K / CPW;          // words per row per step
    __shared__ float xs[BULK_K][BULK_ROWS + 1];     // +1: the transposing writes spread over banks
    __shared__ __align__(16) float ws[BULK_K][BULK_COLS];
    const int o0 = blockIdx.x * BULK_COLS, t0 = blockIdx.y * BULK_ROWS;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;     // 4 columns, 4 rows each
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;

    const int stored_cols = a.words_per_row * CPW;
    for (int k0 = 0; k0 < stored_cols; k0 += BULK_K) {
        for (int i = threadIdx.x; i < BULK_ROWS * BULK_K; i += BULK_THREADS) {
            int r = i / BULK_K, k = i % BULK_K;          // a warp reads one row's 32 columns
            int t = t0 + r;
            xs[k][r] = t >= a.n_rows ? 0.0f
                       : a.x_half ? stored_input<__half>(a, t, k0 + k) : stored_input<float>(a, t, k0 + k);
        }
        for (int i = threadIdx.x; i < BULK_COLS * WORDS; i += BULK_THREADS) {
            int n = i % BULK_COLS, q = i / BULK_COLS;    // consecutive threads, consecutive columns
            float weight[CPW];
            word_weights<Kind>(a, o0 + n, k0 / CPW + q, weight);
#pragma unroll
            for (int s = 0; s < CPW; s++) ws[q * CPW + s][n] = weight[s];
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < BULK_K; k++) {
            float4 b = *reinterpret_cast<const float4*>(&ws[k][tx * 4]);
            float xv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) xv[i] = xs[k][ty * 4 + i];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc[i][0] += xv[i] * b.x;
                acc[i][1] += xv[i] * b.y;
                acc[i][2] += xv[i] * b.z;
                acc[i][3] += xv[i] * b.w;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int t = t0 + ty * 4 + i;
        if (t >= a.n_rows) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int o = o0 + tx * 4 + j;
            if (o < a.n_out) store_output(a, t, o, acc[i][j]);
        }
    }
}

// -- entry points (each declared by name: the CPU harness finds kernels by their declarations) --
extern "C" __global__ void __launch_bounds__(256, 2)
linear_rows_int2(LINEAR_PARAMS(__half)) { tl_dependent_launch(); linear_rows<QuantKind<2, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 2)
linear_rows_int2_f32s(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_rows<QuantKind<2, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 2)
linear_rows_int4(LINEAR_PARAMS(__half)) { tl_dependent_launch(); linear_rows<QuantKind<4, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 2)
linear_rows_int4_f32s(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_rows<QuantKind<4, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 2)
linear_rows_int8(LINEAR_PARAMS(__half)) { tl_dependent_launch(); linear_rows<QuantKind<8, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 2)
linear_rows_int8_f32s(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_rows<QuantKind<8, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 2)
linear_rows_f16(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_rows<F16Kind>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 2)
linear_rows_f32(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_rows<F32Kind>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int2(LINEAR_PARAMS(__half)) { tl_dependent_launch(); linear_bulk<QuantKind<2, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int2_f32s(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_bulk<QuantKind<2, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int4(LINEAR_PARAMS(__half)) { tl_dependent_launch(); linear_bulk<QuantKind<4, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int4_f32s(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_bulk<QuantKind<4, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int8(LINEAR_PARAMS(__half)) { tl_dependent_launch(); linear_bulk<QuantKind<8, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int8_f32s(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_bulk<QuantKind<8, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_f16(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_bulk<F16Kind>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_f32(LINEAR_PARAMS(float)) { tl_dependent_launch(); linear_bulk<F32Kind>(LINEAR_ARGS); }
