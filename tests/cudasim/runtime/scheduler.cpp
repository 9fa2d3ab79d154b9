// The launch: blocks one after another; within a block every thread is a fiber that runs
// until it exits or blocks in a synchronizing intrinsic. A scheduling pass visits the
// fibers in the chosen thread order (id, reverse, seeded random) and runs each runnable
// one; when a pass finds nothing runnable, every live thread must be waiting at one
// __syncthreads (released then) or the block is deadlocked / divergent (the launch fails).
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "state.h"

CUDASIM_HIDDEN uint3 threadIdx;
CUDASIM_HIDDEN uint3 blockIdx;
CUDASIM_HIDDEN dim3 blockDim;
CUDASIM_HIDDEN dim3 gridDim;

namespace cudasim {

CUDASIM_HIDDEN Scheduler g_sched;
static char g_error[4096];

namespace {

uint64_t next_random(uint64_t& state) {  // splitmix64: tiny, seedable, good enough to shuffle
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

template <class T>
void shuffle(std::vector<T>& v, uint64_t& state) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next_random(state) % i]);
}

void fiber_entry() {
    g_sched.body(g_sched.args);
    Fiber* self = g_sched.current;
    self->state = kDone;
    cudasim_switch_context(&self->sp, g_sched.scheduler_sp);
    __builtin_unreachable();
}

void run(Fiber* f) {
    g_sched.current = f;
    threadIdx = f->index;
    cudasim_switch_context(&g_sched.scheduler_sp, f->sp);
    g_sched.current = nullptr;
}

// A thread exited: it no longer counts for barriers, and the collectives its warp-mates
// wait in may now be complete (CUDA waits only for non-exited lanes named in a mask).
void retire(Fiber* f) {
    --g_sched.live;
    int w = f->linear / 32;
    Warp& warp = g_sched.warps[w];
    warp.live &= ~(1u << (f->linear % 32));
    for (unsigned pending = warp.waiting; pending && !g_sched.failed; pending &= warp.waiting) {
        unsigned mask = warp.lane[__builtin_ctz(pending)].mask;
        try_complete(warp, w, mask);
        pending &= ~mask;
    }
}

bool same_site(const Fiber* a, const Fiber* b) {
    return a->line == b->line && a->barrier_kind == b->barrier_kind &&
           (a->file == b->file || std::strcmp(a->file, b->file) == 0);
}

const char* barrier_name(int kind) {
    static const char* const names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and",
                                        "__syncthreads_or"};
    return names[kind];
}

// Nothing is runnable: release the barrier every live thread waits at, or fail.
bool release_barrier() {
    Fiber* first = nullptr;
    for (Fiber& f : g_sched.fibers) {
        if (f.state == kAtWarp) {
            Warp& warp = g_sched.warps[f.linear / 32];
            const LaneSlot& slot = warp.lane[f.linear % 32];
            unsigned missing = slot.mask & warp.live & ~warp.waiting;
            if (!missing) {  // cannot happen: the last lane to arrive completes the collective
                fail("deadlock: thread (%u,%u,%u) waits in %s at %s:%d", f.index.x, f.index.y, f.index.z,
                     warp_op_name(slot.op), slot.file, slot.line);
                return false;
            }
            const Fiber& other = g_sched.fibers[(f.linear & ~31) + __builtin_ctz(missing)];
            fail("deadlock: thread (%u,%u,%u) waits in %s(mask 0x%08x) at %s:%d, but lane %d of its warp "
                 "never joins: thread (%u,%u,%u) waits in %s at %s:%d",
                 f.index.x, f.index.y, f.index.z, warp_op_name(slot.op), slot.mask, slot.file, slot.line,
                 other.linear % 32, other.index.x, other.index.y, other.index.z,
                 other.state == kAtBarrier ? barrier_name(other.barrier_kind) : "another warp collective",
                 other.file, other.line);
            return false;
        }
        if (f.state != kAtBarrier) continue;
        if (!first) {
            first = &f;
        } else if (!same_site(first, &f)) {
            fail("divergent barrier: thread (%u,%u,%u) waits in %s at %s:%d while thread (%u,%u,%u) waits in "
                 "%s at %s:%d; every thread of a block must reach the same barrier",
                 first->index.x, first->index.y, first->index.z, barrier_name(first->barrier_kind),
                 first->file, first->line, f.index.x, f.index.y, f.index.z, barrier_name(f.barrier_kind),
                 f.file, f.line);
            return false;
        }
    }
    int count = 0, waiting = 0;
    for (Fiber& f : g_sched.fibers)
        if (f.state == kAtBarrier) ++waiting, count += f.predicate;
    int result = first->barrier_kind == kBarrierCount ? count
               : first->barrier_kind == kBarrierAnd  ? count == waiting
               : first->barrier_kind == kBarrierOr   ? count > 0
                                                     : 0;
    for (Fiber& f : g_sched.fibers)
        if (f.state == kAtBarrier) f.state = kRunnable, f.barrier_result = result;
    if (g_sched.order_kind == 2) shuffle(g_sched.order, g_sched.rng);  // a new interleaving per phase
    return true;
}

