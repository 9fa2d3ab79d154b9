// The tensor cores' m16n8k16 product (mma.sync, f16 inputs, f32 accumulators), shared by
// linear_tc.cu (the bulk prefill path) and linear_mma.cu (the 1-16 row exact path).
//
// Fragments (PTX ISA, mma.m16n8k16 with .f16 A/B and .f32 C/D; g = lane / 4, c = lane % 4):
//   A (16 x 16, row): a0 = (A[g][2c], A[g][2c+1]), a1 = rows g+8, a2 = columns +8, a3 = both;
//   B (16 x 8, col):  b0 = (B[2c][g], B[2c+1][g]), b1 = k +8;
//   C, D (16 x 8):    d0, d1 = D[g][2c], D[g][2c+1]; d2, d3 = row g+8;
// a register holds its lower-index element in its low 16 bits.
// On the GPU (__CUDA_ARCH__ >= 800) the product is one mma.sync instruction; elsewhere (the
// CPU harness, or TL_NO_TENSOR_CORES) tl_mma_16816 gathers the same fragments from the warp
// with shuffles and multiplies them in float, so the harness runs everything around the
// instruction (staging, fragment addressing, epilogue) against the same layout. What only a
// GPU shows: that the instruction reads that layout (scripts/gpu_check.sh compares this
// kernel with its reference on the device) and its speed.
#pragma once
#include "common.cuh"

__device__ __forceinline__ unsigned int pack_halves(__half low, __half high) {
    return (unsigned int)__half_as_ushort(low) | ((unsigned int)__half_as_ushort(high) << 16);
}

// d = A (16 x 16) B (16 x 8) + c for the warp, fragments as above. Every lane of the warp calls it.
__device__ __forceinline__ void tl_mma_16816(float* d, const unsigned int* a, const unsigned int* b, const float* c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(TL_NO_TENSOR_CORES)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    // This lane's outputs are rows g, g+8 and columns 2c, 2c+1: it needs rows g and g+8 of A
    // (held by lanes 4g .. 4g+3) and columns 2c, 2c+1 of B (lanes 8c .. 8c+3 and 8c+4 .. 8c+7).
    const int lane = threadIdx.x & 31, g = lane >> 2, cc = lane & 3;
    float row0[16], row1[16], col0[16], col1[16];
    for (int q = 0; q < 4; q++) {                    // q: the source lane's c
        unsigned int r0 = __shfl_sync(TL_FULL_MASK, a[0], 4 * g + q);   // A[g][2q, 2q+1]
        unsigned int r1 = __shfl_sync(TL_FULL_MASK, a[1], 4 * g + q);   // A[g+8][2q, 2q+1]
        unsigned int r2 = __shfl_sync(TL_FULL_MASK, a[2], 4 * g + q);   // A[g][2q+8, 2q+9]
        unsigned int r3 = __shfl_sync(TL_FULL_MASK, a[3], 4 * g + q);   // A[g+8][2q+8, 2q+9]
        unsigned int b00 = __shfl_sync(TL_FULL_MASK, b[0], 4 * (2 * cc) + q);       // B[2q, 2q+1][2c]
        unsigned int b01 = __shfl_sync(TL_FULL_MASK, b[1], 4 * (2 * cc) + q);       // B[2q+8, 2q+9][2c]
        unsigned int b10 = __shfl_sync(TL_FULL_MASK, b[0], 4 * (2 * cc + 1) + q);   // column 2c+1
        unsigned int b11 = __shfl_sync(TL_FULL_MASK, b[1], 4 * (2 * cc + 1) + q);
        row0[2 * q] = low_half(r0); row0[2 * q + 1] = high_half(r0);
        row1[2 * q] = low_half(r1); row1[2 * q + 1] = high_half(r1);
        row0[2 * q + 8] = low_half(r2); row0[2 * q + 9] = high_half(r2);
        row1[2 * q + 8] = low_half(r3); row1[2 * q + 9] = high_half(r3);
        col0[2 * q] = low_half(b00); col0[2 * q + 1] = high_half(b00);
        col0[2 * q + 8] = low_half(b01); col0[2 * q + 9] = high_half(b01);
        col1[2 * q] = low_half(b10); col1[2 * q + 1] = high_half(b10);
        col1[2 * q + 8] = low_half(b11); col1[2 * q + 9] = high_half(b11);
    }
    float s[4] = {c[0], c[1], c[2], c[3]};
    for (int k = 0; k < 16; k++) {
        s[0] += row0[k] * col0[k];
        s[1] += row0[k] * col1[k];
        s[2] += row1[k] * col0[k];
        s[3] += row1[k] * col1[k];
    }
    for (int i = 0; i < 4; i++) d[i] = s[i];
#endif
}
