// __half / __half2 for the CPU harness, on g++'s _Float16 (with -mf16c a conversion is one
// vcvtps2ph / vcvtph2ps instruction, round to nearest even).
//
// Arithmetic is done in float and rounded once to half. For +, -, *, / and sqrt that is
// the correctly rounded half result (float's 24 bits >= 2 * 11 + 2, so rounding twice
// cannot differ from rounding once), which is what the GPU's half instructions return.
// __half stays trivially default-constructible so `__shared__ __half tile[...]` and
// arrays of it need no constructors, as on the GPU.
#pragma once
#include "cuda_runtime.h"

struct __half_raw { unsigned short x; };
struct __half2_raw { unsigned short x, y; };

struct __half {
    _Float16 value;

    __half() = default;
    __half(const __half_raw& raw) { __builtin_memcpy(&value, &raw.x, 2); }
    __half(float f) : value((_Float16)f) {}
    __half(double d) : value((_Float16)d) {}  // rounds once, not through float
    __half(int i) : value((_Float16)(float)i) {}
    __half(unsigned int i) : value((_Float16)(float)i) {}
    __half(short i) : value((_Float16)(float)i) {}
    __half(unsigned short i) : value((_Float16)(float)i) {}
    __half(long long i) : value((_Float16)(double)i) {}
    __half(unsigned long long i) : value((_Float16)(double)i) {}
    operator float() const { return (float)value; }
    operator __half_raw() const { __half_raw r; __builtin_memcpy(&r.x, &value, 2); return r; }
    __half& operator=(float f) { value = (_Float16)f; return *this; }
    __half& operator=(double d) { value = (_Float16)d; return *this; }
};
static_assert(sizeof(__half) == 2, "__half must stay two bytes");

struct __attribute__((aligned(4))) __half2 {
    __half x, y;
    __half2() = default;
    __half2(__half a, __half b) : x(a), y(b) {}
    __half2(const __half2_raw& raw) : x(__half_raw{raw.x}), y(__half_raw{raw.y}) {}
};

typedef __half half;
typedef __half2 half2;

#define CUDASIM_H static inline __attribute__((always_inline))

// Conversions.
CUDASIM_H __half __float2half(float f) { return __half(f); }
CUDASIM_H __half __float2half_rn(float f) { return __half(f); }
CUDASIM_H __half __double2half(double d) { return __half(d); }
CUDASIM_H float __half2float(__half h) { return (float)h; }
CUDASIM_H unsigned short __half_as_ushort(__half h) { unsigned short u; __builtin_memcpy(&u, &h, 2); return u; }
CUDASIM_H short __half_as_short(__half h) { short s; __builtin_memcpy(&s, &h, 2); return s; }
CUDASIM_H __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
CUDASIM_H __half __short_as_half(short s) { return __half(__half_raw{(unsigned short)s}); }

// Directed roundings: round to nearest, then step one half-ulp-pattern towards the
// requested side when the nearest value landed on the wrong side of f.
CUDASIM_H __half cudasim_half_toward(float f, int direction) {  // -1 down, 0 zero, +1 up
    __half h(f);
    float back = (float)h;
    if (back == f || f != f) return h;
    bool too_big = back > f;
    bool step = direction > 0 ? !too_big : direction < 0 ? too_big : (fabsf(back) > fabsf(f));
    if (!step) return h;
    unsigned short u = __half_as_ushort(h);
    bool grow_magnitude = (back < f) == !(u & 0x8000);  // moving away from zero?
    if ((u & 0x7fff) == 0) return __ushort_as_half(back < f ? 0x0001 : 0x8001);  // leaving zero
    return __ushort_as_half(grow_magnitude ? u + 1 : u - 1);
}
CUDASIM_H __half __float2half_rz(float f) { return cudasim_half_toward(f, 0); }
CUDASIM_H __half __float2half_rd(float f) { return cudasim_half_toward(f, -1); }
CUDASIM_H __half __float2half_ru(float f) { return cudasim_half_toward(f, 1); }

