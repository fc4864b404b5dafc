/*
 * shm_uring.h -- futex waits through io_uring (Linux 6.7+, IORING_OP_FUTEX_WAITV): a thread
 * that must not block (an event loop's) arms a wait on a watch set (docs/design.md §5,
 * "Resumable waits") and is told by a completion, reaped from its ring, or by an eventfd
 * registered with the ring that a loop watches. Raw system calls on mmap'ed rings, no
 * liburing. The words are shared (never FUTEX2_PRIVATE): they live in segments mapped by
 * several processes.
 *
 * The rules the kernel imposes (each met on this machine, tests/test_nbwait.py):
 *   - completions are task work of the thread that submitted: that thread reaps them
 *     (another thread's io_uring_enter does not run them);
 *   - COOP_TASKRUN, never DEFER_TASKRUN: with DEFER_TASKRUN an epoll on the ring fd never
 *     wakes and a registered eventfd wakes late;
 *   - FUTEX_WAITV: addr = a struct futex_waitv array, len = 1..128; fd, off (addr2), addr3
 *     and the op flags 0 (else -EINVAL); each entry's flags FUTEX2_SIZE_U32;
 *   - a word that no longer holds its value when the wait is armed completes at once with
 *     -EAGAIN: the caller looks again;
 *   - the array is read when the request is prepared (at submission) but is kept alive by
 *     the caller until its completion is reaped (or the ring is closed), as the interface's
 *     contract, whatever a kernel version does;
 *   - IORING_OP_ASYNC_CANCEL by user_data: the wait completes with -ECANCELED, the cancel
 *     with the number of requests it cancelled (or -ENOENT: none was pending any more).
 */
#ifndef SHM_URING_H
#define SHM_URING_H

#include "shm_sys.h"
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <linux/io_uring.h>

/* newer than some distributions' uapi headers */
#define SHM_IORING_OP_FUTEX_WAITV 53
#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8)
#endif
#ifndef IORING_ENTER_EXT_ARG
#define IORING_ENTER_EXT_ARG (1U << 3)
#endif
#ifndef IORING_SQ_CQ_OVERFLOW
#define IORING_SQ_CQ_OVERFLOW (1U << 1)
#endif
#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#define __NR_io_uring_enter 426
#define __NR_io_uring_register 427
#endif

/* one ring: its mappings and where each shared index lives in them */
typedef struct shm_uring {
    int fd;                     /* the ring (-1: none) */
    int efd;                    /* an eventfd registered with it (-1: none) */
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *sq_flags, sq_entries;
    unsigned *cq_head, *cq_tail, *cq_mask, cq_entries;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_map, *cq_map;
    size_t sq_map_sz, cq_map_sz, sqe_map_sz;
    unsigned queued;            /* SQEs written and not yet submitted */
} shm_uring;

static inline void shm_uring_zero(shm_uring *r) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    r->efd = -1;
}

static inline void shm_uring_close(shm_uring *r) {
    /* Closing the ring cancels what is still pending; the arrays were copied when each
     * request was prepared, so the caller may free them after this. */
    if (r->sqes != NULL && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqe_map_sz);
    if (r->cq_map != NULL && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_map_sz);
    if (r->sq_map != NULL && r->sq_map != MAP_FAILED) munmap(r->sq_map, r->sq_map_sz);
    if (r->efd >= 0) close(r->efd);
    if (r->fd >= 0) close(r->fd);
    shm_uring_zero(r);
}

/* A ring of `entries` submission slots and `cq_entries` completion slots (0: the kernel's
 * default, twice entries), COOP_TASKRUN. 0, or -errno: -ENOSYS (no io_uring), -EPERM
 * (disabled: the kernel.io_uring_disabled sysctl, a seccomp filter), -ENOMEM. */
