# lockbase.pxi -- _Lock, the base of every kind: declared with the hooks each kind
# implements in base/kind.pxd (the kind contract); here the Python API built once on those
# hooks (README.md "Usage"; docs/design.md §4). The base class owns everything the kinds
# share: argument checks, participant lookup, holder identity (ctl.holder, DeadlockError,
# NotOwnerError), owner_died/mark_consistent/not-recoverable, pickling, close.

import time as _time
from collections import deque as _deque
from weakref import ref as _weakref_ref

cdef object _NEG1 = -1
cdef double _TIMEOUT_MAX = __import__("threading").TIMEOUT_MAX   # larger: OverflowError


cdef object _not_recoverable(str what):
    """LockNotRecoverableError for a lock (or an RWLock, toolbox/rwlock.pxi) released
    without mark_consistent() after an owner death: `what` happened, and the way back."""
    return LockNotRecoverableError(
        f"{what}: every acquire fails until clear_not_recoverable() is called (by any "
        "process that has it open, once the data can be repaired; the next holder then "
        "gets owner_died)")


cdef _raise_code(_Lock lk, int rc):
    if rc == R_NOTREC:
        raise _not_recoverable(
            f"lock {lk._name!r} was released without mark_consistent() after its owner died")
    raise CorruptRegionError(f"lock {lk._name!r}: shared state is corrupt (code {rc})")


cdef int64_t _deadline_of(blocking, timeout) except -2:
    """acquire()'s argument rules: 0 for a non-blocking call, -1 to wait forever, else the
    absolute CLOCK_MONOTONIC deadline in ns."""
    cdef double t
    if timeout is None:
        t = -1.0
    else:
        if isinstance(timeout, (str, bytes)):
            raise TypeError(f"timeout must be a number, not {type(timeout).__name__}")
        t = PyFloat_AsDouble(timeout)          # TypeError for non-numbers
        if t != t:
            raise ValueError("timeout must not be NaN")
    if not blocking:
        if t != -1.0:
            raise ValueError("can't specify a timeout for a non-blocking call")
        return 0
    if t < 0 and t != -1.0:
        raise ValueError("timeout value must be a non-negative number or -1")
    if t > _TIMEOUT_MAX:
        raise OverflowError("timeout value is too large")
    if t == -1.0 or t >= _FOREVER_S:
        return -1
    return max(1, shm_now_ns() + <int64_t>(t * 1e9))


# shmlocks._aio once imported (it registers itself: _aio_bind): the owner of task holds,
# asked by release(), mark_consistent() and _is_owned() when the calling thread holds
# nothing (docs/design.md §14). None: no task ever held a lock in this process.
cdef object g_aio = None
# bumped in a forked child: no asyncio agent or cohort of its parent's is its (a cheaper
# question than getpid(), a system call, on every step of a task's hold)
cdef unsigned long g_aio_gen = 0


def _aio_forked():
    global g_aio_gen
    g_aio_gen += 1


_os.register_at_fork(after_in_child=_aio_forked)


def _aio_bind(module):
    global g_aio, g_get_loop, g_cur_task, g_cancelled
    import asyncio
    g_get_loop = asyncio.events._get_running_loop
    current = asyncio.current_task
    tasks = getattr(asyncio.tasks, "_current_tasks", None)
    if not isinstance(current, type(len)) and isinstance(tasks, dict):
        current = tasks.get                  # (the dict the C tasks enter themselves in)
    g_cur_task = current
    g_cancelled = asyncio.CancelledError
    g_aio = module


