/*
 * Included once by the test programs that run UCX in this process (they link
 * dp_xfer): under ThreadSanitizer only, switch UCX memory events off.
 *
 * UCX's libucm hooks madvise(); glibc calls it on a thread's stack as the
 * thread exits, after ThreadSanitizer has torn the thread's state down, and
 * TSan crashes in the hook's rwlock. libucm reads its configuration in its
 * own constructor, before this one runs, so the program re-executes itself
 * once with UCX_MEM_EVENTS=no. That happens before main, so the harness
 * (dp_test.h) forks its tests from the re-executed process, and helpers the
 * tests re-execute inherit the variable (no second re-exec).
 */
#ifndef DP_TSAN_UCX_H
#define DP_TSAN_UCX_H

#include <stdlib.h>
#include <unistd.h>

#include "dp_test.h"

#ifdef DP_TEST_TSAN
__attribute__((constructor)) static void
dp_test_tsan_ucx_env(int argc, char **argv)
{
    (void)argc;
    if (getenv("UCX_MEM_EVENTS") != NULL)
        return;
    setenv("UCX_MEM_EVENTS", "no", 1);
    execv("/proc/self/exe", argv);
}
#endif

#endif
