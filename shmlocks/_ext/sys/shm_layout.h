/*
 * shm_layout.h -- the shared-memory layout of a shmlocks region.  This file is the ABI:
 * every process that maps a region agrees on it, so every struct below has its size,
 * offsets and alignment pinned by _Static_assert.  No pointers live in the segment, only
 * 32/64-bit indices and offsets, because each process maps it at its own address.
 *
 *   +---------------------+  0
 *   | shm_header          |  2 lines: identity + sizes + offsets, then the directory mutex
 *   +---------------------+  dir_off
 *   | shm_dirent[L]       |  one line each: name, kind, state
 *   +---------------------+  part_off
 *   | shm_participant[P]  |  four lines each: liveness token, identity + protocol state,
 *   |                     |  the wait link
 *   +---------------------+  locks_off
 *   | lock body [L]       |  lock_stride bytes each (see below)
 *   +---------------------+  total_size
 *
 * A lock body is  ctl (1 line) | word A (1 line) | word B (1 line) | nodes[P+1] | precs[P].
 * Each kind uses the parts it needs; see the top of its .pxi file.  A node line has one
 * view per kind that uses it (shm_node: shm_qnode for MCS and CLH, shm_tslot for ticket),
 * so each field means one thing.
 *
 * Participants that grow (docs/design.md §2).  P (max_participants) is the cap, and the
 * geometry is computed for it: the file is that long, sparse, and mapped whole.  Only
 * participants [0, part_hwm) are provisioned (their pages fallocated and initialised): in
 * the table, and in every body the per-participant lines (nodes and precs [0, part_hwm)).
 * The fixed lines of a body (ctl, words A and B, the node lines its kind uses by index:
 * the ticket's slots, a toolbox object's journal; the lock's own node P) are provisioned
 * when the lock is created.  part_hwm only grows
 * (registration, under the directory mutex), and nothing at or past it is ever read or
 * written: a reader loads it (SC) and clamps it to P; an id naming a participant or its
 * node at or past it is out of range, as one past P is.
 *
 * Indices.  Every index the segment stores (a participant slot, a queue node) is stored
 * as an id, index + 1, and 0 means none, as the kernel's qspinlock stores cpu + 1 in its
 * tail: zeroed memory names nobody.  Node ids run 1..P+1 (P+1: the lock's own node, CLH);
 * SHM_ID_UNKNOWN in a pred field means "not yet published".  Every id read from the
 * segment is bounds-checked before use (id - 1 < count, unsigned: 0 fails too).
 */
#ifndef SHM_LAYOUT_H
#define SHM_LAYOUT_H

#include <stdint.h>
#include <stddef.h>
#include <pthread.h>

#define SHM_LINE        128u              /* padding unit: two 64-byte lines (adjacent-line prefetch) */
#define SHM_MAGIC       0x314b434f4c4d4853ULL   /* "SHMLOCK1", little endian */
#define SHM_VERSION     12u
#define SHM_NAME_MAX    56u               /* bytes of a lock name, NUL included */
#define SHM_MAX_PARTICIPANTS 4096u      /* the cap when none is given (max_participants=None) */
#define SHM_HWM_FIRST   32u               /* participants a new region provisions (at most P) */
#define SHM_FIXED_NODES 5u                /* node lines a toolbox object uses by fixed index (its
                                             journal and a condition's reference: shm_toolbox.h;
                                             the ticket kind's are its slots: SHM_TICKET_SLOTS) */
#define SHM_TICKET_SLOTS 64u              /* ticket slot lines: min(P, this) (ticket.pxi) */
#define SHM_MAX_LOCKS   4096u

#define SHM_STATE_BUILDING 0u
#define SHM_STATE_READY    1u

#define SHM_HDR_PERSIST    1u             /* header.flags: the last user out keeps the name */

#define SHM_LINE_ALIGNED __attribute__((aligned(SHM_LINE)))

