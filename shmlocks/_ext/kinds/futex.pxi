# futex.pxi -- three-state futex mutex with the owner in the word (Drepper, "Futexes Are
# Tricky", mutex #3, with the owner id in place of the 1 as robust futexes do).
#
# Invariant: word A (its view: futex.pxd fx_state) is 0 (free) or (holder participant
# index + 1) | W, where W (bit 31) means "a waiter may be parked". Lockers CAS 0 -> me+1;
# a waiter that will park first sets W, so the unlocker, finding W in what it swapped out,
# wakes one waiter. Because the atomic that takes the lock also names the taker, a dead
# holder is known exactly: a waiter that finds the owner's token OWNER_DIED recovers it
# (participant_recover) and the lock is released on its behalf, with owner_died set when
# the owner had returned from acquire.
# A parked waiter sleeps on the word and on the holder's token (_fx_dep): that death
# wakes it.
# Barging, not FIFO: a running thread may take the lock before a woken one. A waiter that
# times out just leaves: at worst the next unlock makes one spurious FUTEX_WAKE.

cdef enum:
    FX_W = 0x80000000
    # An unlock wakes two parked waiters: the one that may take the lock, and one that, if
    # the first takes it, re-arms on the new holder's token (_fx_dep): the others still
    # sleep on an earlier holder's, so without it the new holder's death would wake nobody.
    FX_WAKE = 2


cdef inline uint32_t _fx_owner1(uint32_t v) noexcept nogil:
    return v & ~(<uint32_t>FX_W)


cdef void _futex_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil:
    """Participant q is dead and ours to recover (repair mutex held): release the lock on
    its behalf if it holds it. owner_died unless it was still inside acquire or release."""
    cdef uint32_t* word = fx_state(b)
    cdef uint32_t v = ld32_seq(word)
    cdef uint32_t op
    if _fx_owner1(v) != q + 1:
        return                                       # [F2] it does not hold it: nothing
    op = participant_op(rm, q, b.index + 1)
    recover_verdict(rm, b, q, op)                    # [F1] the word names it: [V]
    crashpoint("futex.recover.flagged")
    if cas32(word, v, 0):
        if v & FX_W:
            shm_futex_wake(word, FX_WAKE)


cdef struct _fx_ctx:
    uint32_t* word
    uint32_t me1          # our participant index + 1: what the word says once we hold it
    uint32_t keep_w       # 1 once we announced ourselves with W: take the lock with W kept


cdef int _fx_take(void* p) noexcept nogil:
    """park()'s ready: take the lock if it is free (0 -> me+1, with W kept once we parked:
    other waiters may still be parked)."""
    cdef _fx_ctx* c = <_fx_ctx*>p
    if ld32_rlx(c.word) == 0 and cas32(c.word, 0, c.me1 | (FX_W if c.keep_w else 0)):
        return Q_READY
    return Q_NEAR


cdef int _fx_dep(park_t* pk, watch_t* ws) noexcept nogil:
    """park()'s dependency: announce ourselves (W in the word we sleep on, so the unlock
    wakes), then watch the holder the word names: its death wakes us (recovered here)."""
    cdef _fx_ctx* c = <_fx_ctx*>pk.ctx
    cdef uint32_t v = ws.vals[0]
    cdef uint32_t o
    if v == 0:
        return DEP_CHANGED                           # released since: try again
    if not (v & FX_W):
        if not cas32(c.word, v, v | FX_W):
            return DEP_CHANGED
        v = v | FX_W
        ws.vals[0] = v
    c.keep_w = 1
    crashpoint("futex.wait.announced")
    o = _fx_owner1(v)
    if o == 0 or o > body_hwm(pk.b):
        return DEP_UNKNOWN
    return watch_participant(pk.rm, o - 1, ws)


cdef class FutexMutex(_Lock):
    """Three-state futex mutex: the fastest hand-off, no fairness (barging)."""
    kind_name = "futex"
    kind_code = SHM_KIND_FUTEX
    fifo = False
    recovery = "user"
    priority_inheritance = False

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        return R_ACQ if cas32(fx_state(&self.b), 0, me + 1) else R_BUSY

    cdef int _try(self, uint32_t me) noexcept nogil:
        return R_ACQ if cas32(fx_state(&self.b), 0, me + 1) else R_BUSY

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef _fx_ctx c
        cdef park_t pk
        cdef int res
        c.word = fx_state(&self.b)
        c.me1 = me + 1
        c.keep_w = rc == R_PENDING                   # a resumed wait that announced with W
        w.own_parked = 0
        pk.ready = _fx_take
        pk.ctx = &c
        pk.word = c.word
        pk.parked = &w.own_parked                    # (the W bit is this kind's announcement)
        pk.dep = _fx_dep
        pk.rm = self.rm
        pk.b = &self.b
        pk.arg = 0
        w.backoff = 1                                # barging: poll less often as we wait
        res = park(&pk, w)
        if w.nb:
            if res == R_WOULDBLOCK:
                w.resume_rc = R_PENDING if c.keep_w else R_BUSY
            elif res != R_ACQ and c.keep_w:
                # A resumable wait that leaves after it slept may have been woken by an
                # unlock (one of FX_WAKE) that it now does not use: wake another sleeper,
                # who looks again and re-arms W (a sleeper woken in a blocking wait looks
                # at the lock before it can time out). Whatever the word says: that
                # unlock cleared W, and a CAS may have taken the lock since without it
                # (tests/test_nbwait.py test_woken_async_waiter_that_leaves_wakes_a_sleeper)
                shm_futex_wake(c.word, 1)
        return res

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        cdef uint32_t* word = fx_state(&self.b)
        cdef uint32_t v
        dassert(_fx_owner1(ld32_acq(word)) == me + 1, "futex: the word names its holder")
        v = xchg32(word, 0)
        crashpoint_at(armed, "futex.release.swapped")
        if v & FX_W:                                 # someone may be parked
            shm_futex_wake(word, FX_WAKE)
        return 0 if _fx_owner1(v) == me + 1 else R_CORRUPT

    cdef bint _is_locked(self) noexcept nogil:
        return ld32_acq(fx_state(&self.b)) != 0


_register_kind(FutexMutex, NULL, _futex_recover, 1)
