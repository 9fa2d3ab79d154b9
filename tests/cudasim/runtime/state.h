// The scheduler's state for the launch in progress, shared by the runtime's files.
//
// Plain globals, not thread_local: each kernel library carries its own copy of the
// runtime, and the Python side runs one launch at a time (a process-wide lock), because
// the fault handlers it installs are process-wide anyway.
#pragma once
#include <cstdint>
#include <vector>

#include "cuda_runtime.h"
#include "cudasim/launch.h"
#include "fiber.h"

namespace cudasim {

enum FiberState : uint8_t { kRunnable, kAtBarrier, kAtWarp, kDone };

struct Fiber {
    void* sp;               // saved stack pointer while switched out
    FiberState state;
    int linear;             // x + y * blockDim.x + z * blockDim.x * blockDim.y
    uint3 index;            // its threadIdx
    const char* file;       // where it waits (barrier or warp collective)
    int line;
    int barrier_kind;       // BarrierKind of the barrier it waits at
    int predicate;          // its __syncthreads_count/and/or predicate
    int barrier_result;
};

// One lane's part in a pending warp collective. Per-lane slots: a lane released early
// can never overwrite a value a slower lane has not read yet.
struct LaneSlot {
    unsigned long long value;
    unsigned long long result;
    unsigned mask;
    int op, arg, width, size;
    const char* file;
    int line;
};

struct Warp {
    LaneSlot lane[32];
    unsigned waiting;       // lanes blocked in a collective
    unsigned live;          // lanes that exist in the block and have not exited
};

struct Scheduler {
    StackPool stacks;
    std::vector<Fiber> fibers;        // the current block's threads
    std::vector<Warp> warps;
    std::vector<int> order;           // the order a scheduling pass visits fibers in
    int live = 0;                     // fibers not yet exited
    Fiber* current = nullptr;         // the fiber running now; null in the scheduler
    void* scheduler_sp = nullptr;     // the scheduler's context while a fiber runs
    void (*body)(void**) = nullptr;   // the kernel's argument-unpacking entry
    void** args = nullptr;
    int order_kind = 0;               // LaunchConfig::order
    uint64_t rng = 0;                 // state of the random thread order
    bool failed = false;
};
extern CUDASIM_HIDDEN Scheduler g_sched;

// Records the launch's failure (the first one wins), prefixed with the current block and
// thread. In a fiber it then abandons that fiber and returns to the scheduler, never
// coming back; from the scheduler itself it returns.
CUDASIM_HIDDEN void fail(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Switches from the running fiber back to the scheduler until the fiber is runnable again.
CUDASIM_HIDDEN void suspend();

// Completes the collective of the lanes in `mask` if all its live lanes wait in it.
CUDASIM_HIDDEN bool try_complete(Warp& warp, int warp_index, unsigned mask);

// Name of a WarpOp for messages.
CUDASIM_HIDDEN const char* warp_op_name(int op);

// Fault handlers and the watchdog (0: none) around one launch (faults.cpp).
CUDASIM_HIDDEN void install_fault_handlers(int timeout_seconds);
CUDASIM_HIDDEN void restore_fault_handlers();

// Shared memory: the module's thread_local storage (shared_memory.cpp).
CUDASIM_HIDDEN void shared_memory_begin_launch(void* dynamic, size_t capacity);
CUDASIM_HIDDEN void shared_memory_begin_block(size_t shared_mem);

}  // namespace cudasim