typedef struct shm_header {
    uint64_t magic;
    uint32_t version;
    uint32_t line_size;
    uint64_t total_size;
    uint32_t max_locks;
    uint32_t max_participants;
    uint64_t dir_off;
    uint64_t part_off;
    uint64_t locks_off;
    uint64_t lock_stride;
    uint32_t state;            /* SHM_STATE_*; published last with a release store */
    uint32_t creator_pid;
    uint32_t nlocks;           /* directory entries in use (informational) */
    uint32_t glibc_mutex_size; /* sizeof(pthread_mutex_t) of the creator: must match ours */
    uint64_t creator_pidns;    /* the creator's PID namespace (inode of /proc/self/ns/pid), 0 unknown */
    uint32_t flags;            /* SHM_HDR_*, set by the creator before the name exists */
    uint32_t part_hwm;         /* participants provisioned: 0 < part_hwm <= max_participants;
                                  only grows, published with an SC store under the
                                  directory mutex (docs/design.md §2) */
    uint64_t order_key;        /* random, fixed at creation, never 0: the segment's place in
                                  hold_all's global order (docs/design.md §15) */
    uint64_t ext_lines;        /* lines past the lock bodies: a table's stripes (0: none);
                                  part of the geometry (total_size) */
    char     _pad0[SHM_LINE - 112];
    /* line 1: serialises directory changes (create_lock) across processes; robust */
    union { pthread_mutex_t m; char _pad[SHM_LINE]; } dir_mutex;
} SHM_LINE_ALIGNED shm_header;

#define SHM_DIRENT_FREE     0u
#define SHM_DIRENT_READY    2u

typedef struct shm_dirent {
    uint32_t state;            /* SHM_DIRENT_*; READY published with a release store */
    uint32_t kind;             /* SHM_KIND_* */
    uint32_t _pad0[2];
    char     name[SHM_NAME_MAX];
    char     _pad1[SHM_LINE - 16 - SHM_NAME_MAX];
} SHM_LINE_ALIGNED shm_dirent;

/* Protocol steps a participant publishes before and after each shared-state change
 * (docs/design.md §4); op_lock is the lock index + 1, 0 = none; op_step is SHM_OP_*.
 * Holding is published by the lock itself (ctl.holder, the futex word, the ticket...). */
#define SHM_OP_TAKING     1u   /* about to run, or inside, the uncontended acquire */
#define SHM_OP_WAITING    2u   /* inside the slow path of acquire */
#define SHM_OP_RELEASING  3u   /* inside release */
#define SHM_OP_QUARANTINED 0xDEADu
typedef struct shm_participant {
    union { pthread_mutex_t m; char _pad[SHM_LINE]; } token;   /* held by the live owner thread */
    uint32_t pid;
    uint32_t tid;
    uint32_t op_lock;
    uint32_t op_step;
    uint64_t op_value;
    uint64_t generation;       /* bumped on each claim, so a stale view can be told apart */
    uint32_t pending;          /* 1: dead, its recovery begun and cut short at a waiter's
                                  deadline; the token is free, the next waiter goes on */
    uint32_t detects;          /* 1: this waiter looks for deadlocks (its process has a
                                  deadlock timeout); the victim of a cycle is chosen among
                                  these (docs/design.md §9) */
    uint64_t pidns;            /* its PID namespace (as creator_pidns): its pid and tid mean
                                  something only there */
    uint64_t wait_since;       /* CLOCK_MONOTONIC ns when its current wait began (written
                                  on the slow path, before op_step = WAITING) */
    uint64_t tstart;           /* its thread's start time (/proc .../stat field 22, clock
                                  ticks since boot): (pidns, pid, tid, tstart) names one
                                  thread across every segment, immune to tid reuse */
    /* line 1, bytes 64..127: the chain walk's poke word (docs/design.md §9), and what an
       asyncio cohort (issue 37 part B) says of the task it acts for; zeroed at each claim */
    uint32_t poke;             /* a futex word every sleep of this participant's waits
                                  watches: a walker that finds a cycle whose victim waits
                                  here bumps it and wakes it, to make it walk again */
    uint32_t agent;            /* 0: a thread; 1: an asyncio cohort acting for tasks of its
                                  thread's event loop */
    uint32_t tasks;            /* tasks waiting behind this cohort */
    uint32_t _res1;
    uint64_t task_id;          /* the task this participant acts for now (0: a thread) */
    char     label[40];        /* that task's name, UTF-8, NUL-padded, truncated */
    /* lines 2-3: the wait link (docs/design.md §9): while this participant's thread (or
       the task it acts for) holds here and waits for a lock of another segment (or through
       another slot), where that wait is, so that a chain walk that reaches this holder
       can go on.  Written by the owner seqlock-style (link_seq odd while written, even when
       stable) before the wait's first sleep, cleared (link_lock = 0) when it ends; zeroed
       at each claim.  Nothing read here is trusted: a walker validates the waiter's
       record it names (slot, generation, op_lock) before it follows the link. */
    uint32_t link_seq;
    uint32_t link_lock;        /* lock index + 1 waited for in the linked segment, 0 none */
    uint64_t link_since;       /* CLOCK_MONOTONIC ns: when that wait began */
    char     link_name[201];   /* the linked segment's name, NUL-terminated (<= 200 bytes) */
    char     _pad2a[3];
    uint32_t link_slot;        /* the waiter's slot + 1 in the linked segment (its wait
                                  record: op_lock, wait_since, detects, poke), 0 none: a
                                  task that waits behind another task of its own loop */
    uint64_t link_gen;         /* that slot's generation when the link was written */
    uint32_t link_flags;       /* SHM_LINK_DETECTS: the waiter's process looks for
                                  deadlocks (read when link_slot is 0) */
    char     _pad2[2 * SHM_LINE - 236];
} SHM_LINE_ALIGNED shm_participant;
#define SHM_LINK_DETECTS 1u

