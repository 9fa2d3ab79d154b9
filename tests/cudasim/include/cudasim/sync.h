// Thread identity, block barriers and warp collectives, implemented by the fiber
// scheduler (runtime/runtime.cpp).
//
// Every synchronizing intrinsic is a real function whose last two parameters default to
// __builtin_FILE() / __builtin_LINE(): the caller's location reaches the scheduler for
// deadlock and divergence reports, while `::__shfl_xor_sync`, templates and function
// pointers keep working (a macro would break them).
#pragma once

// The scheduler rewrites these before it resumes a fiber. Not const: the compiler must
// reload them after every call that may switch fibers.
extern CUDASIM_HIDDEN uint3 threadIdx;
extern CUDASIM_HIDDEN uint3 blockIdx;
extern CUDASIM_HIDDEN dim3 blockDim;
extern CUDASIM_HIDDEN dim3 gridDim;
static constexpr int warpSize = 32;

namespace cudasim {

// What a warp collective computes once every participating lane has arrived.
enum WarpOp : int {
    kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSyncWarp,
    kReduceAdd, kReduceMinU, kReduceMaxU, kReduceMinI, kReduceMaxI,
    kReduceAnd, kReduceOr, kReduceXor, kMatchAny, kMatchAll,
};
enum BarrierKind : int { kBarrier, kBarrierCount, kBarrierAnd, kBarrierOr };

// Blocks the calling lane until every non-exited lane named in `mask` has made the same
// call, then returns this lane's result (a shuffle's value is `size` bytes of `value`).
CUDASIM_HIDDEN unsigned long long warp_collective(int op, unsigned mask, unsigned long long value, int size,
                                                  int arg, int width, const char* file, int line);
// Blocks until every non-exited thread of the block waits at the same barrier.
CUDASIM_HIDDEN int block_barrier(int kind, int predicate, const char* file, int line);
// Fails the launch with `what` (as a Python exception); never returns.
[[noreturn]] CUDASIM_HIDDEN void trap(const char* what, const char* file, int line);
// Lanes of the calling warp that exist and have not exited.
CUDASIM_HIDDEN unsigned live_lanes();

template <class T>
inline T shuffle(int op, unsigned mask, T var, int arg, int width, const char* file, int line) {
    static_assert(sizeof(T) <= 8 && __is_trivially_copyable(T), "warp shuffles move values of at most 8 bytes");
    unsigned long long bits = 0;
    __builtin_memcpy(&bits, &var, sizeof(T));
    bits = warp_collective(op, mask, bits, (int)sizeof(T), arg, width, file, line);
    T out;
    __builtin_memcpy(&out, &bits, sizeof(T));
    return out;
}

}  // namespace cudasim

#define CUDASIM_SITE const char* file = __builtin_FILE(), int line = __builtin_LINE()

inline void __syncthreads(CUDASIM_SITE) { cudasim::block_barrier(cudasim::kBarrier, 0, file, line); }
inline int __syncthreads_count(int predicate, CUDASIM_SITE) {
    return cudasim::block_barrier(cudasim::kBarrierCount, predicate, file, line);
}
inline int __syncthreads_and(int predicate, CUDASIM_SITE) {
    return cudasim::block_barrier(cudasim::kBarrierAnd, predicate, file, line);
}
inline int __syncthreads_or(int predicate, CUDASIM_SITE) {
    return cudasim::block_barrier(cudasim::kBarrierOr, predicate, file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, CUDASIM_SITE) {
    cudasim::warp_collective(cudasim::kSyncWarp, mask, 0, 0, 0, 32, file, line);
}

template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32, CUDASIM_SITE) {
    return cudasim::shuffle(cudasim::kShflIdx, mask, var, srcLane, width, file, line);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = 32, CUDASIM_SITE) {
    return cudasim::shuffle(cudasim::kShflUp, mask, var, (int)delta, width, file, line);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = 32, CUDASIM_SITE) {
    return cudasim::shuffle(cudasim::kShflDown, mask, var, (int)delta, width, file, line);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32, CUDASIM_SITE) {
    return cudasim::shuffle(cudasim::kShflXor, mask, var, laneMask, width, file, line);
}

inline unsigned __ballot_sync(unsigned mask, int predicate, CUDASIM_SITE) {
    return (unsigned)cudasim::warp_collective(cudasim::kBallot, mask, predicate != 0, 4, 0, 32, file, line);
}
inline int __any_sync(unsigned mask, int predicate, CUDASIM_SITE) {
    return (int)cudasim::warp_collective(cudasim::kAny, mask, predicate != 0, 4, 0, 32, file, line);
}
inline int __all_sync(unsigned mask, int predicate, CUDASIM_SITE) {
    return (int)cudasim::warp_collective(cudasim::kAll, mask, predicate != 0, 4, 0, 32, file, line);
}
// The GPU answers with the lanes converged at this point; fibers never diverge that way,
// so the nearest meaning is every lane that has not exited.
inline unsigned __activemask() { return cudasim::live_lanes(); }

#define CUDASIM_REDUCE(name, T, op)                                                          \
    inline T name(unsigned mask, T value, CUDASIM_SITE) {                                   \
        return (T)cudasim::warp_collective(op, mask, (unsigned)value, 4, 0, 32, file, line); \
    }
CUDASIM_REDUCE(__reduce_add_sync, unsigned, cudasim::kReduceAdd)
CUDASIM_REDUCE(__reduce_add_sync, int, cudasim::kReduceAdd)
CUDASIM_REDUCE(__reduce_min_sync, unsigned, cudasim::kReduceMinU)
CUDASIM_REDUCE(__reduce_min_sync, int, cudasim::kReduceMinI)
CUDASIM_REDUCE(__reduce_max_sync, unsigned, cudasim::kReduceMaxU)
CUDASIM_REDUCE(__reduce_max_sync, int, cudasim::kReduceMaxI)
CUDASIM_REDUCE(__reduce_and_sync, unsigned, cudasim::kReduceAnd)
CUDASIM_REDUCE(__reduce_or_sync, unsigned, cudasim::kReduceOr)
CUDASIM_REDUCE(__reduce_xor_sync, unsigned, cudasim::kReduceXor)
#undef CUDASIM_REDUCE

template <class T>
inline unsigned __match_any_sync(unsigned mask, T value, CUDASIM_SITE) {
    return (unsigned)cudasim::shuffle<unsigned long long>(cudasim::kMatchAny, mask, (unsigned long long)value,
                                                          0, 32, file, line);
}
template <class T>
inline unsigned __match_all_sync(unsigned mask, T value, int* pred, CUDASIM_SITE) {
    unsigned long long r = cudasim::shuffle<unsigned long long>(cudasim::kMatchAll, mask,
                                                                (unsigned long long)value, 0, 32, file, line);
    *pred = (int)(r >> 32);
    return (unsigned)r;
}

[[noreturn]] inline void __trap(CUDASIM_SITE) { cudasim::trap("__trap() called", file, line); }
[[noreturn]] inline void __brkpt(CUDASIM_SITE) { cudasim::trap("__brkpt() called", file, line); }

// Fibers switch only inside the intrinsics above, so a fence only has to stop the
// compiler from moving memory accesses across it.
inline void __threadfence() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __nanosleep(unsigned) {}
