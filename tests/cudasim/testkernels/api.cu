// Harness test kernel: a sample of the CUDA device API the shim headers provide, each with
// a value that follows from CUDA's documentation (tests/test_cudasim.py).
#include <cuda_fp16.h>
#include <cuda/std/limits>

extern "C" __global__ void api_sample(float* f, int* i) {
    __shared__ float total;
    __shared__ int largest;
    const unsigned full = 0xffffffffu;
    int lane = threadIdx.x;
    if (lane == 0) total = 0.0f, largest = -1;
    __syncthreads();
    atomicAdd(&total, 1.0f);
    atomicMax(&largest, lane);
    float from_lane3 = __shfl_sync(full, lane + 0.5f, 3);
    double swapped = __shfl_xor_sync(full, (double)lane, 1);
    __half down2 = __shfl_down_sync(full, __float2half(lane * 0.25f), 2);
    __syncthreads();
    if (lane != 0) return;
    float4 v = make_float4(1.0f, 2.0f, 3.0f, 4.0f);
    float r[] = {
        __fmaf_rn(2.0f, 3.0f, 1.0f), __frcp_rn(4.0f), __fsqrt_rn(9.0f), rsqrtf(4.0f), __saturatef(1.5f),
        cuda::std::numeric_limits<float>::infinity(),
        __half2float(__float2half_rz(1.0009f)), __half2float(__float2half_ru(1.0001f)),
        __half2float(__float2half_rd(-1.0001f)), max(1.5f, -2.0f), from_lane3, (float)swapped,
        __half2float(down2), total, v.x + v.y + v.z + v.w,
    };
    for (int k = 0; k < (int)(sizeof r / sizeof r[0]); ++k) f[k] = r[k];
    int n[] = {
        __popc(0xF0F0u), __clz(1), __ffs(8), (int)__brev(1u), __float2int_rn(2.5f), __float2int_rn(3.5f),
        __float2int_rz(-2.7f), __float2int_rn(1e20f), min(3, -4), (int)max(3u, 4u), __float_as_int(1.0f),
        largest, (int)__byte_perm(0x33221100u, 0x77665544u, 0x7531u), (int)__umulhi(0x80000000u, 4u),
        sizeof(float4) == 16 && alignof(float4) == 16 && sizeof(__half2) == 4 && alignof(__half2) == 4,
        __half_as_ushort(__float2half(1.0f)),
    };
    for (int k = 0; k < (int)(sizeof n / sizeof n[0]); ++k) i[k] = n[k];
}
