# robust.pxi -- robust, process-shared pthread mutex (and the base the pi kind shares).
#
# Invariant: the mutex in word A is PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST, so
# glibc links it into the holder thread's robust list and the kernel marks it OWNER_DIED
# when that thread dies holding it. The next locker gets EOWNERDEAD, reported as
# owner_died; mark_consistent() is pthread_mutex_consistent(); a release without it leaves
# the mutex ENOTRECOVERABLE for everyone (LockNotRecoverableError).
#
# Waiting is bounded: pthread_mutex_clocklock(CLOCK_MONOTONIC) in slices of the wait
# policy, so timeouts and Ctrl-C work; a waiter spins on trylock briefly first.
#
# The mutex is in the segment, so its fields are foreign bytes: every glibc call goes
# through the pm_* guards (shm_sys.h), which refuse a mutex whose kind is not exactly the
# one we initialised (R_CORRUPT: CorruptRegionError) and, for pi, mark a word naming a
# thread that no longer exists FUTEX_OWNER_DIED before FUTEX_LOCK_PI would fail with ESRCH
# (glibc aborts on that); the lock then comes back owner_died.

cdef void _robust_init(shm_body* b) noexcept nogil:
    _robust_mutex_init(&b.wa.m, 0)


cdef void _pi_init(shm_body* b) noexcept nogil:
    _robust_mutex_init(&b.wa.m, 1)


cdef void _pmutex_recover(rmap_t* rm, shm_body* b, uint32_t q) noexcept nogil:
    """Dead participant q: the kernel marked a mutex it held OWNER_DIED (the next locker
    gets EOWNERDEAD); only its holder id is left to clear."""
    holder_forget(rm, b, q)


cdef inline int _pm_code(int rc) noexcept nogil:
    if rc == 0:
        return R_ACQ
    if rc == EOWNERDEAD:
        return R_ACQ_DIED
    if rc == EBUSY:
        return R_BUSY
    if rc == ENOTRECOVERABLE:
        return R_NOTREC
    if rc == ETIMEDOUT:
        return R_TIMEOUT
    return R_CORRUPT


cdef class _PthreadMutexLock(_Lock):
    cdef bint _spins(self) noexcept nogil:
        return 1

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        return _pm_code(pm_trylock(&self.b.wa.m, self._code == SHM_KIND_PI))

    cdef int _try(self, uint32_t me) noexcept nogil:
        if ld32_acq(&self.b.ctl.flags) & SHM_F_NOTRECOVERABLE:
            return R_NOTREC
        return _pm_code(pm_trylock(&self.b.wa.m, self._code == SHM_KIND_PI))

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        cdef timespec ts
        cdef int r
        cdef int64_t sl
        cdef bint spins
        if ld32_acq(&self.b.ctl.flags) & SHM_F_NOTRECOVERABLE:
            return R_NOTREC
        if w.deadline == 0:
            return R_TIMEOUT
        spins = self._spins()                        # once per wait (pi: a system call)
        w.backoff = 1                                # barging: poll less often as we wait
        while spins:
            # read the futex word first (its owner TID; the kernel's flag bits above): a
            # trylock bound to fail would still take the holder's cache line from it
            if ld32_rlx(<uint32_t*>&self.b.wa.m) & FUTEX_TID_MASK_ == 0:
                rc = _pm_code(pm_trylock(&self.b.wa.m, self._code == SHM_KIND_PI))
                if rc != R_BUSY:
                    return rc
            r = wait_pause(w)
            if r == R_PARK:
                break
            if r != R_CONT:
                return R_TIMEOUT
        wait_nogil(w)
        while True:
            sl = wait_slice(w)
            if sl <= 0:
                return R_TIMEOUT
            ts = shm_ts_of_ns(shm_now_ns() + sl)
            rc = _pm_code(pm_clocklock(&self.b.wa.m, self._code == SHM_KIND_PI, &ts))
            if rc != R_TIMEOUT:
                return rc
            r = wait_check(w)
            if r == R_TIMEOUT:
                return R_TIMEOUT
            if r == R_SIGNAL:
                return R_SIGNAL

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        return 0 if pm_unlock(&self.b.wa.m, self._code == SHM_KIND_PI) == 0 else R_CORRUPT

    cdef int _consistent(self) noexcept nogil:
        return pm_consistent(&self.b.wa.m, self._code == SHM_KIND_PI)

    cdef bint _is_locked(self) noexcept nogil:
        # the glibc mutex's first word is its futex: holder TID | FUTEX_WAITERS | OWNER_DIED
        return ld32_acq(<uint32_t*>&self.b.wa.m) != 0


cdef class RobustMutex(_PthreadMutexLock):
    """Robust pthread mutex: the kernel reports a holder's death (owner_died)."""
    kind_name = "robust"
    kind_code = SHM_KIND_ROBUST
    fifo = False
    recovery = "kernel"
    priority_inheritance = False


_register_kind(RobustMutex, _robust_init, _pmutex_recover, 0)
