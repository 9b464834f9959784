/* For workloads whose main thread leaves with pthread_exit: whether
 * /proc shows the main thread (the thread-group leader) as a zombie yet. */
#ifndef ALLOCPROF_WORKLOADS_LEADER_H
#define ALLOCPROF_WORKLOADS_LEADER_H

#include <stdio.h>
#include <string.h>

static int leader_is_zombie(void) {
    char buf[512];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *end = strrchr(buf, ')');
    return end && end[1] == ' ' && end[2] == 'Z';
}

#endif
