"""asyncio: ``await lock.acquire_async()`` and ``async with lock`` (docs/design.md §14).

The owner of an async hold is the task; no thread waits for it. Per event loop thread and
lock, a **cohort** stands for the loop's tasks in shared memory: one participant slot of
the lock's region, claimed by the loop's thread but outside its own registrations (an
*agent* slot, ``_core._Agent``), through which the cohort holds the lock for one task at a
time and waits for it for the tasks queued behind, in call order (a deque of futures, as
``asyncio.Lock`` keeps). Invariant, per cohort: at most one task holds through it; while
tasks wait behind it, it either holds for a task or has a place in the lock's queue (a
resumable wait, docs/design.md §5), and it has that place only while a task waits.

- The first task's call takes the cohort's place at once, on the loop's thread (a FIFO
  kind's ticket or queue node: call order among threads and processes). When the holding
  task releases, the cohort releases the lock to the shared queue and, if tasks wait,
  takes a new place at once: the tasks of a loop are served in call order, and a task is
  overtaken by at most one hold of each other waiter per task ahead of it.
- The wait sleeps in the kernel without a thread: its watch set is an io_uring
  FUTEX_WAITV of the loop's thread's ring, whose eventfd the loop watches (add_reader);
  a completion re-enters the wait. Without io_uring (AIO_MODE "thread": forced by
  SHMLOCKS_AIO=thread), one waiter thread per loop thread sleeps on the union of its
  cohorts' watch sets (``_core._Waiter``) and tells the loop which ones changed.
- Ownership is kept here (``_Cohort.holder``): release() and mark_consistent() from
  another task raise NotOwnerError, a task awaiting a lock it holds DeadlockError; a hold
  whose task ended is inherited by the task that releases it. robust and pi holds are the
  loop thread's in the kernel's eyes: every step runs on that thread, so release() from
  the task returns with the lock released.
- A task's timeout, cancellation or deadlock takes it out of the deque; a cohort with no
  task left withdraws its place; a grant that finds no task to take it (or a task
  cancelled as it is granted) is released at once, owner_died handed on.
- A cycle of tasks of one loop is refused when the task that closes it enqueues. A cycle
  through other threads, processes or loops is on the chain walk (docs/design.md §9), as
  a thread's: a task that holds locks and begins to wait writes its wait link into each
  cohort record that holds for it (the record names the task: its key is the loop
  thread's and the task's id), then walks the chain from itself (``_Agent.walk``, C);
  the member of a cycle that began to wait last gets DeadlockError, and a walker that
  finds a task the victim pokes one of its holding records, whose poke words the task's
  driver watches while it waits (``_Poked``). A task that holds nothing is in no cycle
  and never walks.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import sys
import threading
import time
import weakref
from typing import Any

from . import _core
from .errors import DeadlockError, NotOwnerError

#: threads of shmlocks' that an event loop thread keeps (its waiter thread, AIO_MODE
#: "thread"; none with io_uring)
_IDLE_MAX = 1
passed_on = 0  # grants released because no task took them (tests)
polls = 0  # re-entries of cohorts' waits (tests: a wait behind a live holder makes none)
_URING = _core.AIO_MODE == "io_uring"
_CANCEL_BIT = 1 << 63
_LABEL_MAX = 40  # bytes of a task's name in its cohort's record (shm_layout.h label)
_DL_RECHECK_S = 0.5  # a task waiting past the deadlock timeout walks again this often
_DL_POKED_MIN_S = 0.005  # a poked task walks again at most this often (as a thread)
walks = 0  # chain walks of tasks (tests)

_local = threading.local()
_task_ids: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
_next_task_id = itertools.count(1)
_drivers: weakref.WeakSet[_Driver] = weakref.WeakSet()

IDLE, WAITING, HOLDING = 0, 1, 2


def _task_id(task: asyncio.Task[Any]) -> int:
    n = _task_ids.get(task)
    if n is None:
        n = _task_ids[task] = next(_next_task_id)
    return n


def _label(task: asyncio.Task[Any] | None) -> bytes:
    if task is None:
        return b""
    raw = task.get_name().encode("utf-8", "replace")[:_LABEL_MAX]
    return raw.decode("utf-8", "ignore").encode()  # (never cut inside a character)


def _current() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        return None


def _ended(task: asyncio.Task[Any]) -> bool:
    """A task that can no longer release what it holds (done, or its loop closed)."""
    return task.done() or task.get_loop().is_closed()


#: A task waiting behind its cohort: fut, task, t0 (when it began, ns), timer, done.
_Entry = _core._CohortEntry


class _DLWait:
    """The chain walk's state of a waiting task that holds locks (docs/design.md §9)."""

    __slots__ = ("timer", "arms", "last")

    def __init__(self) -> None:
        self.timer: asyncio.TimerHandle | None = None  # its next walk (timeout, recheck)
        self.arms: list[int] = []  # the watches of its holding records' poke words
        self.last = 0  # when it last walked (ns)


