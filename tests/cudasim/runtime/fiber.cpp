// Fiber stacks and the context switch (see fiber.h).
#include "fiber.h"

#include <sys/mman.h>
#include <cstring>

#if !defined(__x86_64__)
#error "the cudasim fiber switch is written for x86-64"
#endif

// cudasim_switch_context(save_sp, next_sp): push the callee-saved state on the current
// stack, store the stack pointer in *save_sp, load next_sp and pop the state saved there.
// Everything else is caller-saved under the System V ABI, so the C++ caller has already
// assumed it is lost across this call.
asm(R"(
    .pushsection .text
    .globl cudasim_switch_context
    .hidden cudasim_switch_context
    .type cudasim_switch_context, @function
cudasim_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch_context, .-cudasim_switch_context

    .globl cudasim_fiber_start
    .hidden cudasim_fiber_start
    .type cudasim_fiber_start, @function
cudasim_fiber_start:
    subq $504, %rsp
    call *%rbx
    ud2
    .size cudasim_fiber_start, .-cudasim_fiber_start
    .popsection
)");

namespace cudasim {

bool StackPool::reserve(int count) {
    if (count <= count_) return true;
    if (base_) munmap(base_, stride_ * count_);
    base_ = nullptr;
    count_ = 0;
    // MAP_NORESERVE: only the pages a fiber touches (usually one or two) cost memory.
    void* p = mmap(nullptr, stride_ * count, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    base_ = static_cast<char*>(p);
    count_ = count;
    for (int i = 0; i < count; ++i)
        if (mprotect(base_ + i * stride_, kGuardBytes, PROT_NONE) != 0) return false;
    return true;
}

void* StackPool::initial_sp(int i, void (*entry)()) const {
    // The frame cudasim_switch_context pops: control words, r15..r12, rbx = entry, rbp,
    // then the return address cudasim_fiber_start, which moves 504 bytes further down (the
    // kernel's frames must not overlap this frame's leftovers, which are not poison) and
    // calls entry with the stack aligned as the ABI wants.
    uint64_t* top = reinterpret_cast<uint64_t*>(base_ + (i + 1) * stride_);
    top[-1] = 0;  // a fake return address above it all
    top[-2] = reinterpret_cast<uint64_t>(&cudasim_fiber_start);
    top[-3] = 0;                                    // rbp
    top[-4] = reinterpret_cast<uint64_t>(entry);    // rbx
    for (int k = 5; k <= 8; ++k) top[-k] = 0;       // r12..r15
    top[-9] = 0x1f80ull | (0x037full << 32);        // default MXCSR, default x87 control word
    return &top[-9];
}

void StackPool::poison(int count, size_t bytes) const {
    for (int i = 0; i < count; ++i) memset(base_ + (i + 1) * stride_ - bytes, 0xff, bytes);
}

bool StackPool::in_guard(const void* address) const {
    const char* a = static_cast<const char*>(address);
    if (!base_ || a < base_ || a >= base_ + stride_ * count_) return false;
    return size_t(a - base_) % stride_ < kGuardBytes;
}

}  // namespace cudasim
