// What every linear kernel shares (linear.cu: the rows and bulk paths; linear_tc.cu: the
// tensor-core bulk path): the arguments, the weight kinds and how a stored word becomes its
// weights, and the input each stored column multiplies. The layout is described in linear.cu.
#pragma once
#include "common.cuh"

// The uniform flags of a launch that pick a rare path. scripts/sass_loops.py compiles with
// TL_MODEL_COMMON_PATH to count the machine code of the common case alone (no act-order
// permutation, one group of scales per word and per rows-path chunk of 4 words: GGUF's and
// RTN's groups of 32 or more) for the paper model; kernels never do.
#ifdef TL_MODEL_COMMON_PATH
#define TL_HAS_PERM(a) false
#define TL_GROUP_PER_WORD(a, cpw) true
#define TL_GROUP_PER_CHUNK(a, cpw) true
#else
#define TL_HAS_PERM(a) ((a).has_perm)
#define TL_GROUP_PER_WORD(a, cpw) ((a).group_size % (cpw) == 0)
#define TL_GROUP_PER_CHUNK(a, cpw) ((a).group_size % (LIN_SPAN * (cpw)) == 0)
#endif

struct LinearArgs {
    const void* x; int x_half; int x_stride; int n_rows; int rows_per_block;   // x: half or float
    const unsigned int* weights; int words_per_row; int n_out;
    const void* scale; const void* mins; int groups; int group_size;   // half or float: S below
    const int* perm; int has_perm; int stored_in; int in_features;
    const float* bias; int has_bias;
    const float* residual; int has_residual; int residual_stride;  // y = residual + x W^T (+ bias)
    void* y; int y_stride; int y_offset;           // float, or half when y_half
    int act; int y_half;                           // act 1: GELU (tanh) of the output, fused
    // the pre-norm fused into the rows kernels' staging (linear.cu; 0 elsewhere): norm is its
    // kind (norm.cuh TL_NORM_*: x is then the float residual stream, normalized as it is staged),
    // norm_half 1: each normalized value rounded to half, as a norm kernel writing a half
    // output (fp16 activations) would leave it for this linear
    const float* norm_weight; const float* norm_bias; int norm; int norm_half; float norm_eps;
    // the KV write folded into the qkv call (linear.cu's rows kernels; kv_mode 0 elsewhere): the
    // output's columns [kv_k_offset, + n_kv hd) are the keys, [kv_v_offset, + n_kv hd) the values;
    // once a row's 2 hd columns of head g are summed (kv_counters, a (rows, n_kv) count each
    // launch leaves zero) a warp stores that row of the cache with kv_store.cuh, kv_mode its
    // TL_KV_* mode, kv_key0..2 / kv_value0..2 the pool's arrays as kv_write_* takes them, the
    // rest kv_write_*'s arguments of the same names
    int kv_mode; void* kv_key0; void* kv_key1; void* kv_key2; void* kv_value0; void* kv_value1; void* kv_value2;
    const int* kv_blocks; const int* kv_rows; int kv_n_kv; int kv_pool_rows; int kv_hd;
    const float* kv_rotation; int kv_has_rotation; const int* kv_table_offsets; int kv_per_token_tables;
    int kv_k_offset; int kv_v_offset; unsigned int* kv_counters;
    // where this block is in the call's grid: blockIdx.x, blockIdx.y, gridDim.x for a call of its
    // own; the ticket's place for a call chained after another in one launch (linear.cu, the pair)
    int block_x; int block_y; int grid_x;
    // a call chained after another in one launch waits, before anything, until *chain_done counts
    // chain_wait blocks of the call before it (chain_wait 0: no wait; linear_rows.cuh chain_wait)
    const unsigned int* chain_done; unsigned int chain_wait;
};

// The rows path's unit of loading (linear_rows.cuh): a lane loads LIN_SPAN consecutive words at
// once (one 16-byte load; packing.py pads every weight row to whole 16-byte lines), and a warp's
// 32 lanes side by side cover a stripe of LIN_STRIPE words.
#define LIN_SPAN 4
#define LIN_STRIPE (32 * LIN_SPAN)