class _Poked:
    """A watch of a poke word of a waiting task's holding record (in the driver's
    ``inflight``, as a cohort's sleep is): its completion makes the task walk again."""

    __slots__ = ("d", "task")

    def __init__(self, d: _Driver, task: asyncio.Task[Any]) -> None:
        self.d = d
        self.task = task

    def woken(self, ud: int) -> None:
        self.d.poked(self.task, ud)


class _Cohort(_core._CohortCore):
    """One lock's participant for the tasks of one event loop thread (the module's
    docstring has its invariant). Its state and its hot path are ``_core._CohortCore``'s
    (lockbase.pxi): a task's uncontended acquire and release (``take``, ``hold``,
    ``release``), the hand-off to the next task of the loop (``grant``), a wait's sleep and
    wake-up (``_sleep``, ``woken``, ``poll``), the record (``_show``), and a task's wait
    behind it (``_core._aio_wait``). Here: a task's leaving (timeout, cancellation,
    deadlock), errors, and a new place after them. Fields:
    d (its driver), lock, agent (``_core._Agent``), q (a deque of _Entry), nwait (live
    entries in q), holder (a task or None), state (IDLE, WAITING, HOLDING), ud (the sleep
    in flight: a ring's user_data, a waiter's arm id), timer (a poll due without a
    wake-up), backoff, linked (the record carries a wait link of its holder's)."""

    __slots__ = ()

    # -- waiting (_sleep, woken, poll: _core._CohortCore) -------------------------------

    def _unsleep(self) -> None:
        if self.ud:
            self.d.disarm(self.ud)
            self.ud = 0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _due(self) -> None:
        self.timer = None
        if self.state == WAITING:
            self._unsleep()
            self.poll()

    def _fail_first(self, e: BaseException) -> bool:
        """A wait or a take that ended in error ``e``: the first waiting task gets it
        (False if no task waits)."""
        first = self._first()
        if first is None:
            return False
        self._drop(first)
        first.fut.set_exception(e)
        return True

    def _again(self) -> None:
        """After a wait that ended without the lock: a new place for the tasks left."""
        self._show()
        loop = self.d.loop
        if self.nwait > 0 and self.state == IDLE and loop is not None:
            loop.call_soon(self._retake)

    def _retake(self) -> None:
        if self.nwait > 0 and self.state == IDLE and self.holder is None:
            try:
                if self.take():
                    self.grant()
            except Exception as e:
                first = self._first()
                if first is not None:
                    self._drop(first)
                    first.fut.set_exception(e)
                self._again()
        else:
            self._show()

    def _first(self) -> _Entry | None:
        for e in self.q:
            if not e.done and not e.fut.done():
                return e
        return None

    # -- the lock comes (grant, hold), and goes (release): _core._CohortCore ------------

    def _drop(self, e: _Entry) -> None:
        """A waiting task leaves (timeout, cancellation, deadlock, error): with no task
        left, the place goes too."""
        if e.done:
            return
        e.done = True
        self.nwait -= 1
        if e.timer is not None:
            e.timer.cancel()
        self.d.unlinked(e.task)
        if self.nwait == 0 and self.state == WAITING:
            self.withdraw()
        self._show()

    def withdraw(self) -> None:
        self._unsleep()
        self.state = IDLE
        if self.agent.withdraw():
            _count_passed_on()
        self._show()
        self.d.idle(self)

    def expire(self, e: _Entry) -> None:
        """A task's timeout."""
        e.timer = None
        if e.done or e.fut.done():
            return
        self._drop(e)
        self.agent.timed_out()
        e.fut.set_result(False)


