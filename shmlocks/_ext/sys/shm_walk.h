/*
 * shm_walk.h -- the deadlock chain walk (docs/design.md §9): is there a wait-for cycle
 * through this waiter, and who must give it up?  C, without the GIL, bounded, its heap one
 * fixed block (its context) and the victim's description; its cost follows the chain,
 * never the machine.
 *
 * A node of the wait-for graph is a thread, or an asyncio task acting through a cohort
 * participant: (pidns, pid, tid, tstart, task_id), task_id 0 for a thread.  From me, the
 * lock I wait for -> its holder(s) -> each holder's record: its key (mine: a cycle), and
 * its wait: a WAITING step on a lock of the same segment, or its wait link (lines 2-3 of
 * shm_participant) to a lock of another segment (a lock is named by its number, as
 * participants.pxd lock_at decodes it: a directory entry, or a stripe of the segment's
 * lock table, whose header is validated as participants.pxi table_load validates it), validated against the waiter's record it
 * names -> that lock's holder(s) -> ... breadth first, until every branch ends (a live
 * holder that waits for nothing), comes back to me, or a bound is hit (DLW_DEPTH deep,
 * DLW_NODES nodes, DLW_SEGS segments, DLW_WORK_MAX records read: then no cycle is
 * claimed).  Dead participants make
 * no edge; an RWLock's waiter has the edges shmlocks/_segment.py rw_waits_for gives (a
 * reader: the writer of its tag's phase; a writer: the writer present, or every reader it
 * drains, an AND-wait).
 *
 * Every byte read is hostile input.  The walker's own region is read through its mapping
 * (validated by Region.open), every index bounds-checked against the live part_hwm and
 * nothing past what is provisioned touched; any other segment is opened by name under
 * SHM_WALK_DIR with O_RDONLY|O_NOFOLLOW|O_NONBLOCK (a symlink fails, a FIFO never blocks),
 * fstat'ed (a regular file owned by a trusted uid: ours, root, SHMLOCKS_TRUST_UIDS, as
 * shmlocks/_shmread.py trusts), its header validated as Region.open validates one, and read
 * with pread into private buffers, only the lines the chain needs: a short read (a file
 * truncated meanwhile) ends the branch, never SIGBUS.
 *
 * A cycle is believed only if a second walk, every read of it after every read of the
 * first, finds the same one (each member in the same wait: same key, lock and since).  A
 * member waiting in both walks waited all along in between, and a waiting thread takes or
 * gives up no lock, so every edge of the cycle held at the instant between the walks: a
 * real deadlock, never one pieced together from records of different moments.
 *
 * The victim: of the members of the strongly connected set through me that the walk saw
 * (the cycle itself when every wait has one edge), the one that began to wait last among
 * those that detect (their process has a deadlock timeout), ties by key.  Every walker
 * computes it from the same records, so all agree.  A walker that is not the victim pokes
 * it: bumps the `poke` word of the victim's wait record (or of the record holding its
 * link) and wakes it; every sleep of a waiter watches its own poke word.
 */
#ifndef SHM_WALK_H
#define SHM_WALK_H

#include "shm_sys.h"
#include "shm_layout.h"
#include "shm_toolbox.h"
#include "shm_rwlock.h"
#include <sys/stat.h>
#include <sys/mman.h>
#include <stddef.h>

#define SHM_WALK_DIR  "/dev/shm/"      /* region.pxi's SHM_DIR, with its slash */
#define DLW_DEPTH     64                /* members of a chain, at most */
#define DLW_NODES     256               /* nodes a walk visits, at most */
#define DLW_SEGS      32                /* segments a walk reads, at most */
#define DLW_EDGES     1024
#define DLW_TRUST_MAX 32
#define DLW_NAME      201               /* a segment name, NUL included */
#define DLW_RWCHUNK   16                /* an RWLock's reader lines read per pread */
#define DLW_TEXT_MAX  16384
#define DLW_WORK_MAX  32768             /* records and reader lines a walk reads, at most */
#define DLW_DIRCHUNK  64                /* directory entries read per pread (dlw_table) */

enum { DLW_NONE = 0,    /* no cycle through me (or a bound was hit) */
       DLW_VICTIM = 1,  /* a cycle, and I am the one to give up: *text describes it */
       DLW_OTHER = 2 }; /* a cycle whose victim is another member (poked), or none detects */

/* A full fence: a waiter's links (and wait record) are published before its walk reads
 * anyone else's (deadlock.pxi dl_look). */
static inline void shm_fence_seq(void) { __atomic_thread_fence(SEQ); }

/* The thread's wait that published wait links, innermost first (a signal handler's wait
 * runs inside another): deadlock.pxi's, which publishes the outer one's again when an
 * inner one ends. */
static __thread void *shm_tls_dlwait __attribute__((tls_model("initial-exec")));
static inline void *shm_tls_dlwait_get(void) { return shm_tls_dlwait; }
static inline void shm_tls_dlwait_set(void *w) { shm_tls_dlwait = w; }

/* ---- the trusted owners (set from Python at import: shmlocks/_shmread.py trusted_uids) */
static uint32_t dlw_trust[DLW_TRUST_MAX];
static int dlw_ntrust = 0;

static inline void shm_walk_trust(const uint32_t *uids, int n) {
    int i;
    if (n > DLW_TRUST_MAX)
        n = DLW_TRUST_MAX;
    for (i = 0; i < n; i++)
        dlw_trust[i] = uids[i];
    __atomic_store_n(&dlw_ntrust, n, __ATOMIC_RELEASE);
}