// -- weight kinds: columns per word and how a word becomes CPW floats ---------------------------
// floor(column / group_size) as __umulhi(column, magic) (QuantKind::params), magic = ceil(2^32 / group_size): with
// e = magic * group_size - 2^32 (0 <= e < group_size), column * magic / 2^32 = column / group_size
// + column * e / (group_size 2^32), and the second term stays under the 1 / group_size that
// separates column / group_size from the next whole number while column * group_size < 2^32,
// which the launcher checks (launch/linear.py). group_size >= 2 (a multiple of CPW >= 4 here).
__device__ __forceinline__ unsigned group_magic(int group_size) {
    return group_size >= 2 ? 0xffffffffu / (unsigned)group_size + 1u : 0u;   // dense kinds: unused
}

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }

// S: the stored type of scale and min (__half or float)
template <int BITS, class S>
struct QuantKind {
    static const int CPW = 32 / BITS;        // columns per 32-bit word
    static const int PER_BYTE = 8 / BITS;
    // The scale and min of a word whose columns share one group (group_size a multiple of
    // CPW, the usual case), loaded apart from its decoding so that a kernel can issue these
    // loads with the word's own, before it waits for any (the rows path, where a chunk's words
    // share one group: linear_rows.cuh). `magic` is
    // group_magic(group_size): the group is found with one high multiply, not an integer
    // division (about 25 instructions a word on sm_90); `column` holds the row's scale and min
    // pointers, found once.
    struct Params {
        float s, m;
    };
    struct Column {
        const S* s;
        const S* m;
    };
    __device__ __forceinline__ static Column column(int o, const LinearArgs& a) {
        Column c = {static_cast<const S*>(a.scale) + (long long)o * a.groups,
                    static_cast<const S*>(a.mins) + (long long)o * a.groups};
        return c;
    }
    __device__ __forceinline__ static Params params(const Column& c, int word_index, unsigned magic,
                                                    const LinearArgs& a) {
        Params p = {0.0f, 0.0f};
        if (TL_GROUP_PER_WORD(a, CPW)) {
            // unsigned: the address is one wide multiply-add from the column's pointers
            unsigned group = min(__umulhi((unsigned)word_index * CPW, magic), (unsigned)a.groups - 1u);
            p.s = widen(c.s[group]);
            p.m = widen(c.m[group]);
        }
        return p;
    }
    // Whether each of a lane's chunks (LIN_SPAN words from a multiple of LIN_SPAN: linear_rows.cuh)
    // lies in one group: group_size a multiple of the chunk's columns. Its words' params() are then
    // one (params()'s clamp to the last group binds all of them alike). Uniform over a launch.
    __device__ __forceinline__ static bool chunk_uniform(const LinearArgs& a) {
        return TL_GROUP_PER_WORD(a, CPW) && TL_GROUP_PER_CHUNK(a, CPW);
    }
    // params() of the first word of each of a lane's chunks of a batch (linear_rows.cuh
    // load_batch): chunk c is words first + c LIN_STRIPE .. + LIN_SPAN - 1 (CLAMP: from at most
    // end - LIN_SPAN). Where chunk_uniform holds they are every word's of the chunk; elsewhere
    // the sums load each word's own (linear_rows.cuh sum_batch).
    template <int C, bool CLAMP>
    __device__ __forceinline__ static void chunk_params(const Column& col, int first, int end, unsigned magic,
                                                        const LinearArgs& a, Params* p) {
#pragma unroll
        for (int c = 0; c < C; c++)
            p[c] = params(col, CLAMP ? min(first + c * LIN_STRIPE, end - LIN_SPAN) : first + c * LIN_STRIPE, magic, a);
    }
    // word `word_index` of output row `o`: its CPW weights, in column order.
    __device__ __forceinline__ static void decode(unsigned int word, int word_index, int o,
                                                  const LinearArgs& a, float* w) {
        decode_with(word, word_index, o, a, params(column(o, a), word_index, group_magic(a.group_size), a), w);
    }
    // The same from the word's params(): the same weights, bit for bit.
    __device__ __forceinline__ static void decode_with(unsigned int word, int word_index, int o,
                                                       const LinearArgs& a, const Params& p, float* w) {
        const S* scale_row = static_cast<const S*>(a.scale) + (long long)o * a.groups;
        const S* min_row = static_cast<const S*>(a.mins) + (long long)o * a.groups;
        // group_size is a multiple of PER_BYTE: one group per byte, and usually (a multiple
        // of CPW) one per word. Padding bytes past the stored width borrow the last group
        // (finite weights that meet x = 0).
        float s[4], m[4];
        if (TL_GROUP_PER_WORD(a, CPW)) {
#pragma unroll
            for (int b = 0; b < 4; b++) { s[b] = p.s; m[b] = p.m; }
        } else {
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int group = min((word_index * CPW + b * PER_BYTE) / a.group_size, a.groups - 1);
                s[b] = widen(scale_row[group]);
                m[b] = widen(min_row[group]);
            }
        }
        const unsigned int high = word >> 16;
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int i = 0; i < PER_BYTE; i++) {
                float code = code_at<BITS>(word, high, 8 * b + BITS * i);
                // with half scales code * scale is exact in float (BITS + 11 significant bits,
                // far from the float range's ends), so one rounding of code * scale + min is
                // the twin's two (round(code * scale), then + min): the same bits, one FFMA
                w[b * PER_BYTE + i] = EXACT_PRODUCT ? __fmaf_rn(code, s[b], m[b]) : tl_add(tl_mul(code, s[b]), m[b]);
            }
    }
    static const bool EXACT_PRODUCT = sizeof(S) == 2 && BITS <= 13;
};

