// The exact rows path of the linear layer (linear.cu's comment says what it computes and in
// what order): the staging, the batches of weights, the per-column sums, the folded KV write, and
// where a block is in its call's grid. Included by linear.cu (linear_rows_* and the bulk kernels)
// and linear_pair.cu (two calls in one launch), so both run the same code.
#pragma once

#include "kv_store.cuh"
#include "linear_kinds.cuh"
#include "linear_norm.cuh"

// The rows kernels are declared __launch_bounds__(256, 2): two blocks per SM, so ptxas
// budgets 128 registers: a lane holds two batches of chunks with their scales and mins (the
// one in flight and the one it sums) without spilling (cuda/RESOURCES.md, checked in CI).
#define LIN_WARPS 8                         // warps (output columns) per block on the rows path
#define LIN_THREADS (LIN_WARPS * 32)
#define LIN_CHUNK 4                         // rows per register chunk (8 spilled once the sums were FFMA)
#ifndef LIN_STAGE_FLOATS
#define LIN_STAGE_FLOATS 8192               // staged inputs per block (32 KiB): a chunk's whole rows
#endif                                      // where they fit

// -- the exact rows path ------------------------------------------------------------------------
// Lane l of a column owns, in each stripe of LIN_STRIPE (128) words of its row, the chunk of
// LIN_SPAN (4) words from 128 s + 4 l on, loaded at once (one 16-byte load), and sums all its
// words in increasing order (linear_kinds.cuh LIN_SPAN).
//
// A tile is as many whole stripes as LIN_STAGE_FLOATS holds for R rows (a decode row of up to
// 8192 stored columns is one tile, one barrier pair; a 4-row chunk 2048 columns a tile), so a
// lane's chunks of a tile are its chunks of whole stripes (rows_chunk asserts one fits).
__host__ __device__ constexpr int rows_tile_words(int cpw, int rows) {
    return LIN_STAGE_FLOATS / (rows * cpw) / LIN_STRIPE * LIN_STRIPE;
}
// Chunks a lane loads per batch (8 words for a decode row, 4 for more): a batch is in flight
// while the one before it is summed.
__host__ __device__ constexpr int rows_batch(int rows) { return rows == 1 ? 2 : 1; }

