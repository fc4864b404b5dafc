# robust.pxd -- robust pthread mutex, and the base the pi kind shares: the interface of
# robust.pxi (the kind contract it implements: base/kind.pxd).

cdef void _pmutex_recover(rmap_t* rm, shm_body* b, uint32_t q) noexcept nogil


cdef class _PthreadMutexLock(_Lock):
    cdef bint _spins(self) noexcept nogil
    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil
    cdef int _try(self, uint32_t me) noexcept nogil
    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil
    cdef int _sleep(self, wait_t* w) noexcept nogil
    cdef int _sleep_pi(self, wait_t* w) noexcept nogil
    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil
    cdef int _consistent(self) noexcept nogil
    cdef bint _is_locked(self) noexcept nogil
    cdef bint _held_by_tid(self, uint32_t tid) noexcept nogil


cdef class RobustMutex(_PthreadMutexLock):
    pass