cdef class _Lock:
    """Base of every lock kind; not instantiated directly."""
    # The kind registry: what every layer above needs to know of a kind (tests, torture,
    # bench and the CLI read these, never a list of names of their own).
    kind_name = None              # the `kind` string, a key of shmlocks.KINDS
    kind_code = 0                 # SHM_KIND_*: stored in the directory and the body
    fifo = False                  # waiters are served in arrival order
    recovery = None               # owner death: "user" (shmlocks' step protocol) or "kernel"
    priority_inheritance = False  # the holder is boosted to its highest waiter's priority

    def __init__(self, name=None, *, max_participants=None, mode=0o600, persist=False):
        if type(self) is _Lock:
            raise TypeError("_Lock is abstract: use one of shmlocks.KINDS")
        region = Region._create(name, 1, max_participants, mode, persist,
                                kind_code_of(type(self)))    # its lock made before its name
        self._bind(region, 0, region.name)
        self._standalone = True

    @classmethod
    def create(cls, name=None, *, max_participants=None, mode=0o600, persist=False):
        """Create a region holding just this lock. ``name=None`` generates a unique name.
        ``max_participants``: None (no cap: threads get slots as they come, up to 4096), or
        a cap of 1..4096 (CapacityError past it)."""
        return cls(name, max_participants=max_participants, mode=mode, persist=persist)

    @classmethod
    def open(cls, name):
        """Attach to an existing lock (the one lock of region ``name``) from any process.
        LockKindError if it is another kind, or a region of several locks (open those
        with ``Region.open(name).open_lock(lock_name)``)."""
        cdef _Lock lk
        region = Region.open(name)
        try:
            names = region.lock_names()
            if not names:
                raise FileNotFoundError(f"region {region.name!r} holds no lock")
            if len(names) > 1:
                raise LockKindError(
                    f"{region.name!r} is a region of {len(names)} locks, not a single lock: "
                    f"open one with shmlocks.Region.open({region.name!r}).open_lock(name)")
            lk = region.open_lock(names[0])
            if cls is not _Lock and type(lk) is not cls:
                raise LockKindError(f"{region.name!r} holds a {lk.kind!r} lock, "
                                    f"not a {cls.kind_name!r} one ({cls.__name__})")
        except BaseException:
            region.close()
            raise
        lk._standalone = True
        lk._name = region.name
        return lk

    @classmethod
    def open_or_create(cls, name, *, max_participants=None, mode=0o600, persist=False):
        """Open lock ``name``, or create it (with these arguments) if there is none: atomic,
        so that of any number of processes racing on one name, all end up with the same
        lock. LockKindError if the existing one is of another kind. The arguments do not
        apply to a lock that exists already."""
        n = _check_name(name)
        _check_create_args(1, max_participants, mode)
        deadline = _time.monotonic() + 5.0
        while True:
            try:
                return cls.create(n, max_participants=max_participants, mode=mode,
                                  persist=persist)
            except FileExistsError:
                pass
            try:
                return cls.open(n)
            except FileNotFoundError:              # its last user left meanwhile: again
                if _time.monotonic() > deadline:
                    raise

    cdef _bind(self, object region, uint32_t i, name):
        # i: the lock's number (an entry of the directory, or a stripe of the region's
        # table: participants.pxd lock_at, docs/design.md §15)
        cdef Region reg = region
        cdef rmap_t* rm = reg.rm
        cdef shm_body b
        cdef uint32_t code = kind_code_of(type(self))
        if lock_at(rm, i + 1, &b) == LOCK_NONE:
            raise CorruptRegionError(f"region {reg.name!r} has no lock number {i}")
        if b.ctl.magic != SHM_BODY_MAGIC or b.ctl.kind != code:
            raise CorruptRegionError(f"region {reg.name!r}: lock {name!r} body does not "
                                     "match its directory entry")
        self._region = region
        self.rm = rm
        self.b = b
        self._code = code
        self._lock1 = i + 1
        self._name = name
        self._closed = False

    # -- participant lookup: a TLS list scan on the fast path, registration once ----------

    cdef inline reg_t* _me(self) except NULL:
        cdef reg_t* r
        if self._closed or self.rm.closed:
            raise ValueError(f"lock {self._name!r} is closed")
        r = reg_lookup(self.rm)
        if r == NULL:
            r = reg_register(self.rm)
        return r

    cdef reg_t* _me_by(self, int64_t deadline) except NULL:
        """_me() for a timed or non-blocking acquire: a registration that recovers a dead
        participant does so by `deadline` (it leaves the rest to the next waiter)."""
        cdef reg_t* r
        if self._closed or self.rm.closed:
            raise ValueError(f"lock {self._name!r} is closed")
        r = reg_lookup(self.rm)
        if r != NULL:
            return r
        return reg_register(self.rm, deadline)

    # -- the internal interface (overridden by each kind) ---------------------------------

    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil:
        return R_BUSY

    cdef int _try(self, uint32_t me) noexcept nogil:
        return R_BUSY

    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        return R_TIMEOUT

    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil:
        return 0

    cdef bint _is_locked(self) noexcept nogil:
        return ld32_rlx(&self.b.ctl.holder) != 0

    cdef int _waiters(self) noexcept nogil:
        """Live participants that published that they wait for this lock, an asyncio
        cohort counting the tasks it waits or holds for (agent_tasks; a snapshot)."""
        cdef uint32_t i
        cdef int n = 0
        cdef uint32_t h = holder_slot(self.rm, ld32_acq(&self.b.ctl.holder))
        for i in range(rmap_hwm(self.rm)):
            if ld32_acq(&self.rm.part[i].agent) == 1:
                if participant_state(self.rm, i) == 1:
                    n += agent_tasks(self.rm, i, self._lock1, h)
            elif (participant_op(self.rm, i, self._lock1) == SHM_OP_WAITING
                    and participant_state(self.rm, i) == 1):
                n += 1
        return n

    cdef int _consistent(self) noexcept nogil:
        return 0

    cdef bint _held_by_tid(self, uint32_t tid) noexcept nogil:
        return 0

    cdef object _dead_holder(self):
        return None

    cdef void _died_taken(self) noexcept nogil:
        pass

    # -- acquire ------------------------------------------------------------------------

    cdef inline reg_t* _me_fast(self) noexcept nogil:
        """The calling thread's registration on an open lock, or NULL (closed, or not yet
        registered: _me() raises or registers). The fast path's lookup: a TLS list scan."""
        if self._closed or self.rm.closed:
            return NULL
        return reg_lookup(self.rm)

    cdef inline bint _got_fast(self, reg_t* r, int rc, bint armed) noexcept nogil:
        """The hold begins: publish the holder, end the acquire step, count it. Returns 1
        when the flags (owner_died, not-recoverable, hand-on) or rc ask for _got_flags,
        which the caller runs with the GIL; 0 when the hold is complete."""
        crashpoint_at(armed, "lock.acquire.got")
        trace("got", r.slot, rc, ld32_rlx(&self.b.ctl.holder))
        if SHM_DEBUG_BUILT:              # a constant: nothing at all in a normal build
            dassert(ld32_rlx(&self.b.ctl.holder) == 0 or not kind_ops(self._code).repair,
                    "acquire: no holder record is left when a user-recovered lock is taken")
        st32_rlx(&self.b.ctl.holder, r.hid)          # publish HOLDING ...
        crashpoint_at(armed, "lock.acquire.holder")
        shm_op_set(r.op, 0, 0)                       # ... then end the acquire step
        r.held += 1
        crashpoint_lock_at(armed, "lock.acquire.done", self.rm.ino, self._lock1)  # held
        if rc == R_ACQ and ld32_rlx(&self.b.ctl.flags) == 0:
            stats_hold(self.b.ctl, r.pid)
            return 0
        return 1

    cdef object _got(self, reg_t* r, int rc, bint armed):
        """_got_fast, then the flags: True, or raises (off the fast path)."""
        if self._got_fast(r, rc, armed):
            return self._got_flags(r, rc)
        return True

    cdef inline int _take_fast(self, reg_t* r, bint armed) noexcept nogil:
        """Publish the acquire step and make the kind's uncontended attempt; on R_ACQ the
        hold begins (_got_fast). Returns 0 when the lock is held and counted, else the
        kind's code for _acquire_rest (R_ACQ: the flags remain to be handled)."""
        cdef int rc
        shm_op_set(r.op, self._lock1, SHM_OP_TAKING)
        crashpoint_at(armed, "lock.acquire.taking")
        rc = self._fast(r.slot, armed)
        if rc == R_ACQ and not self._got_fast(r, rc, armed):
            return 0
        return rc

    cdef object _acquire_rest(self, reg_t* r, int rc):
        """A blocking acquire after _take_fast returned rc != 0 (not on the fast path)."""
        if rc == R_ACQ:                              # held: only the flags are left
            return self._got_flags(r, rc)
        return self._acquire_slow(r, rc, -1)

    cdef object _got_flags(self, reg_t* r, int rc):
        cdef uint32_t f
        if rc == R_ACQ_DIED:
            for32(&self.b.ctl.flags, SHM_F_OWNER_DIED)
            self._died_taken()
        f = ld32_acq(&self.b.ctl.flags)
        if f & SHM_F_HANDON:                 # the hand-on is over: the hold is ours now
            fand32(&self.b.ctl.flags, ~(<uint32_t>SHM_F_HANDON))
        if f & SHM_F_NOTRECOVERABLE:
            shm_op_set(r.op, self._lock1, SHM_OP_RELEASING)
            st32_rlx(&self.b.ctl.holder, 0)
            r.held -= 1
            self._unlock(r.slot, shm_crash_armed)
            shm_op_set(r.op, 0, 0)
            _raise_code(self, R_NOTREC)
        stats_hold(self.b.ctl, r.pid)
        if f & SHM_F_OWNER_DIED:
            stats_owner_death(self.b.ctl)
        return True

    def acquire(self, blocking=True, timeout=-1):
        """acquire(blocking=True, timeout=-1) -> bool

        Like ``threading.Lock.acquire``: ``timeout`` in seconds, ``-1`` or ``None`` waits
        forever; returns False on timeout (and at once if ``blocking`` is False and the
        lock is held, by this thread or another). A timeout beyond threading.TIMEOUT_MAX
        raises OverflowError. Raises DeadlockError if a blocking or timed acquire would
        wait for a lock the calling thread holds, LockNotRecoverableError if the lock was
        released inconsistent after an owner death. Blocking releases the GIL and runs signal
        handlers (Ctrl-C raises KeyboardInterrupt out of it)."""
        cdef reg_t* r
        cdef int rc
        if g_lockdep is None and blocking is True and (timeout is _NEG1 or timeout is None):
            # the fast path: a few atomics inline, everything else out of line
            r = self._me_fast()
            if r == NULL:
                r = self._me()
            rc = self._take_fast(r, shm_crash_armed)
            if rc == 0:
                return True
            return self._acquire_rest(r, rc)
        if g_lockdep is not None:
            return self._acquire_lockdep(blocking, timeout)
        return self._acquire_args(blocking, timeout)

    cdef str _lockdep_class(self):
        """The lock's class for lockdep: `region/lock`, a standalone lock's region name."""
        if self._ldcls is None:
            if self._lock1 > self.rm.L:
                # a stripe of a lock table: one class for the table (docs/design.md §15)
                self._ldcls = self._region.name
            elif self._standalone or self._name == "lock":
                self._ldcls = self._region.name
            else:
                self._ldcls = f"{self._region.name}/{self._name}"
        return self._ldcls

    cdef object _acquire_lockdep(self, blocking, timeout):
        """acquire() with lock-order validation on (lockdep.pxi): a blocking or timed
        acquire validates and records the orders first, unless the chain (held classes,
        this one) was validated before; any acquire that got the lock counts as held."""
        cdef str cls = self._lockdep_class()
        cdef list held = ld_held()
        if blocking and held and (tuple(held), cls) not in g_ld_validated:
            g_lockdep.before(cls, held)
        if blocking is True and (timeout is _NEG1 or timeout is None):
            got = self._acquire_forever(self._me())
        else:
            got = self._acquire_args(blocking, timeout)
        if got:
            held.append(cls)
        return got

    cdef object _acquire_forever(self, reg_t* r):
        cdef int rc = self._take_fast(r, shm_crash_armed)
        if rc == 0:
            return True
        return self._acquire_rest(r, rc)

    cdef object _acquire_args(self, blocking, timeout):
        cdef int rc
        cdef int64_t deadline = _deadline_of(blocking, timeout)
        cdef reg_t* r
        if deadline == 0:
            r = self._me_by(shm_now_ns())              # never waits, even to recover
            shm_op_set(r.op, self._lock1, SHM_OP_TAKING)
            crashpoint("lock.acquire.taking")
            rc = self._try(r.slot)
            if rc == R_ACQ or rc == R_ACQ_DIED:
                return self._got(r, rc, shm_crash_armed)
            shm_op_set(r.op, 0, 0)
            if rc < 0:
                _raise_code(self, rc)
            return False                 # held, by another thread or this one (threading.Lock)
        r = self._me_by(deadline)
        shm_op_set(r.op, self._lock1, SHM_OP_TAKING)
        crashpoint("lock.acquire.taking")
        rc = self._fast(r.slot, shm_crash_armed)
        if rc == R_ACQ:
            return self._got(r, rc, shm_crash_armed)
        return self._acquire_slow(r, rc, deadline)

    cdef int _withdraw(self, reg_t* r, int rc) except? -100:
        """Leave at once whatever place _fast took (a wait with deadline 0: each kind's
        timeout path). The kind's result: R_TIMEOUT once left, R_ACQ if it was granted."""
        cdef wait_t w
        wait_init(&w, 0, NULL)
        shm_op_set(r.op, self._lock1, SHM_OP_WAITING)
        rc = self._wait(r.slot, rc, &w)
        if rc == R_ACQ or rc == R_ACQ_DIED:
            return rc
        shm_op_set(r.op, 0, 0)
        if rc < 0 and rc != R_SIGNAL:
            _raise_code(self, rc)
        return rc

    cdef bint _waiting_via_other_view(self, reg_t* r) noexcept nogil:
        """Inside a re-entry window only: does another live slot of the calling thread
        (another object of this lock) take or wait for this lock?"""
        cdef shm_participant* me = &self.rm.part[r.slot]
        cdef shm_participant* p
        cdef uint32_t x, op
        for x in range(rmap_hwm(self.rm)):
            if x == r.slot:
                continue
            p = &self.rm.part[x]
            op = participant_op(self.rm, x, self._lock1)
            if ((op == SHM_OP_TAKING or op == SHM_OP_WAITING)
                    and ld32_acq(&p.pid) == r.pid and ld32_acq(&p.tid) == ld32_rlx(&me.tid)
                    and ld64_acq(&p.pidns) == ld64_rlx(&me.pidns)
                    and participant_state(self.rm, x) == 1):
                return 1
        return 0

    cdef bint _held_via_other_view(self, reg_t* r) noexcept nogil:
        """Slow path: does the lock's holder record name another live participant slot of
        the calling thread (same pid, tid and PID namespace as ours)? Each object made by
        open() or unpickling maps the segment anew and registers its own slot, so the
        holder id differs from ours although the thread is the same."""
        cdef uint32_t h = holder_slot(self.rm, ld32_acq(&self.b.ctl.holder))
        cdef shm_participant* me
        cdef shm_participant* p
        if h == 0 or h - 1 == r.slot:
            return 0
        me = &self.rm.part[r.slot]
        p = &self.rm.part[h - 1]
        return (ld32_acq(&p.agent) == 0
                and ld32_acq(&p.pid) == r.pid and ld32_acq(&p.tid) == ld32_rlx(&me.tid)
                and ld64_acq(&p.pidns) == ld64_rlx(&me.pidns)
                and participant_state(self.rm, h - 1) == 1)

    cdef bint _task_of_mine(self, reg_t* r) noexcept nogil:
        """Slow path, with agent slots of this process in the region (rm.agents): does an
        asyncio cohort of the calling thread's event loop (an agent slot of this thread)
        hold this lock, or take or wait for it (docs/design.md §14)?"""
        cdef shm_participant* me = &self.rm.part[r.slot]
        cdef shm_participant* p
        cdef uint32_t x, op
        cdef uint32_t h = holder_slot(self.rm, ld32_acq(&self.b.ctl.holder))
        for x in range(rmap_hwm(self.rm)):
            p = &self.rm.part[x]
            if x == r.slot or ld32_acq(&p.agent) != 1:
                continue
            if (ld32_acq(&p.pid) != r.pid or ld32_acq(&p.tid) != ld32_rlx(&me.tid)
                    or ld64_acq(&p.pidns) != ld64_rlx(&me.pidns)
                    or participant_state(self.rm, x) != 1):
                continue
            op = participant_op(self.rm, x, self._lock1)
            if h == x + 1 or op == SHM_OP_TAKING or op == SHM_OP_WAITING:
                return 1
        return 0

    cdef _raise_deadlock(self):
        raise DeadlockError(f"this thread already holds {self.kind_name} lock {self._name!r} "
                            "(shmlocks locks are not reentrant)")

    cdef int _wait_aside(self, uint32_t me, int rc, wait_t* w) noexcept nogil:
        """_wait, and for a FIFO kind the waits aside (docs/design.md §7.0): a kind's _wait
        that returns R_ASIDE has left its place as at a timeout (ticket, mcs) or marked it
        aside (clh); the waiter sleeps aside until it takes the VIP turn, then rejoins (in
        place if its place is still queued: _aside_end, then _wait)."""
        rc = self._wait(me, rc, w)
        while rc == R_ASIDE:
            rc = self._aside_end(me, aside_sleep(w))
            if rc == R_PENDING or rc == R_BUSY:
                rc = self._wait(me, rc, w)
        if w.aside != NULL:
            aside_done(w)
        return rc

    cdef int _aside_end(self, uint32_t me, int rc) noexcept nogil:
        """The sleep aside ended with rc: on the VIP turn (R_CONT) rejoin as any acquire
        after a timeout does (ticket and mcs left their place as they stepped aside, and
        take it back while it is queued); else the wait is over. clh overrides it: its
        place stays queued while its waiter is aside (kinds/clh.pxi)."""
        if rc != R_CONT:
            return rc
        return self._fast(me, shm_crash_armed)

    cdef object _acquire_slow(self, reg_t* r, int rc, int64_t deadline):
        cdef wait_t w
        cdef uint32_t me = r.slot
        cdef int64_t t0
        if rc == R_ACQ_DIED:
            return self._got(r, rc, shm_crash_armed)
        if rc < 0:
            shm_op_set(r.op, 0, 0)
            _raise_code(self, rc)
        if ld32_rlx(&self.b.ctl.holder) == r.hid:
            if rc == R_PENDING:
                # a place taken all the same (a compact ticket stripe's _fast cannot see
                # that this participant holds it when its table line names another
                # stripe's ticket: ticketc.pxi): left, as at a timeout, before raising
                self._withdraw(r, rc)
            shm_op_set(r.op, 0, 0)
            self._raise_deadlock()
        if self.rm.agents > 0 and deadline != 0 and self._task_of_mine(r):
            # An asyncio task of this thread's event loop holds the lock, or waits for it
            # (docs/design.md §14): this thread would block the loop that must run the
            # task's release (or hand the task the lock first): it would never wake.
            rc = self._withdraw(r, rc)
            if rc == R_ACQ or rc == R_ACQ_DIED:      # released meanwhile
                return self._got(r, rc, shm_crash_armed)
            raise DeadlockError(
                f"a task of this thread's asyncio event loop holds or awaits "
                f"{self.kind_name} lock {self._name!r}: a blocking acquire on the loop's "
                "thread would keep the loop from running it (await acquire_async() in a "
                "task instead)")
        if self._held_via_other_view(r):
            # Held by this very thread through another object of this lock (open() again,
            # a pickle round trip: another participant slot of the same thread). Waiting
            # would never end: withdraw at once, then raise.
            rc = self._withdraw(r, rc)
            if rc == R_ACQ or rc == R_ACQ_DIED:      # released meanwhile
                return self._got(r, rc, shm_crash_armed)
            raise DeadlockError(
                f"this thread already holds {self.kind_name} lock {self._name!r} through "
                "another object of the same lock (opened again, or unpickled): shmlocks "
                "locks are not reentrant")
        if shm_win_n > 0 and self._waiting_via_other_view(r):
            # A handler of ours acquires, through another object, the lock its thread
            # waits for: queued behind its own wait, it would never be served
            self._withdraw(r, rc)
            raise reentry_error(f"acquire() of {self.kind_name} lock {self._name!r}")
        wait_init(&w, deadline, &self.b.precs[me].spin_ns)   # (recoveries it runs keep it)
        w.rm = self.rm                               # hidden while handlers run
        if kind_steps_aside(self._code):
            w.aside = aside_words(&self.b)           # a FIFO kind may step aside (§7.0)
            w.aside_cap = aside_cap(&self.b)
            w.aside_id = r.hid
            w.aside_b = &self.b
            w.aside_slot = me
        t0 = shm_now_ns()                            # also the wait's start, for stats_waited
        dl_arm(&w, self.rm, me, t0)                  # the wait record: since when ...
        shm_op_set(r.op, self._lock1, SHM_OP_WAITING)     # "me waits for this lock"
        crashpoint("lock.wait.waiting")
        if self.rm.nthreads <= 1:
            # no other thread of ours is registered here, so none can hold this lock and
            # need our GIL: spin with it, release it only to yield or park (wait.pxi)
            w.gil = 1
            rc = self._wait_aside(me, rc, &w)
            dl_end(&w)                               # its wait links cleared
            wait_regil(&w)
        else:
            with nogil:
                rc = self._wait_aside(me, rc, &w)
                dl_end(&w)
        found = dl_found(&w)                         # a deadlock victim's cycle, or None
        if rc == R_ACQ or rc == R_ACQ_DIED:
            wait_adapt(&w, &self.b.precs[me].spin_ns)
            if PyErr_Occurred() != NULL:
                # granted while a signal handler raised: hand the lock back, then raise
                shm_op_set(r.op, self._lock1, SHM_OP_RELEASING)
                self._unlock(me, shm_crash_armed)
                shm_op_set(r.op, 0, 0)
                return _raise_pending()
            stats_waited(self.b.ctl, shm_now_ns() - t0)
            return self._got(r, rc, shm_crash_armed)
        shm_op_set(r.op, 0, 0)
        if PyErr_Occurred() != NULL:
            return _raise_pending()                  # never a return value with it set
        if rc == R_TIMEOUT:
            if w.dl_hit:
                dl_raise(f"{self.kind_name} lock {self._name!r}", found)   # a deadlock's victim
            stats_timeout(self.b.ctl)
            return False
        if rc == R_SIGNAL:
            return _raise_pending()
        _raise_code(self, rc)

    # -- release ------------------------------------------------------------------------

    cdef inline reg_t* _holding_me(self) noexcept nogil:
        """The calling thread's registration if the lock is open and it holds it, else
        NULL (then _release() sorts out the closed, not-owner and re-entry cases)."""
        cdef reg_t* r
        if self._closed or self.rm.closed:
            return NULL
        r = reg_lookup(self.rm)
        if r == NULL or ld32_rlx(&self.b.ctl.holder) != r.hid:
            return NULL
        return r

    cdef inline int _unhold(self, reg_t* r, bint armed) noexcept nogil:
        """Release by the holder `r`: the kind's code (< 0: _raise_code)."""
        cdef int rc
        shm_op_set(r.op, self._lock1, SHM_OP_RELEASING)
        trace("release", r.slot, 0, 0)
        crashpoint_at(armed, "lock.release.releasing")
        if ld32_rlx(&self.b.ctl.flags) & SHM_F_OWNER_DIED:
            # released inconsistent: unusable from now on, in every process. The flag in
            # the body is the one source of truth for every kind; a pthread mutex is made
            # consistent first, because glibc leaves an ENOTRECOVERABLE robust mutex's
            # futex word locked by the first thread that tries it.
            for32(&self.b.ctl.flags, SHM_F_NOTRECOVERABLE)
            self._consistent()
        st32_rlx(&self.b.ctl.holder, 0)
        crashpoint_at(armed, "lock.release.unholder")
        r.held -= 1
        rc = self._unlock(r.slot, armed)
        crashpoint_at(armed, "lock.release.unlocked")
        shm_op_set(r.op, 0, 0)
        return rc

    cdef int _release(self) except -1:
        """release() off the fast path: a closed object, a thread that does not hold the
        lock, a task's hold, a kind's error code."""
        cdef reg_t* r = reg_lookup(self.rm)
        cdef int rc
        if r == NULL or ld32_rlx(&self.b.ctl.holder) != r.hid:
            if g_aio is not None:                    # a task's hold (docs/design.md §14)?
                c = _aio_holding(self)
                if c is not None:
                    (<_CohortCore>c).release(False)
                    return 0
                if g_aio._release(self):
                    return 0
            if self._closed or self.rm.closed:
                raise ValueError(f"lock {self._name!r} is closed")
            self._not_owner(r)
        if self._closed or self.rm.closed:
            self._check_held_across_close()
        rc = self._unhold(r, shm_crash_armed)
        if rc < 0:
            _raise_code(self, rc)
        return 0

    cdef int _release_rest(self, reg_t* r, int rc) except -1:
        """release() and __exit__ after the inline attempt, off the fast path: r NULL (not
        the plain holder: _release() checks and releases or raises), or r released with
        the kind's error code rc < 0, or lockdep on (the class leaves the held stack)."""
        if r == NULL:
            self._release()
        elif rc < 0:
            _raise_code(self, rc)
        if g_lockdep is not None:
            ld_released(self._lockdep_class())
        return 0

    cdef int _check_held_across_close(self) except -1:
        """A hold begun before close() (a wait in progress then included) is released
        through the closed object, so that the lock is not left held by a thread that can
        no longer let it go: the thread's registration keeps the mapping until it leaves.
        Anything else on a closed object is ValueError."""
        cdef reg_t* r = reg_lookup(self.rm)
        if r == NULL or r.held <= 0 or ld32_rlx(&self.b.ctl.holder) != r.hid:
            raise ValueError(f"lock {self._name!r} is closed")
        return 0

    cdef int _not_owner(self, reg_t* r) except -1:
        if r == NULL and window_busy(self.rm):
            # a handler releasing a lock its thread holds while that thread waits in this
            # region: the release would publish its step over the wait's
            raise reentry_error(f"release() of {self.kind_name} lock {self._name!r}")
        raise NotOwnerError(f"release of {self.kind_name} lock {self._name!r} by a "
                            "thread that does not hold it")

    def release(self):
        """Release the lock. NotOwnerError if the calling thread does not hold it."""
        cdef reg_t* r = self._holding_me()
        cdef int rc = 0
        if r != NULL:
            rc = self._unhold(r, shm_crash_armed)
            if rc >= 0 and g_lockdep is None:
                return
        self._release_rest(r, rc)

    def _is_owned(self):
        """True if the calling thread holds the lock: what threading.Condition asks."""
        cdef reg_t* r
        self._check()
        r = reg_find(self.rm)
        if r != NULL and ld32_rlx(&self.b.ctl.holder) == r.hid:
            return True
        return g_aio is not None and g_aio._is_owned(self)

    def __enter__(self):
        cdef reg_t* r
        cdef int rc
        if g_lockdep is not None:
            self._acquire_lockdep(True, -1)
            return self
        r = self._me_fast()
        if r == NULL:
            r = self._me()
        rc = self._take_fast(r, shm_crash_armed)
        if rc != 0 and not self._acquire_rest(r, rc):
            raise ShmLockError(f"{self.kind_name} lock {self._name!r}: a wait without "
                               "timeout returned without the lock")
        return self

    cdef int _release_handing_on(self) except -1:
        """Release a hold that has owner_died, leaving it set for the next holder: the
        with block was left by an exception before mark_consistent(), so the repair may
        be half done; the next holder repairs (docs/design.md §6.4). Not the fast path:
        __exit__ calls it only with an exception and OWNER_DIED set."""
        cdef reg_t* r
        cdef int rc
        self._check()
        r = reg_lookup(self.rm)
        if r == NULL or ld32_rlx(&self.b.ctl.holder) != r.hid:
            self._not_owner(r)
        # HANDON first, while we hold: a death from here on leaves owner_died for the next
        # holder, as this release means to (the verdict reads it), never NOTRECOVERABLE
        for32(&self.b.ctl.flags, SHM_F_HANDON)
        shm_op_set(r.op, self._lock1, SHM_OP_RELEASING)
        crashpoint("lock.release.releasing")
        # robust and pi: glibc's mutex must be consistent, or its unlock makes it
        # ENOTRECOVERABLE; owner_died lives on in the lock's own flag, which the next
        # holder's acquire reads (_got_flags)
        self._consistent()
        st32_rlx(&self.b.ctl.holder, 0)
        crashpoint("lock.release.unholder")
        r.held -= 1
        rc = self._unlock(r.slot, shm_crash_armed)
        crashpoint("lock.release.unlocked")
        shm_op_set(r.op, 0, 0)
        if rc < 0:
            _raise_code(self, rc)
        return 0

    def __exit__(self, t, v, tb):
        cdef reg_t* r
        cdef int rc = 0
        if t is not None and self._handing_on():
            self._release_handing_on()
            if g_lockdep is not None:
                ld_released(self._lockdep_class())
            return False
        r = self._holding_me()
        if r != NULL:
            rc = self._unhold(r, shm_crash_armed)
            if rc >= 0 and g_lockdep is None:
                return False
        self._release_rest(r, rc)
        return False

    # -- asyncio (shmlocks/_aio.py, docs/design.md §14) -----------------------------------

    def acquire_async(self, blocking=True, timeout=-1):
        """await acquire_async(blocking=True, timeout=-1) -> bool

        acquire() for a task of an asyncio event loop, with acquire()'s arguments and
        results: the **task** is the owner (two tasks contend like two threads; release()
        from another task raises NotOwnerError; awaiting a lock the task holds raises
        DeadlockError). The loop is never blocked and no thread waits for the task: the
        tasks of one loop queue in call order behind one place of the lock's queue (their
        cohort), which the loop's thread waits on through io_uring (or, without it, one
        waiter thread per loop). Cancelling the awaiting task (task.cancel(),
        asyncio.timeout(), asyncio.wait_for) leaves no hold and no place in the queue."""
        cdef int64_t deadline = _deadline_of(blocking, timeout)
        self._check()
        _aio_module()
        return _aio_acquire(self, deadline)

    def __aenter__(self):
        """async with lock: acquire_async() without timeout; the exit releases."""
        self._check()
        _aio_module()
        return _aio_enter(self)

    def __aexit__(self, t, v, tb):
        _aio_module()
        return _aio_exit(self, t)

    def _lockdep_cls(self):
        """The lock's lockdep class (not API: the asyncio side's validation of a task's
        lock order, shmlocks/_aio.py; docs/design.md §11)."""
        return self._lockdep_class()

    # -- state ----------------------------------------------------------------------------

    def locked(self):
        """True if some thread holds the lock (a snapshot)."""
        self._check()
        return bool(self._is_locked())

    cdef int _check(self) except -1:
        if self._closed or self.rm.closed:
            raise ValueError(f"lock {self._name!r} is closed")
        return 0

    @property
    def owner(self):
        """(pid, native thread id) of the holder, or None: a snapshot."""
        cdef uint32_t h
        self._check()
        h = holder_slot(self.rm, ld32_acq(&self.b.ctl.holder))
        if h == 0:
            dead = self._dead_holder()       # robust, pi: a dead holder whose slot was reused
            if dead is None or other_pidns(dead[2]):
                return None
            return (dead[0], dead[1])
        if other_pidns(ld64_acq(&self.rm.part[h - 1].pidns)):
            return None                  # a pid that means nothing here
        return (ld32_rlx(&self.rm.part[h - 1].pid), ld32_rlx(&self.rm.part[h - 1].tid))

    @property
    def kind(self):
        return self.kind_name

    @property
    def name(self):
        return self._name

    @property
    def region(self):
        return self._region

    @property
    def owner_died(self):
        """True while the current hold follows the death of a holder: repair the data,
        then call mark_consistent()."""
        self._check()
        return bool(ld32_acq(&self.b.ctl.flags) & SHM_F_OWNER_DIED)

    cdef bint _handing_on(self):
        """An exception leaves the with block: does this hold still have owner_died?"""
        return (not self._closed and not self.rm.closed
                and ld32_acq(&self.b.ctl.flags) & SHM_F_OWNER_DIED != 0)

    def clear_not_recoverable(self):
        """clear_not_recoverable() -> bool

        Bring back a lock that was released without mark_consistent() after an owner
        death (every acquire raising LockNotRecoverableError). The next holder gets
        ``owner_died == True``: the protected data is still suspect, so it repairs and
        calls mark_consistent(), as after any owner death. Any thread of any process that
        has the lock open may call it, at any time (nobody holds a not-recoverable lock):
        an acquire that ran before it raised LockNotRecoverableError, one that runs after
        it gets owner_died. Returns True if the lock was not recoverable, False (and does
        nothing) if it was usable already, so that two processes calling it at once
        reset it once."""
        cdef uint32_t f
        self._check()
        while True:
            f = ld32_acq(&self.b.ctl.flags)
            if not f & SHM_F_NOTRECOVERABLE:
                return False
            if cas32(&self.b.ctl.flags, f,
                     (f & ~(<uint32_t>(SHM_F_NOTRECOVERABLE | SHM_F_HANDON)))
                     | SHM_F_OWNER_DIED):
                return True

    def mark_consistent(self):
        """Declare the protected data repaired after an owner death (holder only)."""
        cdef reg_t* r
        self._check()
        r = reg_find(self.rm)
        if r == NULL or ld32_rlx(&self.b.ctl.holder) != r.hid:
            if g_aio is not None and g_aio._mark_consistent(self):
                return                               # a task's hold (docs/design.md §14)
            raise NotOwnerError("mark_consistent() by a thread that does not hold the lock")
        if ld32_acq(&self.b.ctl.flags) & SHM_F_OWNER_DIED:
            self._consistent()
            fand32(&self.b.ctl.flags, ~(<uint32_t>(SHM_F_OWNER_DIED | SHM_F_HANDON)))

    def stats(self):
        """A snapshot of this lock's statistics, summed over every process that used it
        since it was created (or since reset_stats()):

        ``acquisitions`` holds begun; ``contended`` those that had to wait (went through
        the slow path); ``wait_total_s``, ``wait_max_s`` the time they waited, in seconds;
        ``timeouts`` timed acquires that returned False (a non-blocking acquire that finds
        the lock held is not one); ``owner_deaths`` holds that began with ``owner_died``;
        ``handoffs`` holds taken by another process than the previous holder's.

        Each counter is read atomically, the set not at one instant. A holder killed at
        the wrong moment may leave a count one short, never a wrong number."""
        self._check()
        return stats_read(self.b.ctl)

    def reset_stats(self):
        """Zero this lock's statistics, for every process. A count being updated by a
        holder at that instant may keep its value (reset while the lock is quiet)."""
        self._check()
        stats_reset(self.b.ctl)

    def close(self):
        """Detach this object; a lock made by create()/open() also closes its region."""
        if self._closed:
            return
        self._closed = True
        if self._standalone:
            self._region.close()
        if g_aio is not None:
            g_aio._closed(self)          # its idle asyncio cohorts leave (docs/design.md §14)

    def unlink(self):
        """Remove the region's name now; mapped views go on working (ValueError once
        closed)."""
        self._check()
        self._region.unlink()

    def __reduce__(self):
        self._check()
        if self._standalone:
            return (_open_standalone, (type(self), self._region.name))
        if self._lock1 > self.rm.L:                  # a stripe of a lock table
            return (_open_stripe, (self._region.name, self._lock1 - 1 - self.rm.tbl.first))
        return (_open_in_region, (self._region.name, self._name))

    def __repr__(self):
        st = "closed" if (self._closed or self.rm.closed) else (
            "locked" if self._is_locked() else "unlocked")
        return f"<shmlocks.{type(self).__name__} {self._name!r} {st}>"

    def _describe(self):
        """The lock as the next acquire would find it (inspect, stat, top).

        The lock words alone can say "held" when nobody holds it: a thread that died
        inside acquire or release (a published TAKING/WAITING/RELEASING step) leaves them
        set, and the next acquire completes its step on its behalf and gets the lock at
        once, without owner_died (docs/design.md §6.4 [V]). Such a lock is shown free,
        with ``stale_step``. A dead holder the kernel reports (robust, pi), or a user-kind
        holder that died in its critical section (no step), is shown as the holder."""
        cdef uint32_t i, op, h
        cdef uint32_t dead1 = 0
        cdef bint live = 0
        cdef bint stale = 0
        self._check()
        f = ld32_acq(&self.b.ctl.flags)
        locked = bool(self._is_locked())
        h = holder_slot(self.rm, ld32_acq(&self.b.ctl.holder))
        kernel = self.recovery == "kernel"
        if locked:
            for i in range(rmap_hwm(self.rm)):
                op = participant_op(self.rm, i, self._lock1)
                if op == 0:
                    continue
                st = participant_state(self.rm, i)
                if st == 1:
                    live = 1
                elif st == 2 and dead1 == 0:
                    dead1 = i + 1
            if h != 0 and participant_state(self.rm, h - 1) == 2:
                # a dead holder: owner_died unless (user kinds) it died inside a step
                stale = not kernel and participant_op(self.rm, h - 1, self._lock1) != 0
            elif h == 0 and dead1 != 0:
                if kernel:
                    # the kind's word names its owner's thread, or says the owner died
                    if self._held_by_tid(ld32_rlx(&self.rm.part[dead1 - 1].tid)):
                        h = dead1                    # it died holding: owner_died next
                elif not live:
                    stale = 1                        # only a dead thread's step: free
        if stale:
            locked = False
            h = 0
        holder = None
        if locked:
            holder = (<Region>self._region)._participant(h)
            if holder is None and kernel:
                dead = self._dead_holder()  # its slot was reused: the record [R1] (no slot)
                if dead is not None:
                    holder = {"slot": None, "pid": dead[0], "tid": dead[1], "alive": False,
                              "other_namespace": other_pidns(dead[2])}
        return {"name": self._name, "kind": self.kind_name, "locked": locked,
                "holder": holder,
                "waiters": self._waiters(),
                "owner_died": bool(f & SHM_F_OWNER_DIED),
                "not_recoverable": bool(f & SHM_F_NOTRECOVERABLE),
                "stale_step": bool(stale)}

    def _raw(self):
        """Every shared word of this lock's body and its participants' published steps, as
        plain numbers: for diagnosing a wedge or a corrupt state (torture prints it). A
        snapshot read without the repair mutex, so it may be mid-change. The nodes and
        precs of the participants provisioned (and the lock's own node, the last)."""
        cdef uint32_t i
        cdef uint32_t h = body_hwm(&self.b)
        cdef uint32_t nf = shm_fixed_nodes(kind_ops(self._code).fixed_nodes, self.b.P)
        cdef shm_qnode* n
        cdef shm_prec* r
        cdef shm_participant* q
        cdef uint32_t* a
        self._check()
        nodes, precs, parts = [], [], []
        for i in range(self.b.P + 1):
            if self.b.qnodes == NULL:
                break                        # a compact stripe: no nodes
            if i >= h and (i >= nf and i != self.b.P or shm_view_compact(&self.b)):
                continue                     # not provisioned (a compact mcs stripe's
                                             # nodes: its table's, one per participant)
            n = &self.b.qnodes[i]            # raw words, read through the queue view
            nodes.append((ld32_acq(&n.state), ld32_acq(&n.next), ld32_acq(&n.pred),
                          ld32_acq(&n.parked), ld64_acq(&n.left_gen), ld32_acq(&n.round),
                          ld32_acq(&n.guess)))
        for i in range(h):
            r = &self.b.precs[i]
            q = &self.rm.part[i]
            precs.append((ld32_acq(&r.mine), ld32_acq(&r.pred), ld64_acq(&r.ticket),
                          ld64_acq(&r.abandoned), ld64_acq(&r.abandoned_gen),
                          ld32_acq(&r.round), ld64_acq(&r.omark)))
            parts.append((ld32_acq(&q.pid), ld32_acq(&q.op_lock), ld32_acq(&q.op_step),
                          ld64_acq(&q.op_value), ld64_acq(&q.generation)))
        aside = None
        if kind_steps_aside(self._code):
            a = aside_words(&self.b)         # docs/design.md §7.0
            aside = {"vip": ld32_acq(&a[AS_VIP]),
                     "seats": [ld32_acq(&a[AS_SEATS + i])
                               for i in range(min(g_aside_seats, aside_cap(&self.b)))],
                     "aside": [i for i in range(h) if ld64_acq(&self.b.precs[i].aside_since)]}
        return {"flags": ld32_acq(&self.b.ctl.flags), "holder": ld32_acq(&self.b.ctl.holder),
                "wa": ld64_acq(&self.b.wa.u64[0]), "wb": ld64_acq(&self.b.wb.u64[0]),
                "aside": aside,
                "nodes (state, next, pred, parked, value, round, guess)": nodes,
                "precs (mine, pred, ticket, abandoned, abandoned_gen, round, omark)": precs,
                "participants (pid, op_lock, op_step, op_value, generation)": parts}


