// Shared memory is the kernel library's thread_local storage (`__shared__` is
// `thread_local`; the runtime itself keeps no thread_local state). Every block starts
// with it poisoned (0xFF bytes: NaN for floats, -1 for ints), so a kernel that reads
// shared memory before writing it shows it. The `extern __shared__` arrays share one
// region of fixed capacity; only the launch's shared_mem bytes of it are repoisoned per
// block, the rest once per launch (so a large capacity costs little).
#include <dlfcn.h>
#include <link.h>
#include <algorithm>
#include <cstring>

#include "state.h"

namespace cudasim {

namespace {

thread_local char g_tls_anchor;  // forces this thread's TLS block of the module into existence

struct TlsBlock {
    char* base = nullptr;
    size_t size = 0;
};
TlsBlock g_tls;
char* g_dynamic = nullptr;
size_t g_capacity = 0;

int find_module(dl_phdr_info* info, size_t, void* data) {
    auto* code = reinterpret_cast<const char*>(&find_module);
    bool ours = false;
    const ElfW(Phdr)* tls = nullptr;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        const char* start = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
        if (ph.p_type == PT_LOAD && code >= start && code < start + ph.p_memsz) ours = true;
        if (ph.p_type == PT_TLS) tls = &ph;
    }
    if (!ours) return 0;
    auto* block = static_cast<TlsBlock*>(data);
    if (tls && info->dlpi_tls_data) {
        block->base = static_cast<char*>(info->dlpi_tls_data);
        block->size = tls->p_memsz;
    }
    return 1;
}

void poison(char* from, char* to) {
    if (to > from) std::memset(from, 0xff, to - from);
}

}  // namespace

void shared_memory_begin_launch(void* dynamic, size_t capacity) {
    __asm__ volatile("" : : "r"(&g_tls_anchor) : "memory");
    g_tls = TlsBlock{};
    dl_iterate_phdr(find_module, &g_tls);
    g_dynamic = static_cast<char*>(dynamic);
    g_capacity = dynamic ? capacity : 0;
    poison(g_tls.base, g_tls.base + g_tls.size);
}

void shared_memory_begin_block(size_t shared_mem) {
    char* end = g_tls.base + g_tls.size;
    if (!g_dynamic) return poison(g_tls.base, end);
    poison(g_tls.base, g_dynamic + std::min(shared_mem, g_capacity));
    poison(g_dynamic + g_capacity, end);
}

}  // namespace cudasim