def _count_passed_on() -> None:
    global passed_on
    passed_on += 1


class _Driver:
    """One event loop thread's side: its cohorts (one per lock its tasks hold or wait
    for), the holds of its tasks, and how their waits sleep (the thread's ring, or its
    waiter thread)."""

    def __init__(self) -> None:
        self.ident = threading.get_ident()
        self.pid = os.getpid()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.cohorts: dict[int, _Cohort] = {}  # id(lock) -> its cohort
        self.held: dict[asyncio.Task[Any], list[_Cohort]] = {}  # a task's holds
        self.waits: dict[asyncio.Task[Any], tuple[_Cohort, _Entry]] = {}  # holders' waits
        self.inflight: dict[int, _Cohort | _Poked] = {}  # a sleep's id -> its cohort
        self.seq = 0
        self.ring: Any = None
        self.efd = -1
        self.waiter: Any = None
        self.wthread: threading.Thread | None = None
        self.dl: dict[asyncio.Task[Any], _DLWait] = {}  # the walks of holders' waits
        _drivers.add(self)

    # -- the loop ---------------------------------------------------------------------

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve the running loop (a thread runs one at a time; a new one replaces a
        closed one, whose tasks can no longer take or release anything)."""
        old = self.loop
        if old is not None:
            if self.efd >= 0 and not old.is_closed():
                try:
                    old.remove_reader(self.efd)
                except Exception:  # noqa: BLE001 - it may be closing
                    pass
            if old.is_closed():
                self._forget_loop(old)
        self.loop = loop
        if _URING:
            if self.ring is None:
                self.ring = _core._Ring(256)
                self.efd = self.ring.fileno()
            loop.add_reader(self.efd, self._on_ring)

    def _forget_loop(self, old: asyncio.AbstractEventLoop) -> None:
        """The tasks of a closed loop wait no more: their places go (a hold stays, for
        the next task of this thread that releases it: _mine)."""
        for c in list(self.cohorts.values()):
            if c.timer is not None:
                c.timer.cancel()
                c.timer = None
            for e in c.q:
                if not e.done:
                    e.done = True
                    c.nwait -= 1
            c.q.clear()
            if c.state == WAITING:
                c.withdraw()
        self.waits.clear()
        for st in self.dl.values():
            self._dl_unarm(st)
        self.dl.clear()

    def cohort(self, lock: Any) -> _Cohort:
        c = self.cohorts.get(id(lock))
        if c is not None and c.lock is lock:
            return c
        self._sweep()
        c = _Cohort(self, lock)
        self.cohorts[id(lock)] = c
        return c

    def _sweep(self) -> None:
        """Cohorts of closed locks that hold and wait for nothing give their slots back."""
        for k, c in list(self.cohorts.items()):
            if c.idle() and c.agent.closed:
                del self.cohorts[k]
                c.agent.close()

    def idle(self, c: _Cohort) -> None:
        """c holds and waits for nothing now: if its lock was closed, its slot goes."""
        if c.agent.closed and c.idle():
            if self.cohorts.get(id(c.lock)) is c:
                del self.cohorts[id(c.lock)]
            c.agent.close()

    # -- sleeping -----------------------------------------------------------------------

    def arm(self, c: _Cohort) -> int:
        self.seq += 1
        ud = self.seq
        self.inflight[ud] = c
        if _URING:
            c.agent.arm(self.ring, ud)
        else:
            if self.waiter is None:
                self._start_waiter()
            c.agent.arm_thread(self.waiter, ud)
        return ud

    def disarm(self, ud: int) -> None:
        if self.inflight.pop(ud, None) is None:
            return
        if _URING:
            self.ring.cancel(ud)
        else:
            self.waiter.disarm(ud)

    def _on_ring(self) -> None:
        inflight = self.inflight
        for ud, _res in self.ring.drain():
            if ud & _CANCEL_BIT:
                continue
            c = inflight.pop(ud, None)
            if c is not None:
                c.woken(ud)

    def _start_waiter(self) -> None:
        self.waiter = _core._Waiter()
        ref = weakref.ref(self)
        t = threading.Thread(
            target=_waiter_main, args=(self.waiter, ref), name="shmlocks-aio-waiter", daemon=True
        )
        self.wthread = t
        t.start()

    def fired(self, ids: list[int]) -> None:
        inflight = self.inflight
        for ud in ids:
            c = inflight.pop(ud, None)
            if c is not None:
                c.woken(ud)

    # -- the tasks' holds, links and deadlocks ------------------------------------------

    def linked(self, task: asyncio.Task[Any], c: _Cohort, e: _Entry) -> None:
        """`task` (which holds locks through cohorts) waits behind c: each cohort that
        holds for it names, in its record, the lock it waits for (the wait link), and the
        task walks the chain from itself (docs/design.md §9)."""
        hs = self.held.get(task)
        if not hs:
            return
        self.waits[task] = (c, e)
        seg, lock1 = c.agent.target
        for h in hs:
            h.agent.link(seg, lock1, e.t0)
            h.linked = True
        self.dl[task] = _DLWait()
        self._dl_walk(task)

    def unlinked(self, task: asyncio.Task[Any]) -> None:
        if self.waits.pop(task, None) is None:
            return
        st = self.dl.pop(task, None)
        if st is not None:
            self._dl_unarm(st)
        for h in self.held.get(task, ()):
            if h.linked:
                h.linked = False
                h.agent.link(b"", 0, 0)

    def local_cycle(self, task: asyncio.Task[Any], c: _Cohort) -> list[_Cohort] | None:
        """Would `task`, waiting behind c, close a cycle of tasks of this loop (the
        holder of c waits behind a cohort whose holder waits ... for a lock `task`
        holds)? The cohorts of the cycle, or None."""
        path = [c]
        seen = set()
        cur: _Cohort | None = c
        while cur is not None and cur.holder is not None:
            h = cur.holder
            if h is task:
                return path
            if h in seen:
                return None
            seen.add(h)
            w = self.waits.get(h)
            cur = w[0] if w is not None else None
            if cur is not None:
                path.append(cur)
        return None

    # -- the chain walk of a task's wait (docs/design.md §9) ----------------------------

    def _dl_unarm(self, st: _DLWait) -> None:
        if st.timer is not None:
            st.timer.cancel()
            st.timer = None
        for ud in st.arms:
            self.disarm(ud)
        st.arms = []

    def _dl_walk(self, task: asyncio.Task[Any]) -> None:
        """Walk the chain from `task`'s wait (its links are written): a confirmed cycle
        whose victim it is, once its deadlock timeout has passed, ends its wait with
        DeadlockError; otherwise it walks again at its timeout, every _DL_RECHECK_S after
        that, and when poked (the poke words of its holding records, read before the
        walk, are watched after it: a poke meanwhile completes the watch at once)."""
        global walks
        st = self.dl.get(task)
        w = self.waits.get(task)
        loop = self.loop
        if st is None or w is None or loop is None:
            return
        c, e = w
        if e.done or e.fut.done():
            return
        self._dl_unarm(st)
        vals = [(h, h.agent.poke) for h in self.held.get(task, ()) if h.linked]
        walks += 1
        res, n, text = c.agent.walk(_task_id(task), e.t0)
        now = time.monotonic_ns()
        st.last = now
        timeout = _core.get_deadlock_timeout()
        due = -1 if timeout is None else e.t0 + int(timeout * 1e9)
        if res == "victim" and 0 <= due <= now:
            tid = _task_id(task)
            if text is not None:  # (its own line names it by number: its cohort's record
                # may name the cohort's first waiter, docs/design.md §9)
                first, nl, rest = text.partition("\n")
                text = first.replace(f" (task {tid})", f" (task {_label(task).decode()!r})", 1)
                text += nl + rest
            c._drop(e)
            e.fut.set_exception(
                DeadlockError(
                    f"deadlock: task {task.get_name()!r} (pid {os.getpid()}) waits for "
                    f"{c.lock.kind} lock {c.lock.name!r} in a cycle of {n}; it gave up its "
                    "wait (the last of the cycle to begin waiting) and keeps its locks:\n"
                    + (text or "(out of memory to describe it)")
                )
            )
            return
        if due >= 0:
            at = due if due > now else now + int(_DL_RECHECK_S * 1e9)
            st.timer = loop.call_later((at - now) / 1e9, self._dl_walk, task)
        for h, val in vals:
            st.arms.append(self._arm_poke(h, val, _Poked(self, task)))

    def _arm_poke(self, h: _Cohort, val: int, pk: _Poked) -> int:
        self.seq += 1
        ud = self.seq
        self.inflight[ud] = pk
        if _URING:
            h.agent.arm_poke(self.ring, ud, val)
        else:
            if self.waiter is None:
                self._start_waiter()
            h.agent.arm_poke_thread(self.waiter, ud, val)
        return ud

    def poked(self, task: asyncio.Task[Any], ud: int) -> None:
        """A poke word of `task`'s holding records changed: walk again (at most every
        _DL_POKED_MIN_S)."""
        st = self.dl.get(task)
        if st is None or ud not in st.arms or self.loop is None:
            return
        st.arms.remove(ud)
        wait = st.last + int(_DL_POKED_MIN_S * 1e9) - time.monotonic_ns()
        if wait <= 0:
            self._dl_walk(task)
            return
        if st.timer is not None:
            st.timer.cancel()
        st.timer = self.loop.call_later(wait / 1e9, self._dl_walk, task)

    # -- the end ----------------------------------------------------------------------

    def __del__(self) -> None:
        if self.waiter is not None:
            self.waiter.stop()

    def close(self) -> None:
        """At exit (this thread): waits withdrawn, idle slots given back, the ring and the
        waiter thread gone. A hold stays until the process ends, as a thread's would."""
        if self.pid != os.getpid():
            return
        mine = threading.get_ident() == self.ident
        for c in list(self.cohorts.values()):
            if not mine:
                continue
            try:
                if c.state == WAITING:
                    for e in c.q:
                        e.done = True
                    c.nwait = 0
                    c._unsleep()
                    c.state = IDLE
                    if c.agent.withdraw():
                        _count_passed_on()
                if c.idle():
                    c.agent.close()
            except Exception:  # noqa: BLE001 - at exit: best effort
                pass
        if self.waiter is not None:
            self.waiter.stop()
        if self.ring is not None and mine:
            self.ring.close()
            self.ring = None


