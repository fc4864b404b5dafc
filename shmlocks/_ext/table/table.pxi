# table.pxi -- sharded locks (docs/design.md §15): LockTable, the stable hash of its keys,
# and hold_all, the multi-acquire that cannot deadlock.
#
# Invariant (the table): a table of `size` stripes is one directory entry of kind
# SHM_KIND_TABLE whose header (word A of its body: shm_table) was written before the
# entry was READY and never changes; the region keeps a validated copy (rmap_t.tbl,
# participants.pxi table_load), and stripe s is lock number tbl.first + s, a full lock of
# the table's kind (lock_at). Its stripes share the table's repair mutex, and a compact
# stripe (futex, robust, pi) its line per participant (the table entry's precs).
#
# Invariant (the global order): every multi-acquire (hold, hold_all, their async forms)
# takes its locks in ascending (segment order key, segment inode, lock number): the order
# key is random and fixed at the segment's creation (header.order_key), the inode breaks a
# tie between two live segments, and the number orders the locks of one segment (a table's
# stripes by index). So any two multi-acquires whose sets overlap wait for each other in
# one direction only: no cycle, no deadlock. Two handles on one lock (table[i] and
# lock_for(k) -> i, a lock and its open() by name) have the same key: taken once.
# A multi-acquire that fails (its deadline, an exception, Ctrl-C) releases what it took,
# in reverse, before the exception leaves it; a lock taken with owner_died is handed on
# (its owner_died kept for the next holder, as a with block left by an exception does).
# Everything between two acquires runs in C (no bytecode boundary: a signal handler cannot
# run between an acquire that returned True and the record that it is held).

import math as _math


