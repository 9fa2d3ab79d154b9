// Loading the stored KV cache into attention's shared tiles (cuda/attention.cu): where a
// query's keys are (AttGeometry: ring, tree tail, block table), a stored element dequantized
// (att_load), and a 64-key block staged into float tiles, in 16-byte pieces where the rows
// allow it (att_stage) or element by element. Every path gives a tile element the same bits:
// code * scale + min, or the stored float. The layouts are cuda/README.md's.
#pragma once
#include "common.cuh"

#define ATT_KEYS 1           // att_stage's sides
#define ATT_VALUES 2

// One stored side: float modes use data; int modes codes (data), scale and min.
struct KVSide {
    const void* data;
    const __half* scale;
    const __half* min;
};

enum { ATT_FP32, ATT_FP16, ATT_INT8, ATT_INT4 };

// Element d of stored row `row` (index into the pool's (n_kv, rows) planes), dequantized.
template <int MODE>
__device__ __forceinline__ float att_load(const KVSide& s, long long row, int d, int hd) {
    if (MODE == ATT_FP32) return ((const float*)s.data)[row * hd + d];
    if (MODE == ATT_FP16) return __half2float(((const __half*)s.data)[row * hd + d]);
    const int gsize = (hd % 32 == 0) ? 32 : hd, groups = hd / gsize;
    int code;
    if (MODE == ATT_INT8) {
        code = ((const unsigned char*)s.data)[row * hd + d];
    } else {
        int byte = ((const unsigned char*)s.data)[row * (hd / 2) + d / 2];
        code = (byte >> ((d & 1) * 4)) & 15;
    }
    long long gi = row * groups + d / gsize;
    return tl_add(tl_mul((float)code, __half2float(s.scale[gi])), __half2float(s.min[gi]));
}

// Where the query's logical key block b, row j (k = 64 b + j) is stored (README geometry): the
// cache's physical row, then through the slot's block table row `blocks` the pool row.
struct AttGeometry {
    int t, lowest, pos, ring_blocks, shared_end, tail_len, has_tail;
    const int* tail_rows;
    const int* blocks;
    __device__ __forceinline__ bool visible(int k) const { return k >= lowest && k <= pos; }
    __device__ __forceinline__ int physical(int b, int j) const {
        if (has_tail && b >= shared_end) {
            int index = (b - shared_end) * TL_BLOCK + j;
            // a valid plan always has index < tail_len; never read past the row
            return index < tail_len ? tail_rows[(long long)t * tail_len + index] : 0;
        }
        return ring_blocks ? (b % ring_blocks) * TL_BLOCK + j : b * TL_BLOCK + j;
    }
    __device__ __forceinline__ long long pool_row(int b, int j) const {
        int r = physical(b, j);
        return (long long)blocks[r / TL_BLOCK] * TL_BLOCK + r % TL_BLOCK;
    }
};

// Dequantize the visible rows of block b into tile (64, stride): a warp per row, lanes over d.
template <int MODE>
__device__ void att_tile(const KVSide& side, float* tile, int stride, long long plane, int n_rows, int hd,
                         int b, const AttGeometry& geo) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int j = warp; j < TL_BLOCK; j += n_warps) {
        if (!geo.visible(b * TL_BLOCK + j)) continue;          // masked rows are never read
        long long row = plane * n_rows + geo.pool_row(b, j);
        for (int d = lane; d < hd; d += 32) tile[j * stride + d] = att_load<MODE>(side, row, d, hd);   // sass: attention-tile
    }
}

// 16-byte pieces a thread loads before it converts any (4 registers each): 8 in the float
// modes; 4 in the int modes, whose pieces hold 16 or 32 elements (an int4 block of hd 128
// is 4 pieces per thread in all) and whose conversion, unrolled, would not fit 8.
template <int MODE> __device__ __forceinline__ constexpr int att_batch() {
    return (MODE == ATT_INT8 || MODE == ATT_INT4) ? 4 : 8;
}

// Bytes of one stored row of one side.
template <int MODE> __device__ __forceinline__ int att_row_bytes(int hd) {
    return MODE == ATT_FP32 ? 4 * hd : MODE == ATT_FP16 ? 2 * hd : MODE == ATT_INT8 ? hd : hd / 2;
}

// Elements in a 16-byte piece of a stored row.
template <int MODE> __device__ __forceinline__ constexpr int att_piece_elements() {
    return MODE == ATT_FP32 ? 4 : MODE == ATT_FP16 ? 8 : MODE == ATT_INT8 ? 16 : 32;
}

// Element e of a loaded piece, dequantized (an int mode's piece lies in one group: its
// scale s and min m): att_load's value for the same element, bit for bit. e is a constant once
// the caller's loop is unrolled, so an int code is decoded in place as the linear kernels do it
// (common.cuh code_at: a LOP3 and one or two float instructions, no shift and no I2F per code);
// code_at gives (float)code exactly, so the product and sum are att_load's.
template <int MODE>
__device__ __forceinline__ float att_piece_element(const TlWords4& raw, int e, float s, float m) {
    if (MODE == ATT_FP32) return __uint_as_float(raw.w[e]);
    if (MODE == ATT_FP16)
        return __half2float(__ushort_as_half((unsigned short)(raw.w[e >> 1] >> ((e & 1) * 16))));
    float code;
    if (MODE == ATT_INT8) {
        const unsigned int word = raw.w[e >> 2];
        code = code_at<8>(word, word >> 16, (e & 3) * 8);
    } else {
        const unsigned int word = raw.w[e >> 3];                   // byte e / 2, low nibble first
        code = code_at<4>(word, word >> 16, (e & 7) * 4);
    }
    return tl_add(tl_mul(code, s), m);
}

