// Harness test kernels: failures that must become Python exceptions (tests/test_cudasim.py).

extern "C" __global__ void assert_lane(int* out, int bad_lane) {
    assert((int)threadIdx.x != bad_lane);
    out[threadIdx.x] = 1;
}

extern "C" __global__ void trap_lane(int* out, int bad_lane) {
    if ((int)threadIdx.x == bad_lane) __trap();
    out[threadIdx.x] = 1;
}

extern "C" __global__ void write_to_address(unsigned long long address) {
    *reinterpret_cast<volatile int*>(address) = 1;
}

extern "C" __global__ void copy_shifted(float* out, const float* in, int shift) {
    out[threadIdx.x] = in[threadIdx.x + shift];
}

__device__ __noinline__ int recurse(int depth) {
    volatile char frame[1024];
    frame[0] = (char)depth;
    return depth > 0 ? recurse(depth - 1) + frame[0] : 0;
}

extern "C" __global__ void deep_recursion(int* out, int depth) { out[threadIdx.x] = recurse(depth); }

extern "C" __global__ void divide(int* out, int divisor) { out[threadIdx.x] = 1000 / divisor; }
