# lockdep.pxi -- the lockdep hook (lockdep.pxd): installed by shmlocks.lockdep.enable().

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


