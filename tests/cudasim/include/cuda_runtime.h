// CPU harness (tests/cudasim): what nvcc and NVRTC provide to a .cu file without any
// #include, rebuilt for g++. The harness includes this file before the kernel source.
//
// Execution qualifiers vanish (every function is a plain CPU function); `__shared__`
// becomes `thread_local`: a block's threads are fibers on one OS thread, so they all see
// one copy, and `extern __shared__ T x[];` stays a valid declaration (the harness appends
// the definition). Block-scope `thread_local` is implicitly static, as `__shared__` is.
#pragma once

#define __CUDASIM__ 1   // kernels may test this to keep PTX-only paths away from g++

// The C library pieces device code may use without including anything: assert, printf,
// the float math library. Included before the qualifier macros below, which would
// otherwise clash with spellings inside system headers.
#include <assert.h>
#include <math.h>
#include <stdio.h>

// CUDASIM_SCAN: the harness preprocesses a source once with these two kept, to find its
// kernels and dynamic shared arrays after macro expansion.
#ifndef CUDASIM_SCAN
#define __global__
#define __shared__ thread_local
#endif
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __grid_constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __cudart_builtin__

// Runtime symbols live in the same shared library as the kernel; hidden visibility lets
// the compiler address them directly instead of through the GOT.
#define CUDASIM_HIDDEN __attribute__((visibility("hidden")))

#include "cudasim/vector_types.h"
#include "cudasim/sync.h"
#include "cudasim/intrinsics.h"
#include "cudasim/atomics.h"
