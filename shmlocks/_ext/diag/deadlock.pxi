# deadlock.pxi -- a blocked acquire that is part of a wait-for cycle gives up with
# DeadlockError (docs/design.md §9).
#
# Invariant: a waiter that has waited the deadlock timeout looks, every DL_RECHECK_NS, for a
# cycle through itself in the machine-wide graph (shmlocks/waitgraph.py); of a cycle exactly
# one member withdraws, as on a timeout (so every kind leaves the lock usable), keeping what
# it holds: the one that began to wait last among those that look (`detects`).
# Nothing here runs on the uncontended path: dl_arm is called once per slow path, dl_look
# from wait_look_due when a sleep ends at its time (wait.pxi), after the timeout and then
# every DL_RECHECK_NS.

import threading as _threading

cdef int64_t g_dl_timeout_ns = 1000000000    # -1: off
cdef object g_dl_timeout = 1.0
cdef int64_t DL_RECHECK_NS = 500000000
cdef object _dl_local = _threading.local()   # the victim's cycle, from dl_look to dl_raise
cdef object _waitgraph = None


def set_deadlock_timeout(seconds):
    """set_deadlock_timeout(seconds) -> None

    After how long a blocked acquire looks for a wait-for cycle through its thread (and
    then every 0.5 s), for every thread of this process; None turns detection off. Of a
    cycle, the member that began to wait last (among those that look) gets DeadlockError.
    A negative or NaN value raises ValueError, a non-number TypeError."""
    global g_dl_timeout_ns, g_dl_timeout
    cdef double s
    if seconds is None:
        g_dl_timeout_ns = -1
        g_dl_timeout = None
        return
    if isinstance(seconds, (str, bytes, bytearray)) or not hasattr(type(seconds), "__float__"):
        raise TypeError(f"deadlock timeout must be a number or None, not "
                        f"{type(seconds).__name__}")
    s = float(seconds)
    if s != s:
        raise ValueError("deadlock timeout must not be NaN")
    if s < 0:
        raise ValueError("deadlock timeout must be >= 0 (None turns detection off)")
    g_dl_timeout = s
    g_dl_timeout_ns = -1 if s >= _FOREVER_S else <int64_t>(s * 1e9)


@cython.binding(True)        # a real signature on 3.13 too (see _crashpoints in _core.pyx)
def get_deadlock_timeout():
    """The deadlock timeout of this process in seconds (default 1.0), or None if off."""
    return g_dl_timeout


cdef inline void dl_arm(wait_t* w, rmap_t* rm, uint32_t me, int64_t now) noexcept nogil:
    """Slow path, before op_step = WAITING: publish in participant `me` of region rm (the
    wait's w.rm) since when (`now`) it waits and whether it looks for deadlocks, and
    schedule the first look."""
    cdef shm_participant* p = &rm.part[me]
    st64_rlx(&p.wait_since, <uint64_t>now)
    st32_rlx(&p.detects, g_dl_timeout_ns >= 0)
    if g_dl_timeout_ns >= 0:
        w.dl_next = now + g_dl_timeout_ns
        w.dl_slot = me


cdef int dl_look(wait_t* w, int64_t now) noexcept with gil:
    """Called with the wait's deadline not yet reached, once w.dl_next has come: is this
    thread (participant w.dl_slot of region w.rm) the one member of a cycle that must give
    up? 1: yes (w.dl_hit set, and the cycle kept for dl_raise); 0: no; -1: a signal handler
    raised meanwhile (left pending, as wait_signals' PyErr_CheckSignals leaves it)."""
    global _waitgraph
    cdef rmap_t* rm = w.rm
    cdef shm_participant* p
    w.dl_next = now + DL_RECHECK_NS
    try:
        if _waitgraph is None:
            from shmlocks import waitgraph
            _waitgraph = waitgraph
        if rm == NULL or rm.base == NULL or w.dl_slot >= rm.P:
            return 0
        p = &rm.part[w.dl_slot]
        me = (ld64_rlx(&p.pidns), ld32_rlx(&p.pid), ld32_rlx(&p.tid), ld64_rlx(&p.tstart))
        c = _waitgraph.snapshot().cycle_from(me)
        if c is None or _waitgraph.victim(c) != me:
            return 0
        # the same cycle a second time, every member still in the same wait: not a
        # snapshot taken across a hand-off
        c2 = _waitgraph.snapshot().cycle_from(me)
        if c2 is None or ([(m.thread.key, m.thread.since_ns) for m in c]
                          != [(m.thread.key, m.thread.since_ns) for m in c2]):
            return 0
        _dl_local.found = (me[1], me[2], len(c2), _waitgraph.describe_cycle(c2))
        w.dl_hit = 1
        return 1
    except Exception:
        return 0                   # a look that fails is no deadlock; the wait goes on
    except BaseException as e:     # KeyboardInterrupt from a handler run during the look
        PyErr_SetObject(type(e), e)
        return -1


cdef object dl_raise(str kind, str name):
    """Raise the DeadlockError of the victim of the cycle dl_look found, waiting for
    `kind` lock `name`."""
    found = getattr(_dl_local, "found", None)
    _dl_local.found = None
    if found is None:
        raise DeadlockError("deadlock: a wait-for cycle")
    pid, tid, n, cycle = found
    raise DeadlockError(
        f"deadlock: this thread (pid {pid}, tid {tid}) waits for {kind} lock {name!r} in a "
        f"cycle of {n} threads; it gave up its wait (the last of the cycle to begin "
        f"waiting) and keeps its locks:\n" + cycle)


wait_look = dl_look                # wait_look_due's look (wait.pxi)
