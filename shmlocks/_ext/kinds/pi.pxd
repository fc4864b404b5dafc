# pi.pxd -- priority-inheritance robust mutex: the interface of pi.pxi (the kind contract
# it implements: base/kind.pxd).

cdef class PIMutex(_PthreadMutexLock):
    cdef _bind(self, object region, uint32_t i, name)
    cdef bint _spins(self) noexcept nogil
