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


/* ---- a blocking sleep on more words than one futex_waitv takes (docs/design.md §12) ----
 * A toolbox waiter may depend on more participants than SHM_WAITV_MAX - 1 (a Semaphore of
 * 200 units, each held by a `with` of another thread). futex_waitv(2) takes 128 words;
 * io_uring lets the thread sleep on several FUTEX_WAITV requests at once: each thread has
 * a ring of its own for that (made at its first such sleep, closed at its exit; a fork's
 * child makes its own), submits ceil(n / 128) requests, waits for the first completion
 * (or the deadline, or a signal), then cancels the others and reaps every completion
 * before it returns (the arrays are its own until then). The words past the first 128
 * are collected in the thread's list (shm_many_add) by the waiter that depends on them,
 * which claims the list first (shm_many_claim: a generation, so that a nested waiter, a
 * signal handler's, that takes the list over is noticed, and the outer sleep then falls
 * back to slices). */
#define SHM_MANY_MAXREQ 40            /* requests per sleep: 5,120 words */
#define SHM_MANY_RING 128             /* its ring's submission slots (requests + cancels) */
typedef struct shm_many {
    shm_uring r;
    int ring_pid;                     /* the process that made r (0: none made) */
    uint64_t gen;                     /* bumped at each claim of the list */
    uint32_t **words;                 /* the collected words, their values, whose token */
    uint32_t *vals;
    uint32_t *slots;
    int n, cap;
    struct shm_waitv *v;              /* the requests' arrays, SHM_WAITV_MAX per request */
    int vcap;
} shm_many;

static pthread_key_t shm_many_key;
static pthread_once_t shm_many_once = PTHREAD_ONCE_INIT;
static __thread shm_many *shm_many_tls;

static void shm_many_free(void *p) {
    shm_many *m = (shm_many *)p;
    if (m == NULL) return;
    if (m->ring_pid == getpid()) shm_uring_close(&m->r);
    free(m->words);
    free(m->vals);
    free(m->slots);
    free(m->v);
    free(m);
}
static void shm_many_make_key(void) {
    pthread_key_create(&shm_many_key, shm_many_free);
}

/* The calling thread's list, claimed for a new sleep (emptied, its generation bumped: the
 * caller keeps it, and the list is still its own while shm_many_gen(m) says so), or NULL
 * (no memory). */
static inline shm_many *shm_many_claim(uint64_t *gen) {
    shm_many *m = shm_many_tls;
    if (m == NULL) {
        pthread_once(&shm_many_once, shm_many_make_key);
        m = (shm_many *)calloc(1, sizeof *m);
        if (m == NULL) return NULL;
        shm_uring_zero(&m->r);
        shm_many_tls = m;
        pthread_setspecific(shm_many_key, m);
    }
    m->gen++;
    m->n = 0;
    *gen = m->gen;
    return m;
}
static inline uint64_t shm_many_gen(shm_many *m) { return m->gen; }
static inline int shm_many_count(shm_many *m) { return m->n; }
static inline uint32_t shm_many_word_slot(shm_many *m, int i) { return m->slots[i]; }
static inline uint32_t *shm_many_word(shm_many *m, int i) { return m->words[i]; }

/* Add a word (that must still hold val) of participant `slot`'s token: 0, or -ENOMEM,
 * -E2BIG (more than one sleep takes). */
static inline int shm_many_add(shm_many *m, uint32_t *word, uint32_t val, uint32_t slot) {
    if (m->n >= m->cap) {
        int cap = m->cap ? 2 * m->cap : 256;
        uint32_t **w;
        uint32_t *v, *s;
        if (cap > SHM_MANY_MAXREQ * SHM_WAITV_MAX) cap = SHM_MANY_MAXREQ * SHM_WAITV_MAX;
        if (m->n >= cap) return -E2BIG;
        w = (uint32_t **)realloc(m->words, cap * sizeof *w);
        if (w == NULL) return -ENOMEM;
        m->words = w;
        v = (uint32_t *)realloc(m->vals, cap * sizeof *v);
        if (v == NULL) return -ENOMEM;
        m->vals = v;
        s = (uint32_t *)realloc(m->slots, cap * sizeof *s);
        if (s == NULL) return -ENOMEM;
        m->slots = s;
        m->cap = cap;
    }
    m->words[m->n] = word;
    m->vals[m->n] = val;
    m->slots[m->n] = slot;
    m->n++;
    return 0;
}