cdef object _aio_module():
    if g_aio is None:
        import shmlocks._aio                 # binds itself (_aio_bind)
    return g_aio


cdef class _Agent:
    """An asyncio cohort's participant on one lock (not API: shmlocks/_aio.py; docs/design.md
    §14): an agent slot of the event loop's thread (participants.pxi reg_claim_agent)
    through which the cohort holds the lock for one task at a time, and waits for it for
    the tasks queued behind (a resumable wait: docs/design.md §5). Made and used by that
    thread only (its token, and for robust and pi the mutex, are that thread's).

    ``take()`` takes the lock's place (a FIFO kind's ticket or queue node, at once): True
    if held now, False if a wait is in progress; ``poll()`` re-enters it (True once held,
    False where it would sleep: ``arm``/``arm_thread`` hand its watch set to the driver,
    ``until_ns`` says when to poll anyway); ``withdraw()`` gives it up (True if a grant
    that came meanwhile was passed on); ``try_()`` a non-blocking attempt; ``release()``,
    ``pass_on()``, ``mark_consistent()`` act on its hold; ``close()`` gives the slot back."""
    cdef _Lock lk
    cdef reg_t* r
    cdef wait_t w
    cdef watch_t ws
    cdef watch_t pk                  # its poke word, watched for the task it holds for
    cdef int _active                 # 1 while a wait is in progress (a place taken)
    cdef int pid
    cdef unsigned long gen           # g_aio_gen when made (its process's)
    cdef unsigned long owner

    def __cinit__(self):
        self.r = NULL
        self._active = 0
        self.ws.n = 0
        self.pid = getpid()
        self.gen = g_aio_gen
        self.owner = PyThread_get_thread_ident()

    def __init__(self, _Lock lock, int others=0):
        lock._check()
        self.lk = lock
        # (a registration's recoveries are cut short as a resumable wait's are: the loop)
        self.r = reg_claim_agent(lock.rm, shm_now_ns() + NB_RECOVER_NS, others)

    cdef int _mine(self) except -1:
        if self.r == NULL:
            raise ValueError("the lock's asyncio agent is closed")
        if self.gen != g_aio_gen:
            raise ValueError("an asyncio agent made before fork() is not the child's")
        if PyThread_get_thread_ident() != self.owner:
            raise RuntimeError("an asyncio agent is used by the thread that made it only")
        return 0

    @property
    def lock(self):
        return self.lk

    @property
    def slot(self):
        return self.r.slot if self.r != NULL else None

    @property
    def active(self):
        """True while a wait is in progress (a place taken, not yet held or left)."""
        return bool(self._active)

    @property
    def closed(self):
        """The lock object (or its region) was closed: no new wait through the agent."""
        return bool(self.lk._closed or self.lk.rm.closed)

    @property
    def target(self):
        """(segment name, lock index + 1): what a wait link names (docs/design.md §9)."""
        return (self.lk.rm.path[:sizeof(self.lk.rm.path)].split(b"\0", 1)[0]
                .rpartition(b"/")[2], self.lk._lock1)

    @property
    def holding(self):
        """Does the lock's holder record name this agent?"""
        return self.r != NULL and ld32_acq(&self.lk.b.ctl.holder) == self.r.hid

    @property
    def owner_died(self):
        return bool(ld32_acq(&self.lk.b.ctl.flags) & SHM_F_OWNER_DIED)

    def take(self):
        """Take the lock's place: True (held now; owner_died as for acquire()) or False (a
        wait is in progress)."""
        self._mine()
        return self._take()

    cdef object _take(self):
        # take() on the agent's own thread, in its own process (the cohort checked)
        cdef _Lock lk = self.lk
        cdef reg_t* r
        cdef shm_participant* p
        cdef int rc
        lk._check()
        if self._active:
            raise RuntimeError("a wait is in progress already")
        r = self.r
        rc = lk._take_fast(r, shm_crash_armed)
        if rc == 0:
            return True
        if rc == R_ACQ:
            return lk._got_flags(r, rc)
        if rc == R_ACQ_DIED or rc < 0:
            return lk._acquire_slow(r, rc, 0)        # held (owner_died), or raises
        nb_init(&self.w, &self.ws, -1, rc)           # (the tasks' own deadlines: _aio)
        self.w.rm = lk.rm
        p = &lk.rm.part[r.slot]
        st64_rlx(&p.wait_since, <uint64_t>shm_now_ns())
        st32_rlx(&p.detects, g_dl_timeout_ns >= 0)
        shm_op_set(r.op, lk._lock1, SHM_OP_WAITING)  # "the cohort waits for this lock"
        crashpoint("lock.wait.waiting")
        self._active = 1
        return False

    def try_(self):
        """A non-blocking acquire: True or False (acquire(blocking=False))."""
        cdef _Lock lk = self.lk
        cdef int rc
        self._mine()
        lk._check()
        shm_op_set(self.r.op, lk._lock1, SHM_OP_TAKING)
        rc = lk._try(self.r.slot)
        if rc == R_ACQ or rc == R_ACQ_DIED:
            return lk._got(self.r, rc, shm_crash_armed)
        shm_op_set(self.r.op, 0, 0)
        if rc < 0:
            _raise_code(lk, rc)
        return False

    def poll(self):
        """Re-enter the wait: True (held), False (it would sleep on the watch set)."""
        self._mine()
        return self._poll()

    cdef object _poll(self):
        cdef _Lock lk = self.lk
        cdef int rc
        if not self._active:
            raise RuntimeError("no wait in progress")
        with nogil:
            nb_woken(&self.w)
            rc = lk._wait(self.r.slot, self.w.resume_rc, &self.w)
        if rc == R_WOULDBLOCK:
            return False
        self._active = 0
        if rc == R_ACQ or rc == R_ACQ_DIED:
            return lk._got(self.r, rc, shm_crash_armed)
        shm_op_set(self.r.op, 0, 0)
        if rc == R_SIGNAL or PyErr_Occurred() != NULL:
            if PyErr_Occurred() != NULL:
                return _raise_pending()
            raise RuntimeError("an asyncio wait ended by a signal with no exception set")
        if rc == R_TIMEOUT:
            raise RuntimeError("an asyncio wait without a deadline timed out")
        _raise_code(lk, rc)

    def withdraw(self):
        """Give the wait up (a re-entry with deadline 0: the kind's timeout path, the
        place left): True if a grant that came meanwhile was passed on (released at once,
        owner_died handed on), False if the place was left."""
        cdef _Lock lk = self.lk
        cdef int rc
        self._mine()
        if not self._active:
            return False
        with nogil:
            nb_woken(&self.w)
            self.w.deadline = 0
            rc = lk._wait(self.r.slot, self.w.resume_rc, &self.w)
        self._active = 0
        if rc == R_ACQ or rc == R_ACQ_DIED:
            if rc == R_ACQ_DIED:
                for32(&lk.b.ctl.flags, SHM_F_OWNER_DIED)
            lk._got_fast(self.r, R_ACQ, shm_crash_armed)
            _nb_pass_on(lk, self.r)
            return True
        shm_op_set(self.r.op, 0, 0)
        if rc < 0 and rc != R_SIGNAL:
            _raise_code(lk, rc)
        return False

    def arm(self, _Ring ring, uint64_t user_data):
        """Hand the would-be sleep to the ring: a FUTEX_WAITV on the watch set, whose
        completion carries user_data (io_uring; the loop's thread reaps it)."""
        cdef shm_waitv* v
        cdef int i
        self._mine()
        if not self._active or self.ws.n < 1:
            raise RuntimeError("no sleep to arm")
        v = <shm_waitv*>calloc(self.ws.n, sizeof(shm_waitv))
        if v == NULL:
            raise MemoryError()
        for i in range(self.ws.n):
            shm_waitv_fill(&v[i], self.ws.words[i], self.ws.vals[i])
        ring._submit(v, <unsigned>self.ws.n, user_data)

    def arm_thread(self, _Waiter waiter, uint64_t id):
        """Hand the would-be sleep to the fallback's waiter thread (AIO_MODE "thread")."""
        self._mine()
        if not self._active or self.ws.n < 1:
            raise RuntimeError("no sleep to arm")
        waiter._add(&self.ws, id)

    @property
    def until_ns(self):
        """CLOCK_MONOTONIC ns at which to poll even if no word changes (-1: never)."""
        return self.w.nb_until if self._active else -1

    @property
    def cut(self):
        """The last poll's recovery was cut short (left pending for the next waiter)."""
        return bool(self._active and self.w.rec.cut)

    def release(self, bint handing_on=False):
        """Release the agent's hold (handing_on: keep owner_died for the next holder, as
        __exit__ does when an exception leaves the block before mark_consistent())."""
        self._mine()
        self._release(handing_on)

    cdef int _release(self, bint handing_on) except -1:
        cdef reg_t* r = self.r
        cdef _Lock lk = self.lk
        cdef int rc
        # (closed or not: the agent keeps the mapping while it holds, and a hold begun
        # before close() is released through the closed object, as a thread's is)
        if ld32_rlx(&lk.b.ctl.holder) != r.hid:
            raise NotOwnerError(f"release of {lk.kind_name} lock {lk._name!r} by a task "
                                "that does not hold it")
        if not handing_on:
            rc = lk._unhold(r, shm_crash_armed)
        else:
            for32(&lk.b.ctl.flags, SHM_F_HANDON)
            shm_op_set(r.op, lk._lock1, SHM_OP_RELEASING)
            lk._consistent()
            st32_rlx(&lk.b.ctl.holder, 0)
            r.held -= 1
            rc = lk._unlock(r.slot, shm_crash_armed)
            shm_op_set(r.op, 0, 0)
        if rc < 0:
            _raise_code(lk, rc)
        return 0

    def pass_on(self):
        """Release a hold no task saw (granted as its task was cancelled, or with no task
        left): nobody saw owner_died, so a hold that has it hands it on to the next holder,
        as a with block left by an exception does (docs/design.md §6.4), never
        NOTRECOVERABLE."""
        self.release(ld32_acq(&self.lk.b.ctl.flags) & SHM_F_OWNER_DIED != 0)

    def mark_consistent(self):
        cdef _Lock lk = self.lk
        self._mine()
        if ld32_acq(&lk.b.ctl.flags) & SHM_F_OWNER_DIED:
            lk._consistent()
            fand32(&lk.b.ctl.flags, ~(<uint32_t>(SHM_F_OWNER_DIED | SHM_F_HANDON)))

    def waited(self, int64_t ns):
        """Count a task's wait that ended with the lock (statistics: contended)."""
        stats_waited(self.lk.b.ctl, ns)

    def timed_out(self):
        """Count a task's wait that gave up (statistics: timeouts)."""
        stats_timeout(self.lk.b.ctl)

    def record(self, uint64_t task_id, bytes label, uint32_t tasks):
        """What the record shows (inspect): the task the cohort acts for now (0: none),
        its name (UTF-8, cut to 40 bytes by the caller), and the tasks waiting behind."""
        if self.r == NULL or self.pid != getpid():
            return
        self._record(task_id, label, tasks)

    cdef void _record(self, uint64_t task_id, bytes label, uint32_t tasks) noexcept:
        # record() on the agent's own thread, in its own process, its slot held
        cdef shm_participant* p = &self.lk.rm.part[self.r.slot]
        cdef Py_ssize_t n = min(len(label), <Py_ssize_t>sizeof(p.label))
        st64_rlx(&p.task_id, task_id)
        memset(p.label, 0, sizeof(p.label))
        memcpy(p.label, <char*>label, n)
        st32_rel(&p.tasks, tasks)

    def count(self, uint32_t tasks):
        """The tasks waiting behind the cohort (the record's `tasks`)."""
        if self.r != NULL and self.pid == getpid():
            st32_rel(&self.lk.rm.part[self.r.slot].tasks, tasks)

    def link(self, bytes segment, uint32_t lock1, int64_t since):
        """The wait link (docs/design.md §9): the task this agent holds the lock for waits
        for lock lock1 (index + 1) of `segment` since `since`; lock1 0: it waits for
        nothing. Written seqlock-style (link_seq odd while written)."""
        cdef shm_participant* p
        cdef Py_ssize_t n = min(len(segment), <Py_ssize_t>sizeof(p.link_name) - 1)
        if self.r == NULL or self.pid != getpid():
            return
        p = &self.lk.rm.part[self.r.slot]
        fadd32(&p.link_seq, 1)                       # odd: being written
        st32_rlx(&p.link_lock, lock1)
        if lock1 != 0:
            st64_rlx(&p.link_since, <uint64_t>since)
            memset(p.link_name, 0, sizeof(p.link_name))
            memcpy(p.link_name, <char*>segment, n)
            # a task's link names no waiter's record (link_slot 0: the chain walk,
            # sys/shm_walk.h, takes its since and whether it detects from here)
            st32_rlx(&p.link_slot, 0)
            st64_rlx(&p.link_gen, 0)
            st32_rlx(&p.link_flags, SHM_LINK_DETECTS if g_dl_timeout_ns >= 0 else 0)
        fadd32(&p.link_seq, 1)                       # even: stable

    @property
    def poke(self):
        """The record's poke word now: what a walker that finds the task this agent holds
        for the victim of a cycle bumps and wakes (docs/design.md §9). Read before the
        task's links are written, and armed (arm_poke) after its walk."""
        self._mine()
        return ld32_acq(&self.lk.rm.part[self.r.slot].poke)

    cdef int _poke_set(self, uint32_t val) except -1:
        self._mine()
        self.pk.n = 0
        self.pk.token = -1
        self.pk.rec = NULL
        watch_word(&self.pk, &self.lk.rm.part[self.r.slot].poke, val)
        return 0

    def arm_poke(self, _Ring ring, uint64_t user_data, uint32_t val):
        """A FUTEX_WAITV on the record's poke word while it holds `val` (io_uring): it
        completes when a walker pokes the task this agent holds for. The agent holds (its
        mapping stays) until the task's wait ends, which cancels it (docs/design.md §14)."""
        cdef shm_waitv* v
        self._poke_set(val)
        v = <shm_waitv*>calloc(1, sizeof(shm_waitv))
        if v == NULL:
            raise MemoryError()
        shm_waitv_fill(&v[0], self.pk.words[0], self.pk.vals[0])
        ring._submit(v, 1, user_data)

    def arm_poke_thread(self, _Waiter waiter, uint64_t id, uint32_t val):
        """arm_poke for the fallback's waiter thread (AIO_MODE "thread")."""
        self._poke_set(val)
        waiter._add(&self.pk, id)

    def walk(self, uint64_t task_id, int64_t since):
        """The chain walk (docs/design.md §9) for task `task_id`, which waits for this
        agent's lock behind this cohort since `since` (CLOCK_MONOTONIC ns: the since its
        wait links carry) and holds locks through other cohorts whose links are written:
        (result, members, text), the result "none", "victim" (a confirmed cycle whose
        victim is this task: `text` describes it) or "other" (a confirmed cycle whose
        victim, another member, was poked; or nobody in it detects). C, without the GIL;
        reads only the segments on the chain."""
        cdef char* text = NULL
        cdef int members = 0
        cdef int r
        cdef rmap_t* rm
        cdef uint32_t slot, lock
        cdef int detects = g_dl_timeout_ns >= 0
        self._mine()
        rm = self.lk.rm
        slot = self.r.slot
        lock = self.lk._lock1 - 1
        with nogil:
            shm_fence_seq()                  # its links (and record) published, then walk
            r = dl_chain_walk(rm, slot, lock, task_id, since, detects, &text, &members)
        out = None
        if text != NULL:
            out = text.decode("utf-8", "replace")
            free(text)
        return ({DLW_NONE: "none", DLW_VICTIM: "victim", DLW_OTHER: "other"}[r], members, out)

    def key(self):
        """(pidns, pid, tid, tstart) of the agent's thread: with a task id, a task's node
        of the wait-for graph (shmlocks/waitgraph.py)."""
        cdef shm_participant* p = &self.lk.rm.part[self.r.slot]
        self._mine()
        return (ld64_rlx(&p.pidns), ld32_rlx(&p.pid), ld32_rlx(&p.tid), ld64_rlx(&p.tstart))

    def close(self):
        """Give the slot back (the agent holds nothing and waits for nothing). A closed
        agent is inert; from another thread or process than its own, nothing is done (its
        thread's end, or the process's, gives the slot back)."""
        if self.r == NULL:
            return
        if self.pid != getpid() or PyThread_get_thread_ident() != self.owner:
            return
        if self._active or ld32_acq(&self.lk.b.ctl.holder) == self.r.hid:
            raise RuntimeError("an asyncio agent that holds or waits cannot be closed")
        reg_release_agent(self.r)
        self.r = NULL

    def __dealloc__(self):
        # dropped without close(): the owner thread gives the slot back if it can (its
        # waits left as a withdrawal leaves them); elsewhere it is the thread's end's
        cdef int rc
        if self.r == NULL or self.pid != getpid() or self.lk is None:
            return
        if PyThread_get_thread_ident() != self.owner:
            return
        if self._active:
            nb_woken(&self.w)
            self.w.deadline = 0
            rc = self.lk._wait(self.r.slot, self.w.resume_rc, &self.w)
            self._active = 0
            if rc == R_ACQ or rc == R_ACQ_DIED:
                if rc == R_ACQ_DIED:
                    for32(&self.lk.b.ctl.flags, SHM_F_OWNER_DIED)
                self.lk._got_fast(self.r, R_ACQ, shm_crash_armed)
                try:
                    _nb_pass_on(self.lk, self.r)
                except BaseException:
                    pass
            else:
                shm_op_set(self.r.op, 0, 0)
        if ld32_acq(&self.lk.b.ctl.holder) != self.r.hid:
            reg_release_agent(self.r)
        self.r = NULL


