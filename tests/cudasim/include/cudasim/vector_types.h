// CUDA's built-in vector types with CUDA's alignments, so that a kernel reading a float4
// through a reinterpret_cast gets the same layout (and faults on a misaligned pointer,
// as the GPU does) and sizeof matches nvcc.
#pragma once

#define CUDASIM_VEC(name, T, align2, align4)                                            \
    struct name##1 { T x; };                                                            \
    struct __attribute__((aligned(align2))) name##2 { T x, y; };                        \
    struct name##3 { T x, y, z; };                                                      \
    struct __attribute__((aligned(align4))) name##4 { T x, y, z, w; };                  \
    static inline name##1 make_##name##1(T x) { return name##1{x}; }                    \
    static inline name##2 make_##name##2(T x, T y) { return name##2{x, y}; }           \
    static inline name##3 make_##name##3(T x, T y, T z) { return name##3{x, y, z}; }   \
    static inline name##4 make_##name##4(T x, T y, T z, T w) { return name##4{x, y, z, w}; }

CUDASIM_VEC(char, signed char, 2, 4)
CUDASIM_VEC(uchar, unsigned char, 2, 4)
CUDASIM_VEC(short, short, 4, 8)
CUDASIM_VEC(ushort, unsigned short, 4, 8)
CUDASIM_VEC(int, int, 8, 16)
CUDASIM_VEC(uint, unsigned int, 8, 16)
CUDASIM_VEC(long, long, 16, 16)
CUDASIM_VEC(ulong, unsigned long, 16, 16)
CUDASIM_VEC(longlong, long long, 16, 16)
CUDASIM_VEC(ulonglong, unsigned long long, 16, 16)
CUDASIM_VEC(float, float, 8, 16)
CUDASIM_VEC(double, double, 16, 16)

#undef CUDASIM_VEC

// dim3: the launch-shape type (unspecified components are 1).
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};