static inline int dlw_trusted(uint32_t uid) {
    int i, n = __atomic_load_n(&dlw_ntrust, __ATOMIC_ACQUIRE);
    if (uid == 0 || uid == (uint32_t)getuid() || uid == (uint32_t)geteuid())
        return 1;
    for (i = 0; i < n; i++)
        if (dlw_trust[i] == uid)
            return 1;
    return 0;
}

/* ---- a segment the walk reads ------------------------------------------------------- */
typedef struct dlw_src {
    const char *base;          /* the walker's own mapping (NULL: read with pread from fd) */
    const uint32_t *hwmp;      /* its live part_hwm (the mapping's header) */
    int fd;                    /* opened here (closed at the walk's end), or -1 */
    int state;                 /* 1 valid, -1 refused: a branch into it ends */
    uint64_t size;
    uint64_t dir_off, part_off, locks_off, stride;
    uint32_t L, P, hwm;
    char name[DLW_NAME];
    uint64_t ext_off;          /* where a lock table's stripes begin (docs/design.md §15) */
    shm_table tbl;             /* its table's header, validated (size 0: none) ... */
    int tbl_state;             /* ... once loaded: 1; 0 not yet (dlw_table); -1 refused */
} dlw_src;

typedef struct dlw_key {
    uint64_t pidns;
    uint32_t pid, tid;
    uint64_t tstart, task;
} dlw_key;

typedef struct dlw_node {
    dlw_key key;
    int64_t since;             /* when its wait began */
    uint64_t pgen;             /* the generation of the record its poke word is in */
    uint32_t slot;             /* its wait record in seg (UINT32_MAX: none, a task's
                                  local wait known by its link only) */
    uint32_t lock;             /* the lock index it waits for, in seg */
    uint32_t pslot;            /* the record whose poke word wakes it, in pseg */
    uint32_t hslot;            /* the record through which it was reached (it holds), in hseg */
    uint16_t seg, pseg, hseg;
    uint16_t parent;
    uint8_t depth, detects;
    uint8_t mode;              /* its wait: 0 a lock, 1 a read, 2 a write */
    uint8_t hmode;             /* its hold of its parent's lock: 0 a lock, 1 read, 2 write,
                                  3 write, draining */
} dlw_node;

typedef struct dlw_ctx {
    dlw_src seg[DLW_SEGS];
    dlw_node node[DLW_NODES];
    uint16_t edge[DLW_EDGES][2];
    int nseg, n, nedge, bounded;
    int work;                  /* records and reader lines read (DLW_WORK_MAX) */
    int cyc[DLW_DEPTH + 1];    /* the shortest cycle through me: node indices, me first */
    int ncyc;
    uint8_t me_hmode;          /* my hold of the last member's lock */
    int victim;                /* node index, -1: nobody in it detects */
} dlw_ctx;