cdef class _NbWait:
    """A resumable wait of the calling thread on one lock, driven step by step (not API:
    the tests', and the shape of the asyncio driver's steps; docs/design.md §5 "Resumable
    waits"). Made and used by one thread, as the thread's participant on the lock: while
    a wait is in progress that participant is mid-step on this lock, so the thread must not
    use another lock of the same region meanwhile (docs/design.md §4: one step at a time).

    ``begin(timeout=None)`` takes the lock's place (a FIFO kind's ticket or queue node, at
    once): True if the lock is held already, else False (a wait is in progress).
    ``poll()`` re-enters the wait: True once held (``owner_died`` as for acquire()), False
    where it would sleep (``watch``: [(address, value), ...], the words a sleep would watch,
    ``until``: the seconds after which to poll anyway, None: never), None if its timeout
    passed (the place left). ``withdraw()`` gives the wait up as a timeout does (the place
    left, or a grant that came meanwhile released at once, owner_died handed on): True if
    a grant was passed on, False otherwise."""
    cdef _Lock lk
    cdef reg_t* r
    cdef wait_t w
    cdef watch_t ws
    cdef watch_t pk                  # its poke word, watched for the task it holds for
    cdef int _active                 # 1 while a wait is in progress (a place taken)
    cdef int64_t t0
    cdef unsigned long owner

    def __cinit__(self):
        self.owner = PyThread_get_thread_ident()
        self._active = 0
        self.ws.n = 0

    def __init__(self, _Lock lock):
        if self._active:
            raise RuntimeError("a wait is in progress")
        self.lk = lock

    cdef int _mine(self) except -1:
        if PyThread_get_thread_ident() != self.owner:
            raise RuntimeError("a _NbWait is driven by the thread that made it")
        return 0

    def begin(self, timeout=None):
        """Take the lock's place: True (held now) or False (a wait is in progress)."""
        cdef _Lock lk = self.lk
        cdef int64_t deadline = _deadline_of(True, -1 if timeout is None else timeout)
        cdef reg_t* r
        cdef int rc
        self._mine()
        if self._active:
            raise RuntimeError("a wait is in progress already")
        r = lk._me_by(shm_now_ns() + NB_RECOVER_NS)  # (a registration's recoveries too)
        self.r = r
        rc = lk._take_fast(r, shm_crash_armed)
        if rc == 0:
            return True
        if rc == R_ACQ:
            return lk._got_flags(r, rc)
        if rc == R_ACQ_DIED or rc < 0:
            return lk._acquire_slow(r, rc, 0)        # held (owner_died), or raises
        if ld32_rlx(&lk.b.ctl.holder) == r.hid:
            shm_op_set(r.op, 0, 0)
            lk._raise_deadlock()
        nb_init(&self.w, &self.ws, deadline, rc)
        self.w.rm = lk.rm                            # hidden while a deadlock look runs
        self.t0 = shm_now_ns()
        shm_op_set(r.op, lk._lock1, SHM_OP_WAITING)  # "r waits for this lock"
        self._active = 1
        return False

    cdef object _end(self, int rc):
        """After a re-entry's rc: the wait goes on (False), is over (True, None), or raises."""
        cdef _Lock lk = self.lk
        cdef reg_t* r = self.r
        if rc == R_WOULDBLOCK:
            return False
        self._active = 0
        if rc == R_ACQ or rc == R_ACQ_DIED:
            stats_waited(lk.b.ctl, shm_now_ns() - self.t0)
            return lk._got(r, rc, shm_crash_armed)
        shm_op_set(r.op, 0, 0)
        if rc == R_TIMEOUT:
            stats_timeout(lk.b.ctl)
            return None
        if rc == R_SIGNAL:
            if PyErr_Occurred() != NULL:
                return _raise_pending()
            raise RuntimeError("a resumable wait ended by a signal with no exception set")
        _raise_code(lk, rc)

    def poll(self):
        """Re-enter the wait: True (held), False (see watch, until) or None (timed out)."""
        cdef int rc
        cdef _Lock lk = self.lk
        self._mine()
        if not self._active:
            raise RuntimeError("no wait in progress")
        with nogil:
            nb_woken(&self.w)
            rc = lk._wait(self.r.slot, self.w.resume_rc, &self.w)
        return self._end(rc)

    def withdraw(self):
        """Give the wait up (a re-entry with deadline 0: the kind's timeout path): True if
        a grant that came meanwhile was passed on, False if the place was left."""
        cdef int rc
        cdef _Lock lk = self.lk
        self._mine()
        if not self._active:
            return False
        with nogil:
            nb_woken(&self.w)
            self.w.deadline = 0
            rc = lk._wait(self.r.slot, self.w.resume_rc, &self.w)
        if rc == R_ACQ or rc == R_ACQ_DIED:
            self._active = 0
            if rc == R_ACQ_DIED:
                for32(&lk.b.ctl.flags, SHM_F_OWNER_DIED)
            lk._got_fast(self.r, R_ACQ, shm_crash_armed)
            _nb_pass_on(lk, self.r)
            return True
        rc = R_TIMEOUT if rc == R_WOULDBLOCK else rc
        self._end(rc)
        return False

    @property
    def active(self):
        """True while a wait is in progress (begun, not yet held, timed out or withdrawn)."""
        return bool(self._active)

    @property
    def watch(self):
        """The words the last would-be sleep watched: [(address, value), ...]."""
        cdef int i
        if not self._active:
            return []
        return [(<size_t>self.ws.words[i], self.ws.vals[i]) for i in range(self.ws.n)]

    @property
    def token(self):
        """The index in ``watch`` of the liveness token watched (-1: none)."""
        return self.ws.token if self._active else -1

    @property
    def until(self):
        """Seconds until the driver must poll anyway (None: only when a word changes)."""
        if not self._active or self.w.nb_until < 0:
            return None
        return max(0.0, (self.w.nb_until - shm_now_ns()) / 1e9)

    @property
    def resume_rc(self):
        return self.w.resume_rc

    def changed(self):
        """The indices in ``watch`` whose word no longer holds its value (a snapshot)."""
        cdef int i
        if not self._active:
            return []
        return [i for i in range(self.ws.n) if ld32_seq(self.ws.words[i]) != self.ws.vals[i]]

    def __dealloc__(self):
        # a wait never withdrawn: give the place up as withdraw() does (without raising)
        cdef int rc
        if not self._active or self.lk is None:
            return
        nb_woken(&self.w)
        self.w.deadline = 0
        rc = self.lk._wait(self.r.slot, self.w.resume_rc, &self.w)
        if rc == R_ACQ or rc == R_ACQ_DIED:
            if rc == R_ACQ_DIED:
                for32(&self.lk.b.ctl.flags, SHM_F_OWNER_DIED)
            self.lk._got_fast(self.r, R_ACQ, shm_crash_armed)
            try:
                _nb_pass_on(self.lk, self.r)
            except BaseException:
                pass
        else:
            shm_op_set(self.r.op, 0, 0)


