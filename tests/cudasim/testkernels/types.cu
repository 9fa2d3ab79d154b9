// Harness test kernels: launch geometry, argument types, __half (tests/test_cudasim.py).
#include <cuda_fp16.h>

// Each thread writes its threadIdx and blockIdx at its global position; thread 0 of block 0
// also writes blockDim and gridDim.
extern "C" __global__ void ids_3d(unsigned int* ids, unsigned int* dims) {
    unsigned int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned int* o = ids + 6 * (block * blockDim.x * blockDim.y * blockDim.z + thread);
    o[0] = threadIdx.x; o[1] = threadIdx.y; o[2] = threadIdx.z;
    o[3] = blockIdx.x; o[4] = blockIdx.y; o[5] = blockIdx.z;
    if (thread == 0 && block == 0) {
        dims[0] = blockDim.x; dims[1] = blockDim.y; dims[2] = blockDim.z;
        dims[3] = gridDim.x; dims[4] = gridDim.y; dims[5] = gridDim.z;
    }
}

extern "C" __global__ void scalars(double* out, int i, float f, unsigned int u, unsigned char c, long long q,
                                   double d) {
    out[0] = i; out[1] = f; out[2] = u; out[3] = c; out[4] = (double)q; out[5] = d;
}

extern "C" __global__ void half_convert(__half* from_float, float* back, __half* from_double, const float* in,
                                        const double* in_double, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        from_float[i] = __float2half_rn(in[i]);
        back[i] = __half2float(from_float[i]);
        from_double[i] = __double2half(in_double[i]);
    }
}

// out is (4, n): sum, difference, product, quotient.
extern "C" __global__ void half_arith(__half* out, const __half* a, const __half* b, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = __hadd(a[i], b[i]);
        out[n + i] = __hsub(a[i], b[i]);
        out[2 * n + i] = a[i] * b[i];
        out[3 * n + i] = __hdiv(a[i], b[i]);
    }
}

extern "C" __global__ void saxpy(float* y, const float* __restrict__ x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
}

extern "C" __global__ void half_fma(__half* out, const __half* a, const __half* b, const __half* c, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = __hfma(a[i], b[i], c[i]);
}
