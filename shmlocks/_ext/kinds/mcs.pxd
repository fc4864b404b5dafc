# mcs.pxd -- MCS queue lock: the interface of mcs.pxi (the kind contract it implements:
# base/kind.pxd; its word table: the top of mcs.pxi).

cdef class MCSLock(_Lock):
    # overrides _fast, _try, _wait, _unlock, _is_locked (base/kind.pxd); adds:
    cdef inline int _enqueue(self, uint32_t me, bint armed) noexcept nogil