// The 16-byte pieces of block b's visible rows, both sides, into their tiles (att_stage). TAIL:
// the block is a tree's tail, each row found through tail_rows and the block table; otherwise
// the block's rows are one pool block's, first_row + j (one table read per block).
template <int MODE, bool TAIL>
__device__ __forceinline__ void att_stage_pieces(const KVSide& keys, const KVSide& values, float* ktile,
                                                 float* vtile, int stride, long long plane, int n_rows, int hd,
                                                 int b, const AttGeometry& geo, long long first_row, int sides) {
    constexpr int PE = att_piece_elements<MODE>(), BATCH = att_batch<MODE>();
    const int row_bytes = att_row_bytes<MODE>(hd), pieces = row_bytes / 16, per_side = TL_BLOCK * pieces;
    const int gsize = (hd % 32 == 0) ? 32 : hd, groups = hd / gsize;
    // a piece's row j = rest / pieces by a high multiply, magic = ceil(2^32 / pieces) (exact while
    // rest x pieces < 2^32: rest < 64 pieces here; linear_kinds.cuh group_magic argues it), not
    // an integer division by a launch's value (some 20 instructions a piece, twice: both loops)
    const unsigned magic = pieces > 1 ? 0xffffffffu / (unsigned)pieces + 1u : 0u;
    // sides: ATT_KEYS, ATT_VALUES or both; pieces [p_begin, p_end) of the 2 per_side (keys first)
    const int p_begin = sides & ATT_KEYS ? 0 : per_side, p_end = sides & ATT_VALUES ? 2 * per_side : per_side;
    for (int p0 = p_begin + threadIdx.x; p0 < p_end; p0 += BATCH * blockDim.x) {
        TlWords4 raw[BATCH];
        __half sc[BATCH], mn[BATCH];       // widened where they are used: a widening here would wait for its load
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {                        // the loads of the batch
            const int p = p0 + i * blockDim.x, rest = p < per_side ? p : p - per_side;   // p < 2 per_side
            const int j = pieces > 1 ? (int)__umulhi((unsigned)rest, magic) : rest, k = rest - j * pieces;
            if (p < p_end && geo.visible(b * TL_BLOCK + j)) {
                // the side's pointers chosen by value: a reference to either struct would put both on the stack
                const bool key = p < per_side;
                const long long row = plane * n_rows + (TAIL ? geo.pool_row(b, j) : first_row + j);
                const unsigned char* data = (const unsigned char*)(key ? keys.data : values.data);
                raw[i] = ((const TlWords4*)(data + row * row_bytes))[k];   // sass: attention-stage
                if (MODE == ATT_INT8 || MODE == ATT_INT4) {
                    // the piece's group: k PE / gsize without a division (gsize is 32, or hd when
                    // hd is not a multiple of 32, and then every piece lies in group 0)
                    const long long gi = row * groups + (gsize == 32 ? (k * PE) >> 5 : 0);
                    sc[i] = (key ? keys.scale : values.scale)[gi];
                    mn[i] = (key ? keys.min : values.min)[gi];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {                        // then their conversion
            const int p = p0 + i * blockDim.x, rest = p < per_side ? p : p - per_side;   // p < 2 per_side
            const int j = pieces > 1 ? (int)__umulhi((unsigned)rest, magic) : rest, k = rest - j * pieces;
            if (p < p_end && geo.visible(b * TL_BLOCK + j)) {
                float* out = (p < per_side ? ktile : vtile) + j * stride + k * PE;
                const bool coded = MODE == ATT_INT8 || MODE == ATT_INT4;
                const float s_i = coded ? __half2float(sc[i]) : 0.0f, m_i = coded ? __half2float(mn[i]) : 0.0f;
#pragma unroll
                for (int e = 0; e < PE; ++e) out[e] = att_piece_element<MODE>(raw[i], e, s_i, m_i);
            }
        }
    }
}

// Stage block b's visible rows of keys and values into their float tiles (64, stride), in one
// phase. vector = 1 (the launcher's check: every stored row and the arrays 16-byte aligned):
// the rows are cut into 16-byte pieces, a thread takes att_batch() pieces at a time and issues
// every load of the batch (and an int mode's scale and min) before it converts any, so a warp
// keeps up to att_batch() x 512 bytes in flight per round trip; the block table is read once
// per 64-key block (a tree's tail rows: per row). vector = 0: the element loader, keys then
// values. Either way a tile element is att_load's value, bit for bit.
template <int MODE>
__device__ void att_stage(const KVSide& keys, const KVSide& values, float* ktile, float* vtile, int stride,
                          long long plane, int n_rows, int hd, int b, const AttGeometry& geo, int vector,
                          int sides) {
    if (!vector) {
        if (sides & ATT_KEYS) att_tile<MODE>(keys, ktile, stride, plane, n_rows, hd, b, geo);
        if (sides & ATT_VALUES) att_tile<MODE>(values, vtile, stride, plane, n_rows, hd, b, geo);
    } else if (geo.has_tail && b >= geo.shared_end) {           // uniform over the block
        att_stage_pieces<MODE, true>(keys, values, ktile, vtile, stride, plane, n_rows, hd, b, geo, 0, sides);
    } else {
        att_stage_pieces<MODE, false>(keys, values, ktile, vtile, stride, plane, n_rows, hd, b, geo,
                                      geo.pool_row(b, 0), sides);
    }
}
