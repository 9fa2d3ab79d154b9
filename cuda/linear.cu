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
// lane l accumulates the column's words l, l+32, l+64, ... in that order, and within a
// word its columns in order, with tl_mul/tl_add (one accumulator per row); then
// tl_warp_sum; then the bias, then the residual. None of this depends on the number of rows, the row chunk a
// row falls in, or the block: a row's result is the same bits in every launch.
// Rows go through in register chunks of 8 (then 4, 2, 1 for the rest): the weights are
// read from DRAM by the first chunk, and the later chunks' re-reads of the same column
// (a few KiB per block) hit L1/L2. The inputs of a chunk are staged in shared memory,
// one tile of up to 512 stored columns (128 words: 512 for int2/int4/int8, 256 for f16,
// 128 for f32) at a time, already permuted and zero-padded, laid out slot-major so that
// lane l reading word l is free of bank conflicts. Each lane loads its words of a tile
// before the barrier, so the weight loads overlap the staging.
// Launch: block (256,), grid (ceil(n_out / 8), ceil(n_rows / rows_per_block)).
//
// linear_bulk_*: prefill, any number of rows, not row-invariant. A 64-row x 64-column
// output tile per 256-thread block, 4x4 per thread, stepping through 32 stored columns at
// a time: inputs (permuted) and dequantized weights both go through shared memory.
// Launch: block (256,), grid (ceil(n_out / 64), ceil(n_rows / 64)).
#include "linear_kinds.cuh"

// The rows kernels are declared __launch_bounds__(256, 4): four blocks per SM, so ptxas
// budgets 64 registers and does not spill (left to choose, it picked fewer and spilled the
// accumulators on sm_80; cuda/RESOURCES.md, checked in CI).
#define LIN_WARPS 8                         // warps (output columns) per block on the rows path
#define LIN_THREADS (LIN_WARPS * 32)
#define LIN_CHUNK 8                         // rows per register chunk
#define LIN_TILE_COLS 512                   // stored columns staged per shared-memory tile
#define LIN_PIPELINE_ROWS 1                 // chunks up to this many rows load the next tile ahead

#define BULK_ROWS 64                        // rows per bulk tile
#define BULK_COLS 64                        // output columns per bulk tile
#define BULK_K 32                           // stored columns per bulk step
#define BULK_THREADS 256

// -- the exact rows path ------------------------------------------------------------------------
// Words per tile: at most 128, so a lane's words of a tile (<= 4) stay in registers.
__host__ __device__ constexpr int tile_words(int cpw) {
    return LIN_TILE_COLS / cpw < 128 ? LIN_TILE_COLS / cpw : 128;
}

// Stage rows row0..row0+R-1, stored columns col0..col0+TILE_WORDS*CPW-1, slot-major:
// xs[(r * CPW + slot) * TILE_WORDS + word] (word within the tile).
template <int CPW, int R, class X>
__device__ __forceinline__ void stage_rows(const LinearArgs& a, int row0, int col0, float* xs) {
    const int TILE_WORDS = tile_words(CPW), TILE_COLS = TILE_WORDS * CPW;
    for (int i = threadIdx.x; i < R * TILE_COLS; i += LIN_THREADS) {
        int r = i / TILE_COLS, rest = i % TILE_COLS;
        int slot = rest / TILE_WORDS, word = rest % TILE_WORDS;
        xs[i] = stored_input<X>(a, row0 + r, col0 + word * CPW + slot);
    }
}

// This lane's words of the tile starting at word `tile` of the warp's column o (lane l: words
// tile + 32 q + l), and (PARAMS) their scales and mins; zeros past the row or for an inactive warp.
template <class Kind, int ROUNDS, bool PARAMS>
__device__ __forceinline__ void load_tile(const LinearArgs& a, const unsigned int* row_words, int tile, int o,
                                          bool active, unsigned int* words, typename Kind::Params* params) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int q = 0; q < ROUNDS; q++) {
        int w = tile + q * 32 + lane;
        bool inside = active && w < a.words_per_row;
        words[q] = inside ? row_words[w] : 0u;   // sass: linear-rows-weights
        if (PARAMS) params[q] = inside ? Kind::params(w, o, a) : typename Kind::Params();
    }
}