cdef int _nb_pass_on(_Lock lk, reg_t* r) except -1:
    """Release a hold nobody will use (a withdrawn wait granted meanwhile) at once, handing
    owner_died on if it came with it (the next holder repairs: docs/design.md §6.4)."""
    cdef int rc
    if not ld32_acq(&lk.b.ctl.flags) & SHM_F_OWNER_DIED:
        rc = lk._unhold(r, shm_crash_armed)
    else:
        for32(&lk.b.ctl.flags, SHM_F_HANDON)
        shm_op_set(r.op, lk._lock1, SHM_OP_RELEASING)
        lk._consistent()
        st32_rlx(&lk.b.ctl.holder, 0)
        r.held -= 1
        rc = lk._unlock(r.slot, shm_crash_armed)
        shm_op_set(r.op, 0, 0)
    if rc < 0:
        _raise_code(lk, rc)
    return 0


# -- asyncio: the cohort's hot path (shmlocks/_aio.py; docs/design.md §14) ----------------
# A task's uncontended acquire_async()/async with, its release, and the hand-off from one
# task of a loop to the next (a cohort's release that takes the lock's place again, and
# the grant to the first waiting task) run here, without a frame of Python; everything
# else (waits, timeouts, cancellation, deadlocks, lockdep, a new loop or thread) is
# shmlocks/_aio.py's, which the fast path calls as soon as it meets anything but the
# plain case. _aio.py's _Cohort and _Entry are these classes' subclasses, so both sides
# see one state: the invariant is the module's docstring's.

