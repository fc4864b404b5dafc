# pi.pxd -- priority-inheritance robust mutex: the interface of pi.pxi (the kind contract
# it implements: base/kind.pxd).

cdef class PIMutex(_PthreadMutexLock):
    # overrides _bind (base/kind.pxd), to refuse another PID namespace, and _spins
    # (robust.pxd), so that a real-time waiter blocks in FUTEX_LOCK_PI at once
    pass
