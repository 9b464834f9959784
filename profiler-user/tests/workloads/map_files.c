/* Maps every file named on the command line (read-only, shared), prints
 * "ready", and waits for a line on stdin before exiting: a process whose
 * mappings the tests control (huge sparse files, hostile ELF headers). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) { perror(argv[i]); return 2; }
        if (mmap(0, st.st_size, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) {
            perror("mmap");
            return 3;
        }
        close(fd);
    }
    printf("ready\n");
    fflush(stdout);
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) return 0;
    return 0;
}