cdef enum:
    CO_IDLE = 0
    CO_WAITING = 1
    CO_HOLDING = 2

cdef double CO_CUT_MIN_S = 0.005   # a cut recovery is polled again after this, doubling ...
cdef double CO_CUT_MAX_S = 0.2     # ... up to this (the loop thread's time is not the recovery's)
cdef object g_get_loop = None      # asyncio's _get_running_loop (None: no loop running)
cdef object g_cur_task = None      # the running loop -> its current task, or None
cdef object g_cancelled = None     # asyncio.CancelledError


cdef class _CohortEntry:
    """A task waiting behind its cohort (shmlocks/_aio.py _Entry)."""
    cdef public object fut
    cdef public object task
    cdef public int64_t t0
    cdef public object timer
    cdef public bint done

    def __init__(self, fut, task, int64_t t0):
        self.fut = fut
        self.task = task
        self.t0 = t0
        self.timer = None
        self.done = False


cdef class _CohortCore:
    """One lock's participant for the tasks of one event loop thread: the state and the
    hot path of shmlocks/_aio.py's _Cohort (its subclass, which has the rest)."""
    cdef public object d             # its _Driver (the loop thread's)
    cdef public object lock
    cdef public _Agent agent
    cdef public object q             # a deque of _Entry: the tasks waiting, in call order
    cdef public int nwait            # live entries in q
    cdef public object holder        # the task it holds the lock for, or None
    cdef public int state            # CO_IDLE, CO_WAITING (a place taken), CO_HOLDING
    cdef public uint64_t ud          # the sleep in flight (a ring's user_data, an arm id)
    cdef public object timer         # a poll due without a wake-up
    cdef public double backoff
    cdef public bint linked          # the record carries a wait link of its holder's
    cdef dict held                   # its driver's: a task -> the cohorts it holds through
    cdef dict waits                  # its driver's: a holding task -> the wait it makes
    cdef unsigned long ident         # its thread
    cdef unsigned long gen           # g_aio_gen when made
    cdef uint64_t shown_tid          # what the record shows: the task's id ...
    cdef int shown_n                 # ... and the tasks waiting (-1: nothing yet)
    cdef object ltask                # (a weak reference to) the task whose id and label
                                     # were looked up last
    cdef object lname                # its name then
    cdef uint64_t ltid
    cdef bytes llabel
    cdef object __weakref__

    def __init__(self, d, _Lock lock):
        self.d = d
        self.lock = lock
        self.agent = _Agent(lock, len(d.cohorts))
        self.q = _deque()
        self.nwait = 0
        self.holder = None
        self.state = CO_IDLE
        self.ud = 0
        self.timer = None
        self.backoff = 0.0
        self.linked = False
        self.held = d.held
        self.waits = d.waits
        self.ident = PyThread_get_thread_ident()
        self.gen = g_aio_gen
        self.shown_tid = 0
        self.shown_n = -1

    # -- the record (inspect; the wait-for graph) ---------------------------------------

    cpdef _show(self):
        """The record names the task the cohort acts for (its holder, else its first
        waiter) and counts the tasks waiting behind it."""
        cdef uint64_t tid = 0
        q = self.q
        while q and (<_CohortEntry>q[0]).done:
            q.popleft()
        task = self.holder
        if task is None and q:
            task = (<_CohortEntry>q[0]).task
        if task is not None:
            name = task.get_name()
            if self.ltask is None or self.ltask() is not task or name != self.lname:
                self.ltid = g_aio._task_id(task)
                self.llabel = g_aio._label(task)
                self.ltask = _weakref_ref(task)
                self.lname = name
            tid = self.ltid
        if tid == self.shown_tid and self.nwait == self.shown_n:
            return
        if self.agent.r == NULL or self.gen != g_aio_gen:
            return
        if tid != self.shown_tid:
            self.agent._record(tid, self.llabel if tid != 0 else b"", <uint32_t>self.nwait)
        else:
            st32_rel(&self.agent.lk.rm.part[self.agent.r.slot].tasks, <uint32_t>self.nwait)
        self.shown_tid = tid
        self.shown_n = self.nwait

    # -- taking a place, waiting, holding, releasing ----------------------------------------

    cpdef _sleep(self):
        """Hand the would-be sleep to the driver, and a timer if the wait must look
        again by a time (a deadline of the kind's, a recovery cut short: backed off)."""
        cdef _Agent a = self.agent
        cdef int64_t until = a.w.nb_until if a._active else -1
        cdef bint cut = a._active and a.w.rec.cut
        cdef double delay = 0.0
        d = self.d
        self.ud = d.arm(self)
        if until >= 0 or cut:
            if until >= 0:
                delay = max(0.0, (until - shm_now_ns()) / 1e9)
            if cut:
                self.backoff = min(CO_CUT_MAX_S, max(CO_CUT_MIN_S, self.backoff * 2))
                delay = max(delay, self.backoff)
            else:
                self.backoff = 0.0
            self.timer = d.loop.call_later(delay, self._due)
        else:
            self.backoff = 0.0

    cpdef woken(self, uint64_t ud):
        """The sleep `ud` ended (a word changed or was woken, a death): look again."""
        if ud != self.ud or self.state != CO_WAITING:
            return
        self.ud = 0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.poll()

    cpdef poll(self):
        """Re-enter the wait: held (the first task gets it), or asleep again."""
        g_aio.polls += 1
        try:
            got = self.agent._poll()
        except BaseException as e:
            # the wait ended without the lock (not recoverable, corrupt, a signal
            # handler's exception): the first task gets it; the others take a new place
            self.state = CO_IDLE
            if isinstance(e, Exception) and self._fail_first(e):
                self._again()
                return
            self._again()
            raise
        if got:
            self.state = CO_HOLDING
            self.grant()
        else:
            self._sleep()

    cpdef bint take(self) except -1:
        """Take the lock's place for the tasks that wait (IDLE only): True if the lock is
        held now (the caller hands it on), else the cohort waits (its sleep armed)."""
        cdef _Agent a = self.agent
        if a._take() or a._poll():         # (the first entry: held, or its watch set)
            self.state = CO_HOLDING
            return True
        self.state = CO_WAITING
        self._sleep()
        return False

    cpdef hold(self, task):
        """The lock taken for `task` (at once, or granted)."""
        cdef list hs
        self.holder = task
        hs = self.held.get(task)
        if hs is None:
            self.held[task] = [self]
        else:
            hs.append(self)
        self._show()

    cdef _unheld(self, task):
        cdef list hs = self.held.get(task)
        if hs is not None:
            if self in hs:
                hs.remove(self)
            if not hs:
                del self.held[task]
        if self.linked:
            self.linked = False
            self.agent.link(b"", 0, 0)

    cpdef grant(self):
        """The cohort holds the lock (HOLDING, no holder yet): the first task waiting gets
        it; with none left, it is passed on (owner_died handed on)."""
        cdef _CohortEntry e
        q = self.q
        while q:
            e = <_CohortEntry>q.popleft()
            if e.done:
                continue
            e.done = True
            self.nwait -= 1
            if e.timer is not None:
                e.timer.cancel()
            if e.fut.done():  # cancelled, its task not yet back to say so (_drop)
                if e.task in self.waits:
                    self.d.unlinked(e.task)
                continue
            stats_waited(self.agent.lk.b.ctl, shm_now_ns() - e.t0)
            if e.task in self.waits:
                self.d.unlinked(e.task)
            self.hold(e.task)
            e.fut.set_result(True)
            return
        self.state = CO_IDLE
        self.agent.pass_on()
        g_aio._count_passed_on()
        self._show()
        self.d.idle(self)

    cpdef release(self, bint handing_on=False):
        """The holding task's release: the lock goes back to the shared queue; the tasks
        waiting (if any) take a new place at once."""
        task = self.holder
        self.agent._release(handing_on)
        self.holder = None
        self.state = CO_IDLE
        if task is not None:
            self._unheld(task)
        if self.nwait > 0:
            try:
                if self.take():
                    self.grant()
                    return
            except Exception as e:
                self._fail_first(e)
                self._again()
                return
            self._show()
            return
        self._show()
        if self.agent.lk._closed or self.agent.lk.rm.closed:
            self.d.idle(self)

    def idle(self):
        return self.state == CO_IDLE and self.holder is None and self.nwait == 0