// The staged inputs, VEC = min(CPW, 4) consecutive slots of a word side by side, so a lane
// reads its word's inputs for one row with CPW / VEC vector loads; for one (row, part, word
// of the chunk) the lanes' vectors are consecutive, so a warp's shared loads meet no bank
// twice: slot `slot` of tile word w, row r, is
// xs[staged_vec<PARTS, TW>(r, slot / VEC, w) * VEC + slot % VEC].
template <int CPW>
struct StagedVec {
    static const int VEC = CPW < 4 ? CPW : 4;
    static const int PARTS = CPW / VEC;
};
template <int PARTS, int TW>
__device__ __forceinline__ int staged_vec(int r, int part, int w) {
    const unsigned u = (unsigned)w;         // >= 0: a shift and a mask, not a signed division
    return ((r * PARTS + part) * LIN_SPAN + (int)(u % LIN_SPAN)) * (TW / LIN_SPAN) + (int)(u / LIN_SPAN);
}
template <int N> struct FloatVec;
template <> struct FloatVec<1> { typedef float T; };
template <> struct FloatVec<2> { typedef float2 T; };
template <> struct FloatVec<4> { typedef float4 T; };
__device__ __forceinline__ float vec_at(float v, int) { return v; }
__device__ __forceinline__ float vec_at(const float2& v, int i) { return i == 0 ? v.x : v.y; }
__device__ __forceinline__ float vec_at(const float4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The fused pre-norm (a.norm): the statistics of rows row0..row0+R-1 (linear_norm.cuh
// tile_norm_stats: a warp a row, R <= LIN_WARPS, so a 4-row chunk's take a pass's round trips
// once, not once a row as the block's sums did one row after another).
template <int R>
__device__ __forceinline__ void rows_norm_stats(const LinearArgs& a, int row0, NormStats* st) {
    static_assert(R <= LIN_WARPS, "a warp a row");
    tile_norm_stats<LIN_WARPS>(a, row0, R, st);
}

// Whether a kind's rows kernels take the SwiGLU fold: not the float32-scale kinds, whose rows
// kernels have no registers left for it (the exp and divide of the staging, with the first batch
// of weights in flight, spill on sm_90); their launcher keeps the swiglu launch
// (launch/linear.py swiglu_fold_supported).
template <class Kind> struct TakesSwiglu { static const bool value = true; };
template <int BITS> struct TakesSwiglu<QuantKind<BITS, float>> { static const bool value = false; };

// Stage rows row0..row0+R-1, the `words` stored words from column col0 on (words <= TW; the
// sums never read past them), into xs (layout above, TW words a row), normalized on the way
// where the norm is fused (st: the rows' statistics). Consecutive threads read consecutive
// stored columns of a row (coalesced where there is no permutation).
template <int CPW, int R, int TW, class X, bool GATE>
__device__ __forceinline__ void stage_rows(const LinearArgs& a, int row0, int col0, int words, float* xs,
                                           const NormStats* st) {
    const int VEC = StagedVec<CPW>::VEC, PARTS = StagedVec<CPW>::PARTS;
    const int cols = words * CPW;
#pragma unroll 2
    for (int i = threadIdx.x; i < R * cols; i += LIN_THREADS) {
        int r = i / cols, col = i % cols;
        int word = col / CPW, slot = col % CPW;
        xs[staged_vec<PARTS, TW>(r, slot / VEC, word) * VEC + slot % VEC] =
            a.norm ? normed_input<GATE>(a, row0 + r, col0 + col, st[r]) : stored_input<X>(a, row0 + r, col0 + col);
    }
}

// This lane's chunks of a batch of column o (chunk c: words base + c LIN_STRIPE + 4 lane .. + 3,
// one 16-byte load), and their scales and mins. base is a stripe's first word. CLAMP (a batch
// that may pass `end`: a tile's first and last, the uneven resident loop's): a chunk past `end`
// loads the tile's last chunk again instead, so no load waits on a branch; the sums skip it.
// The column's pointers are found again at each load, not held through the sums: the registers
// go to the batches in flight (held, they spilled the row chunks' loop).
template <class Kind, int C, bool CLAMP>
__device__ __forceinline__ void load_batch(const LinearArgs& a, int o, int base, int end, unsigned magic,
                                           uint4* chunks, typename Kind::Params* params) {
    const unsigned int* row_words = a.weights + (long long)o * a.words_per_row;
    const int first = base + LIN_SPAN * (threadIdx.x & 31);
    // one address a batch: the unclamped chunks are its offsets (512 bytes apart), so no load
    // computes a 64-bit address of its own
    const uint4* lines = reinterpret_cast<const uint4*>(row_words + first);
#pragma unroll
    for (int c = 0; c < C; c++) {
        if (CLAMP) chunks[c] = *reinterpret_cast<const uint4*>(row_words + min(first + c * LIN_STRIPE, end - LIN_SPAN));   // sass: linear-rows-weights
        else chunks[c] = lines[c * (LIN_STRIPE / LIN_SPAN)];                                                              // sass: linear-rows-weights
    }
    Kind::template chunk_params<C, CLAMP>(Kind::column(o, a), first, end, magic, a, params);
}

// The batch in flight becomes the one to sum.
template <class Kind, int C>
__device__ __forceinline__ void take_batch(uint4* chunks, typename Kind::Params* params, const uint4* next,
                                           const typename Kind::Params* next_params) {
#pragma unroll
    for (int c = 0; c < C; c++) {
        chunks[c] = next[c];
        params[c] = next_params[c];
    }
}

__device__ __forceinline__ unsigned int chunk_word(const uint4& chunk, int j) {
    return j == 0 ? chunk.x : j == 1 ? chunk.y : j == 2 ? chunk.z : chunk.w;
}

// Add a batch's products to the rows' sums: chunk by chunk, word by word (lane l's words in
// increasing order), within a word its columns in order, each row's own accumulator, each
// product and sum one FFMA (rounded once). UNIFORM (compile time) or uniform (the launch's,
// Kind::chunk_uniform): a word's scale and min are its chunk's, loaded with the chunk; else the
// word's own, loaded here from the launch's arguments (groups narrower than a chunk, an int2
// row's 64 columns a chunk: the loads wait, but registers for four a chunk in flight, or for
// the column's pointers held through the sums, spilled the rows kernels). ptxas keeps a copy
// of the sums for each arm: scripts/sass_loops.py counts the uniform one (TL_MODEL_COMMON_PATH).
// CHECK: a chunk may lie past the tile's `end`.
template <class Kind, int R, int C, int TW, bool CHECK, bool UNIFORM>
__device__ __forceinline__ void sum_batch(const LinearArgs& a, const uint4* chunks,
                                          const typename Kind::Params* params, bool uniform, int base, int tile,
                                          int end, int o, const float* xs, float* acc) {
    const int CPW = Kind::CPW;
    const int VEC = StagedVec<CPW>::VEC, PARTS = StagedVec<CPW>::PARTS;
    typedef typename FloatVec<VEC>::T Vec;
    const Vec* xv = reinterpret_cast<const Vec*>(xs);
    const int first = base + LIN_SPAN * (threadIdx.x & 31);
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int w = first + c * LIN_STRIPE;
        if (CHECK && w >= end) continue;
        // the chunk's inputs: staged_vec(r, part, w - tile + j) is xc's (r, part, j) offset, a
        // constant, so the shared loads need no address of their own
        const Vec* xc = xv + staged_vec<PARTS, TW>(0, 0, w - tile);
#pragma unroll
        for (int j = 0; j < LIN_SPAN; j++) {
            float weight[CPW];
            Kind::decode_with(chunk_word(chunks[c], j), w + j, o, a,
                              UNIFORM || uniform ? params[c] : Kind::params(Kind::column(o, a), w + j, group_magic(a.group_size), a),
                              weight);
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int part = 0; part < PARTS; part++) {
                    Vec v = xc[staged_vec<PARTS, TW>(r, part, j)];
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        acc[r] = tl_fma(weight[part * VEC + i], vec_at(v, i), acc[r]);
                }
            }
        }
    }
}