CUDASIM_H __half __int2half_rn(int i) { return __half(i); }
CUDASIM_H __half __uint2half_rn(unsigned i) { return __half(i); }
CUDASIM_H __half __short2half_rn(short i) { return __half(i); }
CUDASIM_H __half __ushort2half_rn(unsigned short i) { return __half(i); }
CUDASIM_H __half __ll2half_rn(long long i) { return __half(i); }
CUDASIM_H int __half2int_rn(__half h) { return __float2int_rn((float)h); }
CUDASIM_H int __half2int_rz(__half h) { return __float2int_rz((float)h); }
CUDASIM_H int __half2int_rd(__half h) { return __float2int_rd((float)h); }
CUDASIM_H int __half2int_ru(__half h) { return __float2int_ru((float)h); }
CUDASIM_H unsigned __half2uint_rn(__half h) { return __float2uint_rn((float)h); }
CUDASIM_H unsigned __half2uint_rz(__half h) { return __float2uint_rz((float)h); }

// Scalar arithmetic (computed in float, rounded once; see the top of the file).
CUDASIM_H __half __hadd(__half a, __half b) { return __half((float)a + (float)b); }
CUDASIM_H __half __hsub(__half a, __half b) { return __half((float)a - (float)b); }
CUDASIM_H __half __hmul(__half a, __half b) { return __half((float)a * (float)b); }
CUDASIM_H __half __hdiv(__half a, __half b) { return __half((float)a / (float)b); }
CUDASIM_H __half __hadd_rn(__half a, __half b) { return __hadd(a, b); }
CUDASIM_H __half __hsub_rn(__half a, __half b) { return __hsub(a, b); }
CUDASIM_H __half __hmul_rn(__half a, __half b) { return __hmul(a, b); }
// Fused: a*b is exact in double and the sum keeps every bit that can matter in the
// half range, so one final rounding matches the GPU's fma.rn.f16.
CUDASIM_H __half __hfma(__half a, __half b, __half c) {
    return __half((double)(float)a * (double)(float)b + (double)(float)c);
}
CUDASIM_H __half __hneg(__half a) { return __ushort_as_half(__half_as_ushort(a) ^ 0x8000); }
CUDASIM_H __half __habs(__half a) { return __ushort_as_half(__half_as_ushort(a) & 0x7fff); }
CUDASIM_H __half __hmax(__half a, __half b) { return __half(fmaxf((float)a, (float)b)); }
CUDASIM_H __half __hmin(__half a, __half b) { return __half(fminf((float)a, (float)b)); }
CUDASIM_H bool __heq(__half a, __half b) { return (float)a == (float)b; }
CUDASIM_H bool __hne(__half a, __half b) { return (float)a != (float)b; }
CUDASIM_H bool __hlt(__half a, __half b) { return (float)a < (float)b; }
CUDASIM_H bool __hle(__half a, __half b) { return (float)a <= (float)b; }
CUDASIM_H bool __hgt(__half a, __half b) { return (float)a > (float)b; }
CUDASIM_H bool __hge(__half a, __half b) { return (float)a >= (float)b; }
CUDASIM_H bool __hisnan(__half a) { return (float)a != (float)a; }
CUDASIM_H int __hisinf(__half a) {
    unsigned short u = __half_as_ushort(a);
    return u == 0x7c00 ? 1 : u == 0xfc00 ? -1 : 0;
}
// Half math functions (approximate on the GPU; here float libm rounded to half).
CUDASIM_H __half hexp(__half a) { return __half(expf((float)a)); }
CUDASIM_H __half hlog(__half a) { return __half(logf((float)a)); }
CUDASIM_H __half hsqrt(__half a) { return __half(sqrtf((float)a)); }
CUDASIM_H __half hrsqrt(__half a) { return __half(1.0f / sqrtf((float)a)); }
CUDASIM_H __half hrcp(__half a) { return __half(1.0f / (float)a); }
CUDASIM_H __half hfloor(__half a) { return __half(floorf((float)a)); }
CUDASIM_H __half hceil(__half a) { return __half(ceilf((float)a)); }
CUDASIM_H __half htrunc(__half a) { return __half(truncf((float)a)); }
CUDASIM_H __half hrint(__half a) { return __half(rintf((float)a)); }

