# lockdep.pxi -- the hook lock-order validation (shmlocks/lockdep.py, docs/design.md §11)
# hangs on the Python API: None while it is off, so the only cost then is one compare of
# a C global with None in acquire, release, __enter__ and __exit__.

cdef object g_lockdep = None       # the shmlocks.lockdep module while it is on
cdef object g_ld_held = None       # its _held: a threading.local, .stack = classes held
cdef set g_ld_validated = None     # its _validated: the chain cache


def _lockdep_hook(mod):
    """Install (the shmlocks.lockdep module) or remove (None) the lockdep hooks for this
    process; shmlocks.lockdep.enable() calls it."""
    global g_lockdep, g_ld_held, g_ld_validated
    if mod is not None:
        g_ld_held = mod._held
        g_ld_validated = mod._validated
    g_lockdep = mod


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
