/* Maps libcrafted_cfi.so, whose .eh_frame tests/unwind.rs crafts to cost
 * time quadratic in its size to compile (one CIE of half a million
 * DW_CFA_nop shared by 22k FDEs), calls into it once (a `ret`: no
 * allocation, so its code is never on a sampled stack), prints "ready" and
 * exits on the next line. */
#include <stdio.h>

void crafted_code(void);

int main(void) {
    char line[16];
    crafted_code();
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    return 0;
}
