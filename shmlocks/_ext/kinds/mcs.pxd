# mcs.pxd -- MCS queue lock: the interface of mcs.pxi (the kind contract it implements:
# base/kind.pxd; its word table: the top of mcs.pxi).

cdef class MCSLock(_Lock):
    cdef inline int _enqueue(self, uint32_t me, bint armed) noexcept nogil
    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil
    cdef int _try(self, uint32_t me) noexcept nogil
    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil
    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil
    cdef bint _is_locked(self) noexcept nogil
