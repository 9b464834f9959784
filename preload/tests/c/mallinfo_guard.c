/* Preloaded ahead of liballocprof_glibc.so: glibc's heap-walking statistics
 * calls abort the process, so a test sees at once if the library makes
 * one (each walks every free chunk under the arena locks). */
#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

static void guard(const char *msg, size_t n) {
    write(2, msg, n);
    abort();
}
#define GUARD(name) guard("mallinfo_guard: " name " called\n", sizeof "mallinfo_guard: " name " called\n" - 1)

struct mallinfo2 mallinfo2(void) { GUARD("mallinfo2"); for (;;) {} }
struct mallinfo mallinfo(void) { GUARD("mallinfo"); for (;;) {} }
int malloc_info(int options, FILE *fp) { (void)options, (void)fp; GUARD("malloc_info"); return -1; }
void malloc_stats(void) { GUARD("malloc_stats"); }