static inline int shm_uring_setup(shm_uring *r, unsigned entries, unsigned cq_entries) {
    struct io_uring_params p;
    char *sq, *cq;
    long fd;
    shm_uring_zero(r);
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_CLAMP;
    if (cq_entries) {
        p.flags |= IORING_SETUP_CQSIZE;
        p.cq_entries = cq_entries;
    }
    fd = syscall(__NR_io_uring_setup, entries, &p);
    if (fd < 0) return -errno;
    r->fd = (int)fd;
    fcntl(r->fd, F_SETFD, FD_CLOEXEC);
    r->sq_map_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_map_sz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        if (r->cq_map_sz > r->sq_map_sz) r->sq_map_sz = r->cq_map_sz;
        r->cq_map_sz = r->sq_map_sz;
    }
    sq = mmap(NULL, r->sq_map_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
              IORING_OFF_SQ_RING);
    r->sq_map = sq;
    if (sq == MAP_FAILED) goto fail;
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        cq = sq;
    } else {
        cq = mmap(NULL, r->cq_map_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                  IORING_OFF_CQ_RING);
        if (cq == MAP_FAILED) { r->cq_map = cq; goto fail; }
    }
    r->cq_map = cq;
    r->sqe_map_sz = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqe_map_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                   IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) goto fail;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->sq_flags = (unsigned *)(sq + p.sq_off.flags);
    r->sq_entries = p.sq_entries;
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    r->cq_entries = p.cq_entries;
    return 0;
fail:
    shm_uring_close(r);
    return -ENOMEM;
}

/* An eventfd (non-blocking, close-on-exec) the kernel signals at each completion, for an
 * event loop to watch (loop.add_reader). Its fd, or -errno. */
static inline int shm_uring_eventfd(shm_uring *r) {
    int efd;
    if (r->efd >= 0) return r->efd;
    efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) return -errno;
    if (syscall(__NR_io_uring_register, r->fd, IORING_REGISTER_EVENTFD, &efd, 1) < 0) {
        int e = errno;
        close(efd);
        return -e;
    }
    r->efd = efd;
    return efd;
}

static inline struct io_uring_sqe *shm_uring_sqe(shm_uring *r) {
    unsigned tail = *r->sq_tail;
    unsigned head = __atomic_load_n(r->sq_head, ACQ);
    struct io_uring_sqe *s;
    if (tail - head >= r->sq_entries) return NULL;
    s = &r->sqes[tail & *r->sq_mask];
    memset(s, 0, sizeof *s);
    r->sq_array[tail & *r->sq_mask] = tail & *r->sq_mask;
    __atomic_store_n(r->sq_tail, tail + 1, REL);
    r->queued++;
    return s;
}

/* Queue a FUTEX_WAITV on v[0..n) (1 <= n <= SHM_WAITV_MAX, entries filled by the caller:
 * shm_waitv_fill), its completion to carry user_data. 0, or -EBUSY (the submission queue
 * is full: submit first), -EINVAL. The caller keeps v alive until the completion. */
static inline int shm_uring_prep_waitv(shm_uring *r, struct shm_waitv *v, unsigned n,
                                       uint64_t user_data) {
    struct io_uring_sqe *s;
    if (n < 1 || n > SHM_WAITV_MAX) return -EINVAL;
    s = shm_uring_sqe(r);
    if (s == NULL) return -EBUSY;
    s->opcode = SHM_IORING_OP_FUTEX_WAITV;
    s->addr = (uint64_t)(uintptr_t)v;
    s->len = n;
    s->user_data = user_data;
    return 0;
}

/* Queue the cancellation of the request whose user_data is `target`; its own completion
 * carries user_data. 0 or -EBUSY. */
static inline int shm_uring_prep_cancel(shm_uring *r, uint64_t target, uint64_t user_data) {
    struct io_uring_sqe *s = shm_uring_sqe(r);
    if (s == NULL) return -EBUSY;
    s->opcode = IORING_OP_ASYNC_CANCEL;
    s->addr = target;
    s->user_data = user_data;
    return 0;
}

/* Fill a futex_waitv entry: a shared 32-bit word that must still hold val. */
static inline void shm_waitv_fill(struct shm_waitv *e, uint32_t *word, uint32_t val) {
    e->val = val;
    e->uaddr = (uint64_t)(uintptr_t)word;
    e->flags = SHM_FUTEX2_SIZE_U32;       /* shared: no FUTEX2_PRIVATE */
    e->reserved = 0;
}

/* io_uring_enter: submit what is queued and, with min_complete > 0, wait until that many
 * completions are ready or the deadline (absolute CLOCK_MONOTONIC ns; -1 none) passes.
 * The number submitted, or -errno: -ETIME (the deadline), -EINTR (a signal). */