/* kinds: the value stored in the directory and in each body's ctl.kind; 7..10 are the
 * synchronization toolbox's objects (shm_toolbox.h), 11 the reader-writer lock
 * (shm_rwlock.h), which are not locks of KINDS; 12 a lock table (shm_table, below): its
 * stripes are locks of the kind its header names */
enum { SHM_KIND_TICKET = 1, SHM_KIND_MCS = 2, SHM_KIND_CLH = 3,
       SHM_KIND_FUTEX = 4, SHM_KIND_ROBUST = 5, SHM_KIND_PI = 6, SHM_KIND_TABLE = 12,
       SHM_KIND_MAX = 12 };

/* ctl.flags */
#define SHM_F_OWNER_DIED      1u   /* the current hold follows an owner death */
#define SHM_F_NOTRECOVERABLE  2u   /* released while inconsistent: every acquire fails */
#define SHM_F_HANDON          4u   /* set by a holder that releases with OWNER_DIED on purpose
                                      (a with block left by an exception before
                                      mark_consistent()): the next holder inherits
                                      owner_died, and a death mid-release is not a release
                                      made inconsistent (docs/design.md §6.4) */

/* The ctl line.  Lower half: identity, the holder record and the statistics the holder
 * writes under the lock with plain (relaxed) stores: the holder stores ctl.holder at every
 * acquire anyway, so they cost no extra line transfer.  Upper half: the repair mutex, then
 * what is written rarely: timeouts (atomic adds by waiters that gave up) and, in a table's
 * compact stripe only, word B (the dead holder's record, 12 bytes; unused in a lock
 * body).  A compact stripe is this one line: its lock word lies in the repair slot, which
 * a stripe never uses (its table's mutex serves it), so waiters and the holder's
 * statistics stay on different 64-byte halves (SHM_STRIPE_*, below).  The counters are
 * numbers, never indices (docs/design.md §10); owner_deaths (each a process's death) and
 * timeouts are 32 bits and wrap, to leave the room. */
typedef struct shm_lockctl {
    uint32_t kind;
    uint32_t flags;            /* SHM_F_* */
    uint32_t holder;           /* holder id: (index + 1) | generation << 13, 0 = none (a
                                  snapshot; participants.pxd holder_id) */
    uint32_t magic;            /* SHM_BODY_MAGIC once initialised */
    uint64_t acquisitions;     /* holds begun */
    uint64_t handoffs;         /* holds begun by another process than the last holder's */
    uint64_t contended;        /* holds that went through the slow path */
    uint64_t wait_total_ns;    /* time those spent in the slow path */
    uint64_t wait_max_ns;
    uint32_t last_pid;         /* the last holder's pid (handoffs), 0 = none yet */
    uint32_t owner_deaths;     /* holds begun with owner_died set (by their holder) */
    /* serialises recovery of dead participants on this lock (robust; rarely touched); a
       compact stripe keeps its lock word here (shm_stripe_at) */
    union { pthread_mutex_t m; char _pad[SHM_LINE / 2 - 16]; } repair;
    uint32_t timeouts;         /* timed acquires that gave up: atomic add by the waiter */
    uint32_t _wb[3];           /* a compact stripe's word B (robust.pxd: the dead holder's
                                  pid, tid, PID namespace); unused in a lock body */
} SHM_LINE_ALIGNED shm_lockctl;
#define SHM_BODY_MAGIC 0x4b4f4c42u   /* "BLOK" */

/* one hot word (or a pthread mutex) on a line of its own */
typedef union shm_word {
    uint32_t u32[SHM_LINE / 4];
    uint64_t u64[SHM_LINE / 8];
    pthread_mutex_t m;
    char _pad[SHM_LINE];
} SHM_LINE_ALIGNED shm_word;