cdef inline _CohortCore _aio_last(_Lock lk):
    """The cohort the lock's tasks used last (a weak reference: a cohort lives as long as
    its driver keeps it, as without this cache), or None."""
    return None if lk._coh is None else <_CohortCore>lk._coh()


cdef _CohortCore _aio_cohort(_Lock lk, object loop):
    """The calling thread's cohort of lk, its driver bound to the running loop: the one the
    lock's tasks used last if it is that, else _aio.py's (made or bound there)."""
    cdef _CohortCore c = _aio_last(lk)
    if (c is None or c.ident != PyThread_get_thread_ident() or c.gen != g_aio_gen
            or c.agent.r == NULL or c.d.loop is not loop):
        c = <_CohortCore?>g_aio._driver().cohort(lk)
        lk._coh = _weakref_ref(c)
    return c


cdef object _aio_fast(_Lock lk, int64_t deadline, loop, task):
    """acquire_async's fast path (a blocking or timed acquire, run by the awaiting task):
    True when the task holds the lock now; a cohort whose place was taken, which the task
    waits behind (_aio_wait); None when _aio.py's acquire must decide (no task, a task
    of the loop holds or waits for the lock already, lockdep on). ``loop``, ``task``: the
    running loop and task (_aio_task), which a wait behind the cohort uses too."""
    cdef _CohortCore c
    if deadline == 0 or g_lockdep is not None or task is None:
        return None
    c = _aio_cohort(lk, loop)
    if c.holder is not None or c.state != CO_IDLE or c.nwait != 0:
        return None
    if c.take():
        c.hold(task)
        return True
    return c


