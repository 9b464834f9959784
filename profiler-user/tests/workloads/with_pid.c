/* with_pid PID PROGRAM [ARGS...]: runs PROGRAM as process PID (clone3 with
 * set_tid; needs root), waits for it and exits with its status, so a test
 * can make a pid be reused for real. Exits 17 if PID is taken. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) return 64;
    pid_t want = atoi(argv[1]);
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    args.set_tid = (uint64_t)(uintptr_t)&want;
    args.set_tid_size = 1;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid < 0) {
        fprintf(stderr, "clone3 with pid %d: %s\n", want, strerror(errno));
        return errno == EEXIST ? 17 : 1;
    }
    if (pid == 0) {
        execv(argv[2], argv + 2);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) return 1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