#define SHM_ID_UNKNOWN 0xffffffffu   /* a pred not yet published (never an id) */

/* MCS and CLH: a queue node, one line */
typedef struct shm_qnode {
    uint32_t state;            /* futex word: the waiter parks here (M_* / C_* states) */
    uint32_t next;             /* MCS: successor id, a hint (0 none); CLH: unused */
    uint32_t pred;             /* predecessor node id; MCS: 0 = it was first (it holds);
                                  SHM_ID_UNKNOWN until published */
    uint32_t parked;           /* waiters that announced they are parking on state */
    uint64_t left_gen;         /* generation of the participant (thread) that abandoned
                                  it: only that thread rejoins in place */
    uint32_t round;            /* bumped at each enqueue, so a (node, round) pair names
                                  one passage of a node */
    uint32_t guess;            /* the tail's last id as its owner CASed the tail: its pred
                                  if that CAS won (queue.pxi) */
    uint32_t lock1;            /* a table's node (compact mcs stripes, mcsc.pxi): the lock
                                  number + 1 of the stripe it is queued on; 0 elsewhere */
    char     _pad[SHM_LINE - 36];
} SHM_LINE_ALIGNED shm_qnode;

/* a compact CLH stripe's node (kinds/clhc.pxi): 28 bytes, so that a stripe's own node
 * fits its line's waiters' half (SHM_STRIPE_CLH_NODE_OFF); its table's participant nodes
 * are the same 28 bytes at the start of each of the table entry's node lines. state,
 * pred and parked are where a shm_qnode has them. */
typedef struct shm_cnode {
    uint32_t state;            /* futex word (clh.pxi's C_* states) */
    uint32_t lock1;            /* the stripe (lock number + 1) of its passage */
    uint32_t pred;             /* predecessor node id, SHM_ID_UNKNOWN until published */
    uint32_t parked;           /* waiters that announced they are parking on state */
    uint32_t left_gen;         /* low 32 bits of the generation that abandoned it */
    uint32_t round;            /* bumped at each enqueue: (node, round) names one passage */
    uint32_t guess;            /* the tail's last id as its owner CASed the tail */
} shm_cnode;

/* ticket: a ticket slot (tslot[t % TS] for ticket t, TS = min(P, SHM_TICKET_SLOTS)), one
 * line; tickets t and t + TS share one once more than TS are outstanding (ticket.pxi) */
typedef struct shm_tslot {
    uint32_t grants;           /* futex word: bumped (then woken) when serving reaches a
                                  parked ticket of this slot */
    uint32_t overflow;         /* abandon markers of this slot's tickets kept in their
                                  owners' precs (prec.omark), the slot's own being taken */
    uint32_t _unused;
    uint32_t parked;           /* waiters of its tickets that announced they are parking */
    uint64_t abandoned;        /* abandon marker: t + 1 while ticket t of this slot is
                                  abandoned (| SHM_TICKET_SKIP once a releaser passes it),
                                  0 = none */
    char     _pad[SHM_LINE - 24];
} SHM_LINE_ALIGNED shm_tslot;
#define SHM_TICKET_SKIP (1ull << 63)   /* in a marker: claimed by the grant that passes it */

/* one node line, as the kind that owns the lock sees it */
typedef union shm_node {
    shm_qnode q;               /* mcs, clh */
    shm_tslot t;               /* ticket */
} SHM_LINE_ALIGNED shm_node;

/* per-participant, per-lock record: written only by its participant (or its recoverer) */
typedef struct shm_prec {
    uint32_t mine;             /* CLH: id of the node this participant owns */
    uint32_t pred;             /* CLH: id of the node it waits on / adopts at release */
    uint64_t ticket;           /* ticket: current ticket + 1, 0 = none */
    uint64_t abandoned;        /* ticket: ticket + 1 it abandoned and may rejoin, 0 = none */
    uint64_t abandoned_gen;    /* ticket: participant generation that abandoned it */
    uint32_t spin_ns;          /* adaptive spin budget of this participant on this lock */
    uint32_t round;            /* CLH: the round of `mine` as this participant enqueued it */
    uint64_t omark;            /* ticket: the abandon marker of its ticket, kept here when the
                                  ticket's slot marker was taken (as shm_tslot.abandoned) */
    uint64_t aside_since;      /* the queue kinds: while aside (docs/design.md §7.0),
                                  when its wait began (its arrival); 0 = not aside */
    uint32_t aside_wake;       /* the queue kinds: what it sleeps on aside; whoever makes
                                  it the oldest waiter aside, or frees the VIP turn for it,
                                  bumps it and wakes it (docs/design.md §7.0) */
    uint32_t qd;               /* a compact CLH stripe's participant (kinds/clhc.pxi): the
                                  node it last enqueued (with `round`: its last passage) */
    uint64_t hpass;            /* ... and the passage (node | round << 32) whose release it
                                  is making, 0 = none */
    char     _pad[SHM_LINE - 72];
} SHM_LINE_ALIGNED shm_prec;

