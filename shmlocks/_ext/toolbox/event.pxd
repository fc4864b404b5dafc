# event.pxd -- threading.Event in shared memory: the interface of event.pxi (its invariant
# and death cases: the top of that file; what it shares with the other primitives:
# toolbox.pxd).

cdef class Event(_TbObject):
    pass
