// Glue between a kernel's C++ signature and the Python caller. The harness includes this
// after the kernel source and emits, per kernel, a body that unpacks the argument slots
// and two exported C functions (launch, parameter codes) that ctypes can call.
#pragma once
#include <cstddef>
#include <type_traits>
#include <utility>
#include "cuda_fp16.h"

namespace cudasim {

// Mirrors the ctypes.Structure in cudasim/module.py.
struct LaunchConfig {
    unsigned int grid[3];
    unsigned int block[3];
    unsigned long long shared_mem;
    int order;                // 0: thread id order, 1: reverse, 2: seeded random
    int timeout_seconds;      // the watchdog fails a launch running longer (0: none)
    unsigned long long seed;
};

// Runs the whole grid; returns 0, or nonzero with the message in cudasim_error().
// `dynamic` is the storage of the `extern __shared__` arrays (`capacity` bytes; null if none).
CUDASIM_HIDDEN int launch(const LaunchConfig* config, void (*body)(void**), void** args, void* dynamic,
                          size_t capacity);

// One character per parameter type; the Python side maps it to a NumPy dtype.
template <class T> struct ParamCode {
    static_assert(std::is_pointer<T>::value, "kernel parameters must be pointers or arithmetic scalars");
    static constexpr char value = 'p';
};
template <> struct ParamCode<bool> { static constexpr char value = '?'; };
template <> struct ParamCode<char> { static constexpr char value = 'b'; };
template <> struct ParamCode<signed char> { static constexpr char value = 'b'; };
template <> struct ParamCode<unsigned char> { static constexpr char value = 'B'; };
template <> struct ParamCode<short> { static constexpr char value = 'h'; };
template <> struct ParamCode<unsigned short> { static constexpr char value = 'H'; };
template <> struct ParamCode<int> { static constexpr char value = 'i'; };
template <> struct ParamCode<unsigned int> { static constexpr char value = 'I'; };
template <> struct ParamCode<long> { static constexpr char value = 'q'; };
template <> struct ParamCode<unsigned long> { static constexpr char value = 'Q'; };
template <> struct ParamCode<long long> { static constexpr char value = 'q'; };
template <> struct ParamCode<unsigned long long> { static constexpr char value = 'Q'; };
template <> struct ParamCode<__half> { static constexpr char value = 'e'; };
template <> struct ParamCode<float> { static constexpr char value = 'f'; };
template <> struct ParamCode<double> { static constexpr char value = 'd'; };

template <class... A>
const char* param_codes(void (*)(A...)) {
    static const char codes[] = {ParamCode<A>::value..., '\0'};
    return codes;
}

// Each argument slot holds the value of one parameter (a pointer or a scalar's bytes).
template <class... A, size_t... I>
inline void invoke(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<A*>(args[I])...);
}
template <class... A>
inline void invoke(void (*kernel)(A...), void** args) {
    invoke(kernel, args, std::index_sequence_for<A...>{});
}

}  // namespace cudasim

#define CUDASIM_EXPORT extern "C" __attribute__((visibility("default")))
