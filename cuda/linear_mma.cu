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
// row of A; rows of the tile past the call's are never staged nor stored. So the decode
// row and the same row inside a 16-row verify get the same bits. On the harness that is
// proven by the tests; on a GPU, that the tensor cores keep it too is a device test
// (scripts/gpu_check.sh).
//
// The weight as the tensor cores see it: w = half(code * scale + min), rounded once (one
// __hfma2 on the device; in double, then rounded once, elsewhere: the same bits). It differs
// from the float32 weight of the rows kernels by at most half an ulp of half, so this path's
// results agree with linear.cu's within a tolerance (tests), not bit for bit.
//
// Work split. Block: MMA_WARPS warps, each 16 output columns (two n8 tiles) of one split of k:
// `parts` splits (1, 2 or 4, the launcher's choice) of MMA_WARPS / parts column groups, so
// MMA_BLOCK_COLS / parts columns; grid (column blocks, splits / parts, row tiles of 16). A split
// covers split_k stored columns (a multiple of MMA_CHUNK, a function of the weight's shape: the
// launcher splits where the column groups alone leave the GPU short of loads in flight), in
// batches of MMA_MAX_CHUNKS chunks: a lane holds a batch's weights in registers (one 16-byte
// load per chunk and n8 tile, 8 x 512 bytes a warp) and loads the next batch's while the block
// stages this batch's inputs (each part's) in shared memory as half and the warps sum its
// products. The splits are then added in increasing order: in shared memory where a block holds
// them all (no round trip); else each split's partial sums go to `partials` and the last block
// of a column block to finish (counters, left zero for the next launch) adds them. Either way the
// same additions in the same order, so `parts` changes no bit. One split: no sum, the epilogue
// directly.
//
// k order inside a chunk (128 stored columns, 8 mma steps): lane c of a column's 4 lanes
// holds stored columns 32c .. 32c + 31 of the chunk as 4 words of 8 codes; word q serves steps
// 2q (codes (0, 4) as the slots 2c, 2c+1 and (1, 5) as 2c+8, 2c+9) and 2q+1 (codes (2, 6), (3,
// 7)): pairs that one mask of the word yields (0x000f000f << 4i). The staged inputs pair their
// columns the same way ((0, 4), (1, 5), (2, 6), (3, 7) of each 8), laid out so that one 16-byte
// shared load is a step's four A registers (step 2 below). The sum is over the same products
// whichever slot each sits in; the order (what the stand-in and the twin add first) is this one.
#include "linear_kinds.cuh"
#include "kv_store.cuh"
#include "linear_norm.cuh"
#include "mma.cuh"

#define MMA_WARPS 4
#define MMA_THREADS (MMA_WARPS * 32)
#define MMA_TILE_ROWS 16                    // rows per tile: the mma's m
#define MMA_BLOCK_COLS (MMA_WARPS * 16)     // output columns per block: two n8 tiles per warp
#define MMA_CHUNK 128                       // stored columns per chunk: 4 lanes x 32
#define MMA_MAX_CHUNKS 4                    // chunks per batch: a lane's loads in flight
#define MMA_XS_PITCH (MMA_MAX_CHUNKS * 16 * 8 + 4)   // staged words per g (+4: the next g 4 banks on)
#define MMA_XS_WORDS (8 * MMA_XS_PITCH)            // one part's staged batch

// Bits as a half2 (its low 16 bits the first half), and back.
__device__ __forceinline__ __half2 mma_bits_half2(unsigned int bits) { return *reinterpret_cast<__half2*>(&bits); }
__device__ __forceinline__ unsigned int mma_half2_bits(__half2 h) { return *reinterpret_cast<unsigned int*>(&h); }

