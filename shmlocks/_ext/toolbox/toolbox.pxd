# toolbox.pxd -- what the synchronization toolbox's objects share (docs/design.md §12): the
# interface of toolbox.pxi (its invariant: the top of that file). Each primitive (event,
# semaphore, barrier, condition) changes its shared state only under the object's guard
# (tb_guard/tb_unlock), every multi-word change journaled (tb_set), and sleeps with tb_sleep
# on a word and on the lives it depends on (tb_watch).

cdef enum:
    TB_WATCH_MAX = SHM_WAITV_MAX


cdef struct tb_watch_t:
    watch_t ws
    uint32_t slots[TB_WATCH_MAX]   # whose token ws.words[i] is (i >= 1)
    int full                       # a token did not fit: sleep a slice
    recov_t rec                    # recoveries this sleep runs keep its deadline (ws.rec)
    shm_many* more                 # tokens past ws's: the thread's list (io_uring), while it
    uint64_t more_gen              # is this sleep's (its generation is more_gen); NULL none


cdef int tb_lock(rmap_t* rm, shm_body* b, int64_t until) noexcept nogil
cdef int tb_guard(rmap_t* rm, shm_body* b, int64_t until, bint sig) noexcept nogil
cdef void tb_init(shm_body* b) noexcept nogil
cdef int tb_watch(rmap_t* rm, tb_watch_t* t, uint32_t slot) noexcept nogil
cdef int tb_sleep(rmap_t* rm, tb_watch_t* t, uint32_t* parked, int64_t deadline) noexcept nogil
cdef int tb_sleep_w(rmap_t* rm, tb_watch_t* t, uint32_t* parked, wait_t* w) noexcept nogil
cdef int tb_asleep(rmap_t* rm, tb_watch_t* t, uint32_t* parked, int64_t deadline,
                   int64_t* slept) noexcept nogil
cdef void tb_count(shm_body* b, bint got, bint timed_out, int64_t slept) noexcept nogil
cdef bint tb_sweep(rmap_t* rm, shm_body* b, bint (*has)(shm_body*, uint32_t) noexcept nogil,
                   uint32_t me, recov_t* rec) noexcept nogil
cdef int64_t tb_deadline(timeout) except -2
cdef int tb_recover_lock(rmap_t* rm, shm_body* b, recov_t* rec) noexcept nogil


cdef inline void tb_set(shm_body* b, uint32_t* p, uint32_t v) noexcept nogil:
    """Under the guard: journal *p's old value, then store v (docs/design.md §12)."""
    cdef shm_tbjournal* j = shm_tb_journal(b)
    cdef uint32_t n = j.n
    dassert(n < TB_JMAX, "toolbox: a change fits the journal")
    if n < TB_JMAX:
        j.e[n].off = <uint32_t>(<char*>p - <char*>b.ctl)
        j.e[n].old = ld32_rlx(p)
        st32_seq(&j.n, n + 1)              # the entry is there before the store
    st32_seq(p, v)


cdef inline bint tb_cas(shm_body* b, uint32_t* p, uint32_t old, uint32_t v) noexcept nogil:
    """Under the guard: tb_set for a word a thread without the guard may change too (a
    waiter leaving without it, docs/design.md §12): CAS old -> v, journaled; 0 if the word
    no longer held old (nothing stored, nothing journaled)."""
    cdef shm_tbjournal* j = shm_tb_journal(b)
    cdef uint32_t n = j.n
    if n < TB_JMAX:
        j.e[n].off = <uint32_t>(<char*>p - <char*>b.ctl)
        j.e[n].old = old
        st32_seq(&j.n, n + 1)
    if cmpxchg32(p, old, v) == old:
        return 1
    if n < TB_JMAX:
        st32_seq(&j.n, n)
    return 0


cdef inline void tb_gone(shm_body* b, uint32_t me, uint32_t how) noexcept nogil:
    """Without the guard: this waiter has left (rec.gone = how); the next guard holder
    finishes its leaving (each primitive's reap)."""
    st32_seq(&shm_tb_rec(b, me).gone, how)
    fadd32(&shm_tb_word(b).gone, 1)


cdef inline bint tb_gone_any(shm_body* b) noexcept nogil:
    """Guard held: has a waiter left without it since the last look? (clears the hint; the
    records are then looked at by the caller)"""
    cdef shm_tbword* w = shm_tb_word(b)
    if ld32_acq(&w.gone) == 0:
        return 0
    st32_seq(&w.gone, 0)
    return 1


cdef inline void tb_unlock(shm_body* b) noexcept nogil:
    """Commit the change (empty the journal) and let go of the guard."""
    st32_seq(&shm_tb_journal(b).n, 0)
    pm_unlock(shm_tb_guard(b), 0)


cdef inline void tb_bump(shm_body* b, int n) noexcept nogil:
    """After a change a waiter waits for (guard held): change the word it sleeps on. The
    caller wakes after letting go of the guard (tb_wake)."""
    fadd32(&shm_tb_word(b).seq, 1)


cdef inline void tb_wake(shm_body* b, int n) noexcept nogil:
    if ld32_seq(&shm_tb_word(b).parked) != 0:
        shm_futex_wake(&shm_tb_word(b).seq, n)


cdef inline void tb_watch_init(tb_watch_t* t, uint32_t* word, uint32_t val,
                               int64_t deadline) noexcept nogil:
    """A sleep on word while it holds val, until `deadline` (a death found meanwhile is
    recovered by it)."""
    t.ws.words[0] = word
    t.ws.vals[0] = val
    t.ws.n = 1
    t.ws.token = -1
    t.full = 0
    t.slots[0] = 0xffffffff
    recov_init(&t.rec, deadline)
    t.ws.rec = &t.rec
    t.more = NULL


cdef inline void tb_watch_word(tb_watch_t* t, uint32_t* word, uint32_t val) noexcept nogil:
    """Also sleep on word while it holds val (not a token: no death to look for)."""
    if t.ws.n < SHM_WAITV_MAX:
        t.slots[t.ws.n] = 0xffffffff
        watch_word(&t.ws, word, val)


cdef class _TbObject:
    cdef Region _region
    cdef rmap_t* rm
    cdef shm_body b
    cdef bint _closed
    cdef bint _standalone
    cdef str _name
    cdef object __weakref__

    cdef _bind(self, Region region, uint32_t i, name)
    cdef reg_t* _me(self) except NULL
    cdef int _check(self) except -1
    cdef int _guard(self) except -1
    cdef object _guard_error(self)
    cdef int _waiters(self) noexcept nogil
    cdef dict _part(self, uint32_t i)
