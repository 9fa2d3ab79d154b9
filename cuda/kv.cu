// KV cache writes and the accepted-path row copy.
//
// The key rows may be rotated (RoPE) on the way in: kv_load_row below.
//
// kv_write_<mode>: one launch stores a forward's new keys AND values (blockIdx.z picks the
// side) at physical rows rows[t] of one layer instance, whose block table row `blocks` maps
// physical row r to pool row blocks[r / 64] * 64 + r % 64, in the layouts of cuda/README.md.
// With per_token_tables (several caches' tokens in one launch: a batched step), token t's
// table row is blocks + table_offsets[t] instead.
// The int modes reproduce IntStore.quantize (backends/reference/kvstore.py) bit for bit; the
// twin is tinyloop/backends/reference/twins/kv.py.
//
// Geometry (launch/kv.py): grid (T, n_kv, 2), block KV_THREADS, dynamic shared
// (hd + 2 * groups) floats. One block quantizes one (token, kv head, side) row of hd values:
// everything it reads and writes belongs to that row, so a row's stored bits never depend
// on the other rows of the launch.
#include "common.cuh"

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
// thread of the block calls it (it synchronizes).
__device__ void kv_fwht(float* x, int hd) {
    for (int h = 1; h < hd; h <<= 1) {
        for (int i = threadIdx.x; i < hd / 2; i += blockDim.x) {
            int j = (i / h) * 2 * h + i % h;
            float a = x[j], b = x[j + h];
            x[j] = tl_add(a, b);
            x[j + h] = tl_sub(a, b);
        }
        __syncthreads();
    }
    float norm = kv_hadamard_norm(hd);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) x[d] = tl_mul(x[d], norm);
    __syncthreads();
}

// The row this block stores: keys or values of token blockIdx.x, head blockIdx.y,
// copied to shared xs[hd]. Returns the row's index in the pool's (n_kv, rows) planes.
// has_rotation (RoPE fused, one launch fewer per layer): a key row is rotated first, pair (a, b)
// = x[2i], x[2i+1] with (c, d) = rotation[t, 2i], rotation[t, 2i + 1] (the (T, hd/2) complex64
// table as floats) becoming (a c - b d, a d + b c), elementwise.cu rope_rows' arithmetic, and
// written back to `keys` (the forward's rotated keys, as rope_rows would have left them).
__device__ __forceinline__ long long kv_load_row(float* keys, const float* values, int k_stride,
                                                 int v_stride, const int* blocks, const int* rows, int n_kv,
                                                 int n_rows, int hd, const float* rotation, int has_rotation,
                                                 const int* table_offsets, int per_token_tables,
                                                 float* xs) {
    int t = blockIdx.x, g = blockIdx.y;
    const float* src = blockIdx.z ? values + (long long)t * v_stride : keys + (long long)t * k_stride;
    src += g * hd;
    const bool rotate = has_rotation && blockIdx.z == 0;
    if (rotate) {
        float* key = keys + (long long)t * k_stride + g * hd;
        const float* rot = rotation + (long long)t * hd;
        for (int i = threadIdx.x; i < hd / 2; i += blockDim.x) {
            float a = key[2 * i], b = key[2 * i + 1], c = rot[2 * i], d = rot[2 * i + 1];
            float ra = tl_sub(tl_mul(a, c), tl_mul(b, d)), rb = tl_add(tl_mul(a, d), tl_mul(b, c));
            xs[2 * i] = ra;
            xs[2 * i + 1] = rb;
            key[2 * i] = ra;                // each pair read and written by one thread
            key[2 * i + 1] = rb;
        }
    } else {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) xs[d] = src[d];
    }
    __syncthreads();
    const int r = rows[t];
    // several caches in one launch (a batched step): token t's block table row starts at
    // blocks + table_offsets[t]; else every token's is `blocks`
    const int* table = per_token_tables ? blocks + table_offsets[t] : blocks;
    return (long long)g * n_rows + (long long)table[r / TL_BLOCK] * TL_BLOCK + r % TL_BLOCK;
}

template <typename T> __device__ __forceinline__ T kv_cast(float x);
template <> __device__ __forceinline__ float kv_cast<float>(float x) { return x; }
template <> __device__ __forceinline__ __half kv_cast<__half>(float x) { return __float2half_rn(x); }

template <typename T>
__device__ void kv_write_float(float* kv_smem, float* keys, const float* values, int k_stride,
                               int v_stride, T* key_data, T* value_data, const int* blocks, const int* rows, int n_kv,
                               int n_rows, int hd, const float* rotation, int has_rotation,
                               const int* table_offsets, int per_token_tables) {
    long long row = kv_load_row(keys, values, k_stride, v_stride, blocks, rows, n_kv, n_rows, hd, rotation,
                                has_rotation, table_offsets, per_token_tables, kv_smem);
    T* dst = (blockIdx.z ? value_data : key_data) + row * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = kv_cast<T>(kv_smem[d]);
}