_Static_assert(sizeof(shm_header) == 2 * SHM_LINE, "header is two lines");
_Static_assert(offsetof(shm_header, dir_mutex) == SHM_LINE, "dir mutex on line 1");
_Static_assert(sizeof(pthread_mutex_t) <= SHM_LINE, "a pthread mutex fits a line");
_Static_assert(sizeof(shm_dirent) == SHM_LINE, "dirent is one line");
_Static_assert(sizeof(shm_participant) == 4 * SHM_LINE, "participant is four lines");
_Static_assert(offsetof(shm_participant, poke) == SHM_LINE + 64
               && offsetof(shm_participant, task_id) == SHM_LINE + 80
               && offsetof(shm_participant, label) == SHM_LINE + 88,
               "line 1's reserved fields: bytes 64..127");
_Static_assert(offsetof(shm_participant, link_seq) == 2 * SHM_LINE
               && offsetof(shm_participant, link_since) == 2 * SHM_LINE + 8
               && offsetof(shm_participant, link_name) == 2 * SHM_LINE + 16
               && offsetof(shm_participant, link_slot) == 2 * SHM_LINE + 220
               && offsetof(shm_participant, link_gen) == 2 * SHM_LINE + 224
               && offsetof(shm_participant, link_flags) == 2 * SHM_LINE + 232,
               "the wait link: lines 2-3 (shmlocks/_segment.py _PART reads it)");
_Static_assert(offsetof(shm_header, part_hwm) == 92, "part_hwm follows flags");
_Static_assert(offsetof(shm_tslot, overflow) == 4, "tslot fields");
_Static_assert(offsetof(shm_prec, omark) == 40 && offsetof(shm_prec, aside_since) == 48
               && offsetof(shm_prec, aside_wake) == 56 && offsetof(shm_prec, qd) == 60
               && offsetof(shm_prec, hpass) == 64,
               "prec fields");
_Static_assert(offsetof(shm_participant, pid) == SHM_LINE, "participant identity on line 1");
_Static_assert(sizeof(shm_lockctl) == SHM_LINE, "ctl is one line");
_Static_assert(offsetof(shm_lockctl, repair) == SHM_LINE / 2, "repair mutex in the ctl line's upper half");
_Static_assert(sizeof(pthread_mutex_t) <= SHM_LINE / 2 - 16, "a pthread mutex fits the repair slot");
_Static_assert(offsetof(shm_lockctl, last_pid) == 56 && offsetof(shm_lockctl, owner_deaths) == 60,
               "holder-written statistics fill the lower half (shmlocks/_segment.py _CTL)");
_Static_assert(offsetof(shm_lockctl, timeouts) == SHM_LINE - 16
               && offsetof(shm_lockctl, _wb) == SHM_LINE - 12,
               "timeouts and a stripe's word B end the ctl line (shmlocks/_segment.py)");
_Static_assert(offsetof(shm_participant, op_step) == offsetof(shm_participant, op_lock) + 4,
               "op_lock and op_step form one 64-bit word (published with one store)");
_Static_assert(sizeof(shm_word) == SHM_LINE, "word is one line");
_Static_assert(sizeof(pthread_mutex_t) % 4 == 0 && sizeof(pthread_mutex_t) + 8 <= SHM_LINE,
               "a mutex word's line has two free u32 past the mutex (pi: asyncw, aseq; pi.pxd)");
_Static_assert(sizeof(shm_node) == SHM_LINE, "node is one line");
_Static_assert(sizeof(shm_cnode) == 28 && offsetof(shm_cnode, state) == offsetof(shm_qnode, state)
               && offsetof(shm_cnode, pred) == offsetof(shm_qnode, pred)
               && offsetof(shm_cnode, parked) == offsetof(shm_qnode, parked),
               "a compact CLH node: 28 bytes, its state, pred and parked where a queue node's are");
_Static_assert(sizeof(shm_qnode) == SHM_LINE && sizeof(shm_tslot) == SHM_LINE,
               "each view of a node is the whole line");