// A word's 8 codes (code i in bits 4i .. 4i + 3) as four half2 pairs, exactly: pair p holds codes
// (p, p + 4). Bit tricks instead of conversions: 0x6400 is half 1024, whose ulp is 1, so a code
// OR-ed into bits 0-3 of its mantissa gives 1024 + code and one OR-ed into bits 4-7 gives 1024 +
// 16 code, both exact (one LOP3 masks and ORs, `and_or`); minus 1024 (HADD2), or times 1/16
// minus 64 (HFMA2), is the code, exact (every value an integer below 2048, and a power-of-two
// scaling). One shift a word brings codes 2, 3, 6, 7 down to the same places. 13 instructions a
// word where shifting each pair down to bit 0 took 19 (a shift and two LOP3 a pair: nvcc does not
// fuse a mask and an OR whose operands are both constants).
__device__ __forceinline__ void mma_word_codes(unsigned int word, __half2 (&codes)[4]) {
    const __half2 k1024 = mma_bits_half2(0x64006400u), minus64 = mma_bits_half2(0xd400d400u);
    const __half2 sixteenth = mma_bits_half2(0x2c002c00u);                 // 1/16 = 2^-4
    const unsigned int high = word >> 8;                                    // codes 2, 3, 6, 7 at 0, 4, 16, 20
    codes[0] = __hsub2(mma_bits_half2(and_or(word, 0x000f000fu, 0x64006400u)), k1024);
    codes[1] = __hfma2(mma_bits_half2(and_or(word, 0x00f000f0u, 0x64006400u)), sixteenth, minus64);
    codes[2] = __hsub2(mma_bits_half2(and_or(high, 0x000f000fu, 0x64006400u)), k1024);
    codes[3] = __hfma2(mma_bits_half2(and_or(high, 0x00f000f0u, 0x64006400u)), sixteenth, minus64);
}

// A pair of codes -> their weights as half2 bits, w = half(code * s + m): one HFMA2, rounded once
// (code * s + m is exact in double, an 11-bit scale times a 4-bit code plus an 11-bit min within
// 2^40 of it: the harness's __hfma2 rounds that once, as the GPU's does, and as the twin,
// twins/linear.py mma_weights, does in float64).
__device__ __forceinline__ unsigned int mma_weight_pair(__half2 codes, __half2 s, __half2 m) {
    return mma_half2_bits(__hfma2(codes, s, m));
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

// What a lane loads from, found once a launch (the loads' addresses were found again for every
// chunk and tile, about 37 instructions each, a third of the batch loop): its two rows (o = the
// warp's first column + 8 j + g) as the first row's code words and group parameters plus the
// second's offset, whether each row is in the weight, the stored columns the split reads to
// (`end`), and the group of a column as a shift (groups of 32, 64 or 128: mma_eligible).
struct MmaLane {
    const unsigned int* codes;          // row o_0's words from the lane's first column (32 c)
    const __half* scale;                // row o_0's scales
    const __half* mins;                 // and its mins
    int code_row8, group_row8;          // 8 rows on: row o_1 = o_0 + 8
    int end, group_shift;
    bool row_in[2];
};

__device__ __forceinline__ MmaLane mma_lane(const LinearArgs& a, int warp_col0, int k0, int split_k) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int o = warp_col0 + g;                        // warp_col0: the warp's first column
    MmaLane l;
    l.codes = a.weights + (long long)o * a.words_per_row + 4 * c;
    l.scale = static_cast<const __half*>(a.scale) + (long long)o * a.groups;
    l.mins = static_cast<const __half*>(a.mins) + (long long)o * a.groups;
    l.code_row8 = 8 * a.words_per_row;
    l.group_row8 = 8 * a.groups;
    l.end = min(k0 + split_k, a.words_per_row * 8);
    l.group_shift = __ffs(a.group_size) - 1;            // a power of two
    l.row_in[0] = o < a.n_out;
    l.row_in[1] = o + 8 < a.n_out;
    return l;
}

__device__ __forceinline__ void mma_load_batch(const MmaLane& l, int kb, MmaBatch& b) {
    const int c = threadIdx.x & 3;
    const int col = kb + 32 * c;                         // the lane's first stored column of the batch
    const int group = col >> l.group_shift;
#pragma unroll
    for (int ch = 0; ch < MMA_MAX_CHUNKS; ch++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            // past the split's end (or the stored width): a chunk of the next split, or none
            if (l.row_in[j] && col + ch * MMA_CHUNK < l.end) {
                b.words[ch][j] = *reinterpret_cast<const TlWords4*>(l.codes + j * l.code_row8 + kb / 8 + ch * 16);   // sass: linear-mma-weights
                // groups divide a chunk: a chunk on is MMA_CHUNK >> shift groups on; the stored
                // width, a multiple of 32, stays within the groups (pack_linear)
                const int at = j * l.group_row8 + group + (ch * MMA_CHUNK >> l.group_shift);
                b.scale[ch][j] = l.scale[at];
                b.minimum[ch][j] = l.mins[at];
            } else {
                b.words[ch][j] = TlWords4{{0u, 0u, 0u, 0u}};
                b.scale[ch][j] = __ushort_as_half(0);
                b.minimum[ch][j] = __ushort_as_half(0);
            }
        }
}

