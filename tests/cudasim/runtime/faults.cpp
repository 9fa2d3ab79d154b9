// Kernel faults become a failed launch (a Python exception) instead of a dead process:
// a SIGSEGV/SIGBUS/SIGFPE/SIGILL raised while a fiber runs is handled on an alternate
// signal stack (the fiber's own stack may be the thing that overflowed), which records the
// failure and switches straight back to the scheduler; the faulting fiber is abandoned.
// A fault anywhere else goes to whatever handler was installed before the launch.
// `assert` in a kernel reaches the __assert_fail below instead of glibc's abort().
#include <assert.h>
#include <pthread.h>
#include <signal.h>
#include <cstdio>
#include <cstdlib>

#include "state.h"

namespace cudasim {

namespace {

const int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
constexpr int kSignalCount = sizeof kSignals / sizeof kSignals[0];
struct sigaction g_previous[kSignalCount];
stack_t g_previous_stack;
pthread_t g_launch_thread;
alignas(64) char g_alt_stack[64 * 1024];

int signal_slot(int sig) {
    for (int i = 0; i < kSignalCount; ++i)
        if (kSignals[i] == sig) return i;
    return 0;
}

void on_fault(int sig, siginfo_t* info, void*) {
    if (!g_sched.current || !pthread_equal(pthread_self(), g_launch_thread)) {
        // Not a kernel's fault: return with the previous handler in place, so the faulting
        // instruction runs again and faults under it (Python's faulthandler, or the default).
        sigaction(sig, &g_previous[signal_slot(sig)], nullptr);
        return;
    }
    void* address = info->si_addr;
    if (sig == SIGSEGV && g_sched.stacks.in_guard(address))
        fail("stack overflow (each simulated thread has %zu KiB of stack)", StackPool::kStackBytes / 1024);
    else if (sig == SIGSEGV && info->si_code == SI_KERNEL)
        fail("general protection fault: a misaligned vector access (e.g. a float4 load from an address that "
             "is not a multiple of 16) or a non-canonical pointer");
    else if (sig == SIGSEGV)
        fail("invalid memory access at address %p (out of bounds, or a pointer that is not an argument "
             "array)", address);
    else if (sig == SIGFPE && info->si_code == FPE_INTDIV)
        fail("integer division by zero (undefined on the GPU, where it does not trap)");
    else if (sig == SIGILL)
        fail("illegal instruction: __builtin_trap, or control reached the end of a non-void function");
    else
        fail("signal %d (%s) at address %p", sig, sig == SIGBUS ? "bus error" : "arithmetic exception", address);
}

}  // namespace

void install_fault_handlers() {
    g_launch_thread = pthread_self();
    stack_t alt{};
    alt.ss_sp = g_alt_stack;
    alt.ss_size = sizeof g_alt_stack;
    sigaltstack(&alt, &g_previous_stack);
    struct sigaction action {};
    action.sa_sigaction = on_fault;
    // SA_NODEFER: the handler never returns normally (it switches to the scheduler), so
    // the signal must not stay blocked afterwards.
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    for (int i = 0; i < kSignalCount; ++i) sigaction(kSignals[i], &action, &g_previous[i]);
}

void restore_fault_handlers() {
    for (int i = 0; i < kSignalCount; ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
    sigaltstack(&g_previous_stack, nullptr);
}

}  // namespace cudasim

// Hidden (the runtime is built with -fvisibility=hidden), so only this kernel library's
// assert calls land here; glibc's own __assert_fail stays in place for everything else.
extern "C" void __assert_fail(const char* assertion, const char* file, unsigned int line,
                              const char* function) noexcept {
    if (!cudasim::g_sched.current) {
        std::fprintf(stderr, "%s:%u: %s: assertion `%s' failed (outside a kernel)\n", file, line, function,
                     assertion);
        std::abort();
    }
    cudasim::fail("assertion `%s' failed in %s at %s:%u", assertion, function, file, line);
    __builtin_unreachable();
}