static inline int dlw_read(const dlw_src *s, uint64_t off, void *buf, size_t n) {
    size_t got = 0;
    ssize_t r;
    if (off > s->size || n > s->size - off)
        return -1;
    if (s->base != NULL) {
        memcpy(buf, s->base + off, n);
        __atomic_thread_fence(ACQ);
        return 0;
    }
    while (got < n) {
        r = pread(s->fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;                 /* an error, or the file ends first (truncated) */
        got += (size_t)r;
    }
    return 0;
}

static inline int dlw_read32(const dlw_src *s, uint64_t off, uint32_t *v) {
    if (s->base != NULL) {
        if (off > s->size || 4 > s->size - off || (off & 3))
            return -1;
        *v = __atomic_load_n((const uint32_t *)(s->base + off), ACQ);
        return 0;
    }
    return dlw_read(s, off, v, 4);
}

static inline uint32_t dlw_hwm(const dlw_src *s) {
    uint32_t h = s->hwmp != NULL ? __atomic_load_n(s->hwmp, SEQ) : s->hwm;
    return h < s->P ? h : s->P;
}

/* A valid segment name, as region.pxi _check_name makes them: 1..200 bytes, no '/'. */
static inline int dlw_name_ok(const char *name, size_t cap) {
    size_t n = strnlen(name, cap);
    if (n == 0 || n >= cap || n > 200 || memchr(name, '/', n) != NULL)
        return 0;
    return !(strcmp(name, ".") == 0 || strcmp(name, "..") == 0);
}

/* Validate the header of s (read with pread) as region.pxi _validate does: 0 or -1. */
static inline int dlw_validate(dlw_src *s) {
    shm_header h;
    uint64_t dir_off, part_off, locks_off, stride, total;
    if (dlw_read(s, 0, &h, offsetof(shm_header, _pad0)) != 0)
        return -1;
    if (h.magic != SHM_MAGIC || h.version != SHM_VERSION || h.line_size != SHM_LINE
            || h.glibc_mutex_size != sizeof(pthread_mutex_t)
            || __atomic_load_n(&h.state, RLX) != SHM_STATE_READY)
        return -1;
    if (!(h.max_locks >= 1 && h.max_locks <= SHM_MAX_LOCKS && h.max_participants >= 1
          && h.max_participants <= SHM_MAX_PARTICIPANTS))
        return -1;
    dir_off = sizeof(shm_header);
    part_off = dir_off + (uint64_t)h.max_locks * sizeof(shm_dirent);
    locks_off = part_off + (uint64_t)h.max_participants * sizeof(shm_participant);
    stride = shm_body_lines(h.max_participants) * SHM_LINE;
    total = locks_off + (uint64_t)h.max_locks * stride;
    if (h.ext_lines > (uint64_t)SHM_TABLE_MAX * shm_body_lines(SHM_MAX_PARTICIPANTS))
        return -1;
    s->ext_off = total;                /* a lock table's stripes (region.pxi _validate) */
    total += h.ext_lines * SHM_LINE;
    if (h.dir_off != dir_off || h.part_off != part_off || h.locks_off != locks_off
            || h.lock_stride != stride || h.total_size != total || s->size != total)
        return -1;
    if (!(h.part_hwm >= 1 && h.part_hwm <= h.max_participants))
        return -1;
    s->L = h.max_locks;
    s->P = h.max_participants;
    s->hwm = h.part_hwm;
    s->dir_off = dir_off;
    s->part_off = part_off;
    s->locks_off = locks_off;
    s->stride = stride;
    s->tbl_state = 0;
    return 0;
}

/* Open and validate segment `name` (the walk's own region's name: index 0, its mapping).
 * The index of its entry, or -1 (a bound: no room). The entry's state says if it is valid. */
static inline int dlw_seg(dlw_ctx *c, const char *name) {
    int i;
    dlw_src *s;
    struct stat st;
    char path[sizeof(SHM_WALK_DIR) + DLW_NAME];
    for (i = 0; i < c->nseg; i++)
        if (strcmp(c->seg[i].name, name) == 0)
            return i;
    if (c->nseg >= DLW_SEGS) {
        c->bounded = 1;
        return -1;
    }
    s = &c->seg[c->nseg++];
    memset(s, 0, sizeof *s);
    strcpy(s->name, name);             /* (checked by dlw_name_ok: < DLW_NAME bytes) */
    s->fd = -1;
    s->state = -1;
    memcpy(path, SHM_WALK_DIR, sizeof(SHM_WALK_DIR) - 1);
    strcpy(path + sizeof(SHM_WALK_DIR) - 1, name);
    s->fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (s->fd < 0)
        return c->nseg - 1;            /* missing, a symlink, ...: the branch ends */
    if (fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode) || !dlw_trusted(st.st_uid))
        return c->nseg - 1;            /* a FIFO, a directory, another user's file */
    s->size = (uint64_t)st.st_size;
    if (dlw_validate(s) == 0)
        s->state = 1;
    return c->nseg - 1;
}

static inline void dlw_close(dlw_ctx *c) {
    int i;
    for (i = 0; i < c->nseg; i++)
        if (c->seg[i].fd >= 0) {
            close(c->seg[i].fd);
            c->seg[i].fd = -1;
        }
}

/* Participant `slot` of segment si, lines 0 and 1 (token, identity, wait record, poke,
 * task): 0, or -1 if out of range or unreadable. */
static inline int dlw_part(dlw_ctx *c, int si, uint32_t slot, shm_participant *p) {
    const dlw_src *s = &c->seg[si];
    if (s->state != 1 || slot >= dlw_hwm(s))
        return -1;
    return dlw_read(s, s->part_off + (uint64_t)slot * sizeof(shm_participant), p, 2 * SHM_LINE);
}

/* Its wait link (lines 2-3), read seqlock-style: 1 (stable, into p), 0 (none, or being written). */
static inline int dlw_link(dlw_ctx *c, int si, uint32_t slot, shm_participant *p) {
    const dlw_src *s = &c->seg[si];
    uint64_t off = s->part_off + (uint64_t)slot * sizeof(shm_participant);
    uint64_t loff = off + offsetof(shm_participant, link_seq);
    uint32_t s1, s2;
    if (dlw_read32(s, loff, &s1) != 0 || (s1 & 1))
        return 0;
    if (dlw_read(s, loff, (char *)p + offsetof(shm_participant, link_seq), 2 * SHM_LINE) != 0)
        return 0;
    __atomic_thread_fence(ACQ);
    if (dlw_read32(s, loff, &s2) != 0 || s2 != s1 || p->link_lock == 0)
        return 0;
    return 1;
}

static inline int dlw_alive(const shm_participant *p) {
    uint32_t w = *(const uint32_t *)(const void *)&p->token;
    if ((w & 0x40000000u) || (w & 0x3fffffffu) == 0)   /* OWNER_DIED, or free */
        return 0;
    return p->op_step != SHM_OP_QUARANTINED;
}

static inline dlw_key dlw_key_of(const shm_participant *p) {
    dlw_key k;
    k.pidns = p->pidns;
    k.pid = p->pid;
    k.tid = p->tid;
    k.tstart = p->tstart;
    k.task = p->task_id;
    return k;
}

static inline int dlw_same_thread(const dlw_key *a, const dlw_key *b) {
    return a->pidns == b->pidns && a->pid == b->pid && a->tid == b->tid && a->tstart == b->tstart;
}

static inline int dlw_key_eq(const dlw_key *a, const dlw_key *b) {
    return dlw_same_thread(a, b) && a->task == b->task;
}

static inline int dlw_key_cmp(const dlw_key *a, const dlw_key *b) {
#define DLW_CMP(f) if (a->f != b->f) return a->f < b->f ? -1 : 1;
    DLW_CMP(pidns) DLW_CMP(pid) DLW_CMP(tid) DLW_CMP(tstart) DLW_CMP(task)
#undef DLW_CMP
    return 0;
}