// -- where a block is in its call's grid ----------------------------------------------------------
// A call of its own reads blockIdx and gridDim (CHAINED false: the code every rows kernel had); a
// call chained after another in one launch (the pair, below) reads the place its ticket gave it.
template <bool CHAINED> __device__ __forceinline__ int place_x(const LinearArgs& a) {
    return CHAINED ? a.block_x : (int)blockIdx.x;
}
template <bool CHAINED> __device__ __forceinline__ int place_y(const LinearArgs& a) {
    return CHAINED ? a.block_y : (int)blockIdx.y;
}
template <bool CHAINED> __device__ __forceinline__ int place_grid_x(const LinearArgs& a) {
    return CHAINED ? a.grid_x : (int)gridDim.x;
}

// A chained call's wait for the call before it (a grid barrier's second half): thread 0 reads the
// count until every block of that call has counted itself, fences (what they stored before our
// loads), and the block syncs; before anything of the call. (Waiting after the first batch of
// weights is issued, so that it loads during the wait, spilled the pair kernel on sm_90: the place
// and the batch both live across the wait.) Block-uniform.
template <bool CHAINED>
__device__ __forceinline__ void chain_wait(const LinearArgs& a) {
    if (!CHAINED || !a.chain_wait) return;
    if (threadIdx.x == 0) {
        while (*static_cast<const volatile unsigned int*>(a.chain_done) < a.chain_wait) {
#ifdef __CUDA_ARCH__
            __nanosleep(64);                // up to a few hundred blocks poll this one line
#endif
        }
        __threadfence();                    // sm_90: MEMBAR.SC.GPU then CCTL.IVALL (L1 dropped): the
                                            // block's plain loads of x after the barrier read L2
    }
    __syncthreads();
}

// -- the KV write folded into the qkv call (a.kv_mode) --------------------------------------------
// The launch's keys and values are its own output columns; each (row, kv head) has a counter.
// After its last column a warp syncs, fences (its lanes' stores are in memory before any count),
// then counts each (column, row) output it stored among the keys and values (its columns and
// rows are fixed by the grid: place_x * 8 + warp, then place_grid_x * 8 further on; the block's
// rows), 32 at a time. A count that completes a row's 2 hd columns of head g puts (row, g) on the
// warp's list and zeroes the counter (for the next launch, or a replayed graph); a count past
// 2 hd means a launch left a counter behind, and traps. Whenever the list could not take
// another 32, and at the end, the warp fences (what other blocks counted is in memory before
// it is read), syncs, and stores the rows on its list with kv_store.cuh, the kv_write_* kernels'
// own arithmetic (one warp a row instead of one block: the same bits), reading the columns
// other blocks wrote past L1. Nothing of this runs inside the column loops.
#define KV_FOLD_PENDING 64                  // a warp's list: rows completed, not yet stored
__shared__ unsigned int kv_fold_lists[LIN_WARPS][KV_FOLD_PENDING];       // a warp's completed row * n_kv + g
__shared__ float kv_fold_scratch[LIN_WARPS][KV_FOLD_SCRATCH];             // a warp's row being stored

