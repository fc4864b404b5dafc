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
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

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

/* futex_waitv(2) (Linux 5.16+): sleep until one of n (<= SHM_WAITV_MAX) shared 32-bit
 * words is woken, none of them holding its expected value on entry (then EAGAIN at once),
 * or the absolute CLOCK_MONOTONIC deadline (-1: none). Returns the index of the word woken,
 * or -errno: -EAGAIN, -ETIMEDOUT, -EINTR (a signal handler ran), -ENOSYS (the kernel has no
 * futex_waitv: the caller falls back to one word with FUTEX_WAIT). */
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
/* futex_waitv's own limit (the kernel's FUTEX_WAITV_MAX): a lock waiter's set holds a few
 * words, a toolbox waiter's one per participant it depends on (docs/design.md §12) */
#define SHM_WAITV_MAX 128
struct shm_waitv {                  /* struct futex_waitv, spelled here for older headers */
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};
#define SHM_FUTEX2_SIZE_U32 0x02
static inline int shm_futex_waitv(uint32_t **words, const uint32_t *vals, int n,
                                  int64_t deadline_ns) {
    struct shm_waitv v[SHM_WAITV_MAX];
    struct timespec ts, *tsp = NULL;
    int i;
    if (n < 0 || n > SHM_WAITV_MAX)
        return -EINVAL;
    for (i = 0; i < n; i++) {
        v[i].val = vals[i];
        v[i].uaddr = (uint64_t)(uintptr_t)words[i];
        v[i].flags = SHM_FUTEX2_SIZE_U32;         /* shared: no FUTEX2_PRIVATE */
        v[i].reserved = 0;
    }
    if (deadline_ns >= 0) {
        ts.tv_sec = (time_t)(deadline_ns / 1000000000LL);
        ts.tv_nsec = (long)(deadline_ns % 1000000000LL);
        tsp = &ts;
    }
    long r = syscall(SYS_futex_waitv, v, (unsigned)n, 0, tsp, CLOCK_MONOTONIC);
    return r >= 0 ? (int)r : -errno;
}

/* The calling thread's robust list (glibc registers its head at thread start): name a
 * futex word the list's pending operation while we sleep on it, so that at our death the
 * kernel treats it as a lock we were taking (a woken waiter that dies passes the wake-up
 * on, if the word's owner is gone). Only when glibc is not itself mid-operation. Returns
 * the head to clear, or NULL. */
