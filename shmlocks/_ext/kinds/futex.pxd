# futex.pxd -- three-state futex mutex: the interface of futex.pxi (the kind contract it
# implements: base/kind.pxd; its word: the top of futex.pxi).

cdef class FutexMutex(_Lock):
    cdef inline uint32_t* _word(self) noexcept nogil
    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil
    cdef int _try(self, uint32_t me) noexcept nogil
    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil
    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil
    cdef bint _is_locked(self) noexcept nogil