// The two halves of a 32-bit word (the lower-index element in the low 16 bits), widened.
__device__ __forceinline__ float low_half(unsigned int v) {
    return __half2float(__ushort_as_half((unsigned short)(v & 0xffffu)));
}
__device__ __forceinline__ float high_half(unsigned int v) {
    return __half2float(__ushort_as_half((unsigned short)(v >> 16)));
}

// Dense kinds: nothing to load beside the word.
struct NoParams {};

struct F16Kind {
    static const int CPW = 2;
    typedef NoParams Params;
    typedef NoParams Column;
    __device__ __forceinline__ static Column column(int, const LinearArgs&) { return Column(); }
    __device__ __forceinline__ static Params params(const Column&, int, unsigned, const LinearArgs&) { return Params(); }
    __device__ __forceinline__ static bool chunk_uniform(const LinearArgs&) { return true; }
    template <int C, bool CLAMP>
    __device__ __forceinline__ static void chunk_params(const Column&, int, int, unsigned, const LinearArgs&, Params*) {}
    __device__ __forceinline__ static void decode_with(unsigned int word, int, int, const LinearArgs&,
                                                       const Params&, float* w) {
        w[0] = low_half(word);
        w[1] = high_half(word);
    }
    __device__ __forceinline__ static void decode(unsigned int word, int, int, const LinearArgs&,
                                                  float* w) {
        w[0] = low_half(word);
        w[1] = high_half(word);
    }
};

struct F32Kind {
    static const int CPW = 1;
    typedef NoParams Params;
    typedef NoParams Column;
    __device__ __forceinline__ static Column column(int, const LinearArgs&) { return Column(); }
    __device__ __forceinline__ static Params params(const Column&, int, unsigned, const LinearArgs&) { return Params(); }
    __device__ __forceinline__ static bool chunk_uniform(const LinearArgs&) { return true; }
    template <int C, bool CLAMP>
    __device__ __forceinline__ static void chunk_params(const Column&, int, int, unsigned, const LinearArgs&, Params*) {}
    __device__ __forceinline__ static void decode_with(unsigned int word, int, int, const LinearArgs&,
                                                       const Params&, float* w) {
        w[0] = __uint_as_float(word);
    }
    __device__ __forceinline__ static void decode(unsigned int word, int, int, const LinearArgs&,
                                                  float* w) {
        w[0] = __uint_as_float(word);
    }
};

// The input feeding stored column j of row t, or 0.0f where j is padding.
// X: the activations' type (float, or __half: fp16 activations, widened exactly).
template <class X>
__device__ __forceinline__ float stored_input(const LinearArgs& a, int t, int j) {
    int source = j < a.stored_in ? (TL_HAS_PERM(a) ? a.perm[j] : j) : a.in_features;
    return source < a.in_features ? widen(static_cast<const X*>(a.x)[(long long)t * a.x_stride + source]) : 0.0f;
}

// The CPW weights of stored word w of output o, or zeros outside the weight (o >= n_out or
// w >= words_per_row: a tile's edge). The bulk paths' weight staging.
template <class Kind>
__device__ __forceinline__ void word_weights(const LinearArgs& a, int o, int w, float* weight) {
    if (o < a.n_out && w < a.words_per_row) {
        Kind::decode(a.weights[(long long)o * a.words_per_row + w], w, o, a, weight);
    } else {
#pragma unroll
        for (int s = 0; s < Kind::CPW; s++) weight[s] = 0.0f;
    }
}