// The staging: a batch's inputs as the A fragments want them, into xs (8 x MMA_XS_PITCH words). An item is
// 8 stored columns (x0..x7) of rows g and g+8 of the tile, 8 words: step 0's a0..a3 = (g: x0,x4),
// (g+8: x0,x4), (g: x1,x5), (g+8: x1,x5), then step 1's with (x2,x6), (x3,x7); so one 16-byte
// shared load is a step's A, in the four registers mma.sync reads. The item of lane c's word q
// of chunk ch sits in slot 16 ch + 4 q + c: the four lanes of a g read 16-byte granules 0, 2, 4,
// 6 of 8 and the next g (MMA_XS_PITCH words on: 4 mod 32) the odd ones, so a quarter-warp's load
// is free of bank conflicts.
// No permutation (mma_eligible): stored column j feeds input j, or 0 past in_features.
// Only the call's rows are staged (and zeros for a row r + 8 past them, which the whole-items
// loop below writes with row r): a decode's one row stages a sixteenth of a full tile's
// inputs. The rest of the buffer holds what it held (an earlier batch's inputs, or never
// written): the products read it as rows of A past the call's, and an output row of an mma
// depends on its own row of A alone (as row invariance does), so no kept output reads it
// (tests: the harness poisons shared memory with NaN).
// NORM (a.norm: the pre-norm folded in, x the float32 residual stream): each input is the norm
// kernel's value (linear_norm.cuh normed_value, st: the tile's rows' statistics), as the rows
// kernels stage it; rounded to half for the mma as the norm kernel's output would be.
// Parts (the block's splits, 1, 2 or 4 of them, parts_log2 their log): part p's batch, from
// stored column kb + p split_k, into its own buffer, xs + p MMA_XS_WORDS.
// Two loops: where x is float with rows 16-byte aligned and no pre-norm, mma_stage_whole_items
// (16-byte loads, two rows a pass, addresses moving by strides: 29 instructions a pass on sm_90
// where the checked loop takes 88 for one row, cuda/SASS.md) for every item whose columns lie
// within in_features, then the few others a row at a time; else the checked loop of
// mma_stage_batch. The same values in the same places either way.

// Where row r of item `item` of part p lies in the staging buffers: its item's slot (16 ch + 4 q + c
// for lane c's word q of chunk ch), row g = r % 8's words, the odd ones for r >= 8.
__device__ __forceinline__ unsigned int* mma_item_at(unsigned int* xs, int p, int r, int item) {
    const int ch = item >> 4, within = item & 15;                 // within = 4 c + q
    return xs + p * MMA_XS_WORDS + (r & 7) * MMA_XS_PITCH + (ch * 16 + (within & 3) * 4 + (within >> 2)) * 8
           + (r >> 3);
}

// One row of an item, its 8 inputs v (stored columns x0 .. x7), rounded to halves into its four
// words at `at` (mma_item_at): pair q at (q / 2) 4 + (q % 2) 2, the pairs (x0, x4), (x1, x5) ..
__device__ __forceinline__ void mma_store_row_words(unsigned int* at, const float (&v)[8]) {
#pragma unroll
    for (int q = 0; q < 4; q++)                                    // a half x: exact
        at[(q >> 1) * 4 + (q & 1) * 2] = mma_pack_rn(v[mma_stored_offset(2 * q)], v[mma_stored_offset(2 * q + 1)]);
}

// An item's 8 inputs from x (16-byte aligned) as its four words, the pairs (x0, x4), (x1, x5),
// (x2, x6), (x3, x7) rounded to the nearest halves as mma_pack_rn rounds them.
__device__ __forceinline__ void mma_item_words(const float* x, unsigned int (&words)[4]) {
    // (the tags on both lines: ptxas gives the loads the line of their first use)
    const TlWords4 lo = *reinterpret_cast<const TlWords4*>(x), hi = *reinterpret_cast<const TlWords4*>(x + 4);   // sass: linear-mma-stage
#pragma unroll
    for (int q = 0; q < 4; q++) words[q] = mma_pack_rn(__uint_as_float(lo.w[q]), __uint_as_float(hi.w[q]));   // sass: linear-mma-stage
}