_Static_assert(offsetof(shm_qnode, parked) == 12 && offsetof(shm_tslot, parked) == 12
               && offsetof(shm_qnode, left_gen) == 16 && offsetof(shm_tslot, abandoned) == 16
               && offsetof(shm_qnode, lock1) == 32,
               "the views agree where _raw() reads a node as a queue node");
_Static_assert(sizeof(shm_prec) == SHM_LINE, "prec is one line");
_Static_assert(offsetof(shm_header, order_key) == 96 && offsetof(shm_header, ext_lines) == 104
               && offsetof(shm_header, _pad0) == 112, "header fields fill 112 bytes");
_Static_assert(offsetof(shm_participant, wait_since) == SHM_LINE + 48
               && offsetof(shm_participant, tstart) == SHM_LINE + 56,
               "the wait record: line 1, bytes 48..63 (shmlocks/waitgraph.py reads them)");

/* body geometry, in lines */
#define SHM_BODY_CTL    0u
#define SHM_BODY_WA     1u
#define SHM_BODY_WB     2u
#define SHM_BODY_NODES  3u
static inline uint64_t shm_body_lines(uint32_t P) { return 3u + (uint64_t)(P + 1u) + P; }
/* the node lines a body of a kind that uses `fixed` of them by index (its ops table's
   fixed_nodes: the ticket's slots, a toolbox object's journal) provisions with its fixed
   lines, whatever its participants: never past the P + 1 it has */
static inline uint32_t shm_fixed_nodes(uint32_t fixed, uint32_t P) {
    return fixed < P + 1u ? fixed : P + 1u;
}

typedef struct shm_body {      /* process-local view of one lock body; never stored in shm */
    shm_lockctl *ctl;
    shm_word    *wa;
    shm_word    *wb;
    shm_qnode   *qnodes;       /* P + 1 nodes, as MCS and CLH see them (the ticket kind's
                                  view of the same lines: shm_tslots) */
    shm_prec    *precs;        /* P */
    uint32_t    *hwm;          /* the region's part_hwm (participants.pxd body_hwm reads it) */
    uint32_t     P;            /* the cap: the geometry (ticket slots: min(P, SHM_TICKET_SLOTS)) */
    uint32_t     index;        /* lock index in the region */
    uint32_t     hwm_seen;     /* part_hwm as this view last read it (<= P): only grows, so an
                                  id below it is in range without a look at the header
                                  (queue.pxd queue_node_ok); one past it looks again */
} shm_body;
_Static_assert(sizeof(shm_body) <= 64, "a view of a body is one cache line: the fast path's");

static inline shm_tslot *shm_tslots(shm_body *b) { return (shm_tslot *)b->qnodes; }
/* is view b a table's compact stripe (shm_stripe_at)?  Its word B lies in its first two
   lines; a lock body's is its line SHM_BODY_WB (shm_body_at), as a full stripe's */
static inline int shm_view_compact(const shm_body *b) {
    return (const char *)b->wb < (const char *)b->ctl + SHM_BODY_WB * SHM_LINE;
}

static inline shm_body shm_body_at(char *base, uint64_t off, uint32_t P, uint32_t index) {
    shm_body b;
    char *p = base + off;
    b.ctl   = (shm_lockctl *)p;
    b.wa    = (shm_word *)(p + SHM_BODY_WA * SHM_LINE);
    b.wb    = (shm_word *)(p + SHM_BODY_WB * SHM_LINE);
    b.qnodes = (shm_qnode *)(p + SHM_BODY_NODES * SHM_LINE);
    b.precs = (shm_prec *)(p + (SHM_BODY_NODES + (uint64_t)P + 1u) * SHM_LINE);
    b.hwm = &((shm_header *)base)->part_hwm;
    b.P = P;
    b.hwm_seen = __atomic_load_n(b.hwm, __ATOMIC_SEQ_CST);
    if (b.hwm_seen > P) b.hwm_seen = P;
    b.index = index;
    return b;
}