// BITS 8 or 4, codes packed little-end first; ROTATE: int4-h.
template <int BITS, bool ROTATE>
__device__ void kv_write_int(float* kv_smem, float* keys, const float* values, int k_stride, int v_stride,
                             unsigned char* key_codes, __half* key_scale, __half* key_min,
                             unsigned char* value_codes, __half* value_scale, __half* value_min,
                             const int* blocks, const int* rows, int n_kv, int n_rows, int hd,
                             const float* rotation, int has_rotation, const int* table_offsets,
                             int per_token_tables) {
    const int levels = (1 << BITS) - 1, per_byte = 8 / BITS;
    const int gsize = (hd % 32 == 0) ? 32 : hd, groups = hd / gsize;
    float* xs = kv_smem;                   // (hd,) the row, rotated for int4-h
    float* safe_scale = xs + hd;           // (groups,) the stored scale widened, 1 where it is 0
    float* low = safe_scale + groups;      // (groups,) the stored min widened
    long long row = kv_load_row(keys, values, k_stride, v_stride, blocks, rows, n_kv, n_rows, hd, rotation,
                                has_rotation, table_offsets, per_token_tables, xs);
    if (ROTATE) kv_fwht(xs, hd);
    bool side = blockIdx.z;
    // per group: min and max (order-free), then f16 scale = half((max - min) / levels), f16 min
    for (int gi = threadIdx.x; gi < groups; gi += blockDim.x) {
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
    __syncthreads();
    // codes from the stored scale and min: clip(rint((x - min) / scale), 0, levels), packed
    unsigned char* dst = (side ? value_codes : key_codes) + row * (hd / per_byte);
    for (int b = threadIdx.x; b < hd / per_byte; b += blockDim.x) {
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

#define KV_FLOAT_ARGS(T) float* keys, const float* values, int k_stride, int v_stride, \
    T* key_data, T* value_data, const int* blocks, const int* rows, int n_kv, int n_rows, int hd, \
    const float* rotation, int has_rotation, const int* table_offsets, int per_token_tables
#define KV_INT_ARGS float* keys, const float* values, int k_stride, int v_stride, \
    unsigned char* key_codes, __half* key_scale, __half* key_min, \
    unsigned char* value_codes, __half* value_scale, __half* value_min, \
    const int* blocks, const int* rows, int n_kv, int n_rows, int hd, const float* rotation, int has_rotation, \
    const int* table_offsets, int per_token_tables
#define KV_INT_PASS keys, values, k_stride, v_stride, key_codes, key_scale, key_min, \
    value_codes, value_scale, value_min, blocks, rows, n_kv, n_rows, hd, rotation, has_rotation, \
    table_offsets, per_token_tables

// The dynamic shared array is declared in each kernel, not in the templates: the CPU harness
// (tests/cudasim) only resolves `extern __shared__` declared outside templates.
extern __shared__ float kv_smem[];

extern "C" __global__ void kv_write_fp32(KV_FLOAT_ARGS(float)) {
    kv_write_float<float>(kv_smem, keys, values, k_stride, v_stride, key_data, value_data, blocks, rows, n_kv,
                          n_rows, hd, rotation, has_rotation, table_offsets, per_token_tables);
}
extern "C" __global__ void kv_write_fp16(KV_FLOAT_ARGS(__half)) {
    kv_write_float<__half>(kv_smem, keys, values, k_stride, v_stride, key_data, value_data, blocks, rows, n_kv,
                           n_rows, hd, rotation, has_rotation, table_offsets, per_token_tables);
}
extern "C" __global__ void kv_write_int8(KV_INT_ARGS) { kv_write_int<8, false>(kv_smem, KV_INT_PASS); }
extern "C" __global__ void kv_write_int4(KV_INT_ARGS) { kv_write_int<4, false>(kv_smem, KV_INT_PASS); }
extern "C" __global__ void kv_write_int4h(KV_INT_ARGS) { kv_write_int<4, true>(kv_smem, KV_INT_PASS); }

// Accepted-path row copy, any stored pool array seen as bytes: (n_planes, n_rows, row_bytes)
// with n_planes = n_kv; source and target are pool rows (every slot's, translated through the
// block table by the launcher). Two launches through scratch (n_planes, n, row_bytes), so a
// target that is also a source is read before it is written: the semantics of NumPy's
// array[:, target] = array[:, source] (targets must be distinct).
// Grid (n, n_planes), block COPY_THREADS: one block per (row i, plane).
__device__ __forceinline__ void kv_copy_bytes(unsigned char* dst, const unsigned char* src, int n_bytes) {
    if (((n_bytes | (int)((unsigned long long)dst | (unsigned long long)src)) & 3) == 0) {
        for (int w = threadIdx.x; w < n_bytes / 4; w += blockDim.x)
            ((unsigned int*)dst)[w] = ((const unsigned int*)src)[w];
    } else {
        for (int b = threadIdx.x; b < n_bytes; b += blockDim.x) dst[b] = src[b];
    }
}

extern "C" __global__ void rows_gather(const unsigned char* array, unsigned char* scratch, const int* source,
                                       int n, int n_rows, int row_bytes) {
    long long plane = blockIdx.y, i = blockIdx.x;
    kv_copy_bytes(scratch + (plane * n + i) * row_bytes,
                  array + (plane * n_rows + source[i]) * row_bytes, row_bytes);
}

extern "C" __global__ void rows_scatter(unsigned char* array, const unsigned char* scratch, const int* target,
                                        int n, int n_rows, int row_bytes) {
    long long plane = blockIdx.y, i = blockIdx.x;
    kv_copy_bytes(array + (plane * n_rows + target[i]) * row_bytes,
                  scratch + (plane * n + i) * row_bytes, row_bytes);
}
