/*
 * shm_rwlock.h -- the on-disk layout of the reader-writer lock (RWLock: docs/design.md
 * §13).  Part of the ABI, beside shm_layout.h and shm_toolbox.h: an RWLock lives in a
 * region's directory like a toolbox object, with its own kind code, and its body has a
 * lock body's geometry (ctl | word A | word B | nodes[P+1] | precs[P]), seen through
 * these views:
 *
 *   ctl        kind, magic, flags (OWNER_DIED, NOTRECOVERABLE, HANDON), holder (the
 *              writer's holder id while it holds), the writers' statistics; the repair
 *              mutex serialises recoveries
 *   word A     shm_rwword: the writer word every writer CASes and every reader reads
 *   precs[p]   shm_rwrec: participant p's reader indicator and writer state, one line
 *              each, so a reader writes only its own line
 */
#ifndef SHM_RWLOCK_H
#define SHM_RWLOCK_H

#include "shm_layout.h"

enum { SHM_KIND_RWLOCK = 11 };

/* word A's `w`: the writer phase.  PRESENT while a writer has announced itself (draining
 * the readers present at its arrival, then holding); the writer's slot + 1 in the low
 * bits; the phase number (bumped by each writer's announcement) above. */
#define RW_PRESENT    0x80000000u
#define RW_SLOT_BITS  13u
#define RW_SLOT_MASK  ((1u << RW_SLOT_BITS) - 1u)
#define RW_PHASE_MASK 0x3ffffu          /* 18 bits: (w >> RW_SLOT_BITS) & RW_PHASE_MASK */

typedef struct shm_rwword {
    uint32_t w;         /* futex word: RW_PRESENT | phase << 13 | writer slot + 1 */
    uint32_t parked;    /* readers and writers that announced they sleep on w */
    uint32_t wwait;     /* writers waiting for w to be free (a snapshot, for inspect) */
    uint32_t _pad0;
    char     _pad[SHM_LINE - 16];
} SHM_LINE_ALIGNED shm_rwword;

/* a reader indicator (shm_rwrec.ind): the read holds of the participant in the low 13
 * bits; a reader that found a writer of phase n present and waits for it (it does not hold)
 * sets RW_BLOCKED and n (all 18 bits of the phase) as its tag: that writer does not wait
 * for it, and the next one does (it enters as soon as the phase changes). A tag could
 * only be taken for a later phase's after 2^18 writers announced and withdrew (timed
 * out) while the reader never ran: each writer that does not withdraw waits for it. */
#define RW_COUNT_MASK 0x1fffu
#define RW_BLOCKED    0x80000000u
#define RW_TAG_SHIFT  13u
#define RW_TAG_MASK   RW_PHASE_MASK

/* shm_rwrec.wstate: where the participant is as a writer */
#define RW_W_NONE      0u
#define RW_W_DRAINING  1u   /* announced (w names it), waiting for the readers */
#define RW_W_HOLDING   2u   /* returned from acquire_write: in its critical section */
#define RW_W_RELEASING 3u   /* inside release_write, w still naming it */

typedef struct shm_rwrec {
    uint32_t ind;       /* futex word: the reader indicator (RW_COUNT_MASK, RW_BLOCKED) */
    uint32_t wparked;   /* a writer sleeping on ind, waiting for this reader to leave */
    uint32_t wstate;    /* RW_W_*: written by the participant (its recoverer clears it) */
    uint32_t waiting;   /* 1 while its thread sleeps in an acquire here (inspect) */
    uint64_t reads;     /* read holds begun (statistics: the participant's own line) */
    uint64_t read_waits;/* read holds that waited for a writer */
    uint64_t timeouts;  /* timed read acquires that gave up */
    uint64_t read_wait_ns;     /* the time those read_waits waited, summed (the
                                  slow path's two clock reads; never the fast path) */
    uint64_t read_wait_max_ns; /* the longest of them */
    char     _pad[SHM_LINE - 56];
} SHM_LINE_ALIGNED shm_rwrec;

_Static_assert(sizeof(shm_rwword) == SHM_LINE, "an rwlock word A is one line");
_Static_assert(sizeof(shm_rwrec) == SHM_LINE, "an rwlock record is a prec line");
_Static_assert(offsetof(shm_rwrec, reads) == 16
               && offsetof(shm_rwrec, read_wait_max_ns) == 48,
               "the read statistics follow the four words (shmlocks/_segment.py _RWREC)");
_Static_assert(RW_SLOT_BITS == 13u, "the writer's slot + 1 fits as a holder id's does");
_Static_assert((RW_COUNT_MASK | (RW_TAG_MASK << RW_TAG_SHIFT) | RW_BLOCKED) == 0xffffffffu
               && (RW_COUNT_MASK & (RW_TAG_MASK << RW_TAG_SHIFT)) == 0,
               "an indicator is count | tag | blocked, without overlap");

static inline shm_rwword *shm_rw_word(shm_body *b) { return (shm_rwword *)b->wa; }
static inline shm_rwrec *shm_rw_rec(shm_body *b, uint32_t p) { return (shm_rwrec *)&b->precs[p]; }

#endif