def _waiter_main(waiter: Any, ref: weakref.ref[_Driver]) -> None:
    """The waiter thread (AIO_MODE "thread"): sleep on the armed watch sets; tell the
    loop which arms fired."""
    while True:
        ids = waiter.sleep()
        if ids is None:
            return
        if not ids:
            continue
        d = ref()
        if d is None:
            return
        loop = d.loop
        if loop is None:
            continue
        try:
            loop.call_soon_threadsafe(d.fired, ids)
        except RuntimeError:  # its loop is closed: the next loop of the thread re-polls
            pass


def _driver() -> _Driver:
    """The calling thread's driver, bound to its running loop."""
    d: _Driver | None = getattr(_local, "d", None)
    if d is None:
        d = _local.d = _Driver()
    loop = asyncio.get_running_loop()
    if d.loop is not loop:
        d.bind(loop)
    return d


def _mine_driver() -> _Driver | None:
    return getattr(_local, "d", None)  # (a forked child starts without: _after_fork)


# ----------------------------------------------------------------------------- the API


async def acquire(lock: Any, deadline: int) -> bool:
    """Lock.acquire_async's body: deadline 0 non-blocking, -1 forever, else absolute ns."""
    task = _current()
    if task is None:
        raise RuntimeError("acquire_async() must be awaited in an asyncio task")
    d = _driver()
    c = d.cohort(lock)
    if c.holder is task:
        if deadline == 0:
            return False
        raise DeadlockError(
            f"this task already holds {lock.kind} lock {lock.name!r} "
            "(shmlocks locks are not reentrant)"
        )
    if deadline != 0 and task in d.held:
        _lockdep_before(d, task, lock)
    if c.state == IDLE and c.holder is None and c.nwait == 0:
        if deadline == 0:
            if c.agent.try_():
                c.state = HOLDING
                c.hold(task)
                return True
            return False
        if c.take():
            c.hold(task)
            return True
        # (a place is taken: this task waits for it, below)
    elif deadline == 0:
        return False  # another task of this loop holds it or waits for it first
    else:
        cyc = d.local_cycle(task, c)
        if cyc is not None:
            names = ", ".join(f"{x.lock.kind} lock {x.lock.name!r}" for x in cyc)
            raise DeadlockError(
                f"deadlock: task {task.get_name()!r} would wait for a cycle of tasks of "
                f"its own event loop (through {names}), each holding what the next awaits; "
                "it gave up its wait and keeps its locks"
            )
    return await _core._aio_wait(c, task, deadline)  # (its wait: lockbase.pxi)


