// Storing one (token, kv head, side) row of the KV cache: RoPE of a key row on the way in, the
// float modes' cast, the int modes' per-group quantization (int4-h after a Walsh-Hadamard
// rotation). Shared by kv.cu's kv_write_* kernels (a block stores a row) and the KV write
// folded into the qkv linear (linear.cu: a warp stores a row once its columns are summed):
// one code, so the two give the same bits. The int modes reproduce IntStore.quantize
// (backends/reference/kvstore.py) bit for bit; the twin is tinyloop/backends/reference/twins/kv.py.
//
// Every element's arithmetic is the same whoever stores it: RoPE and the cast are elementwise,
// a group's min and max are order-free, its codes elementwise from the stored scale and min,
// and the transform's stages add and subtract fixed pairs. Only which thread does which element
// depends on the team.
#pragma once
#include "common.cuh"

// Who stores a row: a whole block (kv_write_*), or one warp (linear.cu's fold). Every member
// calls the store; sync() is the team's barrier.
struct BlockTeam {
    __device__ __forceinline__ static int rank() { return threadIdx.x; }
    __device__ __forceinline__ static int size() { return blockDim.x; }
    __device__ __forceinline__ static void sync() { __syncthreads(); }
};
struct WarpTeam {
    __device__ __forceinline__ static int rank() { return threadIdx.x & 31; }
    __device__ __forceinline__ static int size() { return 32; }
    __device__ __forceinline__ static void sync() { __syncwarp(); }
};

// A forward's new keys and values and where they go. keys, values: (T, n_kv, hd) float, token
// strides k_stride, v_stride (views of the fused qkv output); token t goes to physical row
// rows[t] of the block table row `blocks` (or blocks + table_offsets[t] with per_token_tables:
// several caches in one launch), pool row table[r / 64] * 64 + r % 64 of the (n_kv, n_rows)
// planes. has_rotation: key rows are rotated by rotation (T, hd/2) complex64 as floats, and left
// rotated in `keys`.
struct KvRows {
    float* keys; const float* values; int k_stride; int v_stride;
    const int* blocks; const int* rows; int n_kv; int n_rows; int hd;
    const float* rotation; int has_rotation; const int* table_offsets; int per_token_tables;
};

// Floats of scratch a row's store needs: the row, then per group the stored scale and min widened.
__host__ __device__ constexpr int kv_scratch_floats(int hd, int groups) { return hd + 2 * groups; }

// The KV write folded into a qkv linear (linear_rows.cuh, linear_mma.cu): a warp stores a row
// with this much scratch; larger heads keep the kv_write launch.
#define KV_FOLD_MAX_HD 128
#define KV_FOLD_SCRATCH kv_scratch_floats(KV_FOLD_MAX_HD, KV_FOLD_MAX_HD / 32)

// 1/sqrt(hd) rounded to float, for hd a power of two: 2^(-k/2) is a power of two for even
// k and 2^(-(k-1)/2) * float(1/sqrt 2) for odd k (scaling by 2^n commutes with rounding),
// so this is exactly float32(1 / sqrt(hd)) as kv/modes.py's hadamard() rounds it.
__device__ __forceinline__ float kv_hadamard_norm(int hd) {
    int k = 0;
    while ((2 << k) <= hd) ++k;            // k = log2(hd)
    float norm = (k & 1) ? 0.70710678118654752f : 1.0f;
    return tl_mul(norm, __int_as_float((127 - (k >> 1)) << 23));
}

// In-place fast Walsh-Hadamard transform of x[0..hd) in shared memory, then * norm:
// stage h = 1, 2, 4, ...: pairs (j, j + h), j & h == 0, become (a + b, a - b). Every
// member of the team calls it (it synchronizes).
template <class Team>
__device__ void kv_fwht(float* x, int hd) {
    for (int h = 1; h < hd; h <<= 1) {
        for (int i = Team::rank(); i < hd / 2; i += Team::size()) {
            int j = (i / h) * 2 * h + i % h;
            float a = x[j], b = x[j + h];
            x[j] = tl_add(a, b);
            x[j + h] = tl_sub(a, b);
        }
        Team::sync();
    }
    float norm = kv_hadamard_norm(hd);
    for (int d = Team::rank(); d < hd; d += Team::size()) x[d] = tl_mul(x[d], norm);
    Team::sync();
}