// The head whose keys or values output column `column` holds, or -1 (a query column).
__device__ __forceinline__ int kv_fold_head(const LinearArgs& a, int column) {
    const int span = a.kv_n_kv * a.kv_hd;
    if (column >= a.kv_k_offset && column < a.kv_k_offset + span) return (column - a.kv_k_offset) / a.kv_hd;
    if (column >= a.kv_v_offset && column < a.kv_v_offset + span) return (column - a.kv_v_offset) / a.kv_hd;
    return -1;
}

// Every lane of every warp calls it, after the warp's last column.
template <bool CHAINED>
__device__ __forceinline__ void kv_fold(const LinearArgs& a) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o_first = place_x<CHAINED>(a) * LIN_WARPS + warp, o_step = place_grid_x<CHAINED>(a) * LIN_WARPS;
    const int row0 = place_y<CHAINED>(a) * a.rows_per_block;
    const int rows = max(min(row0 + a.rows_per_block, a.n_rows) - row0, 0);
    const int columns = o_first < a.n_out ? (a.n_out - o_first + o_step - 1) / o_step : 0;
    const int outputs = columns * rows;
    unsigned int* list = kv_fold_lists[warp];
    const KvRows s = {static_cast<float*>(a.y) + a.kv_k_offset, static_cast<const float*>(a.y) + a.kv_v_offset,
                      a.y_stride, a.y_stride, a.kv_blocks, a.kv_rows, a.kv_n_kv, a.kv_pool_rows, a.kv_hd,
                      a.kv_rotation, a.kv_has_rotation, a.kv_table_offsets, a.kv_per_token_tables};
    __syncwarp();
    __threadfence();                       // every lane's stores are in memory before any count
    int base = 0;
    while (true) {
        unsigned int n = 0;                // the list's length (warp-uniform)
        for (; base < outputs && n + 32 <= KV_FOLD_PENDING; base += 32) {
            const int i = base + lane;
            bool done = false;
            unsigned int entry = 0;
            if (i < outputs) {
                const int o = o_first + (i / rows) * o_step, t = row0 + i % rows;
                const int g = kv_fold_head(a, a.y_offset + o);
                if (g >= 0) {
                    unsigned int* counter = a.kv_counters + (long long)t * a.kv_n_kv + g;
                    const unsigned int count = atomicAdd(counter, 1u) + 1u;
                    if (count > 2u * (unsigned int)a.kv_hd) __trap();     // a counter left behind
                    done = count == 2u * (unsigned int)a.kv_hd;
                    if (done) *counter = 0u;                               // every count of the row is in
                    entry = (unsigned int)(t * a.kv_n_kv + g);
                }
            }
            const unsigned int mask = __ballot_sync(TL_FULL_MASK, done);
            if (done) list[n + __popc(mask & ((1u << lane) - 1u))] = entry;
            n += __popc(mask);
        }
        if (n) {
            __threadfence();               // the counts this warp saw complete: their columns next
            __syncwarp();                  // and the list is written
            for (unsigned int k = 0; k < n; k++) {
                const unsigned int e = list[k];
                kv_store_both<WarpTeam>(s, a.kv_mode, (int)(e / a.kv_n_kv), (int)(e % a.kv_n_kv), a.kv_key0,
                                        a.kv_key1, a.kv_key2, a.kv_value0, a.kv_value1, a.kv_value2,
                                        kv_fold_scratch[warp]);
            }
            __syncwarp();                  // the list is read before it is written again
        }
        if (base >= outputs) return;
    }
}

// A column's R sums, then its output: every lane gets each row's total; lane r stores row r
// (one epilogue in the code instead of R, which keeps the row chunks within their registers).
template <int R>
__device__ __forceinline__ void store_column(const LinearArgs& a, int row0, int o, const float* acc) {
    const int lane = threadIdx.x & 31;
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        float sum = tl_warp_sum(acc[r]);
        if (lane == r) mine = sum;
    }
    if (lane < R) store_output(a, row0 + lane, o, mine);
}

// Lane l of a column sums its words (its chunk of each stripe: 128 s + 4 l .. + 3) in increasing
// order, within a word its columns in order, one accumulator per row: the order the twin
// follows, the same in both paths below. Only the loads are arranged for the memory system; none
// of it moves an addition.
// A block's warps take columns place_x * 8 + warp, then place_grid_x * 8 further on, ...: the
// launcher may give fewer blocks than columns / 8 (launch/linear.py column_block_cap), and
// which block sums a column changes none of its bits.

