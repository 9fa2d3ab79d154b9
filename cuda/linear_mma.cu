// The exact path's linear on tensor cores, for 1-16 rows at a time (decode, draft, verify, tree
// and batched rows alike): y[t, o] = sum_i x[t, i] * W[o, i] (+ bias, + residual, GELU: the
// epilogue of linear_kinds.cuh), with x and the dequantized weights rounded to half and the
// products summed in float32 by mma.sync m16n8k16 (cuda/mma.cuh), sm_80 and later.
// Int4 weights with half scales and mins, groups of 32, 64 or 128 columns, no act-order permutation,
// code rows whole 16-byte lines (launch/packing.py pads them): the common case of every
// model this project serves; other segments stay on linear.cu's rows kernels.
//
// Row invariance (what keeps speculation exact): a row's result is a function of that row's
// inputs and of the weight's shape alone. The k order of every sum is fixed by the kernel's
// constants and the launcher's split (a function of the weight's shape); rows enter the mma
// as the 16 rows of A, and each output row of an m16n8k16 product depends only on its own
// row of A; rows of the tile past the call's rows are zeros and never stored. So the decode
// row and the same row inside a 16-row verify get the same bits. On the harness that is
// proven by the tests; on a GPU, that the tensor cores keep it too is a device test
// (scripts/gpu_check.sh).
//
// The weight as the tensor cores see it: w = half(code * scale + min), rounded once (one
// __hfma2 on the device; in double, then rounded once, elsewhere: the same bits). It differs
// from the float32 weight of the rows kernels by at most half an ulp of half, so this path's
// results agree with linear.cu's within a tolerance (tests), not bit for bit.
//
// Work split. Block: MMA_WARPS warps, 16 output columns each (two n8 tiles), MMA_BLOCK_COLS
// columns; grid (column blocks, splits, row tiles of 16). A split covers split_k stored columns
// (a multiple of MMA_CHUNK; the launcher splits only where the column blocks alone leave the
// GPU short of loads in flight), in batches of MMA_MAX_CHUNKS chunks: a lane holds a batch's
// weights in registers (one 16-byte load per chunk and n8 tile, 8 x 512 bytes a warp) and loads
// the next batch's while the block stages this batch's inputs in shared memory as half and
// the warps sum its products. Partial sums of a split go to `partials`; the last block of a
// column block to finish (counters, left zero for the next launch) adds the splits in
// increasing order and runs the epilogue. One split: no partials, the epilogue directly.
//
// k order inside a chunk (128 stored columns, 8 mma steps): lane c of a column's 4 lanes
// holds stored columns 32c .. 32c + 31 of the chunk as 4 words of 8 codes; word q serves steps
// 2q (codes (0, 4) as the slots 2c, 2c+1 and (1, 5) as 2c+8, 2c+9) and 2q+1 (codes (2, 6), (3,
// 7)): pairs that one mask of the word yields (0x000f000f << 4i). The staged inputs pair their
// columns the same way ((0, 4), (1, 5), (2, 6), (3, 7) of each 8), laid out so that one 16-byte
// shared load is a step's four A registers (step 2 below). The sum is over the same products
// whichever slot each sits in; the order (what the stand-in and the twin add first) is this one.
#include "linear_kinds.cuh"
#include "mma.cuh"

#define MMA_WARPS 4
#define MMA_THREADS (MMA_WARPS * 32)
#define MMA_TILE_ROWS 16                    // rows per tile: the mma's m
#define MMA_BLOCK_COLS (MMA_WARPS * 16)     // output columns per block: two n8 tiles per warp
#define MMA_CHUNK 128                       // stored columns per chunk: 4 lanes x 32
#define MMA_MAX_CHUNKS 4                    // chunks per batch: a lane's loads in flight
#define MMA_XS_PITCH (MMA_MAX_CHUNKS * 16 * 8 + 4)   // staged words per g (+4: the next g 4 banks on)

// Two codes (bits 0-3 and 16-19 of `pair`) -> their weights as half2 bits, w = half(code * s + m).
__device__ __forceinline__ unsigned int mma_dequant_pair(unsigned int pair, __half s, __half m) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // 0x6400 is half 1024, whose ulp is 1: OR-ing a code into its mantissa gives 1024 + code,
    // exactly; minus 1024 gives the code (exact), then one fused multiply-add, rounded once.
    unsigned int biased = pair | 0x64006400u;
    __half2 codes = __hsub2(*reinterpret_cast<__half2*>(&biased), __halves2half2(__ushort_as_half(0x6400),
                                                                                   __ushort_as_half(0x6400)));
    __half2 w = __hfma2(codes, __halves2half2(s, s), __halves2half2(m, m));
    return *reinterpret_cast<unsigned int*>(&w);
