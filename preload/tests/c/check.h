/* What the C test programs share: CHECK, which names the failed condition
 * and its line on stderr and exits with status 1. */
#ifndef ALLOCPROF_TESTS_CHECK_H
#define ALLOCPROF_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(c)                                                                 \
    do {                                                                         \
        if (!(c)) {                                                              \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#endif
