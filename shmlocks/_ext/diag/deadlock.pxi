# deadlock.pxi -- a blocked acquire that is part of a wait-for cycle gives up with
# DeadlockError (docs/design.md §9).
#
# Invariant: a waiter that has waited the deadlock timeout looks, every DL_RECHECK_NS, for a
# cycle through itself in the machine-wide graph (shmlocks/waitgraph.py); of the threads
# its cycles join (its strongly connected set) exactly one withdraws, as on a timeout (so
# every kind leaves the lock usable), keeping what it holds: the one that began to wait
# last among those that look (`detects`).
# Nothing here runs on the uncontended path: dl_arm is called once per slow path, dl_look
# from wait_look_due when a sleep ends at its time (wait.pxi), after the timeout and then
# every DL_RECHECK_NS.

import _thread
import threading as _threading
import signal as _signal
import sys as _sys

cdef int64_t g_dl_timeout_ns = 1000000000    # -1: off
cdef object g_dl_timeout = 1.0
cdef int64_t DL_RECHECK_NS = 500000000
cdef object _dl_local = _threading.local()   # the victim's cycle, from dl_look to dl_raise
cdef object _waitgraph = None


def _import_graph(done):
    """Import the wait-for graph on a thread of its own (see _graph), then say so."""
    try:
        import shmlocks.waitgraph
    except BaseException:
        pass                   # _graph finds it missing: the look fails, the wait goes on
    finally:
        done.release()


cdef object _graph():
    """The wait-for graph's module, imported on the first look. Never by the main thread:
    the import system is not safe against an exception a signal handler raises inside it
    (CPython 3.11: a raise just after `_imp.acquire_lock()` returns leaks the global import
    lock, and every other thread's next import then waits forever; issue 28's signal storm
    hung two waiters that way, importing this module in their first look). The main thread
    has a thread of its own import it and waits for that, where a handler's raise is
    clean; other threads never run handlers and import it themselves."""
    global _waitgraph
    if _waitgraph is None:
        if PyThread_get_thread_ident() == g_main_ident:
            done = _thread.allocate_lock()
            done.acquire()
            _thread.start_new_thread(_import_graph, (done,))
            done.acquire()     # a handler that raises ends the wait here, cleanly
        else:
            import shmlocks.waitgraph
        _waitgraph = _sys.modules["shmlocks.waitgraph"]
    return _waitgraph


cdef bint _from_handler(BaseException e):
    """Did a signal handler raise `e` (it ran inside the look, on the main thread)? Its
    traceback then passes through the code of a handler installed now."""
    codes = set()
    for sig in _signal.valid_signals():
        try:
            h = _signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        for _ in range(4):      # unwrap: partial, bound method, callable object
            if hasattr(h, "__code__"):
                codes.add(h.__code__)
                break
            h = (getattr(h, "func", None) or getattr(h, "__func__", None)
                 or getattr(type(h), "__call__", None))
            if h is None:
                break
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return 1
        tb = tb.tb_next
    return 0


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


cdef int dl_look(wait_t* w, int64_t now) noexcept with gil:
    """Called with the wait's deadline not yet reached, once w.dl_next has come: is this
    thread (participant w.dl_slot of region w.rm) the one member of a cycle that must give
    up? 1: yes (w.dl_hit set, and the cycle kept for dl_raise); 0: no; -1: a signal handler
    raised meanwhile (left pending, as wait_signals' PyErr_CheckSignals leaves it)."""
    cdef rmap_t* rm = w.rm
    cdef shm_participant* p
    w.dl_next = now + DL_RECHECK_NS
    try:
        graph = _graph()
        if rm == NULL or rm.base == NULL or w.dl_slot >= rmap_hwm(rm):
            return 0
        p = &rm.part[w.dl_slot]
        me = (ld64_rlx(&p.pidns), ld32_rlx(&p.pid), ld32_rlx(&p.tid), ld64_rlx(&p.tstart), 0)
        g = graph.snapshot()
        c = g.cycle_from(me)
        if c is None or g.victim(me) != me:
            return 0
        # the same cycle a second time, every member still in the same wait, and this
        # thread still the one to give up: not a snapshot taken across a hand-off
        g2 = graph.snapshot()
        c2 = g2.cycle_from(me)
        if c2 is None or g2.victim(me) != me or (
                [(m.thread.key, m.thread.since_ns) for m in c]
                != [(m.thread.key, m.thread.since_ns) for m in c2]):
            return 0
        _dl_local.found = (me[1], me[2], len(c2), graph.describe_cycle(c2))
        w.dl_hit = 1
        return 1
    except BaseException as e:
        # A handler that ran during the look (main thread) raised: its exception ends the
        # wait, as a raise from wait_signals does. Anything else is a look that failed,
        # which is no deadlock: the wait goes on.
        try:
            if isinstance(e, Exception) and (PyThread_get_thread_ident() != g_main_ident
                                             or not _from_handler(e)):
                return 0
        except BaseException as e2:     # a handler raised again, during this check
            e = e2
        PyErr_SetObject(type(e), e)
        return -1


cdef object dl_raise(str what):
    """Raise the DeadlockError of the victim of the cycle dl_look found, waiting for
    `what` (e.g. "futex lock 'a'", "the write of RWLock 'rw'")."""
    found = getattr(_dl_local, "found", None)
    _dl_local.found = None
    if found is None:
        raise DeadlockError("deadlock: a wait-for cycle")
    pid, tid, n, cycle = found
    raise DeadlockError(
        f"deadlock: this thread (pid {pid}, tid {tid}) waits for {what} in a "
        f"cycle of {n} threads; it gave up its wait (the last of the cycle to begin "
        f"waiting) and keeps its locks:\n" + cycle)


wait_look = dl_look                # wait_look_due's look (wait.pxi)
