/* A process with memory nobody serves: a region registered with
 * userfaultfd (missing pages) whose faults are never answered, so any read
 * of it, process_vm_readv from another process included, sleeps until the
 * process exits. It first allocates from site_a, so that its ledger exists.
 * Prints "region <hex address> <bytes>" and waits for "exit" on stdin. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define N_A 400
#define SIZE_A 65536
#define REGION (4 << 20)

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void *a[N_A];

__attribute__((noinline)) void site_a(void) {
    for (int i = 0; i < N_A; i++) { a[i] = malloc(SIZE_A); ESCAPE(a[i]); }
}

int main(void) {
    site_a();
    void *p = mmap(0, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    /* Kernel-mode faults too (no UFFD_USER_MODE_ONLY): root may. */
    int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
    if (uffd < 0) { perror("userfaultfd"); return 3; }
    struct uffdio_api api = { .api = UFFD_API };
    if (ioctl(uffd, UFFDIO_API, &api)) { perror("UFFDIO_API"); return 4; }
    struct uffdio_register reg = {
        .range = { (unsigned long)p, REGION },
        .mode = UFFDIO_REGISTER_MODE_MISSING,
    };
    if (ioctl(uffd, UFFDIO_REGISTER, &reg)) { perror("UFFDIO_REGISTER"); return 5; }
    printf("region %lx %d\n", (unsigned long)p, REGION);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin))
        if (!strncmp(line, "exit", 4)) return 0;
    return 0;
}