/* The segment's lock table, loaded once per walk as participants.pxi table_load validates
 * it (its one READY entry of kind SHM_KIND_TABLE, its header matching the geometry): 1 if
 * s->tbl holds it (size 0: none), else 0 (unreadable, two tables, a mismatch). */
static inline int dlw_table(dlw_ctx *c, int si) {
    dlw_src *s = &c->seg[si];
    shm_dirent d[DLW_DIRCHUNK];
    shm_lockctl ctl;
    shm_table t;
    uint32_t i, k, x, found = UINT32_MAX;
    uint64_t need, boff;
    if (s->tbl_state != 0)
        return s->tbl_state == 1;
    s->tbl_state = -1;
    memset(&s->tbl, 0, sizeof s->tbl);
    for (x = 0; x < s->L; x += DLW_DIRCHUNK) {
        k = s->L - x < DLW_DIRCHUNK ? s->L - x : DLW_DIRCHUNK;
        c->work += (int)k;
        if (c->work > DLW_WORK_MAX) {
            c->bounded = 1;
            return 0;
        }
        if (dlw_read(s, s->dir_off + (uint64_t)x * sizeof(shm_dirent), d,
                     (size_t)k * sizeof(shm_dirent)) != 0)
            return 0;
        for (i = 0; i < k; i++)
            if (d[i].state == SHM_DIRENT_READY && d[i].kind == SHM_KIND_TABLE) {
                if (found != UINT32_MAX)
                    return 0;                          /* two tables */
                found = x + i;
            }
    }
    if (found == UINT32_MAX) {
        if (s->size != s->ext_off)
            return 0;                                  /* an extension area and no table */
        s->tbl_state = 1;
        return 1;
    }
    boff = s->locks_off + (uint64_t)found * s->stride;
    if (dlw_read(s, boff, &ctl, 16) != 0 || dlw_read(s, boff + SHM_LINE, &t, sizeof t) != 0)
        return 0;
    need = (uint64_t)SHM_STRIPE_LINES * SHM_LINE;
    if (ctl.magic != SHM_BODY_MAGIC || ctl.kind != SHM_KIND_TABLE
            || t.sub < SHM_KIND_TICKET || t.sub > SHM_KIND_PI || t.compact != 1
            || t.size < 1 || t.size > SHM_TABLE_MAX || t.first != s->L
            || t.stride != need || t.off != s->ext_off
            || t.off + (uint64_t)t.size * t.stride != s->size)
        return 0;
    s->tbl = t;
    s->tbl_state = 1;
    return 1;
}

/* The lock that number li names in segment si (participants.pxd lock_at: a directory
 * entry, or a stripe of the segment's table): its kind if it is READY and its body says
 * so, else 0; its body's offset into *boff; its name into `name` (SHM_NAME_MAX bytes; a
 * stripe's is "[s]", to follow the segment's name) if given. */
static inline uint32_t dlw_lock(dlw_ctx *c, int si, uint32_t li, char *name, uint64_t *boff) {
    dlw_src *s = &c->seg[si];
    shm_dirent d;
    shm_lockctl ctl;
    uint32_t kind, st;
    if (s->state != 1)
        return 0;
    if (li < s->L) {
        if (dlw_read(s, s->dir_off + (uint64_t)li * sizeof(shm_dirent), &d, sizeof d) != 0
                || d.state != SHM_DIRENT_READY)
            return 0;
        kind = d.kind;
        *boff = s->locks_off + (uint64_t)li * s->stride;
        if (name != NULL) {
            memcpy(name, d.name, SHM_NAME_MAX);
            name[SHM_NAME_MAX - 1] = 0;
        }
    } else {
        if (!dlw_table(c, si) || s->tbl.size == 0 || li - s->tbl.first >= s->tbl.size)
            return 0;
        st = li - s->tbl.first;
        kind = s->tbl.sub;
        *boff = s->tbl.off + (uint64_t)st * s->tbl.stride;
        if (name != NULL)
            snprintf(name, SHM_NAME_MAX, "[%u]", st);
    }
    if (dlw_read(s, *boff, &ctl, 16) != 0 || ctl.magic != SHM_BODY_MAGIC || ctl.kind != kind)
        return 0;
    return kind;
}

/* A lock number in range for segment si (an entry, or a stripe of its table)? */
static inline int dlw_lock_ok(dlw_ctx *c, int si, uint32_t li) {
    dlw_src *s = &c->seg[si];
    if (s->state != 1)
        return 0;
    if (li < s->L)
        return 1;
    return dlw_table(c, si) && s->tbl.size != 0 && li - s->tbl.first < s->tbl.size;
}

/* One RWLock record (prec line) of participant x: its ind, and its wstate if wanted. */
static inline int dlw_rwrec(dlw_ctx *c, int si, uint32_t li, uint32_t x, shm_rwrec *r) {
    const dlw_src *s = &c->seg[si];
    uint64_t body = s->locks_off + (uint64_t)li * s->stride;
    return dlw_read(s, body + (SHM_BODY_NODES + (uint64_t)s->P + 1u + x) * SHM_LINE, r, 16);
}

