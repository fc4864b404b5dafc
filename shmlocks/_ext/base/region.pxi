# region.pxi -- the segment (docs/design.md §2): create, open and validate, the lock
# directory, lifetime. One POSIX shared-memory object per region, laid out as shm_layout.h.
#
# Creation race: the creator builds everything while header.state == BUILDING, then
# publishes READY with a release store, and only then gives the file its name (below:
# the name's lifetime); open() still waits (bounded) for READY, for a segment built
# under its name where O_TMPFILE is missing, and validates
# magic, version, line size, the geometry and every offset against the file size before
# any other use. The validated geometry is copied into the process-local rmap_t and never
# read from the segment again, so a scribbled header cannot steer an index out of bounds.

import time as _time
import atexit as _atexit
import stat as _stat
import sys as _sys
import fcntl as _fcntl

OPEN_READY_TIMEOUT = 2.0


cdef uint64_t _geometry(uint32_t L, uint32_t P, uint64_t* dir_off, uint64_t* part_off,
                        uint64_t* locks_off, uint64_t* stride) noexcept nogil:
    dir_off[0] = sizeof(shm_header)
    part_off[0] = dir_off[0] + <uint64_t>L * sizeof(shm_dirent)
    locks_off[0] = part_off[0] + <uint64_t>P * sizeof(shm_participant)
    stride[0] = shm_body_lines(P) * SHM_LINE
    return locks_off[0] + <uint64_t>L * stride[0]


SHM_DIR = "/dev/shm"  # where glibc's shm_open() puts POSIX shared memory: its one spelling
_SHM_DIR = SHM_DIR + "/"


