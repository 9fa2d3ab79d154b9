// Harness test kernels: block barriers, shared memory, poisoned memory (tests/test_cudasim.py).

// Thread 0 publishes a value through shared memory; the barrier that should follow the
// write is missing, so threads that run before thread 0 read unwritten memory.
extern "C" __global__ void broadcast_missing_sync(float* out) {
    __shared__ float value;
    if (threadIdx.x == 0) value = 42.0f;
    out[threadIdx.x] = value;
}

extern "C" __global__ void broadcast_with_sync(float* out) {
    __shared__ float value;
    if (threadIdx.x == 0) value = 42.0f;
    __syncthreads();
    out[threadIdx.x] = value;
}

extern "C" __global__ void divergent_barrier(int* out) {
    if (threadIdx.x < 16) {
        __syncthreads();  // barrier A
    } else {
        __syncthreads();  // barrier B
    }
    out[threadIdx.x] = 1;
}

// Threads that have exited do not hold up a barrier (as on the GPU).
extern "C" __global__ void early_exit_barrier(int* out, int n) {
    __shared__ int ids[64];
    if ((int)threadIdx.x >= n) return;
    ids[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = ids[n - 1 - threadIdx.x];
}

extern "C" __global__ void barrier_count(int* out) {
    int count = __syncthreads_count(threadIdx.x % 3 == 0);
    int all = __syncthreads_and(threadIdx.x < 1000);
    int any = __syncthreads_or(threadIdx.x == 5);
    out[threadIdx.x] = count * 100 + all * 10 + any;
}

// Lane 0 waits at a barrier while lanes 1..31 wait for it in a shuffle.
extern "C" __global__ void warp_barrier_deadlock(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x == 0)
        __syncthreads();
    else
        v = __shfl_xor_sync(0xffffffffu, v, 1);  // the shuffle that never completes
    out[threadIdx.x] = v;
}

extern "C" __global__ void shared_reverse(float* out, const float* in, int n) {
    extern __shared__ float buffer[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buffer[i] = in[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buffer[n - 1 - i];
}

// Only block 0 writes its shared memory; block 1 must not see block 0's values.
extern "C" __global__ void read_unwritten_shared(unsigned int* out) {
    __shared__ unsigned int scratch[64];
    if (blockIdx.x == 0) scratch[threadIdx.x] = 7u;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = scratch[threadIdx.x];
}

extern "C" __global__ void read_unwritten_dynamic(unsigned int* out) {
    extern __shared__ unsigned int words[];
    if (blockIdx.x == 0) words[threadIdx.x] = 7u;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = words[threadIdx.x];
}

// A local array on the thread's stack (volatile keeps it in memory), written by one launch
// and read unwritten by the next: the second must see poison, not the first's values.
extern "C" __global__ void write_local(float* out) {
    volatile float local[16];
    for (int i = 0; i < 16; ++i) local[i] = (float)i;
    out[threadIdx.x] = local[threadIdx.x % 16];
}

extern "C" __global__ void read_unwritten_local(float* out) {
    volatile float local[16];
    out[threadIdx.x] = local[threadIdx.x % 16];
}

// CUDA starts every `extern __shared__` array of a kernel at the same address.
extern "C" __global__ void dynamic_arrays_alias(unsigned int* out) {
    extern __shared__ float as_float[];
    extern __shared__ unsigned int as_bits[];
    as_float[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = as_bits[threadIdx.x];
}
