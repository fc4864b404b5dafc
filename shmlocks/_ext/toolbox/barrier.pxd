# barrier.pxd -- threading.Barrier in shared memory: the interface of barrier.pxi (its
# invariant and death cases: the top of that file).

cdef class Barrier(_TbObject):
    cdef public object _action
