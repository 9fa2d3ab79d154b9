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

// Thread 1 spins until thread 0 sets a flag, with no barrier in between: on the harness,
// where threads switch only at barriers and warp collectives, it never sees the flag.
extern "C" __global__ void spin_on_flag(int* out) {
    __shared__ volatile int flag;
    if (threadIdx.x == 1) {
        flag = 0;
        while (flag == 0) {
        }
    } else {
        flag = 1;
    }
    out[threadIdx.x] = 1;
}