#else
    // code * s + m is exact in double (an 11-bit scale times a 4-bit code, plus an 11-bit min
    // within 2^40 of it); the conversion rounds once, to the nearest half: __hfma2's result.
    double fs = (double)__half2float(s), fm = (double)__half2float(m);
    __half low = __double2half((double)(pair & 0xfu) * fs + fm);
    __half high = __double2half((double)((pair >> 16) & 0xfu) * fs + fm);
    return pack_halves(low, high);
#endif
}

// Two floats rounded to the nearest halves (ties to even), the first in the low 16 bits: one
// F2FP instruction on the device.
__device__ __forceinline__ unsigned int mma_pack_rn(float low, float high) {
#ifdef __CUDA_ARCH__
    __half2 h = __floats2half2_rn(low, high);
    return *reinterpret_cast<unsigned int*>(&h);
#else
    return pack_halves(__float2half_rn(low), __float2half_rn(high));
#endif
}

// Staged position p (0..7) of a group of 8 holds stored column (0, 4, 1, 5, 2, 6, 3, 7)[p] of the group.
__device__ __forceinline__ int mma_stored_offset(int p) { return ((p & 1) << 2) | (p >> 1); }


// A lane's weights for one batch (up to MMA_MAX_CHUNKS chunks from stored column kb): per chunk
// and n8 tile one 16-byte line of codes (stored columns kb + 128 ch + 32 c ..) and its group's
// scale and min; zeros outside the weight.
struct MmaBatch {
    TlWords4 words[MMA_MAX_CHUNKS][2];
    __half scale[MMA_MAX_CHUNKS][2], minimum[MMA_MAX_CHUNKS][2];
};

__device__ __forceinline__ void mma_load_batch(const LinearArgs& a, int kb, int chunks, int col0, MmaBatch& b) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int stored_cols = a.words_per_row * 8;
    // groups divide a chunk (mma_eligible: 32, 64 or 128 columns): one division per batch
    const int lane_group = (kb + 32 * c) / a.group_size, groups_per_chunk = MMA_CHUNK / a.group_size;
#pragma unroll
    for (int ch = 0; ch < MMA_MAX_CHUNKS; ch++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int o = col0 + warp * 16 + j * 8 + g;
            const int col = kb + ch * MMA_CHUNK + 32 * c;            // the lane's first stored column
            if (ch < chunks && o < a.n_out && col < stored_cols) {
                b.words[ch][j] = *reinterpret_cast<const TlWords4*>(a.weights + (long long)o * a.words_per_row + col / 8);   // sass: linear-mma-weights
                // (the clamp is defensive: the stored width, a multiple of 32, stays in the groups)
                const int group = min(lane_group + ch * groups_per_chunk, a.groups - 1);
                b.scale[ch][j] = static_cast<const __half*>(a.scale)[(long long)o * a.groups + group];
                b.minimum[ch][j] = static_cast<const __half*>(a.mins)[(long long)o * a.groups + group];
            } else {
                b.words[ch][j] = TlWords4{{0u, 0u, 0u, 0u}};
                b.scale[ch][j] = __ushort_as_half(0);
                b.minimum[ch][j] = __ushort_as_half(0);
            }
        }
}

