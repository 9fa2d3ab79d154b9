// KV cache writes and the accepted-path row copy.
//
// The row arithmetic (RoPE of the keys on the way in, the casts, the int modes' quantization)
// is kv_store.cuh's, shared with the KV write folded into the qkv linear (linear.cu).
//
// kv_write_<mode>: one launch stores a forward's new keys AND values (blockIdx.z picks the
// side) at physical rows rows[t] of one layer instance, whose block table row `blocks` maps
// physical row r to pool row blocks[r / 64] * 64 + r % 64, in the layouts of cuda/README.md.
// With per_token_tables (several caches' tokens in one launch: a batched step), token t's
// table row is blocks + table_offsets[t] instead.
//
// Geometry (launch/kv.py): grid (T, n_kv, 2), block KV_THREADS, dynamic shared
// (hd + 2 * groups) floats. One block quantizes one (token, kv head, side) row of hd values:
// everything it reads and writes belongs to that row, so a row's stored bits never depend
// on the other rows of the launch.
#include "kv_store.cuh"

#define KV_FLOAT_ARGS(T) float* keys, const float* values, int k_stride, int v_stride, \
    T* key_data, T* value_data, const int* blocks, const int* rows, int n_kv, int n_rows, int hd, \
    const float* rotation, int has_rotation, const int* table_offsets, int per_token_tables
#define KV_INT_ARGS float* keys, const float* values, int k_stride, int v_stride, \
    unsigned char* key_codes, __half* key_scale, __half* key_min, \
    unsigned char* value_codes, __half* value_scale, __half* value_min, \
    const int* blocks, const int* rows, int n_kv, int n_rows, int hd, const float* rotation, int has_rotation, \
    const int* table_offsets, int per_token_tables

// The dynamic shared array is declared in each kernel, not in the templates: the CPU harness
// (tests/cudasim) only resolves `extern __shared__` declared outside templates.
extern __shared__ float kv_smem[];

#define KV_ROWS {keys, values, k_stride, v_stride, blocks, rows, n_kv, n_rows, hd, rotation, has_rotation, \
                 table_offsets, per_token_tables}

// One block per (token blockIdx.x, kv head blockIdx.y, side blockIdx.z).
extern "C" __global__ void kv_write_fp32(KV_FLOAT_ARGS(float)) {
    tl_dependent_launch();
    const KvRows s = KV_ROWS;
    kv_store_float<float, BlockTeam>(s, blockIdx.x, blockIdx.y, blockIdx.z, key_data, value_data, kv_smem);
}
extern "C" __global__ void kv_write_fp16(KV_FLOAT_ARGS(__half)) {
    tl_dependent_launch();
    const KvRows s = KV_ROWS;
    kv_store_float<__half, BlockTeam>(s, blockIdx.x, blockIdx.y, blockIdx.z, key_data, value_data, kv_smem);
}
#define KV_INT_STORE(BITS, ROTATE)                                                                          \
    const KvRows s = KV_ROWS;                                                                               \
    kv_store_int<BITS, ROTATE, BlockTeam>(s, blockIdx.x, blockIdx.y, blockIdx.z, key_codes, key_scale, key_min, \
                                          value_codes, value_scale, value_min, kv_smem)
extern "C" __global__ void kv_write_int8(KV_INT_ARGS) { tl_dependent_launch(); KV_INT_STORE(8, false); }
extern "C" __global__ void kv_write_int4(KV_INT_ARGS) { tl_dependent_launch(); KV_INT_STORE(4, false); }
extern "C" __global__ void kv_write_int4h(KV_INT_ARGS) { tl_dependent_launch(); KV_INT_STORE(4, true); }

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
    tl_dependent_launch();
    long long plane = blockIdx.y, i = blockIdx.x;
    kv_copy_bytes(scratch + (plane * n + i) * row_bytes,
                  array + (plane * n_rows + source[i]) * row_bytes, row_bytes);
}

extern "C" __global__ void rows_scatter(unsigned char* array, const unsigned char* scratch, const int* target,
                                        int n, int n_rows, int row_bytes) {
    tl_dependent_launch();
    long long plane = blockIdx.y, i = blockIdx.x;
    kv_copy_bytes(array + (plane * n_rows + target[i]) * row_bytes,
                  scratch + (plane * n + i) * row_bytes, row_bytes);
}