// The chunk's rows fit one tile (every decode row up to 8,192 stored columns): staged once, then
// each warp runs through its columns back to back, a batch always in flight: the next batch,
// or the next column's first, loads while this one is summed. No barrier after the staging.
// EVEN: the row is whole batches (doc-407m's 256- and 1,024-word rows at two stripes a batch)
// and its chunks each in one group (Kind::chunk_uniform: a scale and a min a chunk), so no
// batch is clamped or checked and the loop has one arm.
template <class Kind, class X, int R, bool EVEN, bool CHAINED>
__device__ __forceinline__ void rows_resident(const LinearArgs& a, int row0, float* xs, NormStats* st) {
    const int CPW = Kind::CPW;
    const int TW = rows_tile_words(CPW, R);
    const int C = rows_batch(R);
    const int STEP = LIN_STRIPE * C;        // words a batch covers
    const int W = a.words_per_row;          // <= TW
    const int o_step = place_grid_x<CHAINED>(a) * LIN_WARPS;
    const unsigned magic = group_magic(a.group_size);
    int o = place_x<CHAINED>(a) * LIN_WARPS + (threadIdx.x >> 5);
    const bool any = o < a.n_out;           // warp-uniform
    const bool uniform = EVEN || Kind::chunk_uniform(a);
    uint4 chunks[C], next[C];
    typename Kind::Params params[C], next_params[C];
    if (any) load_batch<Kind, C, !EVEN>(a, o, 0, W, magic, chunks, params);
    if (a.norm && a.norm != LIN_STAGE_SWIGLU) rows_norm_stats<R>(a, row0, st);
    __syncthreads();                        // the previous chunk's readers are done with xs; st is written
    stage_rows<CPW, R, TW, X, TakesSwiglu<Kind>::value>(a, row0, 0, W, xs, st);
    __syncthreads();
    if (!any) return;

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    int base = 0;
    while (true) {
        // the unit after this one: the column's next batch, or the next column's first
        const bool last = base + STEP >= W;   // sass: linear-rows-resident
        const int next_o = last ? o + o_step : o;
        const int next_base = last ? 0 : base + STEP;
        if (next_o < a.n_out) {
            if (EVEN || next_base + STEP <= W) load_batch<Kind, C, false>(a, next_o, next_base, W, magic, next, next_params);
            else load_batch<Kind, C, true>(a, next_o, next_base, W, magic, next, next_params);
        }
        if (EVEN || base + STEP <= W) sum_batch<Kind, R, C, TW, false, EVEN>(a, chunks, params, uniform, base, 0, W, o, xs, acc);
        else sum_batch<Kind, R, C, TW, true, EVEN>(a, chunks, params, uniform, base, 0, W, o, xs, acc);
        if (last) {
            store_column<R>(a, row0, o, acc);
            if (next_o >= a.n_out) return;
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = 0.0f;
        }
        o = next_o;
        base = next_base;
        take_batch<Kind, C>(chunks, params, next, next_params);
    }
}