// The batch's inputs as the A fragments want them, into xs (8 x MMA_XS_PITCH words). An item is
// 8 stored columns (x0..x7) of rows g and g+8 of the tile (zeros for rows past the call's),
// 8 words: step 0's a0..a3 = (g: x0,x4), (g+8: x0,x4), (g: x1,x5), (g+8: x1,x5), then step 1's
// with (x2,x6), (x3,x7); so one 16-byte shared load is a step's A, in the four registers
// mma.sync reads. The item of lane c's word q of chunk ch sits in slot 16 ch + 4 q + c: the four
// lanes of a g read 16-byte granules 0, 2, 4, 6 of 8 and the next g (MMA_XS_PITCH words on:
// 4 mod 32) the odd ones, so a quarter-warp's load is free of bank conflicts.
// No permutation (mma_eligible): stored column j feeds input j, or 0 past in_features.
template <class X>
__device__ __forceinline__ void mma_stage_batch(const LinearArgs& a, int kb, int chunks, int row0, int rows,
                                                unsigned int* xs) {
    const int items = chunks * (MMA_CHUNK / 8);                  // items per g
    for (int i = threadIdx.x; i < 8 * items; i += MMA_THREADS) {
        const int gg = i / items, item = i - gg * items;          // gg: the g of the rows staged
        const int col = kb + item * 8;
        const bool whole = col + 8 <= a.in_features;               // no padding column among the 8
        unsigned int pairs[2][4];                                  // [row g / g+8][pair]
#pragma unroll
        for (int half_tile = 0; half_tile < 2; half_tile++) {
            const int r = gg + 8 * half_tile;
            float v[8];
            if (r < rows) {
                const X* xr = static_cast<const X*>(a.x) + (long long)(row0 + r) * a.x_stride + col;
                if (whole) {
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] = widen(xr[e]);    // sass: linear-mma-stage
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] = col + e < a.in_features ? widen(xr[e]) : 0.0f;
                }
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = 0.0f;
            }
#pragma unroll
            for (int q = 0; q < 4; q++)                            // a half x: exact
                pairs[half_tile][q] = mma_pack_rn(v[mma_stored_offset(2 * q)], v[mma_stored_offset(2 * q + 1)]);
        }
        const int ch = item / 16, within = item % 16;              // within = 4 c + q
        const int slot = ch * 16 + (within & 3) * 4 + (within >> 2);
        unsigned int* dst = xs + gg * MMA_XS_PITCH + slot * 8;
        *reinterpret_cast<TlWords4*>(dst) = TlWords4{{pairs[0][0], pairs[1][0], pairs[0][1], pairs[1][1]}};
        *reinterpret_cast<TlWords4*>(dst + 4) = TlWords4{{pairs[0][2], pairs[1][2], pairs[0][3], pairs[1][3]}};
    }
}

// The batch's products into acc, chunk by chunk, word by word, two steps a word.
__device__ __forceinline__ void mma_batch_products(const MmaBatch& b, int chunks, const unsigned int* xs,
                                                   float (*acc)[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int ch = 0; ch < MMA_MAX_CHUNKS; ch++) {
        if (ch >= chunks) break;                                  // uniform over the block
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const unsigned int* item = xs + g * MMA_XS_PITCH + (ch * 16 + q * 4 + c) * 8;
#pragma unroll
            for (int step = 0; step < 2; step++) {
                const TlWords4 af = *reinterpret_cast<const TlWords4*>(item + 4 * step);
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const unsigned int word = b.words[ch][j].w[q];
                    const unsigned int bf[2] = {
                        mma_dequant_pair((word >> (8 * step)) & 0x000f000fu, b.scale[ch][j], b.minimum[ch][j]),
                        mma_dequant_pair((word >> (8 * step + 4)) & 0x000f000fu, b.scale[ch][j], b.minimum[ch][j])};
                    tl_mma_16816(acc[j], af.w, bf, acc[j]);
                }
            }
        }
    }
}

