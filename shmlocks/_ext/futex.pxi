# futex.pxi -- three-state futex mutex with the owner in the word (Drepper, "Futexes Are
# Tricky", mutex #3, with the owner id in place of the 1 as robust futexes do).
#
# Invariant: word A is 0 (free) or (holder participant index + 1) | W, where W (bit 31)
# means "a waiter may be parked". Lockers CAS 0 -> me+1; a waiter that will park first sets
# W, so the unlocker, finding W in what it swapped out, wakes one waiter. Because the atomic
# that takes the lock also names the taker, a dead holder is known exactly: a waiter that
# finds the owner's token OWNER_DIED recovers it (participant_recover) and the lock is
# released on its behalf, with owner_died set when the owner had returned from acquire.
# Barging, not FIFO: a running thread may take the lock before a woken one. A waiter that
# times out just leaves: at worst the next unlock makes one spurious FUTEX_WAKE.

cdef enum:
    FX_W = 0x80000000


cdef inline uint32_t _fx_owner1(uint32_t v) noexcept nogil:
    return v & ~(<uint32_t>FX_W)


cdef void _futex_recover(rmap_t* rm, shm_body* b, uint32_t q) noexcept nogil:
    """Participant q is dead and ours to recover (repair mutex held): release the lock on
    its behalf if it holds it. owner_died unless it was still inside acquire or release."""
    cdef uint32_t* word = &b.wa.u32[0]
    cdef uint32_t v = ld32_seq(word)
    cdef uint32_t op
    if _fx_owner1(v) != q + 1:
        return                                       # [F2] it does not hold it: nothing
    op = participant_op(rm, q, b.index + 1)
    recover_verdict(rm, b, q, op)                    # [F1] the word names it: [V]
    crashpoint("futex.recover.flagged")
    if cas32(word, v, 0):
        if v & FX_W:
            shm_futex_wake(word, 1)


cdef class FutexMutex(_Lock):
    """Three-state futex mutex: the fastest hand-off, no fairness (barging)."""
    kind_name = "futex"
    kind_code = SHM_KIND_FUTEX
    fifo = False
    recovery = "user"
    priority_inheritance = False

    cdef inline uint32_t* _word(self) noexcept nogil:
        return &self.b.wa.u32[0]

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        return R_ACQ if cas32(self._word(), 0, me + 1) else R_BUSY

    cdef int _try(self, uint32_t me) noexcept nogil:
        return R_ACQ if cas32(self._word(), 0, me + 1) else R_BUSY

    cdef void _check_owner(self, uint32_t v) noexcept nogil:
        cdef uint32_t o = _fx_owner1(v)
        if o != 0 and o <= self.b.P and participant_dead(self.rm, o - 1):
            participant_try_recover(self.rm, o - 1)

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        global shm_recover_sig
        cdef uint32_t* word = self._word()
        cdef uint32_t v
        cdef int r
        if w.deadline == 0:
            return R_TIMEOUT
        w.backoff = 1                                # barging: poll less often as we wait
        while True:                                  # spin and yield: try 0 -> me+1
            if ld32_rlx(word) == 0 and cas32(word, 0, me + 1):
                return R_ACQ
            r = wait_pause(w)
            if r == R_PARK:
                break
            if r != R_CONT:
                return R_TIMEOUT
        while True:                                  # park: announce with W, sleep on it
            v = ld32_seq(word)
            if v == 0:
                # take it with W kept: other waiters may still be parked
                if cas32(word, 0, (me + 1) | FX_W):
                    return R_ACQ
                continue
            if not (v & FX_W):
                if not cas32(word, v, v | FX_W):
                    continue
                v = v | FX_W
            crashpoint("futex.wait.announced")
            r = wait_park(w, word, v)
            if r == R_TIMEOUT:
                return R_TIMEOUT
            if r == R_SIGNAL:
                return R_SIGNAL
            self._check_owner(ld32_acq(word))
            if shm_recover_sig:                      # a handler raised in that recovery
                shm_recover_sig = 0
                return R_SIGNAL

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        cdef uint32_t* word = self._word()
        cdef uint32_t v
        dassert(_fx_owner1(ld32_acq(word)) == me + 1, "futex: the word names its holder")
        v = xchg32(word, 0)
        crashpoint_at(armed, "futex.release.swapped")
        if v & FX_W:                                 # someone may be parked
            shm_futex_wake(word, 1)
        return 0 if _fx_owner1(v) == me + 1 else R_CORRUPT

    cdef bint _is_locked(self) noexcept nogil:
        return ld32_acq(self._word()) != 0


_register_kind(FutexMutex, NULL, _futex_recover, 1)