static inline void *shm_robust_pending_set(uint32_t *word) {
    struct robust_list_head *h = NULL;
    size_t len = 0;
    if (syscall(SYS_get_robust_list, 0, &h, &len) != 0 || h == NULL
            || len != sizeof(*h) || h->list_op_pending != NULL)
        return NULL;
    h->list_op_pending = (struct robust_list *)(void *)((char *)word - h->futex_offset);
    return h;
}
static inline void shm_robust_pending_clear(void *h) {
    ((struct robust_list_head *)h)->list_op_pending = NULL;
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
/* lock.acquire.done fires only for this lock if set (shmlocks/testing.py: the segment
   file's inode and the lock's number + 1); 0: for any lock */
static uint64_t shm_crash_only_ino = 0;
static uint32_t shm_crash_only_lock1 = 0;
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
/* a point in the hold of lock (ino, lock1): fires only for the lock set by
   shm_crash_only_* (if any) */
static __attribute__((noinline, cold)) void shm_crash_check_lock(const char *name,
                                                                 uint64_t ino, uint32_t lock1) {
    if (shm_crash_only_lock1 == 0 || (lock1 == shm_crash_only_lock1 && ino == shm_crash_only_ino))
        shm_crash_check(name);
}
static inline void shm_crashpoint_lock_at(int armed, const char *name, uint64_t ino,
                                          uint32_t lock1) {
    if (__builtin_expect(armed, 0)) shm_crash_check_lock(name, ino, lock1);
}
/* off the fast path: the global, read at each point */
static inline void shm_crashpoint(const char *name) { shm_crashpoint_at(shm_crash_armed, name); }
/* On the fast path the caller reads shm_crash_armed once per Python call and passes it down
 * as `armed`: each point is then a test of a register, not a load of the global. */

/* ---- re-entry windows (docs/design.md §4; participants.pxi window_enter) ----
 * The regions whose participant this thread hides while Python code runs inside its wait
 * or recovery, and that participant's registration: a stack, SHM_WINDOW_MAX deep. */
#define SHM_WINDOW_MAX 8
static __thread void *shm_win_rm[SHM_WINDOW_MAX];
static __thread void *shm_win_reg[SHM_WINDOW_MAX];
static __thread int shm_win_n = 0;

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

/* ---- glibc's robust mutexes in the segment: every call goes through shm_pm_* ----
 * The tokens, the directory and repair mutexes and the robust/pi lock words are glibc
 * pthread mutexes that live in the segment, and the segment is hostile input: glibc
 * assert()s (abort: the interpreter dies) on mutex states it could not have made itself.
 * Read from glibc 2.36 nptl/pthread_mutex_{lock,timedlock,trylock,unlock}.c, the asserts a
 * mutex's own fields can reach are:
 *   - __kind: any kind but the one pthread_mutex_init gave it. A PP kind reaches
 *     __pthread_tpp_change_priority's `new_prio == -1 || ...` and the PP paths'
 *     `__owner == 0`; a non-robust PI kind `robust || !(oldval & FUTEX_OWNER_DIED)` and
 *     trylock's `robust`; unknown low bits unlock's `type == ERRORCHECK`; the elision bits
 *     an xend outside a transaction (SIGSEGV).  So a kind that is not exactly ours makes
 *     the call fail with EINVAL, never reach glibc (a mutex we hold, whose kind changed
 *     under us, gets ours back first: its owner may repair it, and glibc must unlink it
 *     from our robust list).
 *   - __lock of a robust PI mutex naming a thread FUTEX_LOCK_PI cannot attach to: one that
 *     does not exist (ESRCH: clocklock asserts `e != ESRCH || !robust`) or a kernel thread
 *     (EPERM, which glibc's futex_lock_pi64 takes for a fatal error and aborts: "The futex
 *     facility returned an unexpected error code").  The kernel never leaves such a word
 *     behind (a dying owner's robust-list walk clears its TID and sets FUTEX_OWNER_DIED),
 *     but a copy of the segment, a scribble, or an owner whose robust list was longer than
 *     the kernel walks can.  shm_pm_clocklock does first what the kernel would have done
 *     at that owner's death: a CAS of the word to FUTEX_OWNER_DIED (keeping
 *     FUTEX_WAITERS), so the lock comes back EOWNERDEAD and is recovered with owner_died.
 *     "Cannot attach" is what FUTEX_LOCK_PI will find: no task with that TID in the
 *     caller's PID namespace (kill(tid, 0) == ESRCH), an exited one (state Z/X in
 *     /proc/TID/stat) or a kernel thread (PF_KTHREAD there).  The pi kind refuses a region
 *     of another PID namespace (pi.pxi), so a holder's TID is always one of ours.
 *     Remaining windows, both opened only by foreign bytes written into the word: a word
 *     naming a live thread that does NOT hold it, which exits between the check and the
 *     system call (ESRCH: abort); and a word rewritten while kernel waiters are attached
 *     to another owner, then released by us (FUTEX_UNLOCK_PI: EINVAL, fatal to glibc).
 *     No owner of ours opens either (participants.pxi bounds the robust list).
 * __count, __owner, __nusers and __spins reach no assert for our kinds (ENOTRECOVERABLE,
 * EPERM at worst). __list is glibc's robust-list link, rewritten by glibc at every lock:
 * trusted while held (docs/design.md §7.4). */
static int shm_pm_kind_robust = -1;   /* __kind of a robust, process-shared mutex */
static int shm_pm_kind_pi = -1;       /* ... with PTHREAD_PRIO_INHERIT */
#define SHM_PM_CORRUPT EINVAL         /* what the guards return for a foreign kind */

static inline int shm_pm_kind(pthread_mutex_t *m) {
    return __atomic_load_n(&m->__data.__kind, RLX);
}
static inline int shm_pm_kind_ok(pthread_mutex_t *m, int pi) {
    return shm_pm_kind(m) == (pi ? shm_pm_kind_pi : shm_pm_kind_robust);
}
static inline void shm_pm_learn_kinds(pthread_mutex_t *robust, pthread_mutex_t *pi) {
    shm_pm_kind_robust = shm_pm_kind(robust);
    shm_pm_kind_pi = shm_pm_kind(pi);
}

/* Is there no thread `tid` FUTEX_LOCK_PI can attach to? (see above) None with that TID
 * (the kernel: ESRCH), an exited one (ESRCH), or a kernel thread (the kernel: EPERM, which
 * glibc's futex_lock_pi64 takes for a fatal error: "The futex facility returned an
 * unexpected error code", abort). A kernel thread never holds a user futex. */
#define SHM_PF_KTHREAD 0x00200000u    /* include/linux/sched.h */
static __attribute__((noinline)) int shm_tid_gone(uint32_t tid) {
    char path[48], buf[640], *p;
    unsigned long flags = 0;
    int fd, i;
    ssize_t n;
    if (kill((pid_t)tid, 0) != 0) return errno == ESRCH;
    snprintf(path, sizeof path, "/proc/%u/stat", tid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;                 /* unknown: taken as alive */
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ') return 0;
    p += 2;                               /* field 3, the state */
    if (*p == 'Z' || *p == 'X') return 1;
    for (i = 3; i < 9 && p != NULL; i++) {     /* on to field 9, the flags */
        p = strchr(p, ' ');
        if (p) p++;
    }
    if (p != NULL) flags = strtoul(p, NULL, 10);
    return (flags & SHM_PF_KTHREAD) != 0;
}

/* A PI word naming a thread that is gone: mark it as the kernel marks a dead owner's. */
static inline void shm_pi_reap(pthread_mutex_t *m) {
    uint32_t *w = (uint32_t *)(void *)m;
    uint32_t v = __atomic_load_n(w, ACQ);
    uint32_t tid = v & FUTEX_TID_MASK;
    if (tid == 0 || tid == shm_gettid() || !shm_tid_gone(tid)) return;
    __atomic_compare_exchange_n(w, &v, (v & FUTEX_WAITERS) | FUTEX_OWNER_DIED, 0, SEQ, SEQ);
}

/* trylock: glibc's pi trylock sees FUTEX_OWNER_DIED, asks FUTEX_TRYLOCK_PI, ignores its
 * ESRCH and returns EOWNERDEAD with the dead TID still in the word (the release then fails,
 * EPERM). OWNER_DIED with a TID is only ever a live locker's passing state: reap it first. */
static inline int shm_pm_trylock(pthread_mutex_t *m, int pi) {
    if (__builtin_expect(!shm_pm_kind_ok(m, pi), 0)) return SHM_PM_CORRUPT;
    if (pi) {
        uint32_t v = __atomic_load_n((uint32_t *)(void *)m, RLX);
        if (__builtin_expect((v & FUTEX_OWNER_DIED) && (v & FUTEX_TID_MASK), 0)) shm_pi_reap(m);
    }
    return pthread_mutex_trylock(m);
}
static inline int shm_pm_clocklock(pthread_mutex_t *m, int pi, const struct timespec *ts) {
    if (!shm_pm_kind_ok(m, pi)) return SHM_PM_CORRUPT;
    if (pi) shm_pi_reap(m);
    return pthread_mutex_clocklock(m, CLOCK_MONOTONIC, ts);
}
static inline int shm_pm_unlock(pthread_mutex_t *m, int pi) {
    if (__builtin_expect(!shm_pm_kind_ok(m, pi), 0)) {
        if ((__atomic_load_n((uint32_t *)(void *)m, ACQ) & FUTEX_TID_MASK) != shm_gettid())
            return EPERM;                 /* not ours: glibc would say the same */
        __atomic_store_n(&m->__data.__kind, pi ? shm_pm_kind_pi : shm_pm_kind_robust, RLX);
    }
    return pthread_mutex_unlock(m);
}
static inline int shm_pm_consistent(pthread_mutex_t *m, int pi) {
    if (!shm_pm_kind_ok(m, pi)) return SHM_PM_CORRUPT;
    return pthread_mutex_consistent(m);
}

#endif