def _check_name(name):
    """Validate a segment name; returns it without a leading slash. A name is text that
    encodes to UTF-8 (no lone surrogate): what is created is what close() unlinks."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    n = name[1:] if name.startswith("/") else name
    if not n or "/" in n or "\x00" in n or n in (".", ".."):
        raise ValueError(f"invalid segment name {name!r}: it must be non-empty and contain "
                         "no '/' (except one leading) and no NUL")
    try:
        b = n.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"invalid segment name {name!r}: it must be valid text "
                         "(a lone surrogate does not encode to UTF-8)") from None
    if len(b) > 200:
        raise ValueError("segment name too long (at most 200 bytes)")
    return n


def _os_error(int err, path):
    raise OSError(err, _os.strerror(err), _os.fsdecode(path))


def _unlink_quietly(n):
    try:
        _os.unlink(_SHM_DIR + n)
    except OSError:
        pass


def _check_create_args(max_locks, max_participants, mode):
    """The creation arguments, checked; returns the participant cap (None: the most a
    region can have, SHM_MAX_PARTICIPANTS: participants are provisioned as they come,
    docs/design.md §2)."""
    _check_count(max_locks, "max_locks", SHM_MAX_LOCKS)
    if max_participants is None:
        max_participants = SHM_MAX_PARTICIPANTS
    _check_count(max_participants, "max_participants", SHM_MAX_PARTICIPANTS)
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ValueError("mode must be an int permission mask like 0o600")
    return max_participants


def _gen_name():
    return f"shmlocks-{_os.getpid()}-{_os.urandom(6).hex()}"


cdef _check_count(value, what, uint32_t hi):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int" + (" or None" if what == "max_participants"
                                                    else ""))
    if value < 1 or value > hi:
        raise ValueError(f"{what} must be between 1 and {hi}, not {value}")
    return value


cdef int _provision_body(rmap_t* rm, uint32_t i, uint32_t code, what,
                         bint fresh) except -1:
    """Lock body i, of kind `code`, being made (_provision_body_at)."""
    return _provision_body_at(rm, rm.locks_off + <uint64_t>i * rm.stride, code, what, fresh)


cdef int _provision_body_at(rmap_t* rm, uint64_t off, uint32_t code, what,
                            bint fresh) except -1:
    """The lock body at `off`, of kind `code`, being made (the directory mutex held, so
    part_hwm is stable): its fixed lines (ctl, words A and B, the node lines its kind uses
    by index: kind_ops_t.fixed_nodes) with the nodes of the participants provisioned, then
    the lock's own node P with their precs (two runs of lines, each one reservation), given
    pages (a full /dev/shm: OSError(ENOSPC)) and zeroed unless `fresh` (a region still
    being built: a new file, zero already); the rest of the body stays a hole."""
    cdef uint32_t h = rmap_hwm(rm)
    cdef kind_ops_t* ops = kind_ops(code)
    cdef uint32_t nf = shm_fixed_nodes(ops.fixed_nodes if ops != NULL else SHM_TICKET_SLOTS,
                                       rm.P)
    cdef uint64_t a_end = (SHM_BODY_NODES + <uint64_t>(nf if nf > h else h)) * SHM_LINE
    cdef uint64_t b_start = (SHM_BODY_NODES + <uint64_t>rm.P) * SHM_LINE
    cdef uint64_t b_end = b_start + (1 + <uint64_t>h) * SHM_LINE
    if a_end >= b_start:                         # a small cap: one run
        a_end = b_end
        b_start = b_end
    lines_provision(rm, off, a_end, what, fresh)
    lines_provision(rm, off + b_start, b_end - b_start, what, fresh)
    return 0


cdef uint64_t _table_lines(uint32_t size) noexcept nogil:
    """The lines of a table's stripes (the extension area): SHM_STRIPE_LINES each, for
    every kind (docs/design.md §15)."""
    return <uint64_t>size * SHM_STRIPE_LINES


cdef int _table_build(rmap_t* rm, uint32_t i, uint32_t sub, uint32_t size, what,
                      bint fresh) except -1:
    """Entry i becomes a lock table of `size` stripes of kind `sub` (the directory mutex
    held, the region being built: docs/design.md §15). Its own body: the ctl line (kind,
    the table's repair mutex), the header in word A, and the precs of the participants
    provisioned (a compact stripe's line per participant, table-wide); then the stripes,
    in the extension area, each initialised as a lock of its kind (without a repair mutex
    of its own: the table's serves them all)."""
    cdef uint64_t off = rm.locks_off + <uint64_t>i * rm.stride
    cdef uint32_t h = rmap_hwm(rm)
    cdef kind_ops_t* ops = kind_ops(sub)
    cdef shm_body tb, sb
    cdef shm_table* t
    cdef uint32_t s
    if ops == NULL or sub > SHM_KIND_PI:
        raise ValueError(f"a lock table's kind must be a lock kind, not code {sub}")
    lines_provision(rm, off, SHM_BODY_NODES * SHM_LINE, what, fresh)
    lines_provision(rm, off + (SHM_BODY_NODES + <uint64_t>rm.P + 1) * SHM_LINE,
                    <uint64_t>h * SHM_LINE, what, fresh)
    if sub == SHM_KIND_MCS or sub == SHM_KIND_CLH:
        # a node per participant for the table (mcsc.pxi: its wait node; clhc.pxi: its
        # node in the pool that travels between the participants and the stripes)
        lines_provision(rm, off + SHM_BODY_NODES * SHM_LINE, <uint64_t>h * SHM_LINE, what,
                        fresh)
    tb = shm_body_at(rm.base, off, rm.P, i)
    tb.ctl.kind = SHM_KIND_TABLE
    _robust_mutex_init(&tb.ctl.repair.m, 0)
    t = <shm_table*>tb.wa
    t.sub = sub
    t.size = size
    t.first = rm.L
    t.compact = 1
    t.off = rm.ext_off
    t.stride = SHM_STRIPE_LINES * SHM_LINE
    lines_provision(rm, t.off, <uint64_t>size * t.stride, what, fresh)
    for s in range(size):
        sb = shm_stripe_at(rm.base, t, &tb, s)
        sb.ctl.kind = sub
        if ops.stripe_init != NULL:
            ops.stripe_init(&sb)                 # a stripe protocol of its own (clhc.pxi)
        elif ops.init != NULL:
            ops.init(&sb)
        sb.ctl.magic = SHM_BODY_MAGIC
    tb.ctl.magic = SHM_BODY_MAGIC
    return 0


cdef void _init_body(shm_body* b, uint32_t code) noexcept nogil:
    """A new lock body of kind `code` (the caller zeroed it): ctl, the repair mutex, then
    the kind's own words (its init)."""
    cdef kind_ops_t* ops = kind_ops(code)
    b.ctl.kind = code
    _robust_mutex_init(&b.ctl.repair.m, 0)
    if ops != NULL and ops.init != NULL:
        ops.init(b)
    b.ctl.magic = SHM_BODY_MAGIC


# -- the name's lifetime (docs/design.md §2) --------------------------------------------
# Every view (a Region object's mapping) keeps the segment's file open, with flock(LOCK_SH)
# on its own open file description, for as long as it is mapped: the kernel drops that
# lock when the process dies, whatever kills it. The view that leaves last (its unmap, or
# its process's end) gets flock(LOCK_EX | LOCK_NB) and unlinks the name if the name still
# names that file and the segment is not persist (rmap_leave_name, participants.pxi). An
# opener takes its lock first, then checks that the name still names the file it opened
# (if not, the last user left meanwhile: it tries again). A creator builds the segment
# unnamed (O_TMPFILE) and links the name last (linkat fails if the name exists), so nobody
# sees it half-built. A segment whose last user died (a name left behind, a file nobody
# holds) is treated as gone: the next open or create of the name unlinks it.

def _leave_names_at_exit():
    with nogil:
        rmap_leave_all_names()


_atexit.register(_leave_names_at_exit)

# multiprocessing's children (Process, Pool workers) end with os._exit, which skips atexit,
# after running multiprocessing.util's finalizers: one finalizer per process leaves the
# names there. Registered once multiprocessing is in use (it is not imported for this).
_mp_hooked_pid = 0


class _MpAnchor:
    pass


_MP_ANCHOR = _MpAnchor()


def _hook_multiprocessing():
    global _mp_hooked_pid
    util = _sys.modules.get("multiprocessing.util")
    if util is None or _mp_hooked_pid == _os.getpid():
        return
    _mp_hooked_pid = _os.getpid()
    util.Finalize(None, _leave_names_at_exit, exitpriority=-100)
    # a child's registry of finalizers is emptied at its start: register there again
    util.register_after_fork(_MP_ANCHOR, _mp_after_fork)


def _hook_exit():
    """Before this process makes a view: its ends that skip atexit leave the names too."""
    _hook_multiprocessing()
    with nogil:
        _sigterm_leaves_names()


cdef void _sigterm_leave(int sig) noexcept nogil:
    """SIGTERM with its default action otherwise (Pool.terminate() ends every worker so, a
    service manager its services): leave the names as at a normal end, then die of the
    signal as before. If a section of the views' bookkeeping runs (participants.pxi,
    g_lc_busy), in this thread or another, the last thread out of it does so instead."""
    st32_seq(&g_lc_pending, <uint32_t>sig)
    if ld32_seq(&g_lc_busy) == 0:
        lc_end()


cdef void _sigterm_leaves_names() noexcept nogil:
    """Install _sigterm_leave where SIGTERM still has its default action (a handler of the
    program's, Python's included, is left alone). SA_RESTART: a deferred signal (see
    lc_end) does not fail the interrupted call with EINTR."""
    cdef c_sigaction old, act
    if c_sigaction_call(SIGTERM, NULL, &old) != 0 or old.sa_handler != SIG_DFL:
        return
    memset(&act, 0, sizeof(act))
    act.sa_handler = _sigterm_leave
    act.sa_flags = SA_RESTART
    sigemptyset(&act.sa_mask)
    c_sigaction_call(SIGTERM, &act, NULL)


def _mp_after_fork(anchor):
    global _mp_hooked_pid
    _mp_hooked_pid = 0
    _hook_multiprocessing()


_os.register_at_fork(before=_hook_multiprocessing)


cdef bint _names_file(path, int fd) except -1:
    """Does `path` name the file open as fd (not another one, nor nothing)?"""
    st = _os.fstat(fd)
    try:
        ps = _os.lstat(path)
    except FileNotFoundError:
        return False
    return st.st_ino == ps.st_ino and st.st_dev == ps.st_dev


cdef bint _is_orphan(int fd) except -1:
    """A finished, valid segment of our layout, not persist (we hold LOCK_EX: nobody else
    has it open): its last user died. Anything else (a corrupt or truncated file
    included) is left to open's checks, which report it."""
    cdef shm_header h
    data = _os.pread(fd, sizeof(shm_header), 0)
    if len(data) != sizeof(shm_header):
        return False
    memcpy(&h, <const char*>data, sizeof(shm_header))
    if (h.state != SHM_STATE_READY or h.flags & SHM_HDR_PERSIST):
        return False
    try:
        _validate(<char*>&h, _os.fstat(fd).st_size, "")   # reads the header only
    except CorruptRegionError:
        return False
    return True


cdef int _hold_name(int fd, n, double deadline) except -1:
    """Take flock(LOCK_SH) on segment n's file (open as fd) for this view. Returns 0 when
    held and the name still names the file, 1 if the name moved meanwhile (the caller
    retries), 2 if the file was an orphan (its last user died): its name is now unlinked."""
    path = _SHM_DIR + n
    while True:
        try:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
            alone = True
            break
        except BlockingIOError:
            pass
        try:
            _fcntl.flock(fd, _fcntl.LOCK_SH | _fcntl.LOCK_NB)
            alone = False
            break
        except BlockingIOError:
            pass
        if _time.monotonic() > deadline:          # only a hostile holder keeps LOCK_EX
            raise TimeoutError(f"segment {n!r} stays locked (flock LOCK_EX) by another process")
        _time.sleep(0.0005)
    try:
        if not _names_file(path, fd):
            _fcntl.flock(fd, _fcntl.LOCK_UN)
            return 1
        if alone:
            if _is_orphan(fd):
                try:
                    _os.unlink(path)
                except PermissionError:       # another user's, in sticky /dev/shm: it
                    pass                      # stays, but counts as gone all the same
                _fcntl.flock(fd, _fcntl.LOCK_UN)
                return 2
            _fcntl.flock(fd, _fcntl.LOCK_SH | _fcntl.LOCK_NB)   # nobody can conflict now
    except BlockingIOError:
        return 1
    return 0


def _let_go(int fd, n):
    """Close fd, a hold on segment n's file that never became a view (create's look at a
    taken name, an open that failed), leaving as a view leaves: the last user may have
    left while we held it, its LOCK_EX then failed on our LOCK_SH and it did not unlink.
    If we are the last now and the file is an orphan (_is_orphan: a finished segment, not
    persist; a corrupt or half-built one is left to open's checks), unlink the name."""
    try:
        _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        if _names_file(_SHM_DIR + n, fd) and _is_orphan(fd):
            _os.unlink(_SHM_DIR + n)
    except OSError:                   # held by others (BlockingIOError), or not ours
        pass
    finally:
        _os.close(fd)


def _reap_orphan(n):
    """create found the name taken: if it names an orphan, unlink it (True)."""
    try:
        fd = _open_segment(n)
    except (FileNotFoundError, CorruptRegionError):
        return False
    try:
        return _hold_name(fd, n, _time.monotonic() + OPEN_READY_TIMEOUT) == 2
    except (OSError, TimeoutError):
        return False
    finally:
        _let_go(fd, n)


def _new_file(n, mode):
    """A new file for segment n with LOCK_SH taken: (fd, named). Unnamed (O_TMPFILE, to be
    linked once built) where the kernel supports it, else created under the name."""
    cdef int fd
    flags = _os.O_RDWR | _os.O_CLOEXEC
    try:
        fd = _os.open(_SHM_DIR, flags | _os.O_TMPFILE, mode)
        named = False
    except OSError as e:
        if e.errno not in (_errno.EOPNOTSUPP, _errno.EISDIR, _errno.EINVAL):
            raise
        for attempt in range(3):
            try:
                fd = _os.open(_SHM_DIR + n, flags | _os.O_CREAT | _os.O_EXCL | _os.O_NOFOLLOW,
                              mode)
                break
            except FileExistsError:
                if attempt == 2 or not _reap_orphan(n):
                    raise FileExistsError(f"shared-memory segment {n!r} already exists") from None
        named = True
    _fcntl.flock(fd, _fcntl.LOCK_SH)           # nobody else can have it yet: never waits
    return fd, named


def _link_file(int fd, n):
    """Give the built, unnamed segment its name; FileExistsError if the name is taken
    (by a live segment: an orphan's name is reclaimed)."""
    cdef bytes src = f"/proc/self/fd/{fd}".encode()
    cdef bytes dst = (_SHM_DIR + n).encode()
    for attempt in range(3):
        try:
            # linkat, following the magic link to the file (os.link would not follow it)
            if linkat(AT_FDCWD, src, AT_FDCWD, dst, AT_SYMLINK_FOLLOW) != 0:
                _os_error(errno, dst)
            return
        except FileExistsError:
            if attempt == 2 or not _reap_orphan(n):
                raise FileExistsError(f"shared-memory segment {n!r} already exists") from None


cdef class Region:
    """A named POSIX shared-memory segment holding a participant table and lock slots.

    Create with ``Region.create()``, attach from any process with ``Region.open(name)``
    (or either with ``Region.open_or_create(name)``). The name lives while some process
    has the region open, and is unlinked when the last one closes it (or exits, or dies),
    unless it was created with ``persist=True``.
    """
    def __cinit__(self):
        self.rm = NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("use Region.create(...), Region.open(name) or Region.open_or_create(name)")

    # -- construction -------------------------------------------------------------

    @classmethod
    def create(cls, name=None, *, max_locks=64, max_participants=None, mode=0o600,
               persist=False):
        """Create a new region. ``FileExistsError`` if the name is taken.
        ``max_participants``: None (no cap: slots are provisioned as threads come, up to
        4096), or a cap of 1..4096 (CapacityError past it)."""
        return Region._create(name, max_locks, max_participants, mode, persist, 0)

    @classmethod
    def open(cls, name):
        """Attach to an existing region from any process. ``FileNotFoundError`` if there is
        none (a segment whose last user died counts as none, and its name is removed)."""
        return Region._open(_check_name(name))

    @classmethod
    def open_or_create(cls, name, *, max_locks=64, max_participants=None, mode=0o600,
                       persist=False):
        """Open region ``name``, or create it (with these arguments) if there is none:
        atomic, so that of any number of processes racing on one name, all end up with the
        same segment. The arguments do not apply to a region that exists already."""
        n = _check_name(name)
        _check_create_args(max_locks, max_participants, mode)
        deadline = _time.monotonic() + 5.0
        while True:
            try:
                return Region._create(n, max_locks, max_participants, mode, persist, 0)
            except FileExistsError:
                pass
            try:
                return Region._open(n)
            except FileNotFoundError:              # its last user left meanwhile: again
                if _time.monotonic() > deadline:
                    raise

    @staticmethod
    def _create(name, max_locks, max_participants, mode, persist, uint32_t first_kind,
                setup=None, table=None):
        """create(); with first_kind, the region of a lock class: its one lock ("lock") is
        made before the name exists, so nobody can open the region without it. A toolbox
        object's setup(region, index) fills its body in before then (toolbox.pxi). With
        `table` (kind code, size), the region of a LockTable: its one entry ("table", of
        kind SHM_KIND_TABLE) and its stripes, in the extension area (docs/design.md §15)."""
        n = _gen_name() if name is None else _check_name(name)
        max_participants = _check_create_args(max_locks, max_participants, mode)
        _hook_exit()
        # from the file's flock to the view's name in g_rmaps, a SIGTERM waits for us
        # (participants.pxi, g_lc_busy): it would otherwise end the process between the two
        lc_enter()
        try:
            return Region._build(n, max_locks, max_participants, mode, persist, first_kind,
                                 setup, table)
        finally:
            lc_exit()

    @staticmethod
    def _build(n, uint32_t L, uint32_t P, mode, persist, uint32_t first_kind, setup=None,
               table=None):
        """The file is sized for the cap P (sparse: tmpfs gives pages only to what is
        written or reserved) and mapped whole; the header, the directory and the first
        participants (SHM_HWM_FIRST, at most P) are provisioned now, more as they are
        needed (reg_grow), a lock's body at create_lock (docs/design.md §2)."""
        cdef Region self = Region.__new__(Region)
        cdef uint64_t dir_off, part_off, locks_off, stride, total
        cdef uint32_t hwm = P if P < SHM_HWM_FIRST else SHM_HWM_FIRST
        cdef char* base = <char*>MAP_FAILED
        cdef shm_header* h
        cdef int fd
        cdef uint64_t ext_lines = 0
        total = _geometry(L, P, &dir_off, &part_off, &locks_off, &stride)
        if table is not None:
            ext_lines = _table_lines(table[1])
            total += ext_lines * SHM_LINE
        order_key = int.from_bytes(_os.urandom(8), "little") or 1
        fd, named = _new_file(n, mode)            # FileExistsError, PermissionError
        try:
            _os.ftruncate(fd, total)
            # header, directory and the first participants: one reservation
            _reserve(fd, 0, part_off + hwm * sizeof(shm_participant), f"region {n!r}")
            base = <char*>mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
            if base == <char*>MAP_FAILED:
                raise OSError(errno, "mmap failed")
            h = <shm_header*>base
            h.magic = SHM_MAGIC
            h.version = SHM_VERSION
            h.line_size = SHM_LINE
            h.total_size = total
            h.max_locks = L
            h.max_participants = P
            h.dir_off = dir_off
            h.part_off = part_off
            h.locks_off = locks_off
            h.lock_stride = stride
            h.creator_pid = <uint32_t>getpid()
            h.nlocks = 0
            h.glibc_mutex_size = sizeof(pthread_mutex_t)
            h.creator_pidns = my_pidns()
            h.flags = SHM_HDR_PERSIST if persist else 0
            h.part_hwm = hwm
            h.order_key = order_key
            h.ext_lines = ext_lines
            _init_pshared_mutex(&h.dir_mutex.m, False)
        except BaseException:
            if base != <char*>MAP_FAILED:
                munmap(base, total)
            _os.close(fd)
            if named:
                _unlink_quietly(n)
            raise
        self._attach(n, base, total, fd)           # the view owns fd and the mapping now
        try:
            slots_provision(self.rm, 0, hwm, None, True)
            if table is not None:
                self._create_entry("table", SHM_KIND_TABLE, None, True, table)
                table_load(self.rm, n)
            elif first_kind:
                self._create_entry("lock", first_kind, setup, True)
            st32_rel(&h.state, SHM_STATE_READY)    # publish: everything above is visible
            if not named:
                _link_file(fd, n)
            self.rm.named = 1
        except BaseException:
            self._discard(named)
            raise
        return self

    @staticmethod
    def _open(n):
        _hook_exit()
        lc_enter()                                 # as in _create
        try:
            return Region._attach_named(n)
        finally:
            lc_exit()

    @staticmethod
    def _attach_named(n):
        cdef Region self = Region.__new__(Region)
        cdef char* base
        cdef size_t size
        cdef int fd
        deadline = _time.monotonic() + OPEN_READY_TIMEOUT
        while True:
            fd = _open_segment(n)                  # FileNotFoundError
            try:
                held = _hold_name(fd, n, deadline)
            except BaseException:
                _let_go(fd, n)
                raise
            if held == 0:
                break
            _os.close(fd)
            if held == 2:
                raise FileNotFoundError(f"no shared-memory segment named {n!r} (its last "
                                        "user died; the name was removed)")
            if _time.monotonic() > deadline:
                raise FileNotFoundError(f"no shared-memory segment named {n!r} "
                                        "(it was closed by its last user)")
        try:
            size = _wait_ready(fd, n)
            base = <char*>mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
            if base == <char*>MAP_FAILED:
                raise OSError(errno, "mmap failed")
            try:
                _validate(base, size, n)
            except BaseException:
                munmap(base, size)
                raise
        except BaseException:
            _let_go(fd, n)
            raise
        self._attach(n, base, size, fd)
        self.rm.named = 1
        try:
            table_load(self.rm, n)
        except BaseException:
            self.close()
            raise
        return self

    cdef _attach(self, str n, char* base, size_t size, int fd):
        cdef shm_header* h = <shm_header*>base
        cdef rmap_t* rm = <rmap_t*>calloc(1, sizeof(rmap_t))
        cdef bytes path = (_SHM_DIR + n).encode()
        if rm == NULL or len(path) >= sizeof(rm.path):
            free(rm)
            munmap(base, size)
            close(fd)
            raise MemoryError()
        rm.base = base
        rm.size = size
        rm.hdr = h
        rm.L = h.max_locks
        rm.P = h.max_participants
        rm.dir = <shm_dirent*>(base + h.dir_off)
        rm.part = <shm_participant*>(base + h.part_off)
        rm.locks_off = h.locks_off
        rm.stride = h.lock_stride
        rm.ext_off = h.locks_off + <uint64_t>h.max_locks * h.lock_stride
        rm.order_key = h.order_key
        try:
            rm.ino = _os.fstat(fd).st_ino
        except OSError:
            rm.ino = 0
        rm.tbl.size = 0
        rm.pyalive = 1
        rm.fd = fd
        rm.fork_fd = -1
        rm.named = 0
        rm.persist = (h.flags & SHM_HDR_PERSIST) != 0
        memcpy(rm.path, <const char*>path, len(path) + 1)
        rmap_link(rm)
        self.rm = rm
        self.name = n

    cdef _discard(self, bint named):
        """Undo a create that failed after _attach: the name is not ours to leave (it was
        never linked, or names a half-built file we remove)."""
        self.rm.named = 0
        gm_lock()
        self.rm.closed = 1
        rmap_maybe_unmap(self.rm)
        gm_unlock()
        if named:
            _unlink_quietly(self.name)

    # -- lifetime --------------------------------------------------------------------

    cdef int _check_open(self) except -1:
        if self.rm == NULL or self.rm.closed:
            raise ValueError("region is closed")
        return 0

    @property
    def closed(self):
        return self.rm == NULL or bool(self.rm.closed)

    def close(self):
        """Unmap this process's view (deferred while other threads still use it). Releases
        what the calling thread holds here first. The last view of the segment anywhere to
        go unlinks its name, unless it was created with persist=True."""
        if self.rm == NULL:
            return
        if not self.rm.closed:
            self._release_mine()
            reg_unregister(self.rm)
            gm_lock()
            self.rm.closed = 1
            rmap_maybe_unmap(self.rm)
            gm_unlock()

    cdef _release_mine(self):
        cdef reg_t* r = reg_lookup(self.rm)
        cdef uint32_t i
        cdef shm_body b
        if r == NULL:
            return
        for i in range(self.rm.L):
            if r.held <= 0:
                break
            if ld32_acq(&self.rm.dir[i].state) != SHM_DIRENT_READY:
                continue
            if ld32_rlx(&self.rm.dir[i].kind) == SHM_KIND_TABLE:
                continue
            b = shm_body_at(self.rm.base, self.rm.locks_off + i * self.rm.stride, self.rm.P, i)
            if ld32_acq(&b.ctl.holder) == r.hid:
                try:
                    self._lock_at(i).release()
                except Exception:
                    pass
        for i in range(self.rm.tbl.size):              # a table's stripes
            if r.held <= 0:
                break
            b = table_stripe(self.rm, i)
            if ld32_acq(&b.ctl.holder) == r.hid:
                try:
                    self._lock_at(self.rm.tbl.first + i).release()
                except Exception:
                    pass

    def unlink(self):
        """Remove the segment's name now (a persist one's too). Processes that have it
        mapped go on working; the name can be created afresh at once. ValueError once
        closed (the name may stand for another segment by then: open it, then unlink)."""
        path = _SHM_DIR + self.name
        self._check_open()
        if self.rm.fd >= 0 and not _names_file(path, self.rm.fd):
            raise FileNotFoundError(f"the name {self.name!r} no longer names this segment")
        try:
            _os.unlink(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"no shared-memory segment named {self.name!r}") from None

    def __dealloc__(self):
        cdef rmap_t* rm = self.rm
        cdef reg_t* r
        if rm == NULL:
            return
        if not rm.closed:
            # Garbage collection: leave the region as close() would, except that a thread
            # still holding a lock here keeps its slot (and the mapping stays): its robust
            # list may run through this mapping until it exits.
            reg_unregister(rm)
        gm_lock()
        rm.closed = 1
        rm.pyalive = 0
        rmap_maybe_unmap(rm)
        rmap_maybe_free(rm)
        gm_unlock()
        self.rm = NULL

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        self._check_open()
        return (_open_region, (self.name,))

    def __repr__(self):
        state = "closed" if self.closed else f"{self.rm.L} locks, {self.rm.P} participants"
        return f"<shmlocks.Region {self.name!r} ({state})>"

    @property
    def max_locks(self):
        self._check_open()
        return self.rm.L

    @property
    def max_participants(self):
        """The participant cap: the max_participants given at creation, or 4096 (None)."""
        self._check_open()
        return self.rm.P

    @property
    def _provisioned(self):
        """Participant slots provisioned so far (header.part_hwm, docs/design.md §2)."""
        self._check_open()
        return rmap_hwm(self.rm)

    # -- the directory -------------------------------------------------------------------

    cdef int _find(self, bytes bname) except -2:
        """Index of the READY entry named bname, or -1."""
        cdef uint32_t i
        cdef shm_dirent* d
        cdef const char* s = bname
        cdef size_t n = len(bname)
        for i in range(self.rm.L):
            d = &self.rm.dir[i]
            if ld32_acq(&d.state) != SHM_DIRENT_READY:
                continue
            if strnlen(d.name, SHM_NAME_MAX) == n and strncmp(d.name, s, n) == 0:
                return i
        return -1

    def lock_names(self):
        """Names of the locks in this region, in creation order."""
        cdef uint32_t i
        cdef shm_dirent* d
        self._check_open()
        out = []
        for i in range(self.rm.L):
            d = &self.rm.dir[i]
            if ld32_acq(&d.state) == SHM_DIRENT_READY:
                out.append(d.name[:strnlen(d.name, SHM_NAME_MAX - 1)].decode("utf-8", "replace"))
        return out

    def create_lock(self, name, kind):
        """Create a lock of ``kind`` (a KINDS key or class) named ``name`` in this region.
        FileExistsError if the name is in use, CapacityError past max_locks."""
        self._check_open()
        i = self._create_entry(name, kind_code_of(kind))
        return self._lock_at(i, name)

    def _create_entry(self, name, uint32_t code, setup=None, bint fresh=False, table=None):
        """The entry named `name` of kind `code`; `fresh`: the region is being built (a
        new file: its pages are zero); `table`: (kind code, size) of a table entry."""
        self._check_open()
        rmap_pin(self.rm)                     # the wait below releases the GIL: a close()
        try:                                  # by another thread meanwhile must not unmap
            return self._create_entry_pinned(name, code, setup, fresh, table)
        finally:
            rmap_unpin(self.rm)

    def _create_entry_pinned(self, name, uint32_t code, setup=None, bint fresh=False,
                             table=None):
        cdef uint32_t i
        cdef int rc, slot = -1
        cdef shm_dirent* d
        cdef shm_body b
        cdef timespec ts
        bname = _check_lock_name(name)
        ts = shm_ts_of_ns(shm_now_ns() + 5000000000)
        with nogil:
            rc = pm_clocklock(&self.rm.hdr.dir_mutex.m, 0, &ts)   # guarded (shm_sys.h)
        if rc == EOWNERDEAD:
            pm_consistent(&self.rm.hdr.dir_mutex.m, 0)   # entries publish atomically
        elif rc == ETIMEDOUT:
            raise TimeoutError("timed out waiting for the region's directory lock")
        elif rc != 0:
            raise CorruptRegionError(f"region {self.name!r}: directory lock unusable ({rc})")
        try:
            if self._find(bname) >= 0:
                raise FileExistsError(f"a lock named {name!r} already exists in {self.name!r}")
            for i in range(self.rm.L):
                if ld32_acq(&self.rm.dir[i].state) == SHM_DIRENT_FREE:
                    slot = i
                    break
            if slot < 0:
                raise CapacityError(f"region {self.name!r} is full (max_locks={self.rm.L})")
            d = &self.rm.dir[slot]
            if table is not None:
                _table_build(self.rm, slot, table[0], table[1], f"lock table {self.name!r}",
                             fresh)
            else:
                _provision_body(self.rm, slot, code, f"lock {name!r}", fresh)
                b = shm_body_at(self.rm.base, self.rm.locks_off + slot * self.rm.stride,
                                self.rm.P, slot)
                _init_body(&b, code)
            if setup is not None:
                setup(self, slot)                  # a toolbox object's arguments (toolbox.pxi)
            memset(d.name, 0, SHM_NAME_MAX)
            memcpy(d.name, <const char*>bname, len(bname))
            d.kind = code
            self.rm.hdr.nlocks += 1
            st32_rel(&d.state, SHM_DIRENT_READY)       # publish the entry and its body
        finally:
            pm_unlock(&self.rm.hdr.dir_mutex.m, 0)
        return slot

    def open_lock(self, name):
        """Open the lock called ``name``; returns an object of its stored kind."""
        self._check_open()
        bname = _check_lock_name(name)
        i = self._find(bname)
        if i < 0:
            raise FileNotFoundError(f"no lock named {name!r} in region {self.name!r}")
        if ld32_acq(&self.rm.dir[i].kind) == SHM_KIND_TABLE:
            raise LockKindError(f"{name!r} in region {self.name!r} is a lock table, not a "
                                f"lock: open it with shmlocks.LockTable.open({self.name!r})")
        obj = _OBJ_BY_CODE.get(ld32_acq(&self.rm.dir[i].kind))
        if obj is not None:
            raise LockKindError(f"{name!r} in region {self.name!r} is a {obj.__name__}, "
                                f"not a lock (open it with {obj.__name__}.open or "
                                "Region.open_object)")
        return self._lock_at(i, name)

    # -- the synchronization toolbox (toolbox.pxi): objects in the directory beside locks --

    def open_object(self, name):
        """Open the toolbox object (Event, Semaphore, BoundedSemaphore, Barrier,
        Condition, RWLock) called ``name``, as its stored type. LockKindError if it is a lock."""
        self._check_open()
        i = self._find(_check_lock_name(name))
        if i < 0:
            raise FileNotFoundError(f"nothing named {name!r} in region {self.name!r}")
        if ld32_acq(&self.rm.dir[i].kind) not in _OBJ_BY_CODE:
            raise LockKindError(f"{name!r} in region {self.name!r} is a lock: open it with "
                                "open_lock (or open_rlock)")
        o = self._lock_at(i, name)
        o._opened()                     # (a Barrier enrols this process as a party)
        return o

    def create_event(self, name):
        """Create an Event named ``name`` in this region (not set)."""
        return g_tb_api["create_event"](self, name)

    def create_semaphore(self, name, value=1, *, bounded=False):
        """Create a Semaphore (a BoundedSemaphore if ``bounded``) of ``value`` units."""
        return g_tb_api["create_semaphore"](self, name, value, bounded)

    def create_barrier(self, name, parties, action=None, timeout=None):
        """Create a Barrier for ``parties`` threads (``action`` is this object's)."""
        return g_tb_api["create_barrier"](self, name, parties, action, timeout)

    def create_condition(self, name, lock=None):
        """Create a Condition on ``lock`` (None: a new RLock, entry ``name + ".lock"``
        of this region)."""
        if lock is None:
            lock = self.create_rlock(name + ".lock")
        return g_tb_api["create_condition"](self, name, lock)

    def create_rlock(self, name, kind="futex"):
        """Create a lock of ``kind`` named ``name`` and return it as an RLock."""
        return g_tb_api["rlock"](self.create_lock(name, kind))

    def open_rlock(self, name):
        """Open lock ``name`` (any kind) as an RLock."""
        return g_tb_api["rlock"](self.open_lock(name))

    def open_barrier(self, name):
        """Open Barrier ``name``."""
        return self._open_as(name, "barrier")

    def open_condition(self, name):
        """Open Condition ``name``; its lock is opened on first use."""
        return self._open_as(name, "condition")

    def open_event(self, name):
        """Open Event ``name``."""
        return self._open_as(name, "event")

    def create_rwlock(self, name):
        """Create a reader-writer lock (RWLock) named ``name`` in this region."""
        return g_tb_api["create_rwlock"](self, name)

    def open_rwlock(self, name):
        """Open RWLock ``name``."""
        return self._open_as(name, "rwlock")

    def open_semaphore(self, name):
        """Open Semaphore (or BoundedSemaphore) ``name``."""
        return self._open_as(name, "semaphore")

    def _open_as(self, name, str kind):
        o = self.open_object(name)
        if o.kind_name != kind:
            raise LockKindError(f"{name!r} in region {self.name!r} is a "
                                f"{type(o).__name__}, not a {kind}")
        return o

    cdef _lock_at(self, uint32_t i, name=None):
        """The object of lock number i (docs/design.md §15): entry i's (a lock, a toolbox
        object, a lock table), made through the kind registry (base/kind.pxd), or stripe
        i - first of the region's table (a lock of its kind)."""
        cdef shm_dirent* d
        cdef uint32_t code
        if i >= self.rm.L:
            if self.rm.tbl.size == 0 or i - self.rm.tbl.first >= self.rm.tbl.size:
                raise IndexError(f"region {self.name!r} has no lock number {i}")
            if name is None:
                name = f"{self.name}[{i - self.rm.tbl.first}]"
            return kind_new_stripe(self.rm.tbl.sub, self, i, name)
        d = &self.rm.dir[i]
        code = ld32_acq(&d.kind)
        if code == SHM_KIND_TABLE and self.rm.tbl.size != 0 and i == self.rm.tbl_entry:
            return g_tb_api["table"](self)       # the LockTable (_ext/table/table.pxi)
        obj = kind_new_object(code, self, i, name)
        if obj is not None:
            return obj                       # a toolbox object (docs/design.md §12)
        if name is None:
            name = d.name[:strnlen(d.name, SHM_NAME_MAX - 1)].decode("utf-8", "replace")
        lk = kind_new_lock(code, self, i, name)
        if lk is None:
            raise CorruptRegionError(f"region {self.name!r}: lock {i} has unknown kind {code}")
        return lk

    def _describe(self):
        """A snapshot of the region for triage (the CLI's inspect): participants, locks."""
        cdef uint32_t i
        self._check_open()
        h = self.rm.hdr
        parts = []
        for i in range(rmap_hwm(self.rm)):
            if participant_state(self.rm, i):
                parts.append(self._participant(i + 1))
        locks = []
        for i in range(self.rm.L):
            if ld32_acq(&self.rm.dir[i].state) == SHM_DIRENT_READY:
                locks.append(self._lock_at(i)._describe())
        try:
            resident = _os.fstat(self.rm.fd).st_blocks * 512 if self.rm.fd >= 0 else 0
        except OSError:
            resident = 0
        return {"name": self.name, "size": self.rm.size, "resident": resident,
                "version": SHM_VERSION,
                "max_locks": self.rm.L, "max_participants": self.rm.P,
                "participants_provisioned": rmap_hwm(self.rm),
                "creator_pid": h.creator_pid,
                "creator_other_namespace": other_pidns(h.creator_pidns),
                "participants": parts, "locks": locks}

    def stats(self):
        """{lock name: lock.stats()} for every lock of the region (see _Lock.stats; a lock
        table's entry: LockTable.stats(), its stripes summed)."""
        cdef uint32_t i
        cdef shm_dirent* d
        self._check_open()
        out = {}
        for i in range(self.rm.L):
            d = &self.rm.dir[i]
            if ld32_acq(&d.state) == SHM_DIRENT_READY:
                lk = self._lock_at(i)
                out[d.name[:strnlen(d.name, SHM_NAME_MAX - 1)].decode("utf-8", "replace")
                    if ld32_acq(&d.kind) == SHM_KIND_TABLE else lk.name] = lk.stats()
        return out

    def reset_stats(self):
        """Zero the statistics of every lock of the region (see _Lock.reset_stats)."""
        cdef uint32_t i
        self._check_open()
        for i in range(self.rm.L):
            if ld32_acq(&self.rm.dir[i].state) == SHM_DIRENT_READY:
                self._lock_at(i).reset_stats()

    def _recover_dead(self):
        """Recover every participant slot whose owner died (their tokens came back
        EOWNERDEAD to us). Returns how many. Normally done lazily, by the waiters that
        depend on a dead participant and by registration; this sweeps the rest."""
        cdef recov_t rec
        cdef uint32_t i
        cdef int n = 0
        self._check_open()
        rmap_pin(self.rm)
        try:
            for i in range(rmap_hwm(self.rm)):
                if participant_dead(self.rm, i):
                    recov_init(&rec, -1)
                    with nogil:
                        participant_try_recover(self.rm, i, &rec)
                    if rec.sig:                   # a handler raised: its exception
                        return _raise_pending()   # propagates (the recovery is pending)
                    n += not participant_dead(self.rm, i)
        finally:
            rmap_unpin(self.rm)
        return n

    cdef object _participant(self, uint32_t slot1):
        """(slot, pid, tid, alive) of participant index+1 slot1, or None."""
        cdef shm_participant* p
        if slot1 == 0 or slot1 > rmap_hwm(self.rm):
            return None
        p = &self.rm.part[slot1 - 1]
        d = {"slot": slot1 - 1, "pid": ld32_rlx(&p.pid), "tid": ld32_rlx(&p.tid),
             "alive": participant_state(self.rm, slot1 - 1) == 1,
             "other_namespace": other_pidns(ld64_acq(&p.pidns))}
        if ld32_acq(&p.agent) == 1:          # an asyncio cohort: the task it acts for
            d["task"] = _label_of(p)
            d["task_id"] = ld64_acq(&p.task_id)
        return d


cdef str _label_of(shm_participant* p):
    """An agent slot's task name (label: UTF-8, NUL-padded, maybe cut mid-character)."""
    cdef bytes raw = (<char*>p.label)[:sizeof(p.label)]
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _open_segment(n):
    """Open segment n's file: it must be a regular file (a FIFO or a device planted under
    the name would block or lie; a symbolic link is not followed)."""
    try:
        fd = _os.open(_SHM_DIR + n, _os.O_RDWR | _os.O_NOFOLLOW | _os.O_CLOEXEC
                      | _os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileNotFoundError(f"no shared-memory segment named {n!r}") from None
    except PermissionError as e:
        raise PermissionError(f"segment {n!r}: {e.strerror}") from None
    except OSError as e:
        if e.errno == _errno.ELOOP:
            raise CorruptRegionError(f"segment {n!r} is a symbolic link, not a region") from None
        raise
    try:
        if not _stat.S_ISREG(_os.fstat(fd).st_mode):
            raise CorruptRegionError(f"segment {n!r} is not a regular file")
    except BaseException:
        _os.close(fd)
        raise
    return fd


def _open_region(name):
    return Region.open(name)


def _check_lock_name(name):
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    b = name.encode("utf-8")
    if not b or b"\x00" in b or len(b) > SHM_NAME_MAX - 1:
        raise ValueError(f"invalid lock name {name!r}: 1 to {SHM_NAME_MAX - 1} bytes, no NUL")
    return b


def _pid_alive(pid):
    if not 0 < pid <= 4194304:                       # PID_MAX_LIMIT
        return False
    try:
        _os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_ready(int fd, n):
    """Bounded wait for a creator still building the segment; returns the file size."""
    cdef shm_header h
    deadline = _time.monotonic() + OPEN_READY_TIMEOUT
    while True:
        size = _os.fstat(fd).st_size
        if size >= sizeof(shm_header):
            data = _os.pread(fd, sizeof(shm_header), 0)
            if len(data) == sizeof(shm_header):
                memcpy(&h, <const char*>data, sizeof(shm_header))
                if h.magic != SHM_MAGIC:
                    raise CorruptRegionError(f"segment {n!r} is not a shmlocks region (bad magic)")
                if h.state == SHM_STATE_READY:
                    return size
                if h.creator_pid and not _pid_alive(h.creator_pid):
                    raise CorruptRegionError(f"segment {n!r} was never finished: its creator "
                                             f"(pid {h.creator_pid}) died while building it")
        elif size > 0 and _time.monotonic() > deadline:
            raise CorruptRegionError(f"segment {n!r} is too small ({size} bytes) to be a region")
        if _time.monotonic() > deadline:
            raise CorruptRegionError(f"segment {n!r} never became ready (its creator may have "
                                     "died while building it, or it is not a shmlocks region)")
        _time.sleep(0.002)


cdef int _validate(char* base, size_t size, n) except -1:
    cdef shm_header* h = <shm_header*>base
    cdef uint64_t dir_off, part_off, locks_off, stride, total
    if h.magic != SHM_MAGIC:
        raise CorruptRegionError(f"segment {n!r} is not a shmlocks region (bad magic)")
    if h.version != SHM_VERSION:
        raise CorruptRegionError(f"segment {n!r} has layout version {h.version}, "
                                 f"this shmlocks reads version {SHM_VERSION}")
    if h.line_size != SHM_LINE or h.glibc_mutex_size != sizeof(pthread_mutex_t):
        raise CorruptRegionError(f"segment {n!r} was built for another ABI "
                                 f"(line {h.line_size}, mutex {h.glibc_mutex_size} bytes)")
    if not (1 <= h.max_locks <= SHM_MAX_LOCKS and 1 <= h.max_participants <= SHM_MAX_PARTICIPANTS):
        raise CorruptRegionError(f"segment {n!r}: bad geometry {h.max_locks}x{h.max_participants}")
    total = _geometry(h.max_locks, h.max_participants, &dir_off, &part_off, &locks_off, &stride)
    if h.ext_lines > <uint64_t>SHM_TABLE_MAX * shm_body_lines(SHM_MAX_PARTICIPANTS):
        raise CorruptRegionError(f"segment {n!r}: bad extension area ({h.ext_lines} lines)")
    total += h.ext_lines * SHM_LINE
    if (h.dir_off != dir_off or h.part_off != part_off or h.locks_off != locks_off
            or h.lock_stride != stride):
        raise CorruptRegionError(f"segment {n!r}: offsets do not match its geometry")
    if h.total_size != total or size != total:
        raise CorruptRegionError(f"segment {n!r}: size {size} does not match its layout ({total})")
    if not 1 <= h.part_hwm <= h.max_participants:
        raise CorruptRegionError(f"segment {n!r}: {h.part_hwm} participants provisioned, "
                                 f"of at most {h.max_participants}")
    return 0


def _validate_header(const unsigned char[::1] head not None, uint64_t size, name):
    """Validate a private copy of a segment's header against the size of its file, exactly
    as Region.open validates a mapping (raises CorruptRegionError). shmlocks/waitgraph.py
    and the CLI read /dev/shm with pread (shmlocks/_shmread.py), never a mapping."""
    cdef shm_header h
    if head.shape[0] < <Py_ssize_t>sizeof(shm_header):
        raise CorruptRegionError(f"segment {name!r} is too small ({head.shape[0]} bytes) "
                                 "to be a region")
    memcpy(&h, &head[0], sizeof(shm_header))
    _validate(<char*>&h, <size_t>size, name)