// mma_stage_whole_items' 16-byte passes for one item (of every part, the edge items excepted).
__device__ __forceinline__ void mma_stage_items_by_strides(const LinearArgs& a, int kb, int item, int item_bits,
                                                           int parts_log2, int block_parts, int split_k, int row0,
                                                           int rows, unsigned int* xs) {
    const int pairs = min(rows, 8);                               // rows r, r + 8 a pass
    // the (row, part) pairs r parts + p a thread takes are t0, t0 + step, ... (step: the threads of
    // an item): a fixed part and every (step / parts)-th row where the parts divide the step, every
    // row of every step-th part where the step divides the parts, so its addresses move by strides
    const int step = MMA_THREADS >> item_bits, t0 = threadIdx.x >> item_bits;
    const int row_step = max(step >> parts_log2, 1), part_step = min(step, 1 << parts_log2);
    const int r0 = t0 >> parts_log2, stride = a.x_stride;
    const float* x = static_cast<const float*>(a.x) + (long long)(row0 + r0) * stride + kb + item * 8;
    for (int p = t0 & ((1 << parts_log2) - 1); p < block_parts; p += part_step) {
        const float* xr = x + p * split_k;
        unsigned int* at = mma_item_at(xs, p, r0, item);          // r0 < 8: row g = r0's words
        if (kb + p * split_k + item * 8 + 8 > a.in_features) continue;   // an edge item: mma_stage_edge_items'
        for (int r = r0; r < pairs; r += row_step) {
            unsigned int low[4], high[4] = {0u, 0u, 0u, 0u};
            mma_item_words(xr, low);
            if (r + 8 < rows) mma_item_words(xr + 8 * stride, high);
            // the item's words: pair q of rows g and g + 8 at (q / 2) 4 + (q % 2) 2 + (r >= 8)
            reinterpret_cast<TlWords4*>(at)[0] = TlWords4{{low[0], high[0], low[1], high[1]}};
            reinterpret_cast<TlWords4*>(at)[1] = TlWords4{{low[2], high[2], low[3], high[3]}};
            xr += row_step * stride;
            at += row_step * MMA_XS_PITCH;
        }
    }
}

// The edge items of mma_stage_whole_items: those with a column past in_features (the last batch
// of a short last split, or of a width not a multiple of a chunk; with the launcher's padding
// only the block's last part holds any, but a wider padding would put them in others): items
// first_edge .. items - 1 of each part, a row of an item a pass, each column checked, zeros
// past in_features (no load past the row), in the checked loop's places. Every thread takes
// part, its item's or not.
__device__ __forceinline__ void mma_stage_edge_items(const LinearArgs& a, int kb, int items, int block_parts,
                                                     int split_k, int row0, int rows, unsigned int* xs) {
    for (int p = 0; p < block_parts; p++) {                       // uniform over the block
        const int col_p = kb + p * split_k;
        const int first_edge = max(0, (a.in_features - col_p) / 8), edge_items = items - first_edge;
        for (int e = threadIdx.x; e < rows * edge_items; e += MMA_THREADS) {
            const int r = e / edge_items, edge = first_edge + (e - r * edge_items);
            const int col = col_p + edge * 8;
            const float* xr = static_cast<const float*>(a.x) + (long long)(row0 + r) * a.x_stride + col;
            float v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = col + k < a.in_features ? xr[k] : 0.0f;   // sass: linear-mma-stage-edge
            mma_store_row_words(mma_item_at(xs, p, r, edge), v);
        }
    }
}

// The staging of a batch from a float x whose rows are 16-byte aligned: mma_stage_batch's layout
// and values, in fewer instructions.
// (A half x, fp16 activations, stays on the checked loop: this loop's half instantiation took
// linear_mma past its 168 registers, into spills on sm_90 and sm_120.) A thread
// keeps one item (the block's threads are a multiple of a row's items, rounded up to a power of
// two) and walks the (row, part) pairs, so its addresses move by a stride; a pass stages rows r
// and r + 8 of the item (the 8 words rows g and g + 8 share, two 16-byte stores) from 16-byte
// loads, zeros for a row r + 8 past the call's (an A row no kept output reads). An item with a
// column past in_features (a short last split's, or a width's not a multiple of a chunk) is
// left to the edge loop at the end (mma_stage_edge_items). Parts past
// the block's last (3 of 4 staged) are left alone: no warp sums them, and their columns lie
// past x's row. A quarter-warp's 8 items store to two groups of banks (slots 0, 4, 8, 12 and
// 1, 5, 9, 13 of a chunk): a 4-way conflict, against 8-way for the checked loop's 4-byte stores.
__device__ __forceinline__ void mma_stage_whole_items(const LinearArgs& a, int kb, int items, int item_bits,
                                                      int parts_log2, int block_parts, int split_k, int row0,
                                                      int rows, unsigned int* xs) {
    const int item = threadIdx.x & ((1 << item_bits) - 1);
    // a row of 3 chunks: items 48 .. 63 none (their threads go on to the edge loop below)
    if (item < items) mma_stage_items_by_strides(a, kb, item, item_bits, parts_log2, block_parts, split_k, row0, rows, xs);
    mma_stage_edge_items(a, kb, items, block_parts, split_k, row0, rows, xs);
}