static inline int shm_uring_enter(shm_uring *r, unsigned min_complete, int64_t deadline_ns) {
    unsigned n = r->queued;
    unsigned flags = 0;
    struct io_uring_getevents_arg arg;
    struct __kernel_timespec ts;
    void *argp = NULL;
    size_t argsz = 0;
    long rc;
    if (min_complete > 0 || (__atomic_load_n(r->sq_flags, ACQ) & IORING_SQ_CQ_OVERFLOW))
        flags |= IORING_ENTER_GETEVENTS;
    if (min_complete > 0 && deadline_ns >= 0) {
        int64_t rel = deadline_ns - shm_now_ns();
        if (rel < 0) rel = 0;
        ts.tv_sec = rel / 1000000000LL;
        ts.tv_nsec = rel % 1000000000LL;
        memset(&arg, 0, sizeof arg);
        arg.ts = (uint64_t)(uintptr_t)&ts;
        argp = &arg;
        argsz = sizeof arg;
        flags |= IORING_ENTER_EXT_ARG;
    }
    rc = syscall(__NR_io_uring_enter, r->fd, n, min_complete, flags, argp, argsz);
    if (rc < 0) return -errno;
    r->queued = (unsigned)rc < n ? n - (unsigned)rc : 0;
    return (int)rc;
}

static inline int shm_uring_submit(shm_uring *r) {
    return shm_uring_enter(r, 0, -1);
}

/* Take one completion off the ring: 1 (its user_data and result), or 0 if none is ready.
 * A completion may wait in the kernel as task work until this thread enters it: a caller
 * that finds none after its eventfd fired calls shm_uring_enter(r, 0, -1) once first. */
static inline int shm_uring_reap(shm_uring *r, uint64_t *user_data, int32_t *res) {
    unsigned head = *r->cq_head;
    struct io_uring_cqe *c;
    if (head == __atomic_load_n(r->cq_tail, ACQ)) return 0;
    c = &r->cqes[head & *r->cq_mask];
    *user_data = c->user_data;
    *res = c->res;
    __atomic_store_n(r->cq_head, head + 1, REL);
    return 1;
}

/* Read (and so reset) the ring's eventfd: how many completions it counted, 0 if none. */
static inline uint64_t shm_uring_drain_eventfd(shm_uring *r) {
    uint64_t x = 0;
    if (r->efd < 0 || read(r->efd, &x, sizeof x) != (ssize_t)sizeof x) return 0;
    return x;
}

/* Can this thread wait on futex words through io_uring? 1 yes; 0 the kernel has io_uring
 * but not FUTEX_WAITV (before Linux 6.7), or a trial wait did not behave; -errno if
 * io_uring itself is refused (-ENOSYS: not built in; -EPERM: disabled by the
 * kernel.io_uring_disabled sysctl or a seccomp filter). The trial: a FUTEX_WAITV on a word
 * that does not hold the value given must complete at once with -EAGAIN. */
static inline int shm_uring_probe(void) {
    shm_uring r;
    struct io_uring_probe *p;
    size_t psz = sizeof(struct io_uring_probe) + 256 * sizeof(struct io_uring_probe_op);
    struct shm_waitv v;
    uint32_t word = 1;
    uint64_t ud = 0;
    int32_t res = 0;
    int ok = 0, e, i;
    e = shm_uring_setup(&r, 2, 0);
    if (e < 0) return e;
    p = calloc(1, psz);
    if (p == NULL) { shm_uring_close(&r); return -ENOMEM; }
    if (syscall(__NR_io_uring_register, r.fd, IORING_REGISTER_PROBE, p, 256) == 0
            && p->last_op >= SHM_IORING_OP_FUTEX_WAITV
            && (p->ops[SHM_IORING_OP_FUTEX_WAITV].flags & IO_URING_OP_SUPPORTED)) {
        shm_waitv_fill(&v, &word, 0);
        if (shm_uring_prep_waitv(&r, &v, 1, 53) == 0
                && shm_uring_enter(&r, 1, shm_now_ns() + 1000000000LL) >= 0) {
            for (i = 0; i < 3 && !ok; i++) {
                if (shm_uring_reap(&r, &ud, &res))
                    ok = ud == 53 && res == -EAGAIN;
                else
                    shm_uring_enter(&r, 1, shm_now_ns() + 100000000LL);
            }
        }
    }
    free(p);
    shm_uring_close(&r);
    return ok;
}

#endif
