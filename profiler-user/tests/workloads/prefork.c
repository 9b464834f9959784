/* A prefork server in miniature, for `--pid`'s trees. Commands on stdin:
 *   "fork N"  forks N workers; worker k (numbered from 0 over the whole
 *             run) allocates WORKER_N blocks of WORKER_SIZE at
 *             worker_site_k, keeps them, and waits; prints
 *             "worker K PID" for each, then "ready" once all allocated;
 *   "short N" forks N children in turn, each allocating
 *             SHORT_N blocks of SHORT_SIZE at short_site and exiting at
 *             once (reaped before the next); prints "ready";
 *   "bomb N"  forks N children (at most MAX_BOMB) that each allocate
 *             BOMB_N blocks of BOMB_SIZE at bomb_site and stay until all
 *             have, then exit together; reaps them all; prints "ready";
 *   "grand"   forks a child that forks a grandchild allocating at
 *             grand_site; prints "child PID", "grandchild PID", "ready";
 *   "exec"    forks a child that execs this program (LD_PRELOAD is
 *             inherited) as "--exec-child", which allocates at exec_site;
 *             prints "child PID", "ready";
 *   "exit"    exits (every descendant ends with it: PR_SET_PDEATHSIG, and
 *             EOF on the pipe they wait on).
 * Descendants wait by reading the control pipe, whose write end only the
 * parent keeps; they report through the done pipe. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKER_N 1000
#define WORKER_SIZE 4096
#define SHORT_N 16
#define SHORT_SIZE 65536
#define MAX_WORKERS 16
#define BOMB_N 16
#define BOMB_SIZE 65536
#define MAX_BOMB 256

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static int control[2], done[2];

static void keep(int n, size_t size) {
    for (int i = 0; i < n; i++) {
        char *p = malloc(size);
        if (!p) _exit(5);
        p[0] = 1;
        ESCAPE(p);
    }
}

#define SITE(k) \
    __attribute__((noinline)) void worker_site_##k(void) { keep(WORKER_N, WORKER_SIZE); }
SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5) SITE(6) SITE(7)
SITE(8) SITE(9) SITE(10) SITE(11) SITE(12) SITE(13) SITE(14) SITE(15)

static void (*const SITES[MAX_WORKERS])(void) = {
    worker_site_0,  worker_site_1,  worker_site_2,  worker_site_3,
    worker_site_4,  worker_site_5,  worker_site_6,  worker_site_7,
    worker_site_8,  worker_site_9,  worker_site_10, worker_site_11,
    worker_site_12, worker_site_13, worker_site_14, worker_site_15,
};

__attribute__((noinline)) void short_site(void) { keep(SHORT_N, SHORT_SIZE); }

__attribute__((noinline)) void bomb_site(void) { keep(BOMB_N, BOMB_SIZE); }
__attribute__((noinline)) void grand_site(void) { keep(WORKER_N, WORKER_SIZE); }
__attribute__((noinline)) void exec_site(void) { keep(WORKER_N, WORKER_SIZE); }

/* In a new descendant: die with its parent, drop the control pipe's
 * write end (so EOF comes when the parent goes). */
static void descendant(void) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(control[1]);
}

static void report_and_wait(void) {
    char c = 1, buf;
    if (write(done[1], &c, 1) != 1) _exit(6);
    while (read(control[0], &buf, 1) > 0) {}
    _exit(0);
}

static void wait_done(int n) {
    char c;
    for (int i = 0; i < n; i++)
        if (read(done[0], &c, 1) != 1) exit(7);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--exec-child")) {
        control[0] = atoi(argv[2]);
        done[1] = atoi(argv[3]);
        exec_site();
        report_and_wait();
    }
    /* Its own path: exec'ed by it, the child keeps this program's name. */
    static char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return 2;
    self[len] = 0;
    if (pipe(control) || pipe(done)) return 2;
    /* The write end must not survive the exec either. */
    fcntl(control[1], F_SETFD, FD_CLOEXEC);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int workers = 0;
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        int n = 0;
        if (sscanf(line, "fork %d", &n) == 1) {
            for (int i = 0; i < n && workers < MAX_WORKERS; i++, workers++) {
                pid_t pid = fork();
                if (pid < 0) return 3;
                if (pid == 0) {
                    descendant();
                    SITES[workers]();
                    report_and_wait();
                }
                printf("worker %d %d\n", workers, pid);
            }
            wait_done(n);
        } else if (sscanf(line, "short %d", &n) == 1) {
            for (int i = 0; i < n; i++) {
                pid_t pid = fork();
                if (pid < 0) return 3;
                if (pid == 0) {
                    short_site();
                    _exit(0);
                }
                int status;
                if (waitpid(pid, &status, 0) != pid || status != 0) return 4;
            }
        } else if (sscanf(line, "bomb %d", &n) == 1) {
            /* All alive at once: each waits on `hold` until all have
             * allocated. */
            static pid_t bomb[MAX_BOMB];
            int hold[2];
            if (n > MAX_BOMB || pipe(hold)) return 2;
            for (int i = 0; i < n; i++) {
                pid_t pid = fork();
                if (pid < 0) return 3;
                if (pid == 0) {
                    prctl(PR_SET_PDEATHSIG, SIGKILL);
                    close(hold[1]);
                    bomb_site();
                    char c = 1, buf;
                    if (write(done[1], &c, 1) != 1) _exit(6);
                    while (read(hold[0], &buf, 1) > 0) {}
                    _exit(0);
                }
                bomb[i] = pid;
            }
            close(hold[0]);
            wait_done(n);
            close(hold[1]);
            for (int i = 0; i < n; i++) {
                int status;
                if (waitpid(bomb[i], &status, 0) != bomb[i] || status != 0) return 4;
            }
        } else if (!strncmp(line, "grand", 5)) {
            int ids[2];
            if (pipe(ids)) return 2;
            pid_t pid = fork();
            if (pid < 0) return 3;
            if (pid == 0) {
                descendant();
                pid_t grand = fork();
                if (grand < 0) _exit(3);
                if (grand == 0) {
                    prctl(PR_SET_PDEATHSIG, SIGKILL);
                    grand_site();
                    report_and_wait();
                }
                if (write(ids[1], &grand, sizeof grand) != sizeof grand) _exit(6);
                char buf;
                while (read(control[0], &buf, 1) > 0) {}
                _exit(0);
            }
            pid_t grand;
            if (read(ids[0], &grand, sizeof grand) != sizeof grand) return 7;
            close(ids[0]);
            close(ids[1]);
            printf("child %d\ngrandchild %d\n", pid, grand);
            wait_done(1);
        } else if (!strncmp(line, "exec", 4)) {
            pid_t pid = fork();
            if (pid < 0) return 3;
            if (pid == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                char r[16], d[16];
                snprintf(r, sizeof r, "%d", control[0]);
                snprintf(d, sizeof d, "%d", done[1]);
                execl(self, argv[0], "--exec-child", r, d, (char *)NULL);
                _exit(8);
            }
            printf("child %d\n", pid);
            wait_done(1);
        } else if (!strncmp(line, "exit", 4)) {
            return 0;
        } else {
            return 9;
        }
        printf("ready\n");
    }
    return 0;
}