cdef _CohortCore _aio_holding(_Lock lk):
    """The cohort through which the calling task holds lk, if the lock's tasks used it
    last (else None: _aio.py's _mine decides)."""
    cdef _CohortCore c = _aio_last(lk)
    if (c is None or c.holder is None or c.ident != PyThread_get_thread_ident()
            or c.gen != g_aio_gen or c.agent.r == NULL):
        return None
    loop = g_get_loop()
    if loop is None or c.holder is not g_cur_task(loop):
        return None
    return c


async def _aio_wait(_CohortCore c, task, int64_t deadline):
    """The task waits behind cohort c (its place in the lock's queue taken, or to be
    taken when the tasks ahead are served): True once it holds the lock (a grant), False
    at its deadline (c.expire). Cancelled, it leaves nothing: its entry is dropped (the
    place withdrawn with the last task), or a grant that came as it was cancelled is
    released at once, owner_died handed on (nobody saw it)."""
    cdef _CohortEntry e
    d = c.d
    loop = d.loop
    e = _CohortEntry(loop.create_future(), task, shm_now_ns())
    c.q.append(e)
    c.nwait += 1
    if deadline > 0:
        e.timer = loop.call_later(max(0.0, (deadline - e.t0) / 1e9), c.expire, e)
    if task in c.held:
        d.linked(task, c, e)
    c._show()
    try:
        return await e.fut
    except g_cancelled:
        fut = e.fut
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            if fut.result() and c.holder is task:
                # granted as it was cancelled: nobody saw the grant (nor its owner_died)
                c.release(c.agent.owner_died)
                g_aio._count_passed_on()
        elif not e.done:
            c._drop(e)
            c.agent.timed_out()  # (a wait given up: statistics count it as a timeout)
        raise
    finally:
        if not e.done:
            c._drop(e)


cdef inline object _aio_task(loop):
    """The task running on `loop` (None: no loop, or no task)."""
    return None if loop is None else g_cur_task(loop)


async def _aio_acquire(_Lock lk, int64_t deadline):
    loop = g_get_loop()
    task = _aio_task(loop)
    r = _aio_fast(lk, deadline, loop, task)
    if r is True:
        return True
    if r is None:
        return await g_aio.acquire(lk, deadline)
    return await _aio_wait(<_CohortCore>r, task, deadline)


async def _aio_enter(_Lock lk):
    loop = g_get_loop()
    task = _aio_task(loop)
    r = _aio_fast(lk, -1, loop, task)
    if r is None:
        await g_aio.acquire(lk, -1)
    elif r is not True:
        await _aio_wait(<_CohortCore>r, task, -1)
    return lk


async def _aio_exit(_Lock lk, t):
    cdef _CohortCore c = _aio_holding(lk)
    if c is None:
        return await g_aio.aexit(lk, t)
    c.release(t is not None and ld32_acq(&lk.b.ctl.flags) & SHM_F_OWNER_DIED != 0)
    return False


cdef object _lock_bind(type cls, object region, uint32_t index, object name):
    """The region's way to a lock object (kind_new_lock, base/kind.pxi)."""
    cdef _Lock lk = cls.__new__(cls)
    lk._bind(region, index, name)
    return lk


g_kind_bind = _lock_bind


def _open_standalone(cls, name):
    return cls.open(name)


def _open_in_region(region_name, lock_name):
    lk = Region.open(region_name).open_lock(lock_name)
    return lk


def _open_stripe(region_name, stripe):
    """A stripe of lock table `region_name`, unpickled: through a LockTable of its own."""
    return g_tb_api["table"](Region.open(region_name))[stripe]
