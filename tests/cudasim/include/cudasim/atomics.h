// Atomics. Fibers switch only inside synchronizing intrinsics, so a plain
// read-modify-write is already atomic with respect to every other simulated thread.
// The order in which threads add still follows the harness's thread order: a float sum
// built with atomicAdd changes its last bits between orders, as it does on a GPU.
#pragma once

#define CUDASIM_ATOMIC(name, T, expr)                 \
    static inline T name(T* address, T val) {        \
        T old = *address;                            \
        *address = (expr);                           \
        return old;                                  \
    }
#define CUDASIM_ATOMIC_ARITH(T)                                         \
    CUDASIM_ATOMIC(atomicAdd, T, old + val)                             \
    CUDASIM_ATOMIC(atomicExch, T, val)
#define CUDASIM_ATOMIC_INT(T)                                           \
    CUDASIM_ATOMIC_ARITH(T)                                             \
    CUDASIM_ATOMIC(atomicMin, T, val < old ? val : old)                 \
    CUDASIM_ATOMIC(atomicMax, T, val > old ? val : old)                 \
    CUDASIM_ATOMIC(atomicAnd, T, old & val)                             \
    CUDASIM_ATOMIC(atomicOr, T, old | val)                              \
    CUDASIM_ATOMIC(atomicXor, T, old ^ val)                             \
    static inline T atomicCAS(T* address, T compare, T val) {           \
        T old = *address;                                               \
        if (old == compare) *address = val;                             \
        return old;                                                     \
    }

CUDASIM_ATOMIC_INT(int)
CUDASIM_ATOMIC_INT(unsigned int)
CUDASIM_ATOMIC_INT(unsigned long long)
CUDASIM_ATOMIC(atomicMin, long long, val < old ? val : old)
CUDASIM_ATOMIC(atomicMax, long long, val > old ? val : old)
CUDASIM_ATOMIC_ARITH(float)
CUDASIM_ATOMIC_ARITH(double)
CUDASIM_ATOMIC(atomicSub, int, old - val)
CUDASIM_ATOMIC(atomicSub, unsigned int, old - val)
CUDASIM_ATOMIC(atomicInc, unsigned int, old >= val ? 0u : old + 1u)
CUDASIM_ATOMIC(atomicDec, unsigned int, (old == 0u || old > val) ? val : old - 1u)

static inline unsigned short atomicCAS(unsigned short* address, unsigned short compare, unsigned short val) {
    unsigned short old = *address;
    if (old == compare) *address = val;
    return old;
}

#undef CUDASIM_ATOMIC_INT
#undef CUDASIM_ATOMIC_ARITH
#undef CUDASIM_ATOMIC