template <class X>
__device__ __forceinline__ void linear_mma_int4_of(const LinearArgs& a, float* partials, unsigned int* counters,
                                                   int split_k, unsigned int* xs, int* last_flag) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int col_block = blockIdx.x, split = blockIdx.y, tile = blockIdx.z;
    const int n_splits = gridDim.y;
    const int col0 = col_block * MMA_BLOCK_COLS;
    const int row0 = tile * MMA_TILE_ROWS;
    const int rows = min(MMA_TILE_ROWS, a.n_rows - row0);         // this tile's rows, 1..16
    const int k0 = split * split_k;                               // first stored column of the split
    const int chunks = (min(split_k, a.words_per_row * 8 - k0) + MMA_CHUNK - 1) / MMA_CHUNK;   // with columns
    const int batches = (chunks + MMA_MAX_CHUNKS - 1) / MMA_MAX_CHUNKS;

    float acc[2][4];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
    // Software pipeline: batch b + 1's weights load while batch b's inputs are staged and its
    // products summed, so a warp keeps a batch of loads in flight; the staging alternates
    // between two buffers, so one barrier a batch suffices (a buffer is written again only
    // after the next batch's barrier, which every reader of it has passed). Only loads move:
    // the sums keep the k order (chunk after chunk), so no bit depends on the batching.
    MmaBatch current, next;
    mma_load_batch(a, k0, min(chunks, MMA_MAX_CHUNKS), col0, current);
    for (int batch = 0; batch < batches; batch++) {
        const int kb = k0 + batch * MMA_MAX_CHUNKS * MMA_CHUNK;
        const int batch_chunks = min(chunks - batch * MMA_MAX_CHUNKS, MMA_MAX_CHUNKS);
        if (batch + 1 < batches)
            mma_load_batch(a, kb + MMA_MAX_CHUNKS * MMA_CHUNK,
                           min(chunks - (batch + 1) * MMA_MAX_CHUNKS, MMA_MAX_CHUNKS), col0, next);
        unsigned int* buffer = xs + (batch & 1) * 8 * MMA_XS_PITCH;
        mma_stage_batch<X>(a, kb, batch_chunks, row0, rows, buffer);
        __syncthreads();
        mma_batch_products(current, batch_chunks, buffer, acc);
        if (batch + 1 < batches) current = next;
    }

    // 4. this lane's outputs: rows g, g+8; columns 2c, 2c+1 of each n8 tile. One split: the
    // epilogue; several: the split's partials, (splits, n_rows, n_out) floats
    const int n_cols = a.n_out;
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = g + (i >= 2 ? 8 : 0);
            const int o = col0 + warp * 16 + j * 8 + 2 * c + (i & 1);
            if (r >= rows || o >= n_cols) continue;
            if (n_splits == 1) store_output(a, row0 + r, o, acc[j][i]);
            else partials[((long long)split * a.n_rows + row0 + r) * n_cols + o] = acc[j][i];
        }
    if (n_splits == 1) return;
    // The last split block of this column block and row tile adds the splits in order. Each
    // block's fence puts its partials in memory before its count; the one that brings the
    // count to n_splits resets it (for the next launch, or a replayed graph).
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int* counter = counters + (long long)tile * gridDim.x + col_block;
        const bool last = atomicAdd(counter, 1u) + 1u == (unsigned int)n_splits;
        if (last) *counter = 0u;
        *last_flag = last;
    }
    __syncthreads();
    if (!*last_flag) return;                                      // uniform over the block
    __threadfence();
    for (int i = threadIdx.x; i < rows * MMA_BLOCK_COLS; i += MMA_THREADS) {
        const int r = i / MMA_BLOCK_COLS, o = col0 + i % MMA_BLOCK_COLS;
        if (o >= n_cols) continue;
        const float* p = partials + (long long)(row0 + r) * n_cols + o;
        float sum = tl_load_from_other_blocks(p);
        for (int s = 1; s < n_splits; s++)
            sum = tl_add(sum, tl_load_from_other_blocks(p + (long long)s * a.n_rows * n_cols));
        store_output(a, row0 + r, o, sum);
    }
}

// -- entry point (declared by name: the CPU harness finds kernels by their declarations) ---------
// LINEAR_PARAMS (linear_kinds.cuh; rows_per_block unused), then partials: (splits, n_rows, n_out)
// float32 scratch (unused with one split), counters: one uint32 per (row tile, column block),
// zero (and left zero), split_k: stored columns per split, a multiple of MMA_CHUNK.
// Launch: block (MMA_THREADS,), grid (ceil(n_out / 64), ceil(stored columns / split_k),
// ceil(n_rows / 16)).
// __launch_bounds__(128, 3): two batches' weights in registers take ~160; at 4 blocks per SM
// (128 registers) ptxas spilled them (cuda/RESOURCES.md, checked in CI).
extern "C" __global__ void __launch_bounds__(MMA_THREADS, 3)
linear_mma_int4(LINEAR_PARAMS(__half), float* partials, unsigned int* counters, int split_k) {
    tl_dependent_launch();
    __shared__ __align__(16) unsigned int xs[2 * 8 * MMA_XS_PITCH];   // two batches' inputs: 32.1 KiB
    __shared__ int last_flag;
    const LinearArgs a = LINEAR_ARGS;
#ifdef TL_MODEL_COMMON_PATH
    linear_mma_int4_of<float>(a, partials, counters, split_k, xs, &last_flag);   // scripts/sass_loops.py: one path
#else
    if (a.x_half) linear_mma_int4_of<__half>(a, partials, counters, split_k, xs, &last_flag);
    else linear_mma_int4_of<float>(a, partials, counters, split_k, xs, &last_flag);
#endif
}
