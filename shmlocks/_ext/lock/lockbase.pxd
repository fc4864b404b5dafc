# lockbase.pxd -- the lock layer: its class, _Lock, is declared with the hooks each kind
# implements in base/kind.pxd (the kind contract), which the layers below need to name;
# lockbase.pxi defines it and the Python API on it.

cdef double _TIMEOUT_MAX                # a timeout above threading.TIMEOUT_MAX: OverflowError
# acquire()'s argument rules (blocking, timeout) -> 0 (do not wait), -1 (forever) or an
# absolute CLOCK_MONOTONIC deadline in ns; also RWLock's (toolbox/rwlock.pxi)
cdef int64_t _deadline_of(blocking, timeout) except -2
# the LockNotRecoverableError of a lock or an RWLock: what happened, and the way back
cdef object _not_recoverable(str what)