// Rows wider than a tile (a 4-row chunk past 2,048 columns): a column per warp at a time, its
// tiles staged in turn; a tile's first batch is issued before its inputs are staged, each later
// batch while the one before it is summed, so no load waits behind a barrier. (With fewer
// blocks than columns / 8 the tiles are staged again for each column.)
template <class Kind, class X, int R, bool CHAINED>
__device__ __forceinline__ void rows_tiled(const LinearArgs& a, int row0, float* xs, NormStats* st) {
    const int CPW = Kind::CPW;
    const int TW = rows_tile_words(CPW, R);
    const int C = rows_batch(R);
    const int STEP = LIN_STRIPE * C;        // words a batch covers
    const unsigned magic = group_magic(a.group_size);
    const bool uniform = Kind::chunk_uniform(a);
    if (a.norm && a.norm != LIN_STAGE_SWIGLU) rows_norm_stats<R>(a, row0, st);   // read after the first tile's barrier
    // c0 is block-uniform: every warp goes round as often (the barriers need it)
    for (int c0 = place_x<CHAINED>(a) * LIN_WARPS; c0 < a.n_out; c0 += place_grid_x<CHAINED>(a) * LIN_WARPS) {
        const int o = c0 + (threadIdx.x >> 5);
        const bool active = o < a.n_out;    // warp-uniform
        const int loaded = active ? o : 0;
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (int tile = 0; tile < a.words_per_row; tile += TW) {
            const int end = min(tile + TW, a.words_per_row);
            uint4 chunks[C], next[C];
            typename Kind::Params params[C], next_params[C];
            load_batch<Kind, C, true>(a, loaded, tile, end, magic, chunks, params);
            __syncthreads();                // the previous tile's readers are done with xs
            stage_rows<CPW, R, TW, X, TakesSwiglu<Kind>::value>(a, row0, tile * CPW, end - tile, xs, st);
            __syncthreads();
            int base = tile;
            // whole batches while the next one is whole too: no clamps, no checks
            for (; base + 2 * STEP <= end; base += STEP) {
                load_batch<Kind, C, false>(a, loaded, base + STEP, end, magic, next, next_params);
                if (active) sum_batch<Kind, R, C, TW, false, false>(a, chunks, params, uniform, base, tile, end, o, xs, acc);
                take_batch<Kind, C>(chunks, params, next, next_params);
            }
            if (base + STEP < end) {        // a whole batch, then a partial one
                load_batch<Kind, C, true>(a, loaded, base + STEP, end, magic, next, next_params);
                if (active) sum_batch<Kind, R, C, TW, false, false>(a, chunks, params, uniform, base, tile, end, o, xs, acc);
                take_batch<Kind, C>(chunks, params, next, next_params);
                base += STEP;
            }
            if (active) sum_batch<Kind, R, C, TW, true, false>(a, chunks, params, uniform, base, tile, end, o, xs, acc);
        }
        if (active) store_column<R>(a, row0, o, acc);
    }
}

// R rows starting at row0, every column of the block's (all warps of the block call it: it
// holds barriers). Which path depends on the launch alone (block-uniform).
template <class Kind, class X, int R, bool CHAINED>
__device__ __forceinline__ void rows_chunk(const LinearArgs& a, int row0, float* xs, NormStats* st) {
    static_assert(R * rows_tile_words(Kind::CPW, R) * Kind::CPW <= LIN_STAGE_FLOATS, "a tile must fit the stage");
    static_assert(rows_tile_words(Kind::CPW, R) >= LIN_STRIPE, "a tile holds at least a stripe");
    // resident for 1 and 2 rows (decode and draft steps, bound by the weights' bytes; more rows
    // are bound by the sums, and their registers would spill in the resident loop)
    if (R <= 2 && a.words_per_row <= rows_tile_words(Kind::CPW, R)) {
        if (a.words_per_row % (LIN_STRIPE * rows_batch(R)) == 0 && Kind::chunk_uniform(a))
            rows_resident<Kind, X, R, true, CHAINED>(a, row0, xs, st);
        else rows_resident<Kind, X, R, false, CHAINED>(a, row0, xs, st);
    } else {
        rows_tiled<Kind, X, R, CHAINED>(a, row0, xs, st);
    }
}

template <class Kind, class X, bool CHAINED>
__device__ __forceinline__ void linear_rows_of(const LinearArgs& a, float* xs, NormStats* st) {
    int row = place_y<CHAINED>(a) * a.rows_per_block;
    int end = min(row + a.rows_per_block, a.n_rows);
    // chunk sizes depend only on the block's row count (block-uniform, as the barriers need)
    for (; end - row >= LIN_CHUNK; row += LIN_CHUNK) rows_chunk<Kind, X, LIN_CHUNK, CHAINED>(a, row, xs, st);
    if (end - row >= 4) { rows_chunk<Kind, X, 4, CHAINED>(a, row, xs, st); row += 4; }
    if (end - row >= 2) { rows_chunk<Kind, X, 2, CHAINED>(a, row, xs, st); row += 2; }
    if (end - row >= 1) rows_chunk<Kind, X, 1, CHAINED>(a, row, xs, st);
}

// The activations' type (x_half) is chosen once per launch: each path is the whole kernel.
// Under a fused norm x is the float residual stream (the launcher sets x_half = 0).
template <class Kind, bool CHAINED = false>
__device__ __forceinline__ void linear_rows(const LinearArgs& a) {
    __shared__ __align__(16) float xs[LIN_STAGE_FLOATS];     // 32 KiB
    __shared__ NormStats st[LIN_CHUNK];                      // the fused norm's rows
    chain_wait<CHAINED>(a);                 // a chained call: x is the call before it's output
    if (a.x_half) linear_rows_of<Kind, __half, CHAINED>(a, xs, st);
    else linear_rows_of<Kind, float, CHAINED>(a, xs, st);
    if (a.kv_mode) kv_fold<CHAINED>(a);
}