// Whether a float x needs the checked loop for all its items: its rows not 16-byte aligned
// (uniform over the launch).
__device__ __forceinline__ bool mma_stage_is_checked(const LinearArgs& a) {
    return (reinterpret_cast<unsigned long long>(a.x) & 15ull) != 0 || a.x_stride % 4 != 0;
}

// The checked loop: one row of an item a pass, each column checked against in_features, the
// pre-norm applied where there is one. A pass's index is (row, part, item) by shifts and masks
// (an integer division by a count known only at run time is some 20 instructions), the items
// of a row rounded up to a power of two.
template <class X, bool NORM>
__device__ __forceinline__ void mma_stage_batch(const LinearArgs& a, int kb, int chunks, int parts_log2,
                                                int block_parts, int split_k, int row0, int rows,
                                                unsigned int* xs, const NormStats* st) {
    const int items = chunks * (MMA_CHUNK / 8);                  // items per row: 16 a chunk
    const int item_bits = chunks > 2 ? 6 : chunks > 1 ? 5 : 4;  // log2 of 16, 32, 64 >= items
    if constexpr (!NORM && sizeof(X) == sizeof(float)) {
        if (!mma_stage_is_checked(a)) {
            mma_stage_whole_items(a, kb, items, item_bits, parts_log2, block_parts, split_k, row0, rows, xs);
            return;
        }
    }
    const int parts_mask = (1 << parts_log2) - 1;
    for (int i = threadIdx.x; i < rows << (parts_log2 + item_bits); i += MMA_THREADS) {
        const int item = i & ((1 << item_bits) - 1), row_part = i >> item_bits;
        if (item >= items) continue;                              // a row of 3 chunks: 48 of 64
        const int p = row_part & parts_mask, r = row_part >> parts_log2;   // row r of the tile: g = r % 8
        const int col = kb + p * split_k + item * 8;
        const bool whole = col + 8 <= a.in_features;               // no padding column among the 8
        float v[8];
        if (NORM) {
            // the 8 elements' loads first (x, the norm's weight and bias), then their values;
            // padding columns (past in_features: no permutation, mma_eligible) load nothing and
            // stage 0. Without a bias the weight stands in for it (a valid address; its value
            // is not used): selects, not branches, so one path serves every norm kind
            const float* xr = static_cast<const float*>(a.x) + (long long)(row0 + r) * a.x_stride + col;
            const float* bias = a.norm == TL_NORM_LAYER_BIAS ? a.norm_bias : a.norm_weight;
            const NormStats row = st[r];
            float xv[8], wv[8], bv[8];
            bool in[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                in[e] = whole || col + e < a.in_features;
                xv[e] = in[e] ? xr[e] : 0.0f;                                    // sass: linear-mma-norm
                wv[e] = in[e] ? a.norm_weight[col + e] : 0.0f;
                bv[e] = in[e] ? bias[col + e] : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float value = normed_value(a, xv[e], row, wv[e], bv[e]);
                v[e] = in[e] ? value : 0.0f;
            }
        } else {
            const X* xr = static_cast<const X*>(a.x) + (long long)(row0 + r) * a.x_stride + col;
            if (whole) {
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = widen(xr[e]);        // sass: linear-mma-stage-checked
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = col + e < a.in_features ? widen(xr[e]) : 0.0f;
            }
        }
        mma_store_row_words(mma_item_at(xs, p, r, item), v);
    }
}

// The batch's products into acc, chunk by chunk, word by word, two steps a word.
__device__ __forceinline__ void mma_batch_products(const MmaBatch& b, int chunks, const unsigned int* xs,
                                                   float (*acc)[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int ch = 0; ch < MMA_MAX_CHUNKS; ch++) {
        if (ch >= chunks) break;                                  // uniform over the warp
        __half2 scale[2], minimum[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            scale[j] = __halves2half2(b.scale[ch][j], b.scale[ch][j]);
            minimum[j] = __halves2half2(b.minimum[ch][j], b.minimum[ch][j]);
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const unsigned int* item = xs + g * MMA_XS_PITCH + (ch * 16 + q * 4 + c) * 8;
            __half2 codes[2][4];                                  // [tile][pair]: codes (p, p + 4)
#pragma unroll
            for (int j = 0; j < 2; j++) mma_word_codes(b.words[ch][j].w[q], codes[j]);
#pragma unroll
            for (int step = 0; step < 2; step++) {
                const TlWords4 af = *reinterpret_cast<const TlWords4*>(item + 4 * step);
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    // step 0: codes (0, 4) as k slots 2c, 2c+1 and (1, 5) as 2c+8, 2c+9; step 1: (2, 6), (3, 7)
                    const unsigned int bf[2] = {mma_weight_pair(codes[j][2 * step], scale[j], minimum[j]),
                                                mma_weight_pair(codes[j][2 * step + 1], scale[j], minimum[j])};
                    tl_mma_16816(acc[j], af.w, bf, acc[j]);
                }
            }
        }
    }
}