// Output t, o of the call from its sum: + bias, + residual, then (act) GELU, stored as float or
// (y_half: the next linear's input under fp16 activations) rounded to half. The fixed order
// every path uses; the activation is the gelu_tanh kernel's function, so fusing it changes no bit.
__device__ __forceinline__ void store_output(const LinearArgs& a, int t, int o, float sum) {
    if (a.has_bias) sum = tl_add(sum, a.bias[o]);
    if (a.has_residual) sum = tl_add(sum, a.residual[(long long)t * a.residual_stride + a.y_offset + o]);
    if (a.act) sum = tl_gelu_tanh(sum);
    tl_store(a.y, (long long)t * a.y_stride + a.y_offset + o, sum, a.y_half);
}

// Every linear kernel's parameters, S the stored type of scale and min (__half or float; the
// dense kinds take float and ignore them). The CPU harness finds each kernel by the name in its
// declaration and reads these parameters' types from the compiled function.
#define LINEAR_PARAMS(S) LINEAR_PARAMS_AS(S, )
// The same with every name prefixed by P (a second call's parameters in one entry point).
#define LINEAR_PARAMS_AS(S, P)                                                                                 \
    const void *P##x, int P##x_half, int P##x_stride, int P##n_rows, int P##rows_per_block,                    \
    const unsigned int *P##weights, int P##words_per_row, int P##n_out,                                        \
    const S *P##scale, const S *P##mins, int P##groups, int P##group_size,                                     \
    const int *P##perm, int P##has_perm, int P##stored_in, int P##in_features,                                 \
    const float *P##bias, int P##has_bias, const float *P##residual, int P##has_residual, int P##residual_stride, \
    void *P##y, int P##y_stride, int P##y_offset, int P##act, int P##y_half,                                   \
    const float *P##norm_weight, const float *P##norm_bias, int P##norm, int P##norm_half, float P##norm_eps,  \
    int P##kv_mode, void *P##kv_key0, void *P##kv_key1, void *P##kv_key2, void *P##kv_value0, void *P##kv_value1, \
    void *P##kv_value2, const int *P##kv_blocks, const int *P##kv_rows, int P##kv_n_kv, int P##kv_pool_rows,   \
    int P##kv_hd, const float *P##kv_rotation, int P##kv_has_rotation, const int *P##kv_table_offsets,         \
    int P##kv_per_token_tables, int P##kv_k_offset, int P##kv_v_offset, unsigned int *P##kv_counters

// The entry points' argument list as a LinearArgs.
// The output: y[t, o] = (x W^T)[t, o] (+ bias[o]) (+ residual[t, o]: the residual add of a
// pre-norm block fused into the epilogue, one launch fewer; residual has the full output's
// columns, row stride residual_stride floats, and may not overlap y). In that order, so the
// bits are those of the unfused add h + (x W^T + bias), IEEE addition being commutative. act = 1:
// GELU of that (the MLP's up projection: one launch fewer), y_half = 1: y is half.
#define LINEAR_ARGS LINEAR_ARGS_AS(, (int)blockIdx.x, (int)blockIdx.y, (int)gridDim.x, nullptr, 0u)
// Those of the parameters prefixed by P, for the block at (BX, BY) of a GX-wide grid, waiting for
// WAIT blocks counted at DONE first (WAIT 0: none).
#define LINEAR_ARGS_AS(P, BX, BY, GX, DONE, WAIT)                                                    \
    {P##x, P##x_half, P##x_stride, P##n_rows, P##rows_per_block, P##weights, P##words_per_row, P##n_out,   \
     P##scale, P##mins, P##groups, P##group_size, P##perm, P##has_perm, P##stored_in, P##in_features,     \
     P##bias, P##has_bias, P##residual, P##has_residual, P##residual_stride, P##y, P##y_stride,          \
     P##y_offset, P##act, P##y_half, P##norm_weight, P##norm_bias, P##norm, P##norm_half, P##norm_eps,   \
     P##kv_mode, P##kv_key0, P##kv_key1, P##kv_key2, P##kv_value0, P##kv_value1, P##kv_value2,          \
     P##kv_blocks, P##kv_rows, P##kv_n_kv, P##kv_pool_rows, P##kv_hd, P##kv_rotation,                   \
     P##kv_has_rotation, P##kv_table_offsets, P##kv_per_token_tables, P##kv_k_offset, P##kv_v_offset,    \
     P##kv_counters, BX, BY, GX, DONE, WAIT}