CUDASIM_H __half operator+(__half a, __half b) { return __hadd(a, b); }
CUDASIM_H __half operator-(__half a, __half b) { return __hsub(a, b); }
CUDASIM_H __half operator*(__half a, __half b) { return __hmul(a, b); }
CUDASIM_H __half operator/(__half a, __half b) { return __hdiv(a, b); }
CUDASIM_H __half operator-(__half a) { return __hneg(a); }
CUDASIM_H __half operator+(__half a) { return a; }
CUDASIM_H __half& operator+=(__half& a, __half b) { return a = __hadd(a, b); }
CUDASIM_H __half& operator-=(__half& a, __half b) { return a = __hsub(a, b); }
CUDASIM_H __half& operator*=(__half& a, __half b) { return a = __hmul(a, b); }
CUDASIM_H __half& operator/=(__half& a, __half b) { return a = __hdiv(a, b); }
CUDASIM_H bool operator==(__half a, __half b) { return __heq(a, b); }
CUDASIM_H bool operator!=(__half a, __half b) { return __hne(a, b); }
CUDASIM_H bool operator<(__half a, __half b) { return __hlt(a, b); }
CUDASIM_H bool operator<=(__half a, __half b) { return __hle(a, b); }
CUDASIM_H bool operator>(__half a, __half b) { return __hgt(a, b); }
CUDASIM_H bool operator>=(__half a, __half b) { return __hge(a, b); }

// __half2: two lanes, each handled as the scalar operation.
CUDASIM_H __half2 make_half2(__half x, __half y) { return __half2(x, y); }
CUDASIM_H __half2 __halves2half2(__half x, __half y) { return __half2(x, y); }
CUDASIM_H __half2 __half2half2(__half x) { return __half2(x, x); }
CUDASIM_H __half2 __float2half2_rn(float f) { return __half2(__half(f), __half(f)); }
CUDASIM_H __half2 __floats2half2_rn(float a, float b) { return __half2(__half(a), __half(b)); }
CUDASIM_H __half2 __float22half2_rn(float2 f) { return __half2(__half(f.x), __half(f.y)); }
CUDASIM_H float2 __half22float2(__half2 h) { return make_float2((float)h.x, (float)h.y); }
CUDASIM_H __half __low2half(__half2 h) { return h.x; }
CUDASIM_H __half __high2half(__half2 h) { return h.y; }
CUDASIM_H float __low2float(__half2 h) { return (float)h.x; }
CUDASIM_H float __high2float(__half2 h) { return (float)h.y; }
CUDASIM_H __half2 __lows2half2(__half2 a, __half2 b) { return __half2(a.x, b.x); }
CUDASIM_H __half2 __highs2half2(__half2 a, __half2 b) { return __half2(a.y, b.y); }
CUDASIM_H __half2 __lowhigh2highlow(__half2 a) { return __half2(a.y, a.x); }
CUDASIM_H __half2 __hadd2(__half2 a, __half2 b) { return __half2(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
CUDASIM_H __half2 __hsub2(__half2 a, __half2 b) { return __half2(__hsub(a.x, b.x), __hsub(a.y, b.y)); }
CUDASIM_H __half2 __hmul2(__half2 a, __half2 b) { return __half2(__hmul(a.x, b.x), __hmul(a.y, b.y)); }
CUDASIM_H __half2 __h2div(__half2 a, __half2 b) { return __half2(__hdiv(a.x, b.x), __hdiv(a.y, b.y)); }
CUDASIM_H __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
    return __half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}
CUDASIM_H __half2 __hneg2(__half2 a) { return __half2(__hneg(a.x), __hneg(a.y)); }
CUDASIM_H __half2 __habs2(__half2 a) { return __half2(__habs(a.x), __habs(a.y)); }
CUDASIM_H __half2 __hmax2(__half2 a, __half2 b) { return __half2(__hmax(a.x, b.x), __hmax(a.y, b.y)); }
CUDASIM_H __half2 __hmin2(__half2 a, __half2 b) { return __half2(__hmin(a.x, b.x), __hmin(a.y, b.y)); }
CUDASIM_H __half2 operator+(__half2 a, __half2 b) { return __hadd2(a, b); }
CUDASIM_H __half2 operator-(__half2 a, __half2 b) { return __hsub2(a, b); }
CUDASIM_H __half2 operator*(__half2 a, __half2 b) { return __hmul2(a, b); }
CUDASIM_H __half2 operator/(__half2 a, __half2 b) { return __h2div(a, b); }

CUDASIM_H __half atomicAdd(__half* address, __half val) {
    __half old = *address;
    *address = __hadd(old, val);
    return old;
}

#undef CUDASIM_H