// The block's outputs (rows row0 .., columns col0 .. + block_cols) as the sums of the weight's
// splits in increasing order, split_value(s, r, cc) giving split s's (from shared memory where the
// block's warps hold them all, or from the partials other blocks wrote), then the epilogue. One
// loop for both: the same floats added in the same order, so the parts change no bit.
template <class SplitValue>
__device__ __forceinline__ void mma_store_split_sums(const LinearArgs& a, int row0, int rows, int col0,
                                                     int block_cols, int n_splits, SplitValue split_value) {
    for (int i = threadIdx.x; i < rows * block_cols; i += MMA_THREADS) {
        const int r = i / block_cols, cc = i - r * block_cols, o = col0 + cc;
        if (o >= a.n_out) continue;
        float sum = split_value(0, r, cc);
        for (int s = 1; s < n_splits; s++) sum = tl_add(sum, split_value(s, r, cc));
        store_output(a, row0 + r, o, sum);
    }
}

// -> whether this block stored outputs (a block of several splits' last to finish, or every block)
template <class X, bool NORM>
__device__ __forceinline__ bool linear_mma_int4_of(const LinearArgs& a, float* partials, unsigned int* counters,
                                                   int split_k, int parts, unsigned int* xs, int* last_flag,
                                                   NormStats* st) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int col_block = blockIdx.x, tile = blockIdx.z;
    if (parts != 1 && parts != 2 && parts != 4) __trap();       // the staging's shifts take these
    // the block's warps: MMA_WARPS / parts column groups of 16, each `parts` splits of k
    const int part = warp % parts, col_group = warp / parts;
    const int block_cols = MMA_BLOCK_COLS / parts;
    const int stored = a.words_per_row * 8;
    const int n_splits = (stored + split_k - 1) / split_k;
    const int first_split = blockIdx.y * parts;                   // the block's part 0
    // the parts staged: those with columns (a last block may have fewer), rounded up to a power of two
    const int block_parts = min(parts, n_splits - first_split);
    const int stage_parts_log2 = block_parts > 2 ? 2 : block_parts > 1 ? 1 : 0;
    const int split = first_split + part;                         // this warp's
    const int col0 = col_block * block_cols;
    const int row0 = tile * MMA_TILE_ROWS;
    const int rows = min(MMA_TILE_ROWS, a.n_rows - row0);         // this tile's rows, 1..16
    const int k0 = split * split_k;                               // first stored column of the split
    // chunks with columns: this warp's split's (0 past the last split), and the block's most (part 0's)
    const int chunks = split < n_splits ? (min(split_k, stored - k0) + MMA_CHUNK - 1) / MMA_CHUNK : 0;
    const int lead_chunks = (min(split_k, stored - first_split * split_k) + MMA_CHUNK - 1) / MMA_CHUNK;
    const int batches = (lead_chunks + MMA_MAX_CHUNKS - 1) / MMA_MAX_CHUNKS;   // uniform over the block

    // The first batch's weights load first, so the folded norm's statistics below take no
    // round trip of their own on top of theirs
    const MmaLane lane_at = mma_lane(a, col0 + col_group * 16, k0, split_k);
    MmaBatch current, next;
    mma_load_batch(lane_at, k0, current);
    // The folded pre-norm: the statistics of the tile's rows, warp w taking rows w, w + 4, ...
    // each by the norm kernels' code and sum order (norm.cuh norm_stats_warp: the 256 summing
    // threads' partials, eight a lane, their tree in registers), read by the staging after
    // this barrier
    if (NORM) {
        tile_norm_stats<MMA_WARPS>(a, row0, rows, st);
        __syncthreads();
    }

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
    // The block stages each part's batch (part p from stored column first_split split_k + p
    // split_k); a warp sums its own part's, its own split's chunks (a last split may be short).
    for (int batch = 0; batch < batches; batch++) {
        const int offset = batch * MMA_MAX_CHUNKS * MMA_CHUNK;     // within each split
        const int stage_chunks = min(lead_chunks - batch * MMA_MAX_CHUNKS, MMA_MAX_CHUNKS);
        const int batch_chunks = min(chunks - batch * MMA_MAX_CHUNKS, MMA_MAX_CHUNKS);   // <= 0: none
        if (batch + 1 < batches)
            mma_load_batch(lane_at, k0 + offset + MMA_MAX_CHUNKS * MMA_CHUNK, next);
        unsigned int* buffer = xs + (batch & 1) * parts * MMA_XS_WORDS;
        mma_stage_batch<X, NORM>(a, first_split * split_k + offset, stage_chunks, stage_parts_log2, block_parts,
                                 split_k, row0, rows, buffer, st);
        __syncthreads();
        mma_batch_products(current, batch_chunks, buffer + part * MMA_XS_WORDS, acc);
        if (batch + 1 < batches) current = next;
    }

    // This lane's outputs: rows g, g+8; columns 2c, 2c+1 of each n8 tile, of its split. One
    // split: the epilogue; the block's splits all: into shared memory (xs, once every warp is
    // past its last products), for the block's ordered sum; more: the split's partials, (splits,
    // n_rows, n_out) floats, for the last block's
    const int n_cols = a.n_out;
    const bool in_block = n_splits > 1 && gridDim.y == 1;
    float* block_sums = reinterpret_cast<float*>(xs);              // (parts, rows, block_cols)
    if (in_block) __syncthreads();
    if (split < n_splits) {
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = g + (i >= 2 ? 8 : 0);
                const int cc = col_group * 16 + j * 8 + 2 * c + (i & 1);   // within the block
                const int o = col0 + cc;
                if (r >= rows || o >= n_cols) continue;
                if (n_splits == 1) store_output(a, row0 + r, o, acc[j][i]);
                else if (in_block) block_sums[(part * rows + r) * block_cols + cc] = acc[j][i];
                else partials[((long long)split * a.n_rows + row0 + r) * n_cols + o] = acc[j][i];
            }
    }
    if (n_splits == 1) return true;
    if (in_block) {
        __syncthreads();
        mma_store_split_sums(a, row0, rows, col0, block_cols, n_splits,
                             [&](int s, int r, int cc) { return block_sums[(s * rows + r) * block_cols + cc]; });
        return true;
    }
    // The last block of this column block and row tile to finish adds the splits in order. Each
    // block's fence puts its partials in memory before its count; the one that brings the
    // count to the blocks along y resets it (for the next launch, or a replayed graph).
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int* counter = counters + (long long)tile * gridDim.x + col_block;
        const bool last = atomicAdd(counter, 1u) + 1u == gridDim.y;
        if (last) *counter = 0u;
        *last_flag = last;
    }
    __syncthreads();
    if (!*last_flag) return false;                                // uniform over the block
    __threadfence();
    mma_store_split_sums(a, row0, rows, col0, block_cols, n_splits, [&](int s, int r, int cc) {
        return tl_load_from_other_blocks(partials + ((long long)s * a.n_rows + row0 + r) * n_cols + col0 + cc);
    });
    return true;
}