void run_block(unsigned block_linear, unsigned long long seed) {
    int n = (int)(blockDim.x * blockDim.y * blockDim.z);
    g_sched.fibers.resize(n);
    for (int i = 0; i < n; ++i) {
        Fiber& f = g_sched.fibers[i];
        f = Fiber{};
        f.sp = g_sched.stacks.initial_sp(i, fiber_entry);
        f.state = kRunnable;
        f.linear = i;
        f.index = uint3{i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
    }
    g_sched.warps.resize((n + 31) / 32);
    for (size_t w = 0; w < g_sched.warps.size(); ++w) {
        int lanes = n - 32 * (int)w;
        g_sched.warps[w].waiting = 0;
        g_sched.warps[w].live = lanes >= 32 ? 0xffffffffu : (1u << lanes) - 1;
    }
    g_sched.order.resize(n);
    for (int i = 0; i < n; ++i) g_sched.order[i] = g_sched.order_kind == 1 ? n - 1 - i : i;
    if (g_sched.order_kind == 2) {
        g_sched.rng = seed * 0x2545f4914f6cdd1dull + block_linear;
        shuffle(g_sched.order, g_sched.rng);
    }
    g_sched.live = n;
    while (g_sched.live > 0) {
        bool progressed = false;
        for (int k = 0; k < n; ++k) {
            Fiber* f = &g_sched.fibers[g_sched.order[k]];
            if (f->state != kRunnable) continue;
            run(f);
            if (g_sched.failed) return;
            if (f->state == kDone) retire(f);
            if (g_sched.failed) return;
            progressed = true;
        }
        if (!progressed && g_sched.live > 0 && !release_barrier()) return;
    }
}

}  // namespace

void suspend() {
    Fiber* self = g_sched.current;
    cudasim_switch_context(&self->sp, g_sched.scheduler_sp);
}

void fail(const char* format, ...) {
    Fiber* self = g_sched.current;
    if (!g_sched.failed) {
        g_sched.failed = true;
        int n = std::snprintf(g_error, sizeof g_error, "block (%u,%u,%u) ", blockIdx.x, blockIdx.y, blockIdx.z);
        if (self)
            n += std::snprintf(g_error + n, sizeof g_error - n, "thread (%u,%u,%u): ", self->index.x,
                               self->index.y, self->index.z);
        va_list ap;
        va_start(ap, format);
        std::vsnprintf(g_error + n, sizeof g_error - n, format, ap);
        va_end(ap);
    }
    if (self) {
        self->state = kDone;
        cudasim_switch_context(&self->sp, g_sched.scheduler_sp);
        __builtin_unreachable();
    }
}

[[noreturn]] void trap(const char* what, const char* file, int line) {
    fail("%s at %s:%d", what, file, line);
    __builtin_trap();  // only reachable outside a launch
}

int block_barrier(int kind, int predicate, const char* file, int line) {
    Fiber* self = g_sched.current;
    self->state = kAtBarrier;
    self->file = file;
    self->line = line;
    self->barrier_kind = kind;
    self->predicate = predicate != 0;
    suspend();
    return self->barrier_result;
}

unsigned live_lanes() { return g_sched.warps[g_sched.current->linear / 32].live; }

int launch(const LaunchConfig* config, void (*body)(void**), void** args, void* dynamic, size_t capacity) {
    g_sched.failed = false;
    g_error[0] = '\0';
    g_sched.body = body;
    g_sched.args = args;
    g_sched.order_kind = config->order;
    gridDim = dim3(config->grid[0], config->grid[1], config->grid[2]);
    blockDim = dim3(config->block[0], config->block[1], config->block[2]);
    unsigned long long blocks = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
    if (blocks > (1ull << 26) || !g_sched.stacks.reserve((int)(blockDim.x * blockDim.y * blockDim.z))) {
        std::snprintf(g_error, sizeof g_error, "cannot simulate this launch (too many blocks, or no memory for "
                                               "fiber stacks)");
        return 1;
    }
    std::vector<unsigned> block_order(blocks);
    for (unsigned long long b = 0; b < blocks; ++b) block_order[b] = config->order == 1 ? blocks - 1 - b : b;
    uint64_t block_rng = config->seed;
    if (config->order == 2) shuffle(block_order, block_rng);

    // Once per launch, not per block: a kernel's frames are near the top of the stack, and
    // 2 KiB per thread keeps small launches cheap.
    g_sched.stacks.poison((int)(blockDim.x * blockDim.y * blockDim.z), 2048);
    shared_memory_begin_launch(dynamic, capacity);
    install_fault_handlers(config->timeout_seconds);
    for (unsigned b : block_order) {
        blockIdx = uint3{b % gridDim.x, (b / gridDim.x) % gridDim.y, b / (gridDim.x * gridDim.y)};
        shared_memory_begin_block(config->shared_mem);
        run_block(b, config->seed);
        if (g_sched.failed) break;
    }
    restore_fault_handlers();
    std::fflush(stdout);  // kernel printf output appears with its launch
    return g_sched.failed ? 1 : 0;
}

}  // namespace cudasim

CUDASIM_EXPORT const char* cudasim_error() { return cudasim::g_error; }
