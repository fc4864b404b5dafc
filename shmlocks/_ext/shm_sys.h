/*
 * shm_sys.h -- the system interface in one place: atomics, cpu_relax, futex(2), clocks.
 * Shared futexes only (no FUTEX_PRIVATE_FLAG): the words live in memory mapped by
 * several processes.
 */
#ifndef SHM_SYS_H
#define SHM_SYS_H

#define _GNU_SOURCE 1
#include <stdint.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sched.h>
#include <signal.h>
#include <limits.h>
#include <sys/syscall.h>
#include <linux/futex.h>

/* ---- atomics: explicit orderings, named for what they are ---- */
#define SEQ __ATOMIC_SEQ_CST
#define ACQ __ATOMIC_ACQUIRE
#define REL __ATOMIC_RELEASE
#define RLX __ATOMIC_RELAXED

/* One set of wrappers per width: ldN_{acq,rlx,seq}, stN_{rel,rlx,seq}, xchgN, casN,
 * cmpxchgN (returns the value it found: == expected means it swapped), faddN, fsubN, forN,
 * fandN.  The RMWs are SC: the wake-up protocols (wait.pxi) rely on it. */
#define SHM_ATOMICS(N, T)                                                                  \
static inline T ld##N##_acq(T *p) { return __atomic_load_n(p, ACQ); }                     \
static inline T ld##N##_rlx(T *p) { return __atomic_load_n(p, RLX); }                     \
static inline T ld##N##_seq(T *p) { return __atomic_load_n(p, SEQ); }                     \
static inline void st##N##_rel(T *p, T v) { __atomic_store_n(p, v, REL); }                \
static inline void st##N##_rlx(T *p, T v) { __atomic_store_n(p, v, RLX); }                \
static inline void st##N##_seq(T *p, T v) { __atomic_store_n(p, v, SEQ); }                \
static inline T xchg##N(T *p, T v) { return __atomic_exchange_n(p, v, SEQ); }             \
static inline T cmpxchg##N(T *p, T expected, T desired) {                                  \
    __atomic_compare_exchange_n(p, &expected, desired, 0, SEQ, SEQ);                       \
    return expected;                                                                       \
}                                                                                          \
static inline int cas##N(T *p, T expected, T desired) {                                    \
    return __atomic_compare_exchange_n(p, &expected, desired, 0, SEQ, SEQ);                \
}                                                                                          \
static inline T fadd##N(T *p, T v) { return __atomic_fetch_add(p, v, SEQ); }              \
static inline T fsub##N(T *p, T v) { return __atomic_fetch_sub(p, v, SEQ); }              \
static inline T for##N(T *p, T v) { return __atomic_fetch_or(p, v, SEQ); }                \
static inline T fand##N(T *p, T v) { return __atomic_fetch_and(p, v, SEQ); }

SHM_ATOMICS(32, uint32_t)
SHM_ATOMICS(64, uint64_t)

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* ---- futex(2), shared ---- */
static inline int shm_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
        tsp = &ts;
    }
    long r = syscall(SYS_futex, word, FUTEX_WAIT, expected, tsp, NULL, 0);
    return r == 0 ? 0 : errno;        /* 0 woken, EAGAIN value changed, ETIMEDOUT, EINTR */
}
static inline int shm_futex_wake(uint32_t *word, int n) {
    return (int)syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* ---- clocks ---- */
static inline int64_t shm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static inline struct timespec shm_ts_of_ns(int64_t ns) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return ts;
}

/* The calling thread's registrations (participants.pxi) mirror the pthread key's value in
 * initial-exec TLS: the fast path reads them with one %fs-relative load instead of a call
 * to pthread_getspecific (the key stays, for its destructor at thread exit). 8 bytes of
 * the static TLS surplus glibc keeps for dlopen'ed modules. */
static __thread void *shm_tls_regs __attribute__((tls_model("initial-exec")));
static inline void *shm_tls_get(void) { return shm_tls_regs; }
static inline void shm_tls_set(void *v) { shm_tls_regs = v; }

static inline uint32_t shm_gettid(void) { return (uint32_t)syscall(SYS_gettid); }