// -- the KV write folded into the qkv call (a.kv_mode), as the rows kernels fold it ---------------
// The call's keys and values are its own output columns; each (row, kv head) has a counter that
// reaches 2 hd once every column of that row's key and value of that head is in memory. A block
// that stored outputs (its columns, its tile's rows) has fenced them (the caller: each thread's
// fence, then the block's barrier); it adds to each (row, head) counter the number of its
// columns among that head's keys and values: one atomic a pair where the rows kernels add one
// an output (the counters are the same: a qkv of several segments, some on the rows kernels,
// counts into them all). The count that completes a pair resets the counter (for the next launch, or a replayed graph) and its warp stores the row with
// kv_store.cuh, the kv_write_* kernels' own arithmetic (a warp a row: the same bits), reading
// the columns other blocks wrote past L1; a count past 2 hd means a launch left a counter
// behind, and traps. scratch: KV_FOLD_SCRATCH floats a warp (the staging buffers, done with).
__device__ __forceinline__ void mma_kv_fold(const LinearArgs& a, int parts, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int block_cols = MMA_BLOCK_COLS / parts;
    const int lo = a.y_offset + blockIdx.x * block_cols;          // the block's columns [lo, hi), as
    const int hi = a.y_offset + min((int)(blockIdx.x + 1) * block_cols, a.n_out);   // the output numbers them
    const int row0 = blockIdx.z * MMA_TILE_ROWS, rows = min(MMA_TILE_ROWS, a.n_rows - row0);
    const int hd = a.kv_hd, pairs = rows * a.kv_n_kv;
    const KvRows s = {static_cast<float*>(a.y) + a.kv_k_offset, static_cast<const float*>(a.y) + a.kv_v_offset,
                      a.y_stride, a.y_stride, a.kv_blocks, a.kv_rows, a.kv_n_kv, a.kv_pool_rows, hd,
                      a.kv_rotation, a.kv_has_rotation, a.kv_table_offsets, a.kv_per_token_tables};
    for (int base = warp * 32; base < pairs; base += MMA_THREADS) {     // uniform over the warp
        const int i = base + lane;
        bool done = false;
        int t = 0, g = 0;
        if (i < pairs) {
            t = row0 + i / a.kv_n_kv;
            g = i - (t - row0) * a.kv_n_kv;
            const int k = a.kv_k_offset + g * hd, v = a.kv_v_offset + g * hd;
            const int mine = max(0, min(hi, k + hd) - max(lo, k)) + max(0, min(hi, v + hd) - max(lo, v));
            if (mine > 0) {
                unsigned int* counter = a.kv_counters + (long long)t * a.kv_n_kv + g;
                const unsigned int count = atomicAdd(counter, (unsigned int)mine) + (unsigned int)mine;
                if (count > 2u * (unsigned int)hd) __trap();          // a counter left behind
                done = count == 2u * (unsigned int)hd;
                if (done) *counter = 0u;                               // every count of the pair is in
            }
        }
        unsigned int mask = __ballot_sync(TL_FULL_MASK, done);
        if (mask) __threadfence();         // the counts this warp saw complete: their columns next
        while (mask) {
            const int from = __ffs(mask) - 1;
            mask &= mask - 1u;
            kv_store_both<WarpTeam>(s, a.kv_mode, __shfl_sync(TL_FULL_MASK, t, from),
                                    __shfl_sync(TL_FULL_MASK, g, from), a.kv_key0, a.kv_key1, a.kv_key2,
                                    a.kv_value0, a.kv_value1, a.kv_value2, scratch + warp * KV_FOLD_SCRATCH);
        }
    }
}