def _lockdep_before(d: _Driver, task: asyncio.Task[Any], lock: Any) -> None:
    """Lock-order validation (docs/design.md §11), when it is on: a blocking or timed
    acquire by a task that holds locks validates and records the orders from the classes
    the task holds (its cohorts' locks, in the order it took them; a non-blocking acquire
    counts as held) to this lock's, as a thread's acquire does from the classes the thread
    holds. Raises LockOrderError (or warns) before any place is taken."""
    ld = sys.modules.get("shmlocks.lockdep")
    if ld is None or ld._mode is None:
        return
    held = [h.lock._lockdep_cls() for h in d.held.get(task, ())]
    cls = lock._lockdep_cls()
    if held and (tuple(held), cls) not in ld._validated:
        ld.before(cls, held)


async def aenter(lock: Any, deadline: int) -> Any:
    await acquire(lock, deadline)
    return lock


async def aexit(lock: Any, t: Any) -> bool:
    c = _mine(lock)
    if c is None:
        lock.release()  # raises NotOwnerError (or releases the thread's own hold)
        return False
    c.release(handing_on=t is not None and c.agent.owner_died)
    return False


def _mine(lock: Any) -> _Cohort | None:
    """The cohort through which the calling task may act on its hold of lock: its own, or
    one holding for a task that ended (which nobody else can release: the task that
    awaited ``create_task(lock.acquire_async())``, or ``asyncio.wait_for(...)``, which
    wraps its argument in a task of its own before Python 3.12, inherits the hold).
    NotOwnerError if a live task holds it; None if no task of this thread does."""
    d = _mine_driver()
    if d is None:
        return None
    c = d.cohorts.get(id(lock))
    if c is None or c.lock is not lock or c.holder is None:
        return None
    task = _current()
    if c.holder is task:
        return c
    if task is None or not _ended(c.holder):
        raise NotOwnerError(
            f"release of {lock.kind} lock {lock.name!r} by a "
            f"{'task' if task is not None else 'thread'} that does not hold it "
            f"(task {c.holder.get_name()!r} does)"
        )
    return c


