// Warp collectives: each lane parks its operand in its own slot and blocks; the last lane
// of the mask to arrive (or the scheduler, when a lane exits) computes every participant's
// result into that participant's slot, so the answer does not depend on arrival order.
// Semantics follow the CUDA programming guide: lanes named in the mask that have exited
// are not waited for; reading a lane that does not take part gives an undefined value,
// here all one bits so a kernel that uses it shows it.
#include "state.h"

namespace cudasim {

namespace {

constexpr unsigned long long kUndefined = ~0ull;

// The lane a shuffle reads, or `lane` itself where CUDA returns the caller's own value.
unsigned shuffle_source(const LaneSlot& s, unsigned lane) {
    unsigned width = (unsigned)s.width, within = lane & (width - 1), segment = lane & ~(width - 1);
    unsigned long long arg = (unsigned)s.arg;
    switch (s.op) {
    case kShflIdx:   // srcLane taken modulo width, inside the caller's segment
        return segment | ((unsigned)s.arg & (width - 1));
    case kShflUp:    // below the segment start: own value
        return arg > within ? lane : lane - (unsigned)arg;
    case kShflDown:  // past the segment end: own value
        return within + arg >= width ? lane : lane + (unsigned)arg;
    default: {       // kShflXor: earlier segments may be read, later ones give the own value
        unsigned source = lane ^ (unsigned)s.arg;
        return source > segment + width - 1 ? lane : source;
    }
    }
}

void compute(Warp& warp, unsigned need) {
    unsigned predicates = 0;
    for (unsigned m = need; m; m &= m - 1) {
        int j = __builtin_ctz(m);
        if (warp.lane[j].value & 0xffffffffull) predicates |= 1u << j;
    }
    for (unsigned m = need; m; m &= m - 1) {
        unsigned lane = __builtin_ctz(m);
        LaneSlot& s = warp.lane[lane];
        switch (s.op) {
        case kShflIdx: case kShflUp: case kShflDown: case kShflXor: {
            unsigned source = shuffle_source(s, lane);
            s.result = source < 32 && (need >> source & 1) ? warp.lane[source].value : kUndefined;
            break;
        }
        case kBallot: s.result = predicates; break;
        case kAny: s.result = predicates != 0; break;
        case kAll: s.result = predicates == need; break;
        case kSyncWarp: s.result = 0; break;
        case kMatchAny: case kMatchAll: {
            unsigned same = 0;
            for (unsigned k = need; k; k &= k - 1)
                if (warp.lane[__builtin_ctz(k)].value == s.value) same |= 1u << __builtin_ctz(k);
            s.result = s.op == kMatchAny ? same : same == need ? (need | (1ull << 32)) : 0;
            break;
        }
        default: {  // reductions over the 32-bit operands
            unsigned acc = (unsigned)warp.lane[__builtin_ctz(need)].value;
            for (unsigned k = need & (need - 1); k; k &= k - 1) {
                unsigned v = (unsigned)warp.lane[__builtin_ctz(k)].value;
                switch (s.op) {
                case kReduceAdd: acc += v; break;
                case kReduceMinU: acc = v < acc ? v : acc; break;
                case kReduceMaxU: acc = v > acc ? v : acc; break;
                case kReduceMinI: acc = (int)v < (int)acc ? v : acc; break;
                case kReduceMaxI: acc = (int)v > (int)acc ? v : acc; break;
                case kReduceAnd: acc &= v; break;
                case kReduceOr: acc |= v; break;
                default: acc ^= v; break;
                }
            }
            s.result = acc;
        }
        }
    }
}

}  // namespace

const char* warp_op_name(int op) {
    static const char* const names[] = {
        "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync", "__any_sync",
        "__all_sync", "__syncwarp", "__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync",
        "__reduce_min_sync", "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
        "__match_any_sync", "__match_all_sync"};
    return names[op];
}

bool try_complete(Warp& warp, int warp_index, unsigned mask) {
    unsigned need = mask & warp.live;
    if ((warp.waiting & need) != need) return false;
    const LaneSlot& first = warp.lane[__builtin_ctz(need)];
    for (unsigned m = need; m; m &= m - 1) {
        const LaneSlot& s = warp.lane[__builtin_ctz(m)];
        if (s.mask != mask || s.op != first.op) {
            fail("warp collective mismatch in warp %d: lane %d calls %s(mask 0x%08x) at %s:%d while lane %d calls "
                 "%s(mask 0x%08x) at %s:%d; every lane named in a mask must make the same call with the same mask",
                 warp_index, __builtin_ctz(need), warp_op_name(first.op), first.mask, first.file, first.line,
                 __builtin_ctz(m), warp_op_name(s.op), s.mask, s.file, s.line);
            return false;
        }
    }
    compute(warp, need);
    warp.waiting &= ~need;
    for (unsigned m = need; m; m &= m - 1) g_sched.fibers[warp_index * 32 + __builtin_ctz(m)].state = kRunnable;
    return true;
}

unsigned long long warp_collective(int op, unsigned mask, unsigned long long value, int size, int arg, int width,
                                   const char* file, int line) {
    Fiber* self = g_sched.current;
    int w = self->linear / 32;
    unsigned lane = self->linear % 32;
    if (!(mask >> lane & 1))
        fail("%s(mask 0x%08x) at %s:%d: the calling lane %u is not in the mask", warp_op_name(op), mask, file,
             line, lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("%s at %s:%d: width %d is not a power of two in [1, 32]", warp_op_name(op), file, line, width);
    Warp& warp = g_sched.warps[w];
    LaneSlot& slot = warp.lane[lane];
    slot = LaneSlot{value, 0, mask, op, arg, width, size, file, line};
    warp.waiting |= 1u << lane;
    if (!try_complete(warp, w, mask)) {
        self->state = kAtWarp;
        self->file = file;
        self->line = line;
        suspend();
    }
    return slot.result;
}

}  // namespace cudasim