static inline int shm_many_ring(shm_many *m) {
    int e;
    if (m->ring_pid == getpid()) return 0;
    if (m->ring_pid != 0) {
        /* made before a fork: the child's copies of the parent's ring go, unused */
        shm_uring_close(&m->r);
        m->ring_pid = 0;
    }
    e = shm_uring_setup(&m->r, SHM_MANY_RING, 2 * SHM_MANY_RING);
    if (e < 0) return e;
    m->ring_pid = getpid();
    return 0;
}

/* Sleep on w1[0..n1) and the list's words until one of them is woken, or changed before
 * its request was armed, or the deadline (absolute CLOCK_MONOTONIC ns, -1: none), or a
 * signal: the woken word's index (in w1, then the list's after n1), -EAGAIN, -ETIMEDOUT,
 * -EINTR; -ENOSYS if the thread cannot (no ring, too many words: the caller sleeps in
 * slices). Every request is over (completed or cancelled, and reaped) when it returns. */
static inline int shm_many_sleep(shm_many *m, uint32_t **w1, const uint32_t *v1, int n1,
                                 int64_t deadline_ns) {
    int n = n1 + m->n, nreq, k, i, e, pending, cancels = 0, res = -ETIMEDOUT, won = 0;
    unsigned char done[SHM_MANY_MAXREQ];
    uint64_t ud;
    int32_t cres;
    nreq = (n + SHM_WAITV_MAX - 1) / SHM_WAITV_MAX;
    if (nreq < 1 || nreq > SHM_MANY_MAXREQ || shm_many_ring(m) < 0) return -ENOSYS;
    if (m->vcap < nreq * SHM_WAITV_MAX) {
        struct shm_waitv *v = (struct shm_waitv *)realloc(
            m->v, (size_t)nreq * SHM_WAITV_MAX * sizeof *v);
        if (v == NULL) return -ENOSYS;
        m->v = v;
        m->vcap = nreq * SHM_WAITV_MAX;
    }
    for (i = 0; i < n; i++) {
        if (i < n1) shm_waitv_fill(&m->v[i], w1[i], v1[i]);
        else shm_waitv_fill(&m->v[i], m->words[i - n1], m->vals[i - n1]);
    }
    for (k = 0; k < nreq; k++) {
        int cnt = n - k * SHM_WAITV_MAX;
        if (cnt > SHM_WAITV_MAX) cnt = SHM_WAITV_MAX;
        done[k] = 0;
        shm_uring_prep_waitv(&m->r, &m->v[k * SHM_WAITV_MAX], (unsigned)cnt, (uint64_t)k + 1);
    }
    e = shm_uring_submit(&m->r);
    if (e != nreq) {
        /* not all submitted (a ring that cannot take them): drop the ring, which cancels
         * what it took; the caller sleeps in slices */
        shm_uring_close(&m->r);
        m->ring_pid = 0;
        return -ENOSYS;
    }
    e = shm_uring_enter(&m->r, 1, deadline_ns);   /* the first completion */
    if (e == -EINTR) res = -EINTR;
    pending = nreq;
    for (;;) {
        while (shm_uring_reap(&m->r, &ud, &cres)) {
            if (ud & ((uint64_t)1 << 63)) {
                cancels--;
                continue;
            }
            k = (int)ud - 1;
            if (k < 0 || k >= nreq || done[k]) continue;
            done[k] = 1;
            pending--;
            if (won) continue;
            if (cres >= 0) {
                res = k * SHM_WAITV_MAX + cres;
                won = 1;
            } else if (cres == -EAGAIN) {
                res = -EAGAIN;
                won = 1;
            }
        }
        if (pending == 0 && cancels == 0) return res;
        if (cancels == 0) {
            /* the first completion (or the deadline, or a signal) ends the sleep: cancel
             * the requests still pending, then reap them all */
            for (k = 0; k < nreq; k++) {
                if (done[k]) continue;
                if (shm_uring_prep_cancel(&m->r, (uint64_t)k + 1,
                                          ((uint64_t)k + 1) | ((uint64_t)1 << 63)) == 0)
                    cancels++;
            }
            if (cancels == 0 && pending > 0) {      /* no room to cancel (cannot be) */
                shm_uring_close(&m->r);
                m->ring_pid = 0;
                return res;
            }
        }
        e = shm_uring_enter(&m->r, 1, -1);
        if (e < 0 && e != -EINTR && e != -ETIME) {
            shm_uring_close(&m->r);
            m->ring_pid = 0;
            return res;
        }
    }
}


#endif