static inline int dlw_rw_counts(uint32_t ind, uint32_t tag) {   /* rwlock.pxi _rw_counts */
    if ((ind & RW_COUNT_MASK) == 0)
        return 0;
    return !((ind & RW_BLOCKED) && ((ind >> RW_TAG_SHIFT) & RW_TAG_MASK) == tag);
}

/* Whom the waiter of record `ws` (UINT32_MAX: none) on lock li of segment si waits for:
 * up to `cap` slots with the holder id each must have (0: not checked) and how each holds
 * it; *wmode says how it waits. The count. */
static inline int dlw_holders(dlw_ctx *c, int si, uint32_t li, uint32_t ws, uint32_t *slots,
                              uint32_t *hids, uint8_t *hmodes, int cap, uint8_t *wmode) {
    const dlw_src *s = &c->seg[si];
    uint64_t body = 0;
    uint32_t kind = dlw_lock(c, si, li, NULL, &body);
    uint32_t hwm = dlw_hwm(s), h, s1, w, ws1, phase, tag, x, i, k;
    shm_lockctl ctl;
    shm_rwrec mine, recs[DLW_RWCHUNK];
    int n = 0;
    *wmode = 0;
    if (kind == 0)
        return 0;
    if (kind >= SHM_KIND_TICKET && kind <= SHM_KIND_PI) {
        if (dlw_read(s, body, &ctl, 16) != 0)
            return 0;
        h = ctl.holder;
        s1 = h & 0x1fffu;                              /* participants.pxd HOLDER_SLOT_BITS */
        if (h == 0 || s1 == 0 || s1 > hwm)
            return 0;
        slots[0] = s1 - 1;
        hids[0] = h;
        hmodes[0] = 0;
        return 1;
    }
    if (kind != SHM_KIND_RWLOCK || ws >= hwm || li >= s->L)
        return 0;                                      /* a toolbox object: no edge (§9) */
    if (dlw_read32(s, body + SHM_BODY_WA * SHM_LINE, &w) != 0 || dlw_rwrec(c, si, li, ws, &mine) != 0)
        return 0;
    ws1 = (w & RW_PRESENT) ? (w & RW_SLOT_MASK) : 0;
    if (ws1 > hwm)
        ws1 = 0;
    phase = (w >> RW_SLOT_BITS) & RW_PHASE_MASK;
    tag = phase & RW_TAG_MASK;
    if (mine.ind & RW_BLOCKED) {                       /* a reader behind its phase's writer */
        *wmode = 1;
        if (((mine.ind >> RW_TAG_SHIFT) & RW_TAG_MASK) != tag || ws1 == 0 || ws1 - 1 == ws)
            return 0;
    } else if (mine.ind & RW_COUNT_MASK) {
        *wmode = 1;
        return 0;                                      /* it got in */
    } else {
        *wmode = 2;
        if (ws1 != 0 && ws1 - 1 == ws) {
            if (mine.wstate != RW_W_DRAINING)
                return 0;
            for (x = 0; x < hwm; x += DLW_RWCHUNK) {   /* every reader it still counts */
                k = hwm - x < DLW_RWCHUNK ? hwm - x : DLW_RWCHUNK;
                c->work += (int)k;
                if (c->work > DLW_WORK_MAX) {
                    c->bounded = 1;
                    return n;
                }
                if (dlw_read(s, body + (SHM_BODY_NODES + (uint64_t)s->P + 1u + x) * SHM_LINE,
                             recs, (size_t)k * SHM_LINE) != 0)
                    return n;
                for (i = 0; i < k; i++) {
                    if (x + i == ws || !dlw_rw_counts(recs[i].ind, tag))
                        continue;
                    if (n >= cap) {
                        c->bounded = 1;
                        return n;
                    }
                    slots[n] = x + i;
                    hids[n] = 0;
                    hmodes[n++] = 1;
                }
            }
            return n;
        }
        if (ws1 == 0)
            return 0;
    }
    slots[0] = ws1 - 1;                                /* the writer present */
    hids[0] = 0;
    hmodes[0] = (dlw_rwrec(c, si, li, ws1 - 1, &mine) == 0 && mine.wstate == RW_W_DRAINING)
                ? 3 : 2;
    return 1;
}

/* Where the live holder of record h in segment si (read into p) waits: fills nd's wait and
 * poke location. 1 if it waits, 0 if not (or its link is stale: the branch ends). */