/*
 * Lock tables (docs/design.md §15).  A table is one directory entry of kind SHM_KIND_TABLE.
 * Its own body (a lock body's place) holds the table's repair mutex (ctl.repair: it
 * serialises the recoveries of every stripe), its header (word A: shm_table) and, in its
 * precs, the table-wide line of each participant for compact stripes (the adaptive spin
 * budget, pi's asynchronous-wait mark).  The stripes live past the lock bodies, in the
 * segment's extension area (header.ext_lines), `stride` bytes each:
 *   compact (every kind): one line (128 bytes), a shm_lockctl whose
 *     repair slot
 *     (never used: the table's mutex serves its stripes) holds the lock word: the view
 *     aims wa at the slot (SHM_STRIPE_WA_OFF, byte 64: the futex word, or the glibc mutex
 *     with pi's asyncw and aseq in the two u32 past it; ticket: next, then serving, which
 *     wb names, SHM_STRIPE_TICKET_WB_OFF; mcs: the tail and its first hint; for both,
 *     24 bytes past wa, their waiters' aside words, SHM_STRIPE_ASIDE_OFF)
 *     and wb at the ctl's _wb (the dead holder's
 *     record, 12 bytes).  So the line's first 64-byte half is what the holder
 *     writes at each hold (holder, statistics) and the second what waiters read, CAS,
 *     sleep on or add to (the word, timeouts), as a lock body's ctl and word lines are.
 *     Where glibc's mutex is larger than the slot leaves room for (aarch64: 48 bytes),
 *     the stripe is two lines and the word the second.  Nodes: none (mcs: the table
 *     entry's node lines, one wait node per participant for the whole table, mcsc.pxi;
 *     clh: the same lines and one node in each stripe's line, a pool the nodes travel
 *     in, clhc.pxi: the tail at word A, the head at word B, SHM_STRIPE_CLH_*).
 * Lock numbers: entry i of the directory is lock i; the table's stripe s is lock
 * first + s, first >= max_locks.  op_lock, the wait link and every reader name a lock by
 * number + 1; participants.pxd lock_at is the decoder of a mapped region (shmlocks/_segment.py
 * mirrors it for the readers, sys/shm_walk.h dlw_lock for the chain walk's pread copies).
 */
#define SHM_TABLE_MAX      (1u << 20)     /* stripes of one table */
#define SHM_MUTEX_U32      ((uint32_t)(sizeof(pthread_mutex_t) / 4))  /* pi.pxd: asyncw, aseq */
/* a compact stripe: its lines, and where its view aims word A and word B (byte offsets
   into the stripe, whose ctl is at 0; the Python readers take them from _core.LAYOUT) */
#define SHM_STRIPE_FITS    (offsetof(shm_lockctl, repair) + sizeof(pthread_mutex_t) + 8 \
                            <= offsetof(shm_lockctl, timeouts))
#define SHM_STRIPE_LINES   (SHM_STRIPE_FITS ? 1u : 2u)
#define SHM_STRIPE_WA_OFF  (SHM_STRIPE_FITS ? (uint32_t)offsetof(shm_lockctl, repair) : SHM_LINE)
#define SHM_STRIPE_WB_OFF  ((uint32_t)offsetof(shm_lockctl, _wb))
/* a compact ticket stripe (kinds/ticketc.pxi): next at word A, serving the u64 past it
   (word B: the view aims wb there, so `next != serving` reads as for a lock body), then
   its parked and marks counts */
#define SHM_STRIPE_TICKET_WB_OFF (SHM_STRIPE_WA_OFF + 8u)
/* a compact CLH stripe (kinds/clhc.pxi): the tail at word A, the head (the holder's queued
   node | its round << 32) as word B past it, the stripe's own node past that, and its
   waiters' aside words with one seat in the last 12 bytes of the line (where a robust or
   pi stripe keeps its dead holder's record: a CLH stripe has none) */
#define SHM_STRIPE_CLH_HEAD_OFF  (SHM_STRIPE_WA_OFF + 8u)
#define SHM_STRIPE_CLH_NODE_OFF  (SHM_STRIPE_WA_OFF + 16u)
#define SHM_STRIPE_CLH_ASIDE_OFF (SHM_STRIPE_LINES == 1u ? SHM_STRIPE_WB_OFF \
                                                         : SHM_STRIPE_WA_OFF + 48u)
#define SHM_STRIPE_CLH_SEATS     1u
/* a FIFO kind's compact stripe (ticket, mcs) keeps its waiters' aside words (the VIP
   turn and SHM_STRIPE_SEATS spinner seats: participants.pxd aside_words, docs/design.md
   §7.0) in its waiters' half, 24 bytes past its word A (past the ticket's next, serving,
   parked and marks; the mcs tail and first hint), before timeouts: a lock body keeps
   them in its word B line's upper half, with AS_MAX_SEATS seats */
#define SHM_STRIPE_ASIDE_OFF (SHM_STRIPE_WA_OFF + 24u)
#define SHM_STRIPE_SEATS     4u

