// Harness test kernel: an int4 GEMV shaped like the project's decode linear (one warp per
// output row), to measure the harness's speed (tests/test_cudasim.py).
//
// codes (rows, cols / 2) uint8, low nibble first; scale, minimum (rows, cols / group) float;
// weight = code * scale + minimum; out[row] = sum over columns of weight * x.
extern "C" __global__ void gemv_int4(float* out, const unsigned int* __restrict__ codes,
                                     const float* __restrict__ scale, const float* __restrict__ minimum,
                                     const float* __restrict__ x, int rows, int cols, int group) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const unsigned int* row_codes = codes + (size_t)row * (cols / 8);
    int groups = cols / group;
    float acc = 0.0f;
    for (int word = lane; word < cols / 8; word += 32) {
        unsigned int packed = row_codes[word];
        for (int k = 0; k < 8; ++k) {
            int col = word * 8 + k;
            float s = scale[row * groups + col / group], m = minimum[row * groups + col / group];
            float w = __fadd_rn(__fmul_rn((float)((packed >> (4 * k)) & 15u), s), m);
            acc = __fadd_rn(acc, __fmul_rn(w, x[col]));
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, offset));
    if (lane == 0) out[row] = acc;
}