cdef uint64_t _int_hash(object key) except? 0:
    """An int that does not fit in 64 bits: its minimal two's-complement bytes, big endian."""
    k = int(key)
    data = k.to_bytes(((~k if k < 0 else k).bit_length() // 8) + 1, "big", signed=True)
    return shm_xxh64(<const char*>(<bytes>data), len(data), 0)


cdef int key_hash(object key, uint64_t* h, int depth) except -1:
    """The stable 64-bit hash of `key` (docs/design.md §15): XXH64 (seed 0) of its bytes,
    a str's UTF-8, a bytes' own, an int's minimal two's-complement big-endian bytes (0 is
    one zero byte; a bool is the int it equals, as a dict key is); a tuple's: XXH64 (seed
    SHM_HASH_TUPLE_SEED) of its elements' hashes, each 8 bytes little endian, in order.
    Anything else is TypeError."""
    cdef Py_ssize_t n, i
    cdef const char* p
    cdef long long v
    cdef int ovf = 0
    cdef int nb
    cdef unsigned char buf[9]
    cdef unsigned char small[8 * 16]
    cdef unsigned char* parts = small
    cdef uint64_t e
    cdef int j
    if PyUnicode_Check(key):
        p = PyUnicode_AsUTF8AndSize(key, &n)       # UnicodeEncodeError: a lone surrogate
        h[0] = shm_xxh64(p, <size_t>n, 0)
        return 0
    if PyBytes_Check(key):
        h[0] = shm_xxh64(PyBytes_AS_STRING(key), <size_t>PyBytes_GET_SIZE(key), 0)
        return 0
    if PyLong_Check(key):
        v = PyLong_AsLongLongAndOverflow(key, &ovf)
        if ovf == 0:
            nb = shm_int_bytes(v, buf)
            h[0] = shm_xxh64(&buf[9 - nb], <size_t>nb, 0)
        else:
            h[0] = _int_hash(key)
        return 0
    if PyTuple_Check(key):
        if depth >= 32:
            raise ValueError("a key tuple nested more than 32 deep")
        n = PyTuple_GET_SIZE(key)
        big = None
        if n > 16:
            big = bytearray(8 * n)
            parts = <unsigned char*>(<char*>big)
        for i in range(n):
            key_hash((<tuple>key)[i], &e, depth + 1)
            for j in range(8):
                parts[8 * i + j] = <unsigned char>((e >> (8 * j)) & 0xff)
        h[0] = shm_xxh64(parts, <size_t>(8 * n), SHM_HASH_TUPLE_SEED)
        return 0
    raise TypeError(f"a lock table's key must be a str, bytes, int or a tuple of them, not "
                    f"{type(key).__name__}")


class _SizeTypeError(TypeError, ValueError):
    """A table size that is not an int: a TypeError, as Python's own, and a ValueError,
    as the contract says of any size that is not an int >= 1."""


cdef uint32_t _check_size(size) except 0:
    if isinstance(size, bool) or not isinstance(size, int):
        raise _SizeTypeError(f"size must be an int, not {type(size).__name__}")
    if size < 1 or size > SHM_TABLE_MAX:
        raise ValueError(f"size must be between 1 and {SHM_TABLE_MAX}, not {size}")
    return size


def stable_hash(key):
    """stable_hash(key) -> int

    The 64-bit hash LockTable.index_of is built on: the same in every process, on every
    run, Python version and machine (never ``hash()``, which is randomized per process for
    str and bytes). XXH64, seed 0, of the key's bytes: a str's UTF-8, a bytes' own, an
    int's minimal two's-complement big-endian bytes (a bool is the int it equals); a
    tuple's elements' hashes, 8 bytes each little endian, with seed 0x5455504C45."""
    cdef uint64_t h
    key_hash(key, &h, 0)
    return h


def index_of(key, size):
    """index_of(key, size) -> int

    The stripe of ``key`` in a table of ``size`` stripes, as LockTable.index_of gives it:
    Lemire's multiply-shift of stable_hash(key), ``(h * size) >> 64``."""
    cdef uint64_t h
    cdef uint32_t n = _check_size(size)
    key_hash(key, &h, 0)
    return shm_hash_index(h, n)


cdef int64_t _hold_deadline(timeout) except -2:
    """-1 (wait forever: None) or the absolute CLOCK_MONOTONIC deadline in ns."""
    cdef double t
    if timeout is None:
        return -1
    if isinstance(timeout, (str, bytes, bool)) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number or None, not {type(timeout).__name__}")
    t = timeout
    if t != t or t < 0:
        raise ValueError("timeout must be None or a non-negative number")
    if _math.isinf(t) or t >= _FOREVER_S:
        return -1
    return shm_now_ns() + <int64_t>(t * 1e9)


def _order_key(_Lock lk):
    """A lock's place in the global order (docs/design.md §15): (its segment's order key,
    the segment's inode, its number). Two handles on one lock have the same."""
    lk._check()
    return (lk.rm.order_key, lk.rm.ino, lk._lock1)


def _plan(locks):
    """(the distinct locks in the global order, for each the positions in `locks` it
    stands for). TypeError for anything but a shmlocks lock, ValueError for a closed one."""
    keyed = {}
    for pos, lk in enumerate(locks):
        if not isinstance(lk, _Lock):
            raise TypeError(f"hold_all takes shmlocks locks, not {type(lk).__name__}")
        k = _order_key(lk)
        if k in keyed:
            keyed[k][1].append(pos)
        else:
            keyed[k] = (lk, [pos])
    plan = [keyed[k] for k in sorted(keyed)]
    return [p[0] for p in plan], [p[1] for p in plan]


cdef class Held:
    """What hold() and hold_all() return: a context manager that takes its locks at
    ``__enter__`` (in the global order, each distinct lock once, all or nothing by the
    deadline) and releases them at ``__exit__``.

    ``owner_died``: a lock taken had a dead owner; ``died``: which (hold: stripe indices,
    hold_all: positions in the arguments); ``mark_consistent()`` declares them all
    repaired. ``locks``: the distinct locks, in the order taken."""

    def __init__(self, *args, **kwargs):
        raise TypeError("use LockTable.hold(...) or shmlocks.hold_all(...)")

    cdef int _take(self) except -1:
        cdef int64_t deadline = _hold_deadline(self._timeout)
        cdef int64_t left
        cdef _Lock lk
        cdef Py_ssize_t i
        if self._taken:
            raise RuntimeError("this hold is held already: leave its with block first")
        self._died = []
        try:
            for i in range(len(self._locks)):
                lk = self._locks[i]
                if deadline < 0:
                    ok = lk.acquire()
                else:
                    left = deadline - shm_now_ns()
                    ok = lk.acquire(True, left / 1e9 if left > 0 else 0)
                if not ok:
                    raise TimeoutError(f"hold: {len(self._taken)} of {len(self._locks)} "
                                       f"locks taken by the deadline ({self._timeout} s); "
                                       "released again")
                self._taken.append(lk)                 # (no bytecode in between)
                if ld32_acq(&lk.b.ctl.flags) & SHM_F_OWNER_DIED:
                    self._died.append(i)
                crashpoint("hold.took")
        except BaseException as e:
            self._let_go(type(e), e, e.__traceback__)
            raise
        return 0

    cdef int _let_go(self, t, v, tb) except -1:
        """Release what is held, last taken first, each as its with block's exit would
        (an exception with owner_died still set hands it on); every one is released even
        if one raises, and the first error is raised after."""
        cdef _Lock lk
        first = None
        while self._taken:
            lk = self._taken.pop()
            try:
                lk.__exit__(t, v, tb)
            except BaseException as e:
                if first is None:
                    first = e
        if first is not None:
            raise first
        return 0

    def __enter__(self):
        self._take()
        return self

    def __exit__(self, t, v, tb):
        self._let_go(t, v, tb)
        return False

    async def __aenter__(self):
        from shmlocks import _holdasync
        await _holdasync.take(self, self._locks, self._taken, self._died, self._timeout)
        return self

    async def __aexit__(self, t, v, tb):
        from shmlocks import _holdasync
        await _holdasync.let_go(self._taken, t, v, tb)
        return False

    @property
    def locks(self):
        """The distinct locks of this hold, in the global order."""
        return list(self._locks)

    @property
    def owner_died(self):
        """True if a lock taken had a dead owner (repair, then mark_consistent())."""
        return bool(self._died)

    @property
    def died(self):
        """Whose owner had died: a table's stripe indices (hold), or the positions in the
        arguments (hold_all; a lock given twice: both)."""
        out = []
        for i in self._died:
            w = self._where[i]
            if self._stripes:
                out.append(w)
            else:
                out.extend(w)
        return sorted(out)

    def mark_consistent(self):
        """mark_consistent() on every lock taken whose owner had died."""
        cdef _Lock lk
        for i in self._died:
            lk = self._locks[i]
            lk.mark_consistent()

    def __repr__(self):
        return (f"<shmlocks.Held {len(self._locks)} locks, "
                f"{'held' if self._taken else 'not held'}>")


cdef Held _held(list locks, list where, timeout, bint stripes):
    cdef Held h = Held.__new__(Held)
    h._locks = locks
    h._where = where
    h._taken = []
    h._died = []
    h._timeout = timeout
    h._stripes = stripes
    _hold_deadline(timeout)                   # its argument errors now, not at __enter__
    return h


def hold_all(*locks, timeout=None):
    """hold_all(*locks, timeout=None) -> Held

    ``with hold_all(a, b, c) as held:`` takes every lock given (any kinds, any segments,
    stripes of tables too) in one global order, each distinct lock once, so that any two
    holds whose sets overlap can never deadlock; releases them at the end of the block.
    All or nothing: ``TimeoutError`` at the deadline (``timeout`` seconds; None waits for
    ever), and on it, Ctrl-C or any exception nothing stays held. ``held.died``: the
    positions in ``locks`` whose owner had died. ``async with`` works too
    (hold_all_async)."""
    order, where = _plan(locks)
    return _held(order, where, timeout, False)


def hold_all_async(*locks, timeout=None):
    """``async with hold_all_async(*locks, timeout=None) as held:``: hold_all for a task
    (acquire_async for each lock, in the global order); a cancellation leaves nothing
    held."""
    return hold_all(*locks, timeout=timeout)


def _hold_took():
    """The crash point between two acquires of a multi-acquire (shmlocks/_holdasync.py)."""
    crashpoint("hold.took")


def _make_table(region):
    """The LockTable of a region that holds one (Region._lock_at, unpickled stripes)."""
    cdef LockTable t = LockTable.__new__(LockTable)
    t._attach(region)
    return t


g_tb_api["table"] = _make_table


cdef class LockTable:
    """``size`` locks ("stripes") of one kind in one segment, chosen by key.

    ``table = LockTable(size=64, kind="futex")``; ``with table.lock_for(key): ...`` takes
    the stripe of ``key`` (a str, bytes, int or tuple of them; index_of: a stable hash, the
    same in every process); ``table[i]`` is stripe i, a lock with the whole lock API;
    ``with table.hold(k1, k2, ...):`` takes every distinct stripe of the keys in index
    order (no deadlock between two holds). Pickles, closes and unlinks as a lock does."""

    def __init__(self, size=64, kind="futex", *, name=None, mode=0o600, persist=False,
                 max_participants=None):
        cdef uint32_t n = _check_size(size)
        cdef uint32_t code = kind_code_of(kind)
        region = Region._create(name, 1, max_participants, mode, persist, 0, None,
                                (code, n))
        self._attach(region)

    def _attach(self, region):
        cdef Region reg = region
        if reg.rm.tbl.size == 0:
            raise LockKindError(f"{reg.name!r} is not a lock table")
        self._region = reg
        self.rm = reg.rm
        self._size = reg.rm.tbl.size
        self._sub = reg.rm.tbl.sub
        self._stripes = [None] * self._size
        self._closed = False

    @classmethod
    def create(cls, size=64, kind="futex", *, name=None, mode=0o600, persist=False,
               max_participants=None):
        """A new table (as the constructor). FileExistsError if ``name`` is taken."""
        return cls(size, kind, name=name, mode=mode, persist=persist,
                   max_participants=max_participants)

    @classmethod
    def open(cls, name):
        """Attach to table ``name`` from any process. LockKindError if the segment is not
        a lock table."""
        region = Region.open(name)
        try:
            return _make_table(region)
        except BaseException:
            region.close()
            raise

    @classmethod
    def open_or_create(cls, name, size=64, kind="futex", *, mode=0o600, persist=False,
                       max_participants=None):
        """Open table ``name``, or create it with these arguments: atomic, as a lock's
        open_or_create. The arguments do not apply to a table that exists already."""
        n = _check_name(name)
        _check_size(size)
        kind_code_of(kind)
        deadline = _time.monotonic() + 5.0
        while True:
            try:
                return cls(size, kind, name=n, mode=mode, persist=persist,
                           max_participants=max_participants)
            except FileExistsError:
                pass
            try:
                return cls.open(n)
            except FileNotFoundError:
                if _time.monotonic() > deadline:
                    raise

    cdef int _check(self) except -1:
        if self._closed or self.rm.closed:
            raise ValueError(f"lock table {self._region.name!r} is closed")
        return 0

    cdef object _stripe(self, uint32_t s):
        lk = self._stripes[s]
        if lk is None:
            self._check()
            lk = (<Region>self._region)._lock_at(self.rm.tbl.first + s)
            self._stripes[s] = lk
        return lk

    @property
    def size(self):
        return self._size

    @property
    def kind(self):
        """The stripes' kind (a key of shmlocks.KINDS)."""
        for cls in _KIND_CLASSES:
            if cls.kind_code == self._sub:
                return cls.kind_name
        return None

    @property
    def name(self):
        return self._region.name

    @property
    def region(self):
        return self._region

    @property
    def closed(self):
        return self._closed or self.rm.closed

    def __len__(self):
        return self._size

    def index_of(self, key):
        """index_of(key) -> int

        The stripe of ``key``: the same in every process, on every run, Python version and
        machine (shmlocks.stable_hash: XXH64 of the key's bytes; then ``(h * size) >> 64``).
        key: a str (its UTF-8), bytes, an int (its minimal two's-complement big-endian
        bytes; a bool is the int it equals) or a tuple of them; anything else TypeError."""
        cdef uint64_t h
        self._check()
        key_hash(key, &h, 0)
        return shm_hash_index(h, self._size)

    def lock_for(self, key):
        """lock_for(key) -> Lock: the stripe of ``key`` (self[self.index_of(key)])."""
        cdef uint64_t h
        cdef uint32_t s
        self._check()
        key_hash(key, &h, 0)
        s = shm_hash_index(h, self._size)
        lk = self._stripes[s]
        if lk is None:
            return self._stripe(s)
        return lk

    def __getitem__(self, i):
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"a lock table's index must be an int, not {type(i).__name__}")
        if not 0 <= i < self._size:
            raise IndexError(f"stripe {i} out of range (the table has {self._size})")
        self._check()
        return self._stripe(i)

    def __iter__(self):
        cdef uint32_t s
        self._check()
        for s in range(self._size):
            yield self._stripe(s)

    def hold(self, *keys, timeout=None):
        """hold(*keys, timeout=None) -> Held

        ``with table.hold(k1, k2) as held:`` takes every distinct stripe of the keys, in
        index order (the global order: two holds never deadlock), all or nothing by the
        deadline (TimeoutError; nothing stays held on it, Ctrl-C or any exception).
        ``held.died``: the stripes whose owner had died. ``async with`` works too."""
        cdef uint64_t h
        cdef set idx = set()
        self._check()
        for k in keys:
            key_hash(k, &h, 0)
            idx.add(shm_hash_index(h, self._size))
        order = sorted(idx)
        return _held([self._stripe(s) for s in order], order, timeout, True)

    def hold_async(self, *keys, timeout=None):
        """``async with table.hold_async(*keys, timeout=None) as held:`` hold() for a task:
        a cancellation leaves nothing held."""
        return self.hold(*keys, timeout=timeout)

    def stats(self, hottest=10):
        """The stripes' statistics summed (the keys of a lock's stats(); ``wait_max_s`` the
        largest), and ``"hottest"``: the ``hottest`` busiest stripes as (index,
        acquisitions), busiest first (stripes never taken left out)."""
        cdef uint32_t s
        cdef shm_body b
        self._check()
        tot = {"acquisitions": 0, "contended": 0, "wait_total_s": 0.0, "wait_max_s": 0.0,
               "timeouts": 0, "owner_deaths": 0, "handoffs": 0}
        acq = []
        for s in range(self._size):
            b = table_stripe(self.rm, s)
            st = stats_read(b.ctl)
            for k in tot:
                if k == "wait_max_s":
                    tot[k] = max(tot[k], st[k])
                else:
                    tot[k] += st[k]
            if st["acquisitions"]:
                acq.append((st["acquisitions"], s))
        acq.sort(key=lambda x: (-x[0], x[1]))
        tot["hottest"] = [(s, a) for a, s in acq[:hottest]]
        tot["size"] = self._size
        return tot

    def reset_stats(self):
        """Zero every stripe's statistics."""
        cdef uint32_t s
        cdef shm_body b
        self._check()
        for s in range(self._size):
            b = table_stripe(self.rm, s)
            stats_reset(b.ctl)

    def _describe(self, hottest=5):
        """The table as inspect shows it (one entry): its stripes that are held, waited
        for or flagged (each as a lock's _describe(), with its index), and the hottest."""
        cdef uint32_t s, x, n
        cdef shm_body b
        cdef set named = set()
        self._check()
        for x in range(rmap_hwm(self.rm)):
            n = ld32_acq(&self.rm.part[x].op_lock)
            if n > self.rm.tbl.first and n - 1 - self.rm.tbl.first < self._size:
                named.add(n - 1 - self.rm.tbl.first)
        stripes = []
        for s in range(self._size):
            b = table_stripe(self.rm, s)
            if s not in named and stripe_untouched(&b):
                continue                     # every word zero, no step: free, untouched
            d = self._stripe(s)._describe()
            if d["locked"] or d["waiters"] or d["owner_died"] or d["not_recoverable"]:
                d["index"] = s
                stripes.append(d)
        st = self.stats(hottest)
        return {"name": "table", "kind": "table", "stripe_kind": self.kind,
                "size": self._size,
                "locked": any(d["locked"] for d in stripes), "holder": None,
                "waiters": sum(d["waiters"] for d in stripes),
                "owner_died": any(d["owner_died"] for d in stripes),
                "not_recoverable": any(d["not_recoverable"] for d in stripes),
                "stale_step": False, "held": sum(1 for d in stripes if d["locked"]),
                "stripes": stripes, "hottest": st["hottest"]}

    def close(self):
        """Detach: close the table's segment in this process (its stripe objects too)."""
        if not self._closed:
            self._closed = True
            self._region.close()
            for lk in self._stripes:     # each stripe's idle asyncio cohorts leave too, as
                if lk is not None:       # at a lock's close (docs/design.md §14)
                    lk.close()

    def unlink(self):
        """Remove the table's name now; mapped views go on working (ValueError once
        closed)."""
        self._check()
        self._region.unlink()

    def __enter__(self):
        self._check()
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        self._check()
        return (_open_table, (self._region.name,))

    def __repr__(self):
        st = "closed" if self.closed else f"{self._size} {self.kind} stripes"
        return f"<shmlocks.LockTable {self._region.name!r} ({st})>"


def _open_table(name):
    return LockTable.open(name)