// -- entry point (declared by name: the CPU harness finds kernels by their declarations) ---------
// LINEAR_PARAMS (linear_kinds.cuh; rows_per_block unused), then partials: (splits, n_rows, n_out)
// float32 scratch (unused unless the splits outnumber a block's parts), counters: one uint32 per
// (row tile, column block), zero (and left zero), split_k: stored columns per split, a multiple
// of MMA_CHUNK, parts: the splits a block's warps take (1, 2 or 4: MMA_WARPS / parts column
// groups of 16 a block).
// Launch: block (MMA_THREADS,), grid (ceil(n_out / (64 / parts)), ceil(splits / parts),
// ceil(n_rows / 16)), dynamic shared memory 2 parts MMA_XS_WORDS words (the staging buffers:
// 32.3 KiB a part).
// __launch_bounds__(128, 3): two batches' weights in registers take ~160; at 4 blocks per SM
// (128 registers) ptxas spilled them (cuda/RESOURCES.md, checked in CI).
// The harness resolves `extern __shared__` only outside templates.
extern __shared__ __align__(16) unsigned int mma_xs[];

extern "C" __global__ void __launch_bounds__(MMA_THREADS, 3)
linear_mma_int4(LINEAR_PARAMS(__half), float* partials, unsigned int* counters, int split_k, int parts) {
    tl_dependent_launch();
    __shared__ int last_flag;
    __shared__ NormStats st[MMA_TILE_ROWS];                           // the folded norm's rows
    const LinearArgs a = LINEAR_ARGS;
    bool stored;
    // scripts/sass_loops.py (TL_MODEL_COMMON_PATH): float inputs, with and without the norm
    if (a.norm) stored = linear_mma_int4_of<float, true>(a, partials, counters, split_k, parts, mma_xs, &last_flag, st);
#ifdef TL_MODEL_COMMON_PATH
    else stored = linear_mma_int4_of<float, false>(a, partials, counters, split_k, parts, mma_xs, &last_flag, st);
#else
    else if (a.x_half)
        stored = linear_mma_int4_of<__half, false>(a, partials, counters, split_k, parts, mma_xs, &last_flag, st);
    else stored = linear_mma_int4_of<float, false>(a, partials, counters, split_k, parts, mma_xs, &last_flag, st);
#endif
    if (stored && a.kv_mode) {             // uniform over the block
        __threadfence();                   // this thread's outputs are in memory before any count,
        __syncthreads();                   // every thread's are, and no warp reads the staging buffers
        mma_kv_fold(a, parts, reinterpret_cast<float*>(mma_xs));
    }
}