/* ---- crash points (docs/design.md §8): armed once at import, one branch when unarmed ---- */
static int shm_crash_armed = 0;
static char shm_crash_name[64];
static int shm_crash_signal = SIGKILL;   /* SIGSTOP: stop there once (a stalled process) */
static int shm_crash_fired = 0;
static long shm_crash_skip = 0;          /* passes to let by first (name:N arms the N-th) */
/* the armed path, out of line and cold, so that each point costs the fast path one test */
static __attribute__((noinline, cold)) void shm_crash_check(const char *name) {
    if (shm_crash_fired) return;
    const char *a = shm_crash_name, *b = name;
    while (*a && *a == *b) { a++; b++; }
    if (*a == 0 && *b == 0) {
        if (shm_crash_skip > 0) {
            shm_crash_skip--;
            return;
        }
        shm_crash_fired = shm_crash_signal == SIGSTOP;
        kill(getpid(), shm_crash_signal);
    }
}
static inline void shm_crashpoint_at(int armed, const char *name) {
    if (__builtin_expect(armed, 0)) shm_crash_check(name);
}
/* off the fast path: the global, read at each point */
static inline void shm_crashpoint(const char *name) { shm_crashpoint_at(shm_crash_armed, name); }
/* On the fast path the caller reads shm_crash_armed once per Python call and passes it down
 * as `armed`: each point is then a test of a register, not a load of the global. */

/* ---- the deadline a recovery must keep ----
 * A waiter that recovers a dead participant does it on its own time: the calling thread's
 * acquire deadline (CLOCK_MONOTONIC ns, -1: none) bounds each wait inside the recovery (the
 * repair mutex, live participants settling); a wait cut short sets shm_recover_cut, and
 * the recovery stops there, leaving the rest to the next waiter (participants.pxi). Set on
 * the slow path only. */
static __thread int64_t shm_recover_deadline = -1;
static __thread int shm_recover_cut = 0;

/* ---- the debug trace (SHMLOCKS_DEBUG builds only; nothing at all otherwise) ----
 * shm_trace(what, a, b, c) appends one event to a ring in an anonymous shared mapping that
 * _core._trace_open() makes: processes forked after it write to the same ring, so the one
 * counter orders every traced step of every process. `what` is a string literal: its
 * address is the same in every process forked from the one that made the ring, which reads
 * it back (_core._trace_dump()). The torture prints the ring on a violation or a wedge. */
typedef struct shm_trace_ent {
    uint64_t seq;              /* index + 1 once written (0: never written) */
    uint64_t what;             /* const char * */
    uint32_t pid, tid;
    uint64_t a, b, c;
} shm_trace_ent;
static shm_trace_ent *shm_trace_ring = 0;
static uint64_t *shm_trace_count = 0;
static uint64_t shm_trace_mask = 0;
#ifdef SHMLOCKS_DEBUG
static inline void shm_trace(const char *what, uint64_t a, uint64_t b, uint64_t c) {
    if (shm_trace_ring) {
        uint64_t i = __atomic_fetch_add(shm_trace_count, 1, SEQ);
        shm_trace_ent *e = &shm_trace_ring[i & shm_trace_mask];
        __atomic_store_n(&e->seq, 0, RLX);
        e->what = (uint64_t)(uintptr_t)what;
        e->pid = (uint32_t)getpid();
        e->tid = (uint32_t)syscall(SYS_gettid);
        e->a = a; e->b = b; e->c = c;
        __atomic_store_n(&e->seq, i + 1, REL);
    }
}
#define SHM_TRACE_BUILT 1
#else
#define shm_trace(what, a, b, c) ((void)0)
#define SHM_TRACE_BUILT 0
#endif

/* publish (lock index + 1, step) in a participant's op_lock/op_step pair with one store;
 * release order: everything before it is visible first, and the SC atomics that follow
 * cannot be seen before it */
static inline void shm_op_set(uint32_t *op_lock, uint32_t lock1, uint32_t step) {
    __atomic_store_n((uint64_t *)(void *)op_lock, (uint64_t)lock1 | ((uint64_t)step << 32), REL);
}

#endif