// Row (t, g, side: 0 keys, 1 values) copied to xs[hd], a key row rotated first where
// has_rotation: pair (a, b) = x[2i], x[2i+1] with (c, d) = rotation[t, 2i], rotation[t, 2i + 1]
// becomes (a c - b d, a d + b c), elementwise.cu rope_rows' arithmetic, and is written back to
// `keys` (the forward's rotated keys, as rope_rows would have left them). The row may have been
// written by other blocks of this launch (the fold), so it is read past L1. Returns the row's
// index in the pool's (n_kv, rows) planes.
template <class Team>
__device__ __forceinline__ long long kv_load_row(const KvRows& s, int t, int g, int side, float* xs) {
    const int hd = s.hd;
    const bool rotate = s.has_rotation && side == 0;
    if (rotate) {
        float* key = s.keys + (long long)t * s.k_stride + g * hd;
        const float* rot = s.rotation + (long long)t * hd;
        for (int i = Team::rank(); i < hd / 2; i += Team::size()) {
            float a = tl_load_from_other_blocks(key + 2 * i), b = tl_load_from_other_blocks(key + 2 * i + 1);
            float c = rot[2 * i], d = rot[2 * i + 1];
            float ra = tl_sub(tl_mul(a, c), tl_mul(b, d)), rb = tl_add(tl_mul(a, d), tl_mul(b, c));
            xs[2 * i] = ra;
            xs[2 * i + 1] = rb;
            key[2 * i] = ra;                // each pair read and written by one thread
            key[2 * i + 1] = rb;
        }
    } else {
        const float* src = side ? s.values + (long long)t * s.v_stride : s.keys + (long long)t * s.k_stride;
        src += g * hd;
        for (int d = Team::rank(); d < hd; d += Team::size()) xs[d] = tl_load_from_other_blocks(src + d);
    }
    Team::sync();
    const int r = s.rows[t];
    // several caches in one launch (a batched step): token t's block table row starts at
    // blocks + table_offsets[t]; else every token's is `blocks`
    const int* table = s.per_token_tables ? s.blocks + s.table_offsets[t] : s.blocks;
    return (long long)g * s.n_rows + (long long)table[r / TL_BLOCK] * TL_BLOCK + r % TL_BLOCK;
}

template <typename T> __device__ __forceinline__ T kv_cast(float x);
template <> __device__ __forceinline__ float kv_cast<float>(float x) { return x; }
template <> __device__ __forceinline__ __half kv_cast<__half>(float x) { return __float2half_rn(x); }

// The float modes: the row cast to T (fp32, fp16), stored.
template <typename T, class Team>
__device__ void kv_store_float(const KvRows& s, int t, int g, int side, T* key_data, T* value_data, float* xs) {
    long long row = kv_load_row<Team>(s, t, g, side, xs);
    T* dst = (side ? value_data : key_data) + row * s.hd;
    for (int d = Team::rank(); d < s.hd; d += Team::size()) dst[d] = kv_cast<T>(xs[d]);
}

