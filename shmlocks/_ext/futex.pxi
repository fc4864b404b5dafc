# futex.pxi -- Drepper's three-state futex mutex ("Futexes Are Tricky", 2011, mutex #3).
#
# Invariant: word A is 0 (free), 1 (locked, no waiter has parked) or 2 (locked, some
# waiter may be parked). Lockers CAS 0 -> 1; a waiter that will park first swaps in 2, so
# the unlocker, seeing 2 (its fetch_sub did not return 1), stores 0 and wakes one waiter.
# Barging, not FIFO: a running thread may take the lock before a woken one. A waiter that
# times out just leaves: at worst the next unlock makes one spurious FUTEX_WAKE.

cdef class FutexMutex(_Lock):
    """Three-state futex mutex: the fastest hand-off, no fairness (barging)."""
    kind_name = "futex"

    cdef inline uint32_t* _word(self) noexcept nogil:
        return &self.b.wa.u32[0]

    cdef int _fast(self, uint32_t me) noexcept nogil:
        return R_ACQ if cas32(self._word(), 0, 1) else R_BUSY

    cdef int _try(self, uint32_t me) noexcept nogil:
        return R_ACQ if cas32(self._word(), 0, 1) else R_BUSY

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef uint32_t* word = self._word()
        cdef int r
        if w.deadline == 0:
            return R_TIMEOUT
        while True:                                  # spin and yield: try 0 -> 1
            if ld32_rlx(word) == 0 and cas32(word, 0, 1):
                return R_ACQ
            r = wait_pause(w)
            if r == W_PARK:
                break
            if r != W_CONT:
                return R_TIMEOUT
        while True:                                  # park: announce with 2, sleep on 2
            if xchg32(word, 2) == 0:
                return R_ACQ                         # took it (as 2: the unlock will wake)
            r = wait_park(w, word, 2)
            if r == W_TIMEOUT:
                return R_TIMEOUT
            if r == W_SIGNAL:
                return R_SIGNAL

    cdef int _unlock(self, uint32_t me) noexcept nogil:
        cdef uint32_t* word = self._word()
        if fsub32(word, 1) != 1:                     # it was 2: someone may be parked
            st32_seq(word, 0)
            shm_futex_wake(word, 1)
        return 0

    cdef bint _is_locked(self) noexcept nogil:
        return ld32_acq(self._word()) != 0
