// Two exact linear calls in one launch: the attention's out projection with its residual add,
// then the MLP's up projection over the new residual stream (launch/linear.py linear_pair; the
// backend's residual_norm_linear under TINYLOOP_CUDA_PAIR=1). A module of its own, so that a
// server that leaves the pair off never compiles it (each pair is two rows kernels' code).
// Launch: block (256,), grid (the first call's blocks + the second call's,).
#include "linear_rows.cuh"


// -- two calls chained in one launch (launch/linear.py linear_pair) -------------------------------
// The attention's out projection with its residual add, then the MLP's up projection over the
// new residual stream (its norm folded in): the second call needs every column of the first, which
// other blocks compute, so until now it was a launch of its own. Here both run in one launch:
// blocks take tickets in the order they start (chain[0]); tickets [0, blocks0) run the first call
// at (ticket % grid_x0, ticket / grid_x0), the rest the second at the same place of theirs, which
// wait until chain[1] counts the first call's blocks0 blocks done (chain_wait). A waiting block waits only on
// blocks that took lower tickets, which are running or done, so however few blocks the GPU holds
// at once the wait cannot deadlock (the grid need not fit: no cooperative launch). The handoff is
// a grid barrier's: barrier, fence, count (every thread's stores before the count); count seen,
// fence, barrier (the second call's loads after it). Each call is the linear_rows of its own
// launch, so every output has that launch's bits. The last block of the second call zeroes the
// counters (a count left behind traps): every launch leaves them zero, a replayed graph finds them so.
__shared__ int chain_ticket_shared;

// Every thread gets the block's ticket (thread 0 takes it).
__device__ __forceinline__ int chain_ticket(unsigned int* chain) {
    if (threadIdx.x == 0) {
        const unsigned int ticket = atomicAdd(&chain[0], 1u);
        if (ticket >= gridDim.x) __trap();                        // a launch left its counters behind
        chain_ticket_shared = (int)ticket;
    }
    __syncthreads();
    return chain_ticket_shared;
}

template <class Kind>
__device__ __forceinline__ void linear_rows_pair(const LinearArgs& first, const LinearArgs& second, int ticket,
                                                 int blocks0, unsigned int* chain) {
    if (ticket < blocks0) {
        linear_rows<Kind, true>(first);
        __syncthreads();                                          // the block's outputs are stored
        if (threadIdx.x == 0) {
            __threadfence();                                      // ... and in memory before the count
            atomicAdd(&chain[1], 1u);
        }
        return;
    }
    linear_rows<Kind, true>(second);                              // waits for the first (chain_wait)
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(&chain[2], 1u) + 1u == gridDim.x - (unsigned int)blocks0) {
        chain[0] = 0u;                                            // every block has its ticket and is done
        chain[1] = 0u;
        chain[2] = 0u;
    }
}

// A pair entry point: the first call's parameters, the second's (prefixed b_), the first call's
// blocks (grid_x0 x its rows' blocks), the two calls' column grids and the three counters;
// grid (blocks0 + the second call's blocks,), block (256,).
#define LINEAR_PAIR_PARAMS(S) LINEAR_PARAMS(S), LINEAR_PARAMS_AS(S, b_), int blocks0, int grid_x0, int grid_x1, \
                              unsigned int *chain
// The body after the entry's tl_dependent_launch(): the ticket, then each call's arguments at its place.
#define LINEAR_PAIR_BODY(KIND)                                                                                   \
    const int t = chain_ticket(chain), u = t - blocks0;  /* u: the place in the second call (t >= blocks0) */     \
    linear_rows_pair<KIND>(LINEAR_ARGS_AS(, t % grid_x0, t / grid_x0, grid_x0, nullptr, 0u),                     \
                           LINEAR_ARGS_AS(b_, u % grid_x1, u / grid_x1, grid_x1, chain + 1, (unsigned int)blocks0), \
                           t, blocks0, chain)

// the pair for int4 with half scales and mins (GGUF Q4_0/Q4_1, RTN and GPTQ int4: the decode
// weights of the models we serve); every other kind keeps two launches. One kind only: each pair
// is two rows kernels' code, and the int2 and int8 pairs spill on sm_90. One block an SM: within
// 128 registers (two blocks an SM) the int4 pair spilled on sm_90 once the rows path summed with
// FFMA (36 B; cuda/README.md), so it gets the registers and runs half the warps an SM.
typedef QuantKind<4, __half> PairInt4;
extern "C" __global__ void __launch_bounds__(256, 1)
linear_rows_pair_int4(LINEAR_PAIR_PARAMS(__half)) { tl_dependent_launch(); LINEAR_PAIR_BODY(PairInt4); }