def _release(lock: Any) -> bool:
    """Lock.release() when the calling thread holds nothing: the calling task's hold."""
    c = _mine(lock)
    if c is None:
        return False
    c.release()
    return True


def _mark_consistent(lock: Any) -> bool:
    c = _mine(lock)
    if c is None:
        return False
    c.agent.mark_consistent()
    return True


def _is_owned(lock: Any) -> bool:
    d = _mine_driver()
    if d is None:
        return False
    c = d.cohorts.get(id(lock))
    task = _current()
    return c is not None and c.lock is lock and task is not None and c.holder is task


def _closed(lock: Any) -> None:
    """A lock (and its region) was closed: its cohorts that hold and wait for nothing give
    their slots back (on their own threads: this one now, the others at their loop's next
    turn), so that the region is unmapped and its name left as at a close without asyncio."""
    me = threading.get_ident()
    for d in list(_drivers):
        if d.pid != os.getpid():
            continue
        c = d.cohorts.get(id(lock))
        if c is None or c.lock is not lock:
            continue
        if d.ident == me:
            d.idle(c)
        elif d.loop is not None and not d.loop.is_closed():
            try:
                d.loop.call_soon_threadsafe(d.idle, c)
            except RuntimeError:
                pass


def _shutdown() -> None:
    d = _mine_driver()
    if d is not None:
        d.close()
    for o in list(_drivers):
        if o is not d and o.waiter is not None and o.pid == os.getpid():
            o.waiter.stop()


def _after_fork() -> None:
    global _local, _drivers
    _local = threading.local()  # (the parent's cohorts are not the child's)
    _drivers = weakref.WeakSet()


atexit.register(_shutdown)
os.register_at_fork(after_in_child=_after_fork)
_core._aio_bind(__import__(__name__, fromlist=["_"]))