static inline int dlw_resolve(dlw_ctx *c, int si, uint32_t h, shm_participant *p, dlw_node *nd) {
    const dlw_src *s = &c->seg[si];
    shm_participant q;
    dlw_key kp, kq;
    uint32_t ol = p->op_lock;
    int ti;
    if (p->op_step == SHM_OP_WAITING && ol >= 1 && dlw_lock_ok(c, si, ol - 1)) {
        nd->seg = nd->pseg = (uint16_t)si;
        nd->slot = nd->pslot = h;
        nd->lock = ol - 1;
        nd->since = (int64_t)p->wait_since;
        nd->detects = p->detects != 0;
        nd->pgen = p->generation;
        return 1;
    }
    if (!dlw_link(c, si, h, p))
        return 0;
    p->link_name[DLW_NAME - 1] = 0;
    if (!dlw_name_ok(p->link_name, DLW_NAME))
        return 0;
    ti = dlw_seg(c, p->link_name);
    if (ti < 0 || c->seg[ti].state != 1 || !dlw_lock_ok(c, ti, p->link_lock - 1))
        return 0;
    nd->seg = (uint16_t)ti;
    nd->lock = p->link_lock - 1;
    if (p->link_slot == 0) {           /* a task waiting behind another task of its loop */
        nd->slot = UINT32_MAX;
        nd->since = (int64_t)p->link_since;
        nd->detects = (p->link_flags & SHM_LINK_DETECTS) != 0;
        nd->pseg = (uint16_t)si;
        nd->pslot = h;
        nd->pgen = p->generation;
        return 1;
    }
    /* the waiter's record it names: the same thread, this generation, waiting for that lock */
    if (dlw_part(c, ti, p->link_slot - 1, &q) != 0 || !dlw_alive(&q)
            || q.generation != p->link_gen || q.op_step != SHM_OP_WAITING
            || q.op_lock != p->link_lock)
        return 0;
    kp = dlw_key_of(p);
    kq = dlw_key_of(&q);
    if (!dlw_same_thread(&kp, &kq))
        return 0;
    nd->slot = nd->pslot = p->link_slot - 1;
    nd->pseg = (uint16_t)ti;
    nd->since = (int64_t)q.wait_since;
    nd->detects = q.detects != 0;
    nd->pgen = q.generation;
    return 1;
}

static inline void dlw_edge(dlw_ctx *c, int a, int b) {
    if (c->nedge >= DLW_EDGES) {
        c->bounded = 1;
        return;
    }
    c->edge[c->nedge][0] = (uint16_t)a;
    c->edge[c->nedge][1] = (uint16_t)b;
    c->nedge++;
}

/* One walk from node 0 (filled by the caller), breadth first. */
static inline void dlw_bfs(dlw_ctx *c) {
    uint32_t slots[DLW_NODES], hids[DLW_NODES];
    uint8_t hmodes[DLW_NODES], wmode;
    shm_participant p;
    dlw_node *nd, *nn;
    dlw_key k;
    int u, v, i, cnt, j;
    c->n = 1;
    c->nedge = 0;
    c->ncyc = 0;
    c->victim = -1;
    c->work = 0;
    for (u = 0; u < c->n; u++) {
        nd = &c->node[u];
        if (nd->depth >= DLW_DEPTH) {
            c->bounded = 1;
            continue;
        }
        cnt = dlw_holders(c, nd->seg, nd->lock, nd->slot, slots, hids, hmodes, DLW_NODES, &wmode);
        nd->mode = wmode;
        for (i = 0; i < cnt; i++) {
            if (++c->work > DLW_WORK_MAX) {
                c->bounded = 1;
                break;
            }
            if (dlw_part(c, nd->seg, slots[i], &p) != 0 || !dlw_alive(&p))
                continue;                              /* dead: its recoverer releases it */
            if (hids[i] != 0 && ((slots[i] + 1u) | (uint32_t)(p.generation << 13)) != hids[i])
                continue;                              /* left by an earlier occupant */
            k = dlw_key_of(&p);
            if (dlw_key_eq(&k, &nd->key))
                continue;                              /* a record naming itself */
            if (dlw_key_eq(&k, &c->node[0].key)) {
                dlw_edge(c, u, 0);                     /* back to me: a cycle */
                if (c->ncyc == 0) {
                    for (v = u, j = 0; v != 0xffff && j <= DLW_DEPTH; v = c->node[v].parent)
                        c->cyc[j++] = v;
                    c->ncyc = j;
                    for (v = 0; v < j / 2; v++) {      /* me first */
                        int t = c->cyc[v];
                        c->cyc[v] = c->cyc[j - 1 - v];
                        c->cyc[j - 1 - v] = t;
                    }
                    c->me_hmode = hmodes[i];
                }
                continue;
            }
            for (v = 1; v < c->n; v++)
                if (dlw_key_eq(&k, &c->node[v].key))
                    break;
            if (v < c->n) {
                dlw_edge(c, u, v);                     /* seen: a loop, with me or not */
                continue;
            }
            if (c->n >= DLW_NODES) {
                c->bounded = 1;
                continue;
            }
            nn = &c->node[c->n];
            if (dlw_resolve(c, nd->seg, slots[i], &p, nn) != 1)
                continue;                              /* waits for nothing: the branch ends */
            nn->key = k;
            nn->parent = (uint16_t)u;
            nn->depth = (uint8_t)(nd->depth + 1);
            nn->hseg = nd->seg;
            nn->hslot = slots[i];
            nn->hmode = hmodes[i];
            nn->mode = 0;
            dlw_edge(c, u, c->n);
            c->n++;
        }
    }
    if (c->ncyc == 0)
        return;
    {   /* the victim, over the nodes that reach me (my strongly connected set) */
        uint8_t reach[DLW_NODES];
        int changed = 1, best = -1;
        memset(reach, 0, sizeof reach);
        reach[0] = 1;
        while (changed) {
            changed = 0;
            for (i = 0; i < c->nedge; i++)
                if (reach[c->edge[i][1]] && !reach[c->edge[i][0]]) {
                    reach[c->edge[i][0]] = 1;
                    changed = 1;
                }
        }
        for (v = 0; v < c->n; v++) {
            if (!reach[v] || !c->node[v].detects)
                continue;
            if (best < 0 || c->node[v].since > c->node[best].since
                    || (c->node[v].since == c->node[best].since
                        && dlw_key_cmp(&c->node[v].key, &c->node[best].key) > 0))
                best = v;
        }
        c->victim = best;
    }
}

