# rwlock.pxd -- the reader-writer lock in shared memory, phase-fair, surviving the death
# of readers and writers: the interface of rwlock.pxi (its invariant and death cases: the
# top of that file; docs/design.md §13). It is a toolbox object (a directory entry of its
# own kind with the toolbox's lifecycle, toolbox.pxd), but it keeps no guard: readers and
# writers change one word each, by CAS or by a store to their own line.

cdef enum:
    R_RW_DEADLOCK = -11     # the wait would be for the calling thread itself
    RW_NONE_LEFT = 0xffffffff   # _rw_next_counted: no reader left to drain


cdef class RWLock(_TbObject):
    cdef object _acquire_read(self, blocking, timeout)
    cdef object _read_failed(self, int rc, int64_t deadline)
    cdef object _acquire_write(self, blocking, timeout)
    cdef int _held_across_close(self, bint write) except -1
    cdef int _release_read(self) except -1
    cdef int _release_write(self, bint handon) except -1
    cdef reg_t* _holding_write(self) noexcept nogil
    cdef str _lockdep_class(self)
    cdef int _lockdep_before(self) except -1


cdef class _RWHold:
    cdef RWLock _rw
    cdef bint _write