// The int modes: BITS 8 or 4, codes packed little end first; ROTATE: int4-h. scratch holds
// kv_scratch_floats(hd, groups).
template <int BITS, bool ROTATE, class Team>
__device__ void kv_store_int(const KvRows& s, int t, int g, int side, unsigned char* key_codes, __half* key_scale,
                             __half* key_min, unsigned char* value_codes, __half* value_scale, __half* value_min,
                             float* scratch) {
    const int hd = s.hd;
    const int levels = (1 << BITS) - 1, per_byte = 8 / BITS;
    const int gsize = (hd % 32 == 0) ? 32 : hd, groups = hd / gsize;
    float* xs = scratch;                   // (hd,) the row, rotated for int4-h
    float* safe_scale = xs + hd;           // (groups,) the stored scale widened, 1 where it is 0
    float* low = safe_scale + groups;      // (groups,) the stored min widened
    long long row = kv_load_row<Team>(s, t, g, side, xs);
    if (ROTATE) kv_fwht<Team>(xs, hd);
    // per group: min and max (order-free), then f16 scale = half((max - min) / levels), f16 min
    for (int gi = Team::rank(); gi < groups; gi += Team::size()) {
        float lo = xs[gi * gsize], hi = lo;
        for (int i = 1; i < gsize; ++i) {
            lo = fminf(lo, xs[gi * gsize + i]);
            hi = fmaxf(hi, xs[gi * gsize + i]);
        }
        __half scale16 = __float2half_rn(tl_div(tl_sub(hi, lo), (float)levels));
        __half min16 = __float2half_rn(lo);
        (side ? value_scale : key_scale)[row * groups + gi] = scale16;
        (side ? value_min : key_min)[row * groups + gi] = min16;
        float scale32 = __half2float(scale16);
        safe_scale[gi] = scale32 == 0.0f ? 1.0f : scale32;
        low[gi] = __half2float(min16);
    }
    Team::sync();
    // codes from the stored scale and min: clip(rint((x - min) / scale), 0, levels), packed
    unsigned char* dst = (side ? value_codes : key_codes) + row * (hd / per_byte);
    for (int b = Team::rank(); b < hd / per_byte; b += Team::size()) {
        unsigned int packed = 0;
        for (int i = 0; i < per_byte; ++i) {
            int d = b * per_byte + i, gi = d / gsize;
            float c = rintf(tl_div(tl_sub(xs[d], low[gi]), safe_scale[gi]));
            c = fminf(fmaxf(c, 0.0f), (float)levels);
            packed |= (unsigned int)c << (i * BITS);
        }
        dst[b] = (unsigned char)packed;
    }
}

// The stored modes by number (launch/kv.py KV_MODE_CODES): how a fold names its cache's mode.
#define TL_KV_FP32 1
#define TL_KV_FP16 2
#define TL_KV_INT8 3
#define TL_KV_INT4 4
#define TL_KV_INT4H 5

// Both sides of row (t, g) in `mode`, the pool's arrays as kv_write_* take them (float modes:
// key0 / value0 the data; int modes: codes, scale, min). The team syncs before reusing scratch.
template <class Team>
__device__ __forceinline__ void kv_store_both(const KvRows& s, int mode, int t, int g, void* key0, void* key1,
                                              void* key2, void* value0, void* value1, void* value2, float* scratch) {
    for (int side = 0; side < 2; side++) {
        switch (mode) {
            case TL_KV_FP32:
                kv_store_float<float, Team>(s, t, g, side, (float*)key0, (float*)value0, scratch);
                break;
            case TL_KV_FP16:
                kv_store_float<__half, Team>(s, t, g, side, (__half*)key0, (__half*)value0, scratch);
                break;
            case TL_KV_INT8:
                kv_store_int<8, false, Team>(s, t, g, side, (unsigned char*)key0, (__half*)key1, (__half*)key2,
                                             (unsigned char*)value0, (__half*)value1, (__half*)value2, scratch);
                break;
            case TL_KV_INT4:
                kv_store_int<4, false, Team>(s, t, g, side, (unsigned char*)key0, (__half*)key1, (__half*)key2,
                                             (unsigned char*)value0, (__half*)value1, (__half*)value2, scratch);
                break;
            default:
                kv_store_int<4, true, Team>(s, t, g, side, (unsigned char*)key0, (__half*)key1, (__half*)key2,
                                            (unsigned char*)value0, (__half*)value1, (__half*)value2, scratch);
                break;
        }
        Team::sync();                      // the side's readers of scratch are done before the next loads
    }
}