/* Node 0: the waiter of record `slot` of segment 0 waiting for lock `lock`; a task
 * (task != 0) of that record's thread with its own wait's since and detects (since >= 0:
 * the values its wait links carry, which every other walker reads; the record's own are
 * its cohort's first waiter's). 0, or -1 if its record is not a live one. */
static inline int dlw_start(dlw_ctx *c, uint32_t slot, uint32_t lock, uint64_t task,
                            int64_t since, int detects) {
    shm_participant p;
    dlw_node *me = &c->node[0];
    if (dlw_part(c, 0, slot, &p) != 0 || !dlw_alive(&p) || !dlw_lock_ok(c, 0, lock))
        return -1;
    memset(me, 0, sizeof *me);
    me->key = dlw_key_of(&p);
    me->key.task = task;
    me->since = since >= 0 ? since : (int64_t)p.wait_since;
    me->detects = since >= 0 ? detects != 0 : p.detects != 0;
    me->pgen = p.generation;
    me->slot = me->pslot = me->hslot = slot;
    me->lock = lock;
    me->parent = 0xffff;
    return 0;
}

/* Bump and wake the poke word of node v's record (its wait record, or the record holding
 * its link). In our own mapping: an atomic add and FUTEX_WAKE. Elsewhere, the segment is
 * opened again for writing (the same file, still trusted, still that long): the word is
 * written with pwrite and woken through a read-only mapping of its page, which user space
 * never touches (a file truncated meanwhile is a failed call, never SIGBUS). */
static inline void dlw_poke(dlw_ctx *c, const dlw_node *v) {
    const dlw_src *s = &c->seg[v->pseg];
    uint64_t off, page, gen;
    uint32_t val;
    struct stat st, st0;
    char path[sizeof(SHM_WALK_DIR) + DLW_NAME];
    long psz;
    int fd;
    void *m;
    if (s->state != 1 || v->pslot >= dlw_hwm(s))
        return;
    off = s->part_off + (uint64_t)v->pslot * sizeof(shm_participant);
    if (s->base != NULL) {
        shm_participant *p = (shm_participant *)(void *)(s->base + off);
        if (__atomic_load_n(&p->generation, ACQ) != v->pgen)
            return;
        __atomic_fetch_add(&p->poke, 1, SEQ);
        shm_futex_wake(&p->poke, INT_MAX);
        return;
    }
    memcpy(path, SHM_WALK_DIR, sizeof(SHM_WALK_DIR) - 1);
    strcpy(path + sizeof(SHM_WALK_DIR) - 1, s->name);
    fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return;
    psz = sysconf(_SC_PAGESIZE);
    if (fstat(fd, &st) != 0 || fstat(s->fd, &st0) != 0 || st.st_ino != st0.st_ino
            || st.st_dev != st0.st_dev || !S_ISREG(st.st_mode) || !dlw_trusted(st.st_uid)
            || (uint64_t)st.st_size < off + sizeof(shm_participant) || psz <= 0)
        goto out;
    if (pread(fd, &gen, 8, (off_t)(off + offsetof(shm_participant, generation))) != 8
            || gen != v->pgen)
        goto out;
    off += offsetof(shm_participant, poke);
    if (pread(fd, &val, 4, (off_t)off) != 4)
        goto out;
    val += 1;
    if (pwrite(fd, &val, 4, (off_t)off) != 4)
        goto out;
    page = off & ~((uint64_t)psz - 1);
    m = mmap(NULL, (size_t)psz, PROT_READ, MAP_SHARED, fd, (off_t)page);
    if (m != MAP_FAILED) {
        shm_futex_wake((uint32_t *)(void *)((char *)m + (off - page)), INT_MAX);
        munmap(m, (size_t)psz);
    }
out:
    close(fd);
}

/* ---- the description of a cycle (the victim's DeadlockError) ------------------------- */
static const char *const dlw_kinds[] = {
    "?", "ticket", "mcs", "clh", "futex", "robust", "pi", "event", "semaphore", "barrier",
    "condition", "rwlock"};
static const char *const dlw_wmodes[] = {"", "read", "write"};
static const char *const dlw_hmodes[] = {"", "read", "write", "write, draining"};

/* "seg/lock (kind[, mode])", a standalone lock's just "seg (kind)", a table's stripe
 * "seg[i] (kind)" (waitgraph.py LockRef). */
static inline int dlw_lockref(dlw_ctx *c, int si, uint32_t li, const char *mode, char *out,
                              size_t cap) {
    char name[SHM_NAME_MAX];
    uint64_t boff;
    uint32_t k = dlw_lock(c, si, li, name, &boff);
    const char *kn = k <= SHM_KIND_RWLOCK ? dlw_kinds[k] : "?";
    const char *seg = c->seg[si].name;
    const char *sep = *mode ? ", " : "";
    if (k == 0)
        snprintf(name, sizeof name, "#%u", li);
    if (strcmp(name, "lock") == 0)
        return snprintf(out, cap, "%s (%s%s%s)", seg, kn, sep, mode);
    if (k != 0 && li >= c->seg[si].L)
        return snprintf(out, cap, "%s%s (%s%s%s)", seg, name, kn, sep, mode);
    return snprintf(out, cap, "%s/%s (%s%s%s)", seg, name, kn, sep, mode);
}

