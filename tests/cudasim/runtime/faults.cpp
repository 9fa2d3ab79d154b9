// Kernel faults become a failed launch (a Python exception) instead of a dead process:
// a SIGSEGV/SIGBUS/SIGFPE/SIGILL raised while a fiber runs is handled on an alternate
// signal stack (the fiber's own stack may be the thing that overflowed), which records the
// failure and switches straight back to the scheduler; the faulting fiber is abandoned.
// A fault anywhere else goes to whatever handler was installed before the launch.
// `assert` in a kernel reaches the __assert_fail below instead of glibc's abort().
// A watchdog timer does the same for a launch that runs too long: fibers only switch at
// barriers and warp collectives, so a thread spinning on a value another thread must
// write never finishes here.
#include <assert.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
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
timer_t g_watchdog;
bool g_watchdog_armed = false;
struct sigaction g_previous_watchdog;
int g_timeout_seconds = 0;

int watchdog_signal() { return SIGRTMIN + 7; }  // glibc keeps the first two for itself; Python uses none

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

void on_watchdog(int, siginfo_t*, void*) {
    // Fires every half second after the timeout; only a running fiber can be stuck.
    if (g_sched.current && pthread_equal(pthread_self(), g_launch_thread))
        fail("the launch ran longer than %d s: an endless loop, or a thread spinning on a value another "
             "thread must write (simulated threads switch only at barriers and warp collectives; "
             "CUDASIM_TIMEOUT sets the limit)", g_timeout_seconds);
}

void arm_watchdog(int seconds) {
    g_timeout_seconds = seconds;
    struct sigaction action {};
    action.sa_sigaction = on_watchdog;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(watchdog_signal(), &action, &g_previous_watchdog);
    sigevent event{};
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = watchdog_signal();
    event._sigev_un._tid = gettid();
    g_watchdog_armed = timer_create(CLOCK_MONOTONIC, &event, &g_watchdog) == 0;
    if (!g_watchdog_armed) return;
    itimerspec when{};
    when.it_value.tv_sec = seconds;
    when.it_interval.tv_nsec = 500 * 1000 * 1000;
    timer_settime(g_watchdog, 0, &when, nullptr);
}

}  // namespace

void install_fault_handlers(int timeout_seconds) {
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
    if (timeout_seconds > 0) arm_watchdog(timeout_seconds);
}

void restore_fault_handlers() {
    if (g_watchdog_armed) {
        timer_delete(g_watchdog);  // a signal it already raised is delivered as this returns, to on_watchdog
        g_watchdog_armed = false;
    }
    if (g_timeout_seconds > 0) sigaction(watchdog_signal(), &g_previous_watchdog, nullptr);
    g_timeout_seconds = 0;
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
