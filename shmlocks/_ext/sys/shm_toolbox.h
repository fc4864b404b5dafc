/*
 * shm_toolbox.h -- the on-disk layout of the synchronization toolbox's objects (Event,
 * Semaphore, BoundedSemaphore, Barrier, Condition: docs/design.md §12).  Part of the ABI,
 * beside shm_layout.h: an object lives in a region's directory like a lock, with its own
 * kind code, and its body has a lock body's geometry (ctl | word A | word B | nodes[P+1] |
 * precs[P]), seen through these views:
 *
 *   ctl        kind, magic (as a lock's); the repair mutex serialises recoveries
 *   word A     shm_tbword: the futex word waiters sleep on, and the object's state
 *   word B     the guard: a robust pthread mutex every change of the state is made under
 *   nodes 0-1  shm_tbjournal: the undo journal of the change in progress under the guard
 *   nodes 2-4  shm_tbref: a Condition's lock (region name, lock name)
 *   precs[p]   shm_tbrec: participant p's part in the object (units, arrival, waiting)
 */
#ifndef SHM_TOOLBOX_H
#define SHM_TOOLBOX_H

#include "shm_layout.h"

enum { SHM_KIND_EVENT = 7, SHM_KIND_SEMAPHORE = 8, SHM_KIND_BARRIER = 9,
       SHM_KIND_CONDITION = 10 };

typedef struct shm_tbword {
    uint32_t seq;       /* futex word: changed (then woken) when what waiters wait for may
                           have changed. Event: its state itself, set bit | generation << 1 */
    uint32_t parked;    /* waiters that announced they sleep on seq */
    uint32_t value;     /* semaphore: free units; barrier: state (TB_B_*); condition: the
                           next waiter ticket */
    uint32_t limit;     /* bounded semaphore: the initial value (0: unbounded);
                           barrier: parties */
    uint32_t count;     /* barrier: threads inside wait() (threading's _count) */
    uint32_t waiting;   /* semaphore, condition: threads inside wait (a snapshot for inspect) */
    uint64_t timeout_ns;/* barrier: the default timeout, ns + 1 (0: none) */
    uint32_t flags;     /* TB_F_* */
    uint32_t cycle;     /* barrier: bumped each time it releases its waiters */
    uint32_t gone;      /* barrier, condition: bumped by a waiter that left without the guard
                           (its record's `gone` says how): the next guard holder looks */
    char     _pad[SHM_LINE - 44];
} SHM_LINE_ALIGNED shm_tbword;

#define TB_F_BOUNDED 1u   /* semaphore: bounded */
#define TB_F_BREAK   2u   /* barrier: a party died during the drain: it ends BROKEN */

#define TB_JMAX 31u
typedef struct shm_tbjent {
    uint32_t off;       /* byte offset of the word in the body (word A or a record) */
    uint32_t old;       /* its value before the change */
} shm_tbjent;
typedef struct shm_tbjournal {
    uint32_t n;         /* entries valid: a change in progress; 0 between changes */
    uint32_t _pad;
    shm_tbjent e[TB_JMAX];
} SHM_LINE_ALIGNED shm_tbjournal;

typedef struct shm_tbref {
    uint32_t how;       /* TB_REF_*: how a Condition's lock is opened */
    uint32_t _pad;
    char     region[248];    /* the lock's region name, NUL-terminated (names <= 200 bytes) */
    char     lock[SHM_NAME_MAX];
    char     _pad1[3 * SHM_LINE - 256 - SHM_NAME_MAX];
} SHM_LINE_ALIGNED shm_tbref;

#define TB_REF_NONE       0u   /* not a shmlocks lock (threading's): not openable elsewhere */
#define TB_REF_STANDALONE 1u   /* the one lock of region `region` */
#define TB_REF_IN_REGION  2u   /* lock `lock` of region `region` */
#define TB_REF_RLOCK   0x100u  /* wrapped in an RLock */

typedef struct shm_tbrec {
    uint32_t units;     /* semaphore: units this participant took with `with` and holds */
    uint32_t inside;    /* barrier: 1 while counted in count (from arrival to leaving) */
    uint32_t member;    /* barrier: this participant's holder id once it has waited on it */
    uint32_t ticket;    /* condition: its wait's ticket, 0 = not waiting */
    uint32_t notified;  /* condition: futex word: 1 once notified (the waiter sleeps here) */
    uint32_t parked;    /* condition: 1 while its waiter sleeps on notified */
    uint32_t poke;      /* condition: futex word: bumped when its waiter must look again at
                           whom it watches (it became the oldest waiter) */
    uint32_t waiting;   /* semaphore, barrier: 1 while its thread sleeps in a wait here */
    uint32_t gone;      /* TB_GONE_*: its waiter left without the guard (its deadline, or a
                           signal, came while another held it); the next holder finishes */
    uint32_t gone_cycle;/* barrier: the cycle a TB_GONE_BREAK left in */
    char     _pad[SHM_LINE - 40];
} SHM_LINE_ALIGNED shm_tbrec;

/* rec.gone: how a waiter left without the guard (docs/design.md §12, "Leaving without the
 * guard"); 0: it did not */
#define TB_GONE_BREAK 1u   /* barrier: left while filling cycle gone_cycle: that breaks it */
#define TB_GONE_LEAVE 2u   /* barrier: left after the round was released: it just leaves */
#define TB_GONE_HELD  3u   /* barrier: claimed by the thread releasing the round, meanwhile */
#define TB_GONE_DROP  4u   /* condition: left not notified (notified 0 -> TB_N_GONE) */
#define TB_GONE_PASS  5u   /* condition: left notified, by an exception: pass it on */
#define TB_GONE_USED  6u   /* condition: left notified, and returned True */
#define TB_N_GONE     2u   /* condition: rec.notified of a waiter that left, never notified */

/* barrier states, threading.Barrier's _state */
#define TB_B_FILLING   0u
#define TB_B_DRAINING  1u
#define TB_B_RESETTING 2u
#define TB_B_BROKEN    3u

_Static_assert(sizeof(shm_tbword) == SHM_LINE, "a toolbox word A is one line");
_Static_assert(sizeof(shm_tbjournal) == 2 * SHM_LINE, "the journal is two node lines");
_Static_assert(sizeof(shm_tbref) == 3 * SHM_LINE, "a condition's lock ref is three node lines");
_Static_assert(sizeof(shm_tbrec) == SHM_LINE, "a toolbox record is a prec line");
_Static_assert(offsetof(shm_tbword, timeout_ns) == 24, "tbword fields");
_Static_assert(offsetof(shm_tbrec, gone) == 32, "tbrec fields");

static inline shm_tbword *shm_tb_word(shm_body *b) { return (shm_tbword *)b->wa; }
static inline pthread_mutex_t *shm_tb_guard(shm_body *b) { return &b->wb->m; }
static inline shm_tbjournal *shm_tb_journal(shm_body *b) { return (shm_tbjournal *)b->qnodes; }
static inline shm_tbref *shm_tb_ref(shm_body *b) { return (shm_tbref *)&b->qnodes[2]; }
static inline shm_tbrec *shm_tb_rec(shm_body *b, uint32_t p) { return (shm_tbrec *)&b->precs[p]; }

#endif