/* A malloc'd text: one line per member of the cycle, me first (NULL if out of memory). */
static inline char *dlw_describe(dlw_ctx *c, int64_t now) {
    char *out = (char *)malloc(DLW_TEXT_MAX), held[320], waits[320], task[80];
    size_t len = 0;
    int i, r;
    shm_participant p;
    if (out == NULL)
        return NULL;
    out[0] = 0;
    for (i = 0; i < c->ncyc; i++) {
        const dlw_node *m = &c->node[c->cyc[i]];
        const dlw_node *prev = &c->node[c->cyc[(i + c->ncyc - 1) % c->ncyc]];
        uint8_t hm = i == 0 ? c->me_hmode : m->hmode;
        dlw_lockref(c, prev->seg, prev->lock, dlw_hmodes[hm & 3], held, sizeof held);
        dlw_lockref(c, m->seg, m->lock, dlw_wmodes[m->mode % 3], waits, sizeof waits);
        task[0] = 0;
        if (m->key.task != 0) {
            /* the record it was reached through names it (node 0, a task: its cohort's
               record may name the cohort's first waiter instead) */
            if (dlw_part(c, m->hseg, m->hslot, &p) == 0 && p.task_id == m->key.task) {
                p.label[sizeof p.label - 1] = 0;
                snprintf(task, sizeof task, " (task '%s')", p.label);
            } else {
                snprintf(task, sizeof task, " (task %llu)", (unsigned long long)m->key.task);
            }
        }
        r = snprintf(out + len, DLW_TEXT_MAX - len, "%spid %u tid %u%s holds %s, waits for %s since %.3f s",
                     i ? "\n" : "", m->key.pid, m->key.tid, task, held, waits,
                     (double)(now > m->since ? now - m->since : 0) / 1e9);
        if (r < 0 || (size_t)r >= DLW_TEXT_MAX - len) {
            strcpy(out + (DLW_TEXT_MAX - 5), "\n...");
            break;
        }
        len += (size_t)r;
    }
    return out;
}

/* The chain walk from record `slot` of the region mapped by `mine` (its mapping and name,
 * state 1), waiting for lock index `lock` (as task `task`: 0 for a thread, the task's id
 * for a cohort's; since >= 0: the task's wait began then, and `detects` says if its
 * process looks for deadlocks, else both are the record's), at CLOCK_MONOTONIC `now`:
 *   DLW_NONE    no cycle through it (nothing found, a stale record, or a bound hit);
 *   DLW_VICTIM  a cycle, confirmed, and it is the victim: *text (malloc'd, the caller frees;
 *               NULL if out of memory) has a line per member, *members their number;
 *   DLW_OTHER   a cycle, confirmed, whose victim is another member: poked (or nobody in
 *               it detects, and nobody is).
 * nogil; its one heap block is its context (~40 KB, freed before it returns), and the
 * text. */
static inline int shm_walk(const dlw_src *mine, uint32_t slot, uint32_t lock, uint64_t task,
                           int64_t since, int detects, int64_t now, char **text, int *members) {
    dlw_ctx *c;
    dlw_key keys[DLW_DEPTH + 1];
    int64_t sinces[DLW_DEPTH + 1];
    uint32_t locks[DLW_DEPTH + 1];
    uint16_t segs[DLW_DEPTH + 1];
    int i, n, rc = DLW_NONE;
    *text = NULL;
    *members = 0;
    c = (dlw_ctx *)malloc(sizeof *c);  /* ~40 KB: never on the stack of a thread whose
                                          stack may be 32 KiB (threading.stack_size) */
    if (c == NULL)
        return DLW_NONE;
    c->nseg = 1;
    c->bounded = 0;
    c->seg[0] = *mine;
    c->seg[0].fd = -1;
    c->seg[0].state = 1;
    if (dlw_start(c, slot, lock, task, since, detects) != 0)
        goto done;
    dlw_bfs(c);
    if (c->ncyc == 0)
        goto done;
    n = c->ncyc;                        /* the first walk's cycle, then a second walk */
    for (i = 0; i < n; i++) {
        keys[i] = c->node[c->cyc[i]].key;
        sinces[i] = c->node[c->cyc[i]].since;
        locks[i] = c->node[c->cyc[i]].lock;
        segs[i] = c->node[c->cyc[i]].seg;
    }
    for (i = 1; i < c->nseg; i++) {     /* the participants provisioned, afresh */
        uint32_t h;
        if (c->seg[i].state == 1
                && (dlw_read32(&c->seg[i], offsetof(shm_header, part_hwm), &h) != 0
                    || h == 0 || h > c->seg[i].P))
            c->seg[i].state = -1;
        else if (c->seg[i].state == 1)
            c->seg[i].hwm = h;
    }
    if (dlw_start(c, slot, lock, task, since, detects) != 0)
        goto done;
    dlw_bfs(c);
    if (c->ncyc != n)
        goto done;
    for (i = 0; i < n; i++) {
        const dlw_node *m = &c->node[c->cyc[i]];
        if (!dlw_key_eq(&m->key, &keys[i]) || m->since != sinces[i] || m->lock != locks[i]
                || m->seg != segs[i])
            goto done;
    }
    *members = n;
    if (c->victim == 0) {
        *text = dlw_describe(c, now);
        rc = DLW_VICTIM;
    } else {
        if (c->victim > 0)
            dlw_poke(c, &c->node[c->victim]);
        rc = DLW_OTHER;
    }
done:
    dlw_close(c);
    free(c);
    return rc;
}

#endif
