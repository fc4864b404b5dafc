# clh.pxd -- CLH queue lock: the interface of clh.pxi (the kind contract it implements:
# base/kind.pxd; its word table: the top of clh.pxi).

cdef class CLHLock(_Lock):
    # overrides _fast, _try, _wait, _unlock, _is_locked, _aside_end (base/kind.pxd); adds:
    cdef inline int _enqueue(self, uint32_t me, uint32_t X, bint armed) noexcept nogil