typedef struct shm_table {
    uint32_t sub;              /* the stripes' kind (SHM_KIND_TICKET .. SHM_KIND_PI) */
    uint32_t size;             /* stripes, 1 .. SHM_TABLE_MAX */
    uint32_t first;            /* the lock number of stripe 0 */
    uint32_t compact;          /* 1: SHM_STRIPE_LINES-line stripes, every kind's since layout
                                  12 (0, whole lock bodies, was clh's: refused now) */
    uint64_t off;              /* byte offset of stripe 0 in the segment */
    uint64_t stride;           /* bytes from one stripe to the next */
    char     _pad[SHM_LINE - 32];
} SHM_LINE_ALIGNED shm_table;

_Static_assert(sizeof(shm_table) == SHM_LINE, "a table's header is one line (its word A)");
_Static_assert(SHM_STRIPE_WA_OFF + sizeof(pthread_mutex_t) + 8 <= SHM_STRIPE_LINES * SHM_LINE
               && (SHM_STRIPE_LINES == 2u
                   || SHM_STRIPE_WA_OFF + sizeof(pthread_mutex_t) + 8
                      <= offsetof(shm_lockctl, timeouts)),
               "a compact stripe's mutex, asyncw and aseq lie in its ctl's repair slot (or its "
               "second line)");
_Static_assert(SHM_STRIPE_TICKET_WB_OFF + 16 <= offsetof(shm_lockctl, timeouts)
               || SHM_STRIPE_LINES == 2u,
               "a ticket stripe's next, serving, parked and marks lie in the repair slot");
_Static_assert(SHM_STRIPE_TICKET_WB_OFF + 16 <= SHM_STRIPE_ASIDE_OFF
               && SHM_STRIPE_ASIDE_OFF + (2u + SHM_STRIPE_SEATS) * 4u
                  <= (SHM_STRIPE_LINES == 2u ? 2u * SHM_LINE
                                             : (uint32_t)offsetof(shm_lockctl, timeouts)),
               "a ticket or mcs stripe's aside words follow its words, before timeouts (or "
               "within its second line)");
_Static_assert(SHM_STRIPE_CLH_NODE_OFF + sizeof(shm_cnode)
                  <= (SHM_STRIPE_LINES == 2u ? SHM_STRIPE_WA_OFF + 48u
                                             : (uint32_t)offsetof(shm_lockctl, timeouts))
               && SHM_STRIPE_CLH_ASIDE_OFF + (2u + SHM_STRIPE_CLH_SEATS) * 4u
                  <= SHM_STRIPE_LINES * SHM_LINE
               && SHM_STRIPE_CLH_NODE_OFF % 4u == 0 && SHM_STRIPE_CLH_HEAD_OFF % 8u == 0,
               "a CLH stripe's tail, head, node and aside words fit its line, timeouts apart");
_Static_assert(SHM_STRIPE_WA_OFF >= SHM_LINE / 2 && SHM_STRIPE_WB_OFF >= SHM_LINE / 2,
               "a compact stripe's words lie in the half the holder's statistics do not");

/* the view of stripe s of table t (its geometry validated: participants.pxi table_load);
 * `tbody` the table entry's own body */
static inline shm_body shm_stripe_at(char *base, const shm_table *t, const shm_body *tbody,
                                     uint32_t s) {
    shm_body b;
    char *p = base + t->off + (uint64_t)s * t->stride;
    b.ctl = (shm_lockctl *)p;
    b.wa = (shm_word *)(p + SHM_STRIPE_WA_OFF);
    b.wb = (shm_word *)(p + (t->sub == SHM_KIND_TICKET ? SHM_STRIPE_TICKET_WB_OFF
                             : t->sub == SHM_KIND_CLH ? SHM_STRIPE_CLH_HEAD_OFF
                             : SHM_STRIPE_WB_OFF));
    /* mcs: one wait node per participant for the table, the table entry's own node lines
       (mcsc.pxi); clh: the same lines, the pool its nodes travel in with one node per
       stripe (clhc.pxi); the other kinds have none */
    b.qnodes = (t->sub == SHM_KIND_MCS || t->sub == SHM_KIND_CLH) ? tbody->qnodes : NULL;
    b.precs = tbody->precs;            /* one line per participant for the table */
    b.hwm = tbody->hwm;
    b.P = tbody->P;
    b.hwm_seen = __atomic_load_n(b.hwm, __ATOMIC_SEQ_CST);
    if (b.hwm_seen > b.P) b.hwm_seen = b.P;
    b.index = t->first + s;
    return b;   /* its recoveries' mutex: the table's (participants.pxd body_repair) */
}

#endif
