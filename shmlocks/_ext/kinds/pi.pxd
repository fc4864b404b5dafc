# pi.pxd -- priority-inheritance robust mutex: the interface of pi.pxi (the kind contract
# it implements: base/kind.pxd).

# What a pi lock's resumable (asynchronous) waiters use, since a FUTEX_WAIT on the PI futex
# word itself is never woken by FUTEX_UNLOCK_PI (and makes that unlock fail): the word table
# at the top of pi.pxi.
#   word A  u32 asyncw  (the u32 past glibc's mutex, which writes nothing past itself)
#                       1 while some participant waits that way: a release reads it after
#                       its unlock, on the line that unlock has just written
#           u32 aseq    (the u32 past asyncw) bumped (then woken) by each release that
#                       finds asyncw set
#   (two u32 past the mutex, not a line's last words: a table's compact stripe keeps its
#   word A in 48 bytes, shm_layout.h shm_stripe_at)
cdef inline uint32_t* pi_asyncw(shm_body* b) noexcept nogil:
    return &b.wa.u32[SHM_MUTEX_U32]


cdef inline uint32_t* pi_aseq(shm_body* b) noexcept nogil:
    return &b.wa.u32[SHM_MUTEX_U32 + 1]


# prec[p].mine (a CLH field, unused by pi): the lock's number + 1 (b.index + 1) while
# participant p waits on it without sleeping in FUTEX_LOCK_PI (an asynchronous waiter,
# counted in asyncw); a number, not 1, because a table's compact stripes share the prec
# line (docs/design.md §15)
cdef inline uint32_t* pi_awaiting(shm_body* b, uint32_t p) noexcept nogil:
    return &b.precs[p].mine


cdef class PIMutex(_PthreadMutexLock):
    # overrides _bind (base/kind.pxd), to refuse another PID namespace, _spins
    # (robust.pxd), so that a real-time waiter blocks in FUTEX_LOCK_PI at once, _wait_nb
    # (robust.pxd: a resumable wait sleeps on word B's aseq) and _unlock (which then bumps
    # aseq)
    pass
