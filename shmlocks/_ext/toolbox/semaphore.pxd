# semaphore.pxd -- threading.Semaphore and BoundedSemaphore in shared memory: the
# interface of semaphore.pxi (its invariant and death cases: the top of that file).

cdef class Semaphore(_TbObject):
    cdef object _acquire(self, blocking, timeout, bint owned)
    cdef int _release(self, n, bint owned) except -1


cdef class BoundedSemaphore(Semaphore):
    pass
