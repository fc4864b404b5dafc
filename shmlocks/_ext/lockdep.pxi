# lockdep.pxi -- the hook lock-order validation (shmlocks/lockdep.py, docs/design.md §11)
# hangs on the Python API: None while it is off, so the only cost then is one compare of
# a C global with None in acquire, release, __enter__ and __exit__.

from cpython.pythread cimport PyThread_get_thread_ident

cdef object g_lockdep = None       # the shmlocks.lockdep module while it is on
cdef dict g_ld_stacks = None       # its _stacks: thread ident -> classes held, in order
cdef set g_ld_validated = None     # its _validated: the chain cache


def _lockdep_hook(mod):
    """Install (the shmlocks.lockdep module) or remove (None) the lockdep hooks for this
    process; shmlocks.lockdep.enable() calls it."""
    global g_lockdep, g_ld_stacks, g_ld_validated
    if mod is not None:
        g_ld_stacks = mod._stacks
        g_ld_validated = mod._validated
    g_lockdep = mod


cdef inline list ld_held():
    """The calling thread's stack of held classes (created on first use)."""
    cdef object k = PyThread_get_thread_ident()
    h = g_ld_stacks.get(k)
    if h is None:
        h = g_ld_stacks[k] = []
    return <list>h


cdef inline void ld_released(str cls) except *:
    """Pop `cls` from the calling thread's stack (the last occurrence: usually the top)."""
    cdef list held = ld_held()
    cdef Py_ssize_t i
    for i in range(len(held) - 1, -1, -1):
        if held[i] == cls:
            del held[i]
            return