// R rows starting at row0 for this warp's column `o` (all warps of the block call it:
// it holds barriers).
template <class Kind, class X, int R>
__device__ __forceinline__ void rows_chunk(const LinearArgs& a, int row0, int o, float* xs) {
    const int CPW = Kind::CPW;
    const int TILE_WORDS = tile_words(CPW);
    const int ROUNDS = TILE_WORDS / 32;     // words per lane per tile
    const int lane = threadIdx.x & 31;
    const bool active = o < a.n_out;        // warp-uniform
    const unsigned int* row_words = a.weights + (long long)(active ? o : 0) * a.words_per_row;

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;

    // Software pipeline (chunks of up to LIN_PIPELINE_ROWS rows: decode and draft rows, bound
    // by the weights' latency): a tile's words, scales and mins are loaded while the tile
    // before it is staged and summed, so a warp has two tiles' loads in flight and none waits
    // behind a barrier. Larger chunks (a verify's, bound by arithmetic) load each tile's words
    // at its start and the scales and mins as they decode, as before: the registers held
    // across the barrier would spill there. The sums keep their order either way: only the
    // loads move, so no bit changes.
    constexpr bool PIPELINE = R <= LIN_PIPELINE_ROWS;
    unsigned int next[ROUNDS];
    typename Kind::Params next_params[ROUNDS];
    if (PIPELINE) load_tile<Kind, ROUNDS, true>(a, row_words, 0, o, active, next, next_params);
    for (int tile = 0; tile < a.words_per_row; tile += TILE_WORDS) {
        unsigned int words[ROUNDS];
        typename Kind::Params params[ROUNDS];
        if (PIPELINE) {
#pragma unroll
            for (int q = 0; q < ROUNDS; q++) {
                words[q] = next[q];
                params[q] = next_params[q];
            }
            if (tile + TILE_WORDS < a.words_per_row)
                load_tile<Kind, ROUNDS, true>(a, row_words, tile + TILE_WORDS, o, active, next, next_params);
        } else {
            load_tile<Kind, ROUNDS, false>(a, row_words, tile, o, active, words, params);
        }
        __syncthreads();                    // the previous tile's readers are done with xs
        stage_rows<CPW, R, X>(a, row0, tile * CPW, xs);
        __syncthreads();
        if (!active) continue;
#pragma unroll
        for (int q = 0; q < ROUNDS; q++) {
            int w = tile + q * 32 + lane;
            if (w >= a.words_per_row) break;
            float weight[CPW];
            if (PIPELINE) Kind::decode_with(words[q], w, o, a, params[q], weight);
            else Kind::decode(words[q], w, o, a, weight);
            const float* xw = xs + q * 32 + lane;
#pragma unroll
            for (int slot = 0; slot < CPW; slot++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r] = tl_add(acc[r], tl_mul(weight[slot], xw[(r * CPW + slot) * TILE_WORDS]));
        }
    }
    if (!active) return;
    // every lane gets each row's total; lane r stores row r: one epilogue (bias, residual, GELU,
    // half) in the code instead of R, which kept the 8-row chunk within its registers
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        float sum = tl_warp_sum(acc[r]);
        if (lane == r) mine = sum;
    }
    if (lane < R) store_output(a, row0 + lane, o, mine);
}

template <class Kind, class X>
__device__ __forceinline__ void linear_rows_of(const LinearArgs& a, float* xs) {
    int o = blockIdx.x * LIN_WARPS + (threadIdx.x >> 5);
    int row = blockIdx.y * a.rows_per_block;
    int end = min(row + a.rows_per_block, a.n_rows);
    // chunk sizes depend only on the block's row count (block-uniform, as the barriers need)
    for (; end - row >= LIN_CHUNK; row += LIN_CHUNK) rows_chunk<Kind, X, LIN_CHUNK>(a, row, o, xs);
    if (end - row >= 4) { rows_chunk<Kind, X, 4>(a, row, o, xs); row += 4; }
    if (end - row >= 2) { rows_chunk<Kind, X, 2>(a, row, o, xs); row += 2; }
    if (end - row >= 1) rows_chunk<Kind, X, 1>(a, row, o, xs);
}

// The activations' type (x_half) is chosen once per launch: each path is the whole kernel.
template <class Kind>
__device__ __forceinline__ void linear_rows(const LinearArgs& a) {
    __shared__ float xs[LIN_CHUNK * LIN_TILE_COLS];     // 16 KiB
    if (a.x_half) linear_rows_of<Kind, __half>(a, xs);
    else linear_rows_of<Kind, float>(a, xs);
}

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
extern "C" __global__ void __launch_bounds__(256, 4)
linear_rows_int2(LINEAR_PARAMS(__half)) { linear_rows<QuantKind<2, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_rows_int2_f32s(LINEAR_PARAMS(float)) { linear_rows<QuantKind<2, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_rows_int4(LINEAR_PARAMS(__half)) { linear_rows<QuantKind<4, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_rows_int4_f32s(LINEAR_PARAMS(float)) { linear_rows<QuantKind<4, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_rows_int8(LINEAR_PARAMS(__half)) { linear_rows<QuantKind<8, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_rows_int8_f32s(LINEAR_PARAMS(float)) { linear_rows<QuantKind<8, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_rows_f16(LINEAR_PARAMS(float)) { linear_rows<F16Kind>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256, 4)
linear_rows_f32(LINEAR_PARAMS(float)) { linear_rows<F32Kind>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int2(LINEAR_PARAMS(__half)) { linear_bulk<QuantKind<2, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int2_f32s(LINEAR_PARAMS(float)) { linear_bulk<QuantKind<2, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int4(LINEAR_PARAMS(__half)) { linear_bulk<QuantKind<4, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int4_f32s(LINEAR_PARAMS(float)) { linear_bulk<QuantKind<4, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int8(LINEAR_PARAMS(__half)) { linear_bulk<QuantKind<8, __half>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_int8_f32s(LINEAR_PARAMS(float)) { linear_bulk<QuantKind<8, float>>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_f16(LINEAR_PARAMS(float)) { linear_bulk<F16Kind>(LINEAR_ARGS); }
extern "C" __global__ void __launch_bounds__(256)
linear_bulk_f32(LINEAR_PARAMS(float)) { linear_bulk<F32Kind>(LINEAR_ARGS); }
