// CUDA's arithmetic and bit intrinsics on the CPU.
//
// The harness compiles with -ffp-contract=off and SSE arithmetic, so a plain a + b is one
// IEEE round-to-nearest operation: exactly what __fadd_rn and friends promise. The
// approximate GPU intrinsics (__expf, __logf, ...) map to the accurate libm functions;
// results then differ from the GPU in the last bits (the GPU uses ex2.approx and co).
#pragma once

#define CUDASIM_FN static inline __attribute__((always_inline))

CUDASIM_FN float __fadd_rn(float a, float b) { return a + b; }
CUDASIM_FN float __fsub_rn(float a, float b) { return a - b; }
CUDASIM_FN float __fmul_rn(float a, float b) { return a * b; }
CUDASIM_FN float __fdiv_rn(float a, float b) { return a / b; }
CUDASIM_FN float __fmaf_rn(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
CUDASIM_FN float __fsqrt_rn(float a) { return __builtin_sqrtf(a); }
CUDASIM_FN float __frcp_rn(float a) { return 1.0f / a; }
CUDASIM_FN float __frsqrt_rn(float a) { return (float)(1.0 / __builtin_sqrt((double)a)); }
CUDASIM_FN double __dadd_rn(double a, double b) { return a + b; }
CUDASIM_FN double __dsub_rn(double a, double b) { return a - b; }
CUDASIM_FN double __dmul_rn(double a, double b) { return a * b; }
CUDASIM_FN double __ddiv_rn(double a, double b) { return a / b; }
CUDASIM_FN double __fma_rn(double a, double b, double c) { return __builtin_fma(a, b, c); }
CUDASIM_FN double __dsqrt_rn(double a) { return __builtin_sqrt(a); }
CUDASIM_FN float __fdividef(float a, float b) { return a / b; }
CUDASIM_FN float fdividef(float a, float b) { return a / b; }
CUDASIM_FN float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0

// glibc declares (but does not export) functions with these very names, so they are
// function-like macros here: the accurate libm function stands in for the GPU's
// approximate one.
#define __expf(x) expf(x)
#define __exp10f(x) exp10f(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __log10f(x) log10f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) powf(x, y)
#define __sincosf(x, s, c) sincosf(x, s, c)
CUDASIM_FN float rsqrtf(float x) { return 1.0f / sqrtf(x); }
CUDASIM_FN double rsqrt(double x) { return 1.0 / sqrt(x); }
CUDASIM_FN float rcbrtf(float x) { return 1.0f / cbrtf(x); }

// Bit reinterpretation.
template <class To, class From>
CUDASIM_FN To cudasim_bit_cast(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between types of different sizes");
    To out;
    __builtin_memcpy(&out, &v, sizeof(To));
    return out;
}
CUDASIM_FN float __int_as_float(int x) { return cudasim_bit_cast<float>(x); }
CUDASIM_FN int __float_as_int(float x) { return cudasim_bit_cast<int>(x); }
CUDASIM_FN float __uint_as_float(unsigned x) { return cudasim_bit_cast<float>(x); }
CUDASIM_FN unsigned __float_as_uint(float x) { return cudasim_bit_cast<unsigned>(x); }
CUDASIM_FN double __longlong_as_double(long long x) { return cudasim_bit_cast<double>(x); }
CUDASIM_FN long long __double_as_longlong(double x) { return cudasim_bit_cast<long long>(x); }
CUDASIM_FN int __double2hiint(double x) { return (int)(cudasim_bit_cast<unsigned long long>(x) >> 32); }
CUDASIM_FN int __double2loint(double x) { return (int)cudasim_bit_cast<unsigned long long>(x); }
CUDASIM_FN double __hiloint2double(int hi, int lo) {
    return cudasim_bit_cast<double>(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}

// Float -> integer conversions saturate and send NaN to 0, as cvt.*i.s32.f32 does
// (a C cast would be undefined behaviour out of range).
template <class I>
CUDASIM_FN I cudasim_float_to_int(double rounded, double lowest, double highest, I lowest_int, I highest_int) {
    if (rounded != rounded) return 0;
    if (rounded <= lowest) return lowest_int;
    if (rounded >= highest) return highest_int;
    return (I)rounded;
}
#define CUDASIM_CVT(I, name, LOW, HIGH)                                                               \
    CUDASIM_FN I cudasim_to_##name(double x) { return cudasim_float_to_int<I>(x, LOW, HIGH, LOW, HIGH); } \
    CUDASIM_FN I __float2##name##_rn(float x) { return cudasim_to_##name(__builtin_rintf(x)); }          \
    CUDASIM_FN I __float2##name##_rz(float x) { return cudasim_to_##name(__builtin_truncf(x)); }         \
    CUDASIM_FN I __float2##name##_rd(float x) { return cudasim_to_##name(__builtin_floorf(x)); }         \
    CUDASIM_FN I __float2##name##_ru(float x) { return cudasim_to_##name(__builtin_ceilf(x)); }          \
    CUDASIM_FN I __double2##name##_rn(double x) { return cudasim_to_##name(__builtin_rint(x)); }         \
    CUDASIM_FN I __double2##name##_rz(double x) { return cudasim_to_##name(__builtin_trunc(x)); }
CUDASIM_CVT(int, int, -__INT_MAX__ - 1, __INT_MAX__)
CUDASIM_CVT(unsigned, uint, 0u, __INT_MAX__ * 2u + 1u)
CUDASIM_CVT(long long, ll, -__LONG_LONG_MAX__ - 1, __LONG_LONG_MAX__)
CUDASIM_CVT(unsigned long long, ull, 0ull, __LONG_LONG_MAX__ * 2ull + 1ull)
#undef CUDASIM_CVT
CUDASIM_FN float __int2float_rn(int x) { return (float)x; }
CUDASIM_FN float __uint2float_rn(unsigned x) { return (float)x; }
CUDASIM_FN float __ll2float_rn(long long x) { return (float)x; }
CUDASIM_FN float __double2float_rn(double x) { return (float)x; }
CUDASIM_FN double __int2double_rn(int x) { return (double)x; }

// Integer bit tricks.
CUDASIM_FN int __popc(unsigned x) { return __builtin_popcount(x); }
CUDASIM_FN int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
CUDASIM_FN int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
CUDASIM_FN int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
CUDASIM_FN int __ffs(int x) { return __builtin_ffs(x); }
CUDASIM_FN int __ffsll(long long x) { return __builtin_ffsll(x); }
CUDASIM_FN unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
CUDASIM_FN unsigned long long __brevll(unsigned long long x) {
    return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
CUDASIM_FN unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long bytes = ((unsigned long long)y << 32) | x, out = 0;
    for (int i = 0; i < 4; ++i) out |= ((bytes >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return (unsigned)out;
}
CUDASIM_FN unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) << (s & 31) >> 32);
}
CUDASIM_FN unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (s & 31));
}
CUDASIM_FN int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
CUDASIM_FN unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
CUDASIM_FN long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
CUDASIM_FN unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
CUDASIM_FN int __mul24(int a, int b) { return ((a << 8) >> 8) * ((b << 8) >> 8); }
CUDASIM_FN unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }

template <class T>
CUDASIM_FN T __ldg(const T* p) { return *p; }

// CUDA's integer and float min/max overloads (the mixed signed/unsigned ones compare as
// unsigned, like CUDA's).
#define CUDASIM_MINMAX(A, B, R)                                   \
    CUDASIM_FN R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; } \
    CUDASIM_FN R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
CUDASIM_MINMAX(int, int, int)
CUDASIM_MINMAX(unsigned, unsigned, unsigned)
CUDASIM_MINMAX(int, unsigned, unsigned)
CUDASIM_MINMAX(unsigned, int, unsigned)
CUDASIM_MINMAX(long, long, long)
CUDASIM_MINMAX(unsigned long, unsigned long, unsigned long)
CUDASIM_MINMAX(long long, long long, long long)
CUDASIM_MINMAX(unsigned long long, unsigned long long, unsigned long long)
#undef CUDASIM_MINMAX
CUDASIM_FN float min(float a, float b) { return fminf(a, b); }
CUDASIM_FN float max(float a, float b) { return fmaxf(a, b); }
CUDASIM_FN double min(double a, double b) { return fmin(a, b); }
CUDASIM_FN double max(double a, double b) { return fmax(a, b); }

#undef CUDASIM_FN
