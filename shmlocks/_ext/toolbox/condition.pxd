# condition.pxd -- threading.Condition in shared memory: the interface of condition.pxi
# (its invariant and death cases: the top of that file).

cdef class Condition(_TbObject):
    cdef public object _lock
    cdef bint _owns_lock

    cdef object _the_lock(self)
