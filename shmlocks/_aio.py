"""asyncio: ``await lock.acquire_async()`` and ``async with lock`` (docs/design.md §14).

The owner of an async hold is the task. In shared memory a participant is a thread (its
slot, its liveness token, its holder id; robust and pi mutexes are owned by a kernel thread
id), so each task that holds or waits for a lock is served by a **proxy**: a thread of this
process leased to that task for as long as it holds or waits for anything, which is the
task's participant in every region. The holder id, the wait record, the statistics, the
wait-for graph, owner_died and recovery then see the task as they see any thread.

- The loop never blocks: a wait runs on the proxy thread, asleep in the kernel
  (futex_waitv on the lock's words, the liveness token it depends on, and the seat's
  cancel word), with the GIL released. Its result comes back through
  ``loop.call_soon_threadsafe``. No polling.
- The user-space kinds (ticket, mcs, clh, futex) take their place in line on the loop's
  thread, on the proxy's behalf, when the call is made, and in call order: a task that
  must await something first (its proxy's first use of the lock) makes the tasks of its
  loop that call after it wait for its place (``_tail``), so FIFO kinds serve tasks in the
  order they called. They release there too, while the proxy is idle: one thread at a time
  acts for a participant, so any step while the proxy is busy goes through its queue. The
  pthread kinds (robust, pi) are owned by a thread id: every step of theirs runs on the
  proxy, which owns the mutex for the task.
- Cancellation sets the seat's cancel word and wakes it: the proxy's wait leaves as at a
  timeout (the kind abandons its place). A grant that comes at the moment of cancellation
  is released at once, passing the lock on; nobody saw its owner_died, so it is handed on
  to the next holder (``_Seat.pass_on``), as by a with block left by an exception.

Proxies come from a per-process pool (``_IDLE_MAX`` kept idle, the others end). A proxy
that ends gives its slots back as any thread does; the pool is emptied at exit and
forgotten in a forked child.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import threading
import weakref
from typing import Any

from . import _core
from .errors import CapacityError, DeadlockError, NotOwnerError

_IDLE_MAX = 8  # idle proxies kept for the next task (each keeps its slots)

_mutex = threading.Lock()  # the pool and the registry (loops may run in several threads)
_idle: list[_Proxy] = []
_all: weakref.WeakSet[_Proxy] = weakref.WeakSet()
_of_task: weakref.WeakKeyDictionary[asyncio.Task[Any], _Proxy] = weakref.WeakKeyDictionary()
passed_on = 0  # grants released because their task was cancelled as they came (tests)
# per lock: the turn of the last task of this process that called acquire_async() and had
# to await something before taking its place; a task that calls later takes its place
# after that one's (call order, docs/design.md §14)
_tail: weakref.WeakKeyDictionary[Any, asyncio.Future[None]] = weakref.WeakKeyDictionary()


def _count_passed_on() -> None:
    global passed_on
    with _mutex:
        passed_on += 1


class _Proxy:
    """A thread that stands for one task at a time in shared memory."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.seats: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.holds: set[Any] = set()  # the locks the task holds (through this proxy)
        self.task: asyncio.Task[Any] | None = None
        self.calls = 0  # acquire_async calls of the task in progress
        self.posted = 0  # commands posted (the owning loop's thread writes it) ...
        self.finished = 0  # ... and done (the proxy thread writes it): idle when equal
        self.thread = threading.Thread(target=self._run, name="shmlocks-task", daemon=True)
        self.thread.start()
        _all.add(self)

    def _run(self) -> None:
        get = self.q.get
        while True:
            item = get()
            if item is None:
                return
            fn, args, done = item
            try:
                res, exc = fn(*args), None
            except BaseException as e:  # handed to the loop, raised there
                res, exc = None, e
            if done is None:  # (not posted: a chore, _closed)
                continue
            self.finished += 1
            done(res, exc)
            task = self.task
            if task is not None and task.done():
                # its loop may have stopped before our result reached it (a closed loop
                # runs no callback): give the proxy back from here
                _maybe_return(self)

    def idle(self) -> bool:
        return self.posted == self.finished

    def post(self, fn: Any, args: tuple[Any, ...], done: Any) -> None:
        self.posted += 1
        self.q.put((fn, args, done))

    def call(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        """Run fn(*args) on the proxy thread: a future of the running loop."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        self.post(fn, args, _threadsafe(loop, _arrival(fut, self)))
        return fut

    def call_sync(self, fn: Any, *args: Any) -> Any:
        """Run fn(*args) on the idle proxy and wait for it (a step that never waits: a
        pthread kind's release, mark_consistent)."""
        done = threading.Event()
        out: list[Any] = []

        def back(res: Any, exc: BaseException | None) -> None:
            out.append((res, exc))
            done.set()

        self.post(fn, args, back)
        done.wait()
        res, exc = out[0]
        if exc is not None:
            raise exc
        return res


def _arrival(fut: asyncio.Future[Any], p: _Proxy) -> Any:
    """What a proxy's command reports to, on the task's loop: its result or exception
    into fut (unless the task gave up on it), then the proxy back to the pool if free."""

    def arrive(res: Any, exc: BaseException | None) -> None:
        if not fut.cancelled():
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(res)
        _maybe_return(p)

    return arrive


def _threadsafe(loop: asyncio.AbstractEventLoop, cb: Any) -> Any:
    def done(res: Any, exc: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(cb, res, exc)
        except RuntimeError:  # the loop is closed: nobody waits for this any more
            pass

    return done


class _WaitState:
    """Who passes on a lock granted as its task is cancelled: the proxy, if the
    cancellation came first (it releases at once, whatever the loop does next); the task,
    if the grant came first (it releases as it leaves with CancelledError)."""

    __slots__ = ("mutex", "cancelled", "granted")

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.cancelled = False
        self.granted = False


def _wait_cmd(seat: Any, rc: int, deadline: int, st: _WaitState) -> bool:
    """On the proxy thread: the wait (deadline 0: the one attempt of a pthread kind), and
    the pass-on of a grant nobody awaits any more."""
    got = seat.try_() if deadline == 0 else seat.wait(rc, deadline)
    if got:
        with st.mutex:
            st.granted = not st.cancelled
        if not st.granted:
            seat.pass_on()  # owner_died, if it came with the grant, goes to the next holder
            _count_passed_on()
            return False
    return bool(got)


def _lease(task: asyncio.Task[Any], lock: Any) -> _Proxy:
    """The task's proxy: its own, or one from the pool (one with a seat on this lock
    first), or a new one."""
    p = _of_task.get(task)
    if p is not None:
        return p
    with _mutex:
        for i, q in enumerate(_idle):
            if lock in q.seats:
                p = _idle.pop(i)
                break
        else:
            p = _idle.pop() if _idle else None
    if p is None:
        p = _Proxy()
    p.task = task
    _of_task[task] = p
    _set_name(p, task)
    return p


def _set_name(p: _Proxy, task: asyncio.Task[Any]) -> None:
    """The proxy thread's name says whose it is (threading's name; the kernel's comm, which
    `ps -L` and /proc show, is the thread's own to set and stays "shmlocks-task")."""
    p.thread.name = f"shmlocks-task:{task.get_name()}"


def _maybe_return(p: _Proxy) -> None:
    """Give the proxy back to the pool once its task holds and waits for nothing (from
    the task's loop, or from the proxy once the task is done)."""
    with _mutex:
        if p.holds or p.calls or not p.idle() or p.task is None:
            return
        task, p.task = p.task, None
        if _of_task.get(task) is p:
            del _of_task[task]
        if len(_idle) < _IDLE_MAX:
            _idle.append(p)
            return
    p.q.put(None)  # ends: its thread gives its slots back


def _current() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        return None


def _inline(lock: Any, p: _Proxy) -> bool:
    """May a step of this lock run on the loop's thread for the proxy (a user-space kind,
    the proxy idle)?"""
    return lock.recovery == "user" and p.idle()


def _release_seat(p: _Proxy, seat: Any, handing_on: bool | None = False) -> None:
    """Release seat's hold now (on the loop's thread, or on the idle proxy), or post it
    behind the proxy's work in progress (a cancelled wait still ending). handing_on None:
    a grant its task never saw, passed on (``_Seat.pass_on``: owner_died goes on)."""
    args: tuple[Any, ...]
    if handing_on is None:
        release, args = seat.pass_on, ()
    else:
        release, args = seat.release, (handing_on,)
    if _inline(seat.lock, p):
        release(*args)
    elif p.idle():
        p.call_sync(release, *args)
    else:
        loop = asyncio.get_running_loop()

        def after(res: Any, exc: BaseException | None) -> None:
            if exc is not None:
                loop.call_exception_handler(
                    {"message": f"shmlocks: release of {seat.lock!r} failed", "exception": exc}
                )
            _maybe_return(p)

        p.post(release, args, _threadsafe(loop, after))


async def _seat(p: _Proxy, lock: Any) -> Any:
    seat = p.seats.get(lock)
    if seat is None:
        try:
            seat = await p.call(lock._async_seat)  # registers the proxy (maybe recovers)
        except CapacityError as e:
            raise CapacityError(
                f"{e}: each asyncio task waiting in acquire_async() (or holding a lock it "
                "got there) uses one, as a thread does; create the lock or its region "
                "with a larger max_participants"
            ) from None
        p.seats[lock] = seat
    return seat


def _line_up(lock: Any, seat: Any) -> tuple[asyncio.Future[None] | None, Any]:
    """The turn of a task that must await something before it takes its place in line
    (its seat on the lock, the turn of a task that called before it), or None when it
    takes its place at once; and the turn it waits for."""
    prev = _tail.get(lock)
    if prev is not None and prev.done():
        prev = None
    if seat is not None and prev is None:
        return None, None
    loop = asyncio.get_running_loop()
    if prev is not None and prev.get_loop() is not loop:
        prev = None  # (another loop's task: tasks of different loops have no call order)
    turn = loop.create_future()
    _tail[lock] = turn
    return turn, prev


def _taken(lock: Any, turn: asyncio.Future[None] | None) -> None:
    """The task took its place (or gave up): the next task that called may take its own."""
    if turn is not None and not turn.done():
        turn.set_result(None)
        if _tail.get(lock) is turn:
            del _tail[lock]


async def acquire(lock: Any, deadline: int) -> bool:
    """Lock.acquire_async's body: deadline 0 non-blocking, -1 forever, else absolute ns."""
    task = _current()
    if task is None:
        raise RuntimeError("acquire_async() must be awaited in an asyncio task")
    p = _of_task.get(task)
    if p is not None and lock in p.holds:
        if deadline == 0:
            return False
        raise DeadlockError(
            f"this task already holds {lock.kind} lock {lock.name!r} "
            "(shmlocks locks are not reentrant)"
        )
    p = _lease(task, lock)
    p.calls += 1
    turn = None
    try:
        seat = p.seats.get(lock)
        turn, prev = _line_up(lock, seat)
        if seat is None:
            seat = await _seat(p, lock)
        if prev is not None and not prev.done():
            await asyncio.shield(prev)  # (its cancellation is ours, not prev's)
        if _inline(lock, p):
            got = seat.try_() if deadline == 0 else seat.take()
            _taken(lock, turn)
            if got is True or got is False:
                if got:
                    p.holds.add(lock)
                return got
            rc = got  # in line: the proxy waits on from here
        else:
            rc = 0  # the proxy takes (deadline 0: tries), then waits
        _taken(lock, turn)  # (the wait is posted before the next task runs)
        got = await _wait(p, seat, rc, deadline)
        if got:
            p.holds.add(lock)
        return bool(got)
    finally:
        _taken(lock, turn)
        p.calls -= 1
        _maybe_return(p)


async def _wait(p: _Proxy, seat: Any, rc: int, deadline: int) -> bool:
    """The proxy waits; the task awaits its result, cancellable."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    st = _WaitState()

    seat.reset()
    p.post(_wait_cmd, (seat, rc, deadline, st), _threadsafe(loop, _arrival(fut, p)))
    try:
        return bool(await fut)
    except asyncio.CancelledError:
        with st.mutex:
            st.cancelled = True
            granted = st.granted
        if granted:
            _release_seat(p, seat, None)  # granted before the cancellation: pass it on
            _count_passed_on()
        else:
            seat.cancel()  # the wait ends as at a timeout (or the proxy passes it on)
        raise


async def aenter(lock: Any, deadline: int) -> Any:
    await acquire(lock, deadline)
    return lock


async def aexit(lock: Any, t: Any) -> bool:
    p = _mine(lock)
    if p is None:
        lock.release()  # raises NotOwnerError (or releases the thread's own hold)
        return False
    handing_on = t is not None and lock.owner_died
    p.holds.discard(lock)
    try:
        _release_seat(p, p.seats[lock], handing_on)
    finally:
        _maybe_return(p)
    return False


def _holder(lock: Any) -> tuple[asyncio.Task[Any] | None, _Proxy | None]:
    """The task of this process that holds lock through its proxy, and the proxy."""
    for task, q in list(_of_task.items()):
        if lock in q.holds:
            return task, q
    return None, None


def _mine(lock: Any) -> _Proxy | None:
    """The proxy through which the calling task may act on its hold of lock: its own, or
    that of a task that ended holding it (which nobody else can release: the task that
    awaited ``create_task(lock.acquire_async())``, or ``asyncio.wait_for(...)``, which
    wraps its argument in a task of its own before Python 3.12, inherits the hold).
    NotOwnerError if a live task of this process holds it; None if no task does."""
    task = _current()
    p = _of_task.get(task) if task is not None else None
    if p is not None and lock in p.holds:
        return p
    holder, q = _holder(lock)
    if holder is None or q is None:
        return None
    if task is None or not holder.done():
        raise NotOwnerError(
            f"release of {lock.kind} lock {lock.name!r} by a "
            f"{'task' if task is not None else 'thread'} that does not hold it "
            f"(task {holder.get_name()!r} does)"
        )
    return q


def _release(lock: Any) -> bool:
    """Lock.release() when the calling thread holds nothing: the calling task's hold."""
    p = _mine(lock)
    if p is None:
        return False
    p.holds.discard(lock)
    try:
        _release_seat(p, p.seats[lock])
    finally:
        _maybe_return(p)
    return True


def _mark_consistent(lock: Any) -> bool:
    p = _mine(lock)
    if p is None:
        return False
    seat = p.seats[lock]
    if _inline(lock, p):
        seat.mark_consistent()
    else:
        p.call_sync(seat.mark_consistent)  # pthread_mutex_consistent: the owner's call
    return True


def _is_owned(lock: Any) -> bool:
    task = _current()
    p = _of_task.get(task) if task is not None else None
    return p is not None and lock in p.holds


def _closed() -> None:
    """A lock (and its region) was closed: every proxy leaves the closed regions where it
    holds nothing (after what it is doing), so that the region is unmapped and its name
    left as at a close without asyncio, not at the proxy's next registration."""
    for p in list(_all):
        p.q.put((_core._leave_closed, (), None))


def _shutdown() -> None:
    """At exit: end every proxy (waits cancelled); a proxy still holding a lock keeps it
    until the process ends, as a thread would."""
    for p in list(_all):
        for seat in list(p.seats.values()):
            seat.cancel()
        p.q.put(None)
    for p in list(_all):
        p.thread.join(1.0)


def _after_fork() -> None:
    global _mutex
    _mutex = threading.Lock()
    _idle.clear()
    _all.clear()
    _of_task.clear()
    _tail.clear()


atexit.register(_shutdown)
os.register_at_fork(after_in_child=_after_fork)
_core._aio_bind(__import__(__name__, fromlist=["_"]))
