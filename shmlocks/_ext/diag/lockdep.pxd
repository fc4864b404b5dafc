# lockdep.pxd -- the hook lock-order validation (shmlocks/lockdep.py, docs/design.md §11)
# hangs on the Python API: g_lockdep is None while it is off, so the only cost then is one
# compare of a C global with None in acquire, release, __enter__ and __exit__.

cdef object g_lockdep       # the shmlocks.lockdep module while it is on
cdef object g_ld_held       # its _held: a threading.local, .stack = classes held
cdef set g_ld_validated     # its _validated: the chain cache


cdef inline list ld_held():
    """The calling thread's stack of held classes: thread-local storage, created empty on
    a thread's first use and dropped when the thread ends, so a new thread never inherits
    the stack of an old one that had its ident (thread idents are reused)."""
    return <list>g_ld_held.stack


cdef inline void ld_released(str cls) except *:
    """Pop `cls` from the calling thread's stack (the last occurrence: usually the top)."""
    cdef list held = ld_held()
    cdef Py_ssize_t i
    for i in range(len(held) - 1, -1, -1):
        if held[i] == cls:
            del held[i]
            return
