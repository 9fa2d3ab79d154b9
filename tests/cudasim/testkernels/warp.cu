// Harness test kernels: warp collectives (tests/test_cudasim.py).

// mode 0: __shfl_sync, 1: __shfl_up_sync, 2: __shfl_down_sync, 3: __shfl_xor_sync; every
// lane offers 100 + its lane id.
extern "C" __global__ void shuffle(int* out, int mode, int arg, int width) {
    int value = 100 + (int)(threadIdx.x % 32);
    int r;
    if (mode == 0)
        r = __shfl_sync(0xffffffffu, value, arg, width);
    else if (mode == 1)
        r = __shfl_up_sync(0xffffffffu, value, (unsigned)arg, width);
    else if (mode == 2)
        r = __shfl_down_sync(0xffffffffu, value, (unsigned)arg, width);
    else
        r = __shfl_xor_sync(0xffffffffu, value, arg, width);
    out[threadIdx.x] = r;
}

// Two half-warps vote separately, each with its own mask.
extern "C" __global__ void ballot_partial(unsigned int* out) {
    int lane = threadIdx.x;
    if (lane < 16)
        out[lane] = __ballot_sync(0x0000ffffu, lane & 1);
    else
        out[lane] = __ballot_sync(0xffff0000u, lane % 3 == 0);
}

extern "C" __global__ void vote(int* votes, unsigned int* sums, unsigned int* groups) {
    int lane = threadIdx.x;
    votes[lane] = __any_sync(0xffffffffu, lane == 7) + 2 * __all_sync(0xffffffffu, lane < 32) +
                  4 * __all_sync(0xffffffffu, lane < 31);
    sums[lane] = __reduce_add_sync(0xffffffffu, (unsigned)lane);
    groups[lane] = __match_any_sync(0xffffffffu, lane / 8);
}

// Only lanes 0..15 take part; lane 15's source (lane 16) does not, so its value is undefined.
extern "C" __global__ void shuffle_partial_mask(int* out) {
    int lane = threadIdx.x;
    out[lane] = lane < 16 ? __shfl_down_sync(0x0000ffffu, 100 + lane, 1) : -5;
}

// Lanes 16..31 exit first: a full-mask shuffle waits only for lanes that have not exited.
extern "C" __global__ void shuffle_after_exit(int* out) {
    int lane = threadIdx.x;
    if (lane >= 16) return;
    out[lane] = __shfl_xor_sync(0xffffffffu, 100 + lane, 1);
}

extern "C" __global__ void mask_mismatch(int* out) {
    int lane = threadIdx.x;
    if (lane == 5)
        out[lane] = __ballot_sync(0xffffffffu, 1);
    else
        out[lane] = __shfl_xor_sync(0xffffffffu, lane, 1);
}

// A float butterfly sum, the pattern reductions are built from.
extern "C" __global__ void warp_sum(float* out, const float* in) {
    float v = in[threadIdx.x];
    for (int offset = 16; offset > 0; offset >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
    out[threadIdx.x] = v;
}
