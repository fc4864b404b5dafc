/*
 * shm_debug.h -- the assertion build.  `SHMLOCKS_DEBUG=1 pip install -e .` (setup.py
 * passes -DSHMLOCKS_DEBUG=1) checks the invariants of each kind's state table at its
 * transitions, as the kernel's CONFIG_DEBUG_MUTEXES does; in a normal build every
 * shm_assert is nothing at all: its condition is not even evaluated.
 *
 * A failed assertion is a protocol bug, not a user error: it prints what failed, where
 * and in which process to stderr and aborts that process (SIGABRT), so the other
 * participants see a death and recover it, and a test or the torture sees which.
 */
#ifndef SHM_DEBUG_H
#define SHM_DEBUG_H

#ifdef SHMLOCKS_DEBUG
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SHM_DEBUG_BUILT 1
static __attribute__((noinline, cold, noreturn)) void
shm_assert_fail(const char *cond, const char *what, const char *file, int line) {
    fprintf(stderr, "shmlocks: assertion failed in pid %d: %s (%s) at %s:%d\n",
            (int)getpid(), what, cond, file, line);
    fflush(stderr);
    abort();
}
#define shm_assert(cond, what) \
    (__builtin_expect(!!(cond), 1) ? (void)0 : shm_assert_fail(#cond, what, __FILE__, __LINE__))
#else
#define SHM_DEBUG_BUILT 0
/* sizeof does not evaluate cond; naming both keeps the compiler from warning that
 * Cython's temporaries and message strings go unused */
#define shm_assert(cond, what) ((void)sizeof(cond), (void)(what))
#endif

#endif
