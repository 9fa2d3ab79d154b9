// Cooperative fibers: one mmap'd stack per simulated thread, a guard page below each, and
// a hand-written x86-64 context switch (callee-saved registers, MXCSR and the x87 control
// word; about 4-6x faster than swapcontext, which also makes a signal-mask syscall).
#pragma once
#include <cstddef>
#include <cstdint>

namespace cudasim {

extern "C" void cudasim_switch_context(void** save_sp, void* next_sp);
extern "C" void cudasim_fiber_start();  // first code a new fiber runs (calls its entry)

// Stacks for up to `count` fibers, reused across blocks and launches.
class StackPool {
public:
    static constexpr size_t kStackBytes = 256 * 1024;
    static constexpr size_t kGuardBytes = 4096;
    // Grows the pool to hold at least `count` stacks (whole pool remapped; call between launches).
    bool reserve(int count);
    // A fresh context for fiber `i` that starts in `entry` (which must never return).
    void* initial_sp(int i, void (*entry)()) const;
    // Fills the top `bytes` of the first `count` stacks with 0xFF, so a kernel reading a
    // local array it never wrote sees NaN / -1 instead of a previous launch's values.
    void poison(int count, size_t bytes) const;
    // Whether `address` lies in one of the guard pages (a stack overflow).
    bool in_guard(const void* address) const;

private:
    char* base_ = nullptr;
    size_t stride_ = kStackBytes + kGuardBytes;
    int count_ = 0;
};

}  // namespace cudasim
