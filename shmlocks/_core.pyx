# cython: language_level=3
"""shmlocks._core -- the compiled core, one extension built from its units: _core.pxd
includes their declarations (a .pxd each), this file their definitions (a .pxi each),
in layer order, bottom first: each layer a folder of _ext/, each unit using only what
the units before it declare (docs/design.md §1; tests/test_layers.py checks it):

  _ext/sys/     every foreign declaration (layout ABI, atomics, futex, pthread, mmap,
                CPython, the assertion build's dassert)
  _ext/base/    kind (the kind contract: result codes, hooks, ops table, park's
                callbacks), participants (slots, liveness tokens, registration, the
                recovery driver), wait (the one waiting policy, park()), region (the
                segment: create/open/validate, directory, lifetime)
  _ext/diag/    stats, the lockdep hook, the deadlock look
  _ext/lock/    lockbase: the hooks every kind implements, the Python API on them
  _ext/kinds/   queue (what MCS and CLH share), then one unit per algorithm
  _ext/toolbox/ the synchronization toolbox: its guard, journal and sleep (toolbox), then
                one unit per primitive (event, semaphore, barrier, condition,
                rwlock)
"""

cimport cython

from shmlocks.errors import (CapacityError, CorruptRegionError, DeadlockError,
                             LockKindError, LockNotRecoverableError, NamespaceError,
                             NotOwnerError, ReentryError, ShmLockError)

include "_ext/base/kind.pxi"
include "_ext/base/participants.pxi"
include "_ext/base/uring.pxi"
include "_ext/base/wait.pxi"
include "_ext/base/region.pxi"
include "_ext/diag/stats.pxi"
include "_ext/diag/lockdep.pxi"
include "_ext/diag/deadlock.pxi"
include "_ext/lock/lockbase.pxi"
include "_ext/kinds/queue.pxi"
include "_ext/kinds/ticket.pxi"
include "_ext/kinds/ticketc.pxi"
include "_ext/kinds/mcs.pxi"
include "_ext/kinds/mcsc.pxi"
include "_ext/kinds/clh.pxi"
include "_ext/kinds/clhc.pxi"
include "_ext/kinds/futex.pxi"
include "_ext/kinds/robust.pxi"
include "_ext/kinds/pi.pxi"
include "_ext/table/table.pxi"
include "_ext/toolbox/toolbox.pxi"
include "_ext/toolbox/event.pxi"
include "_ext/toolbox/semaphore.pxi"
include "_ext/toolbox/barrier.pxi"
include "_ext/toolbox/condition.pxi"
include "_ext/toolbox/rwlock.pxi"

CACHE_LINE = SHM_LINE
#: how a blocked waiter sleeps (docs/design.md §5): "futex_waitv" (on the lock and on the
#: lives it depends on) or "sliced" (the fallback: no futex_waitv in this kernel, or
#: SHMLOCKS_WAIT=sliced at import; it wakes every 5 ms to look)
WAIT_MODE = wait_mode_init(_os.environ.get("SHMLOCKS_WAIT", ""))
#: how a waiter that must not block a thread (an asyncio task's) sleeps (docs/design.md §5,
#: "Resumable waits"): "io_uring" (IORING_OP_FUTEX_WAITV, Linux 6.7+: the event loop's
#: thread is told by a completion) or "thread" (the fallback: io_uring refused or too old,
#: or SHMLOCKS_AIO=thread at import; a waiter thread sleeps in futex_waitv)
AIO_MODE = aio_mode_init(_os.environ.get("SHMLOCKS_AIO", ""))
_os.register_at_fork(after_in_child=_wait_after_fork)
#: True in an assertion build (SHMLOCKS_DEBUG=1 at build time: docs/design.md §8)
DEBUG = bool(SHM_DEBUG_BUILT)
LAYOUT_VERSION = SHM_VERSION
MAGIC = SHM_MAGIC

# The on-disk layout (shm_layout.h) for the Python readers that copy a segment with pread
# (shmlocks/_segment.py, shmlocks/_shmread.py, shmlocks/pytest_plugin.py): the sizes,
# offsets and codes come from the C declarations here, so no reader re-spells them.
cdef shm_header _lay_h
cdef shm_participant _lay_p
cdef shm_rwrec _lay_rw
LAYOUT = {
    "line": SHM_LINE,
    "header_size": sizeof(shm_header),
    "creator_pid_off": <char*>&_lay_h.creator_pid - <char*>&_lay_h,
    "creator_pidns_off": <char*>&_lay_h.creator_pidns - <char*>&_lay_h,
    "header_fields": <char*>&_lay_h.ext_lines - <char*>&_lay_h + sizeof(uint64_t),
    "part_hwm_off": <char*>&_lay_h.part_hwm - <char*>&_lay_h,
    "order_key_off": <char*>&_lay_h.order_key - <char*>&_lay_h,
    "ext_lines_off": <char*>&_lay_h.ext_lines - <char*>&_lay_h,
    # lock tables (docs/design.md §15): the entry's kind, its header (word A of its body:
    # shm_table), a compact stripe's lines and where its view aims word B
    "kind_table": SHM_KIND_TABLE,
    "table_max": SHM_TABLE_MAX,
    "stripe_lines": SHM_STRIPE_LINES,
    "stripe_wa_off": SHM_STRIPE_WA_OFF,
    "stripe_wb_off": SHM_STRIPE_WB_OFF,
    "stripe_ticket_wb_off": SHM_STRIPE_TICKET_WB_OFF,
    "stripe_clh_head_off": SHM_STRIPE_CLH_HEAD_OFF,
    "stripe_clh_node_off": SHM_STRIPE_CLH_NODE_OFF,
    "stripe_aside_off": SHM_STRIPE_ASIDE_OFF,      # a ticket or mcs stripe's aside words
    "stripe_seats": SHM_STRIPE_SEATS,              # and its spinner seats
    "participant_size": sizeof(shm_participant),
    # an asyncio cohort's fields, the chain walk's poke word and the wait link
    # (docs/design.md §3, §9, §14)
    "agent_off": <char*>&_lay_p.agent - <char*>&_lay_p,
    "poke_off": <char*>&_lay_p.poke - <char*>&_lay_p,
    "task_id_off": <char*>&_lay_p.task_id - <char*>&_lay_p,
    "label_off": <char*>&_lay_p.label - <char*>&_lay_p,
    "link_seq_off": <char*>&_lay_p.link_seq - <char*>&_lay_p,
    "link_lock_off": <char*>&_lay_p.link_lock - <char*>&_lay_p,
    "link_since_off": <char*>&_lay_p.link_since - <char*>&_lay_p,
    "link_name_off": <char*>&_lay_p.link_name - <char*>&_lay_p,
    "link_slot_off": <char*>&_lay_p.link_slot - <char*>&_lay_p,
    "link_gen_off": <char*>&_lay_p.link_gen - <char*>&_lay_p,
    "link_flags_off": <char*>&_lay_p.link_flags - <char*>&_lay_p,
    "link_detects": SHM_LINK_DETECTS,
    "walk_dir": SHM_WALK_DIR.decode(),      # where the chain walk opens segments by name
    "max_participants": SHM_MAX_PARTICIPANTS,  # the cap of max_participants=None
    "hwm_first": SHM_HWM_FIRST,               # participants a new region provisions
    "ticket_slots": SHM_TICKET_SLOTS,         # the ticket kind's slot lines: min(P, this)
    "body_lines_read": SHM_BODY_NODES,  # ctl, word A, word B: the lines before the nodes
    "name_max": SHM_NAME_MAX,
    "state_ready": SHM_STATE_READY,
    "dirent_ready": SHM_DIRENT_READY,
    "body_magic": SHM_BODY_MAGIC,
    "op_taking": SHM_OP_TAKING,
    "op_waiting": SHM_OP_WAITING,
    "op_quarantined": SHM_OP_QUARANTINED,
    "holder_slot_bits": HOLDER_SLOT_BITS,
    "futex_owner_died": FUTEX_OWNER_DIED_,
    "futex_tid_mask": FUTEX_TID_MASK_,
    # the RWLock's words (shm_rwlock.h): word A's w, and a participant line's ind, wstate
    "rw_present": RW_PRESENT,
    "rw_slot_bits": RW_SLOT_BITS,
    "rw_phase_mask": RW_PHASE_MASK,
    "rw_count_mask": RW_COUNT_MASK,
    "rw_blocked": RW_BLOCKED,
    "rw_tag_shift": RW_TAG_SHIFT,
    "rw_tag_mask": RW_TAG_MASK,
    "rw_w_draining": RW_W_DRAINING,
    # shm_rwlock.h shm_rwrec: the bytes its fields span (ind .. read_wait_max_ns)
    "rwrec_fields": <char*>&_lay_rw.read_wait_max_ns - <char*>&_lay_rw + sizeof(uint64_t),
}

# The kind registry: each kind's file registers its class and its ops (_register_kind, in
# base/kind.pxi) as it is included; every other list of kinds is built from this one.
KINDS = {cls.kind_name: cls for cls in _KIND_CLASSES}
#: the synchronization toolbox's shared-memory objects (_ext/toolbox/): their `kind`, as
#: `shmlocks inspect` shows it -> class (BoundedSemaphore is a Semaphore with a bound)
OBJECTS = {cls.kind_name: cls for cls in _OBJ_BY_CODE.values()}
#: the public name of every kind's base class, for annotations and isinstance (shmlocks.Lock)
Lock = _Lock

# Crash points (docs/design.md §8): a named point between every two protocol steps.
# SHMLOCKS_CRASHPOINT=<name>, read once at import, makes the process SIGKILL itself there;
# <name>:N at its N-th pass (SHMLOCKS_CRASHPOINT_ACTION=stop: SIGSTOP itself there, once,
# for a test that needs a participant stalled mid-step).
# name -> the kinds whose code passes through it. tests/test_crashpoints.py checks this
# table against the crash point calls in the sources.
_ALL = tuple(KINDS)
_USERSPACE = tuple(k for k, c in KINDS.items() if c.recovery == "user")
_CRASHPOINTS = {
    "lock.acquire.taking": _ALL,        # acquire step published, before the kind's atomic
    "lock.acquire.got": _ALL,           # the kind took the lock, holder not yet published
    "lock.acquire.holder": _ALL,        # holder published, acquire step not yet ended
    "lock.acquire.done": _ALL,          # acquire returned: in the critical section
    "lock.wait.waiting": _ALL,          # slow path published, before waiting
    "lock.release.releasing": _ALL,     # release step published, holder still set
    "lock.release.unholder": _ALL,      # holder cleared, before the kind's unlock
    "lock.release.unlocked": _ALL,      # unlocked, release step not yet ended
    "recover.locked": _USERSPACE,       # a recoverer holds the lock's repair mutex
    "recover.done": _USERSPACE,         # a recoverer finished, token not yet freed
    "ticket.acquire.took": ("ticket",),     # fetch_add done, ticket not yet published
    "ticket.abandon.marked": ("ticket",),   # abandon marker set, before the serving check
    "ticket.release.served": ("ticket",),   # serving stored, before the skip check / wake
    "ticket.release.granted": ("ticket",),  # granted, own ticket not yet cleared
    "ticket.release.skipping": ("ticket",), # claimed an abandoned ticket's marker, serving not moved
    "ticket.recover.flagged": ("ticket",),  # recoverer set owner_died, before the grant
    # more than 64 tickets outstanding (a region grown past its first 64 participants)
    "ticket.overflow.counted": ("ticket",), # slot marker taken: overflow counted, own omark not set
    "ticket.overflow.marked": ("ticket",),  # own omark set, before the serving check
    "ticket.overflow.claimed": ("ticket",), # a grant claimed an omark, serving not moved
    "mcs.acquire.joined": ("mcs",),         # tail taken, own pred not yet published
    "mcs.acquire.pred": ("mcs",),           # pred published, not yet linked behind it
    "mcs.try.armed": ("mcs",),              # try-lock node armed, before its tail CAS
    "mcs.release.emptied": ("mcs",),        # tail emptied, own node not yet idle
    "mcs.release.idled": ("mcs",),          # successor recorded, own node idle, before the pass
    "mcs.release.passing": ("mcs",),        # passing through an abandoned node, next recorded
    "mcs.recover.flagged": ("mcs",),        # recoverer set owner_died, before the release
    "clh.acquire.joined": ("clh",),         # tail taken, own pred not yet published
    "clh.acquire.pred": ("clh",),           # pred published, before checking it
    "clh.wait.reclaiming": ("clh",),        # taking an abandoned predecessor's pred
    "clh.abort.stepped_out": ("clh",),      # tail given back, own node not yet reclaimed
    "clh.release.freed": ("clh",),          # own node freed, predecessor's not yet adopted
    "clh.recover.flagged": ("clh",),        # recoverer set owner_died, before the release
    "clh.aside.left": ("clh",),             # own node ASIDE (place kept), not yet marked aside
    "clh.aside.passed": ("clh",),           # passed a node aside at its turn, before the wake
    "clh.aside.back": ("clh",),             # own node taken back from ASIDE, before the wait
    "clh.aside.adopt": ("clh",),            # back from aside, passed over: pred not yet adopted
    # a queue kind's waiter that stepped aside (base/wait.pxi, docs/design.md §7.0)
    "aside.marked": ("ticket", "mcs", "clh"),   # place left or kept, aside mark set, before its sleep
    "aside.vip": ("ticket", "mcs", "clh"),  # took the VIP turn, not yet rejoined
    "futex.wait.announced": ("futex",),     # waiter set the W bit, before sleeping
    "futex.release.swapped": ("futex",),    # word swapped to 0, before the wake
    "futex.recover.flagged": ("futex",),    # recoverer set owner_died, before the release
    # passed only by a resumable wait (docs/design.md §5): the generic matrices of
    # tests/test_crashpoints.py and tests/test_double_death.py run blocking participants,
    # tests/test_nbwait.py kills a resumable waiter at each
    "pi.async.marked": ("pi",),             # async waiter's mark up, asyncw not yet set
    "pi.async.unmarked": ("pi",),           # its mark down, the flag not yet looked at
    # the reader-writer lock (toolbox/rwlock.pxi), an object, not a kind of KINDS
    "rwlock.read.raised": ("rwlock",),      # indicator raised, writer word not yet read
    "rwlock.read.blocked": ("rwlock",),     # indicator tagged blocked, before the wake
    "rwlock.write.announced": ("rwlock",),  # writer word names us, readers not drained
    "rwlock.write.drained": ("rwlock",),    # readers drained, holder not yet recorded
    "rwlock.write.holder": ("rwlock",),     # holder recorded, state not yet HOLDING
    "rwlock.release.releasing": ("rwlock",),  # state RELEASING, holder still recorded
    "rwlock.release.unholder": ("rwlock",),   # holder cleared, writer word still ours
    "rwlock.release.freed": ("rwlock",),    # writer word free, state not yet NONE
    "rwlock.recover.flagged": ("rwlock",),  # recoverer set the verdict, word not yet free
    # participants that grow (base/participants.pxi reg_grow), passed by a registration of
    # any kind or object that finds every provisioned slot taken: "region", no kind's code
    "region.grow.locked": ("region",),      # directory mutex held, nothing provisioned
    "region.grow.slots": ("region",),       # the new slots provisioned, the bodies not
    "region.grow.bodies": ("region",),      # every body provisioned, part_hwm not published
    "region.grow.published": ("region",),   # part_hwm published, directory mutex still held
    # a table's compact ticket stripe (kinds/ticketc.pxi): "table", passed only by a
    # LockTable(kind="ticket")'s stripes, not by a lock of KINDS (tests/test_table_ticket.py)
    "ticketc.acquire.took": ("table",),     # fetch_add done, tagged ticket not yet published
    "ticketc.try.took": ("table",),         # a free stripe taken by CAS, not yet published
    "ticketc.ticketless.took": ("table",),  # the same, by a waiter whose marker is queued
    "ticketc.abandon.counted": ("table",),  # marks counted, own omark not yet set
    "ticketc.abandon.marked": ("table",),   # own omark set, before the serving check
    "ticketc.release.served": ("table",),   # serving moved, before the marks check / wake
    "ticketc.release.claimed": ("table",),  # an abandoned ticket's marker claimed, not passed
    "ticketc.release.skipped": ("table",),  # it was passed, its marker not yet cleared
    "ticketc.release.granted": ("table",),  # granted, own tagged ticket not yet cleared
    "ticketc.recover.flagged": ("table",),  # recoverer gave its verdict, before the grant
    # a table's compact mcs stripe (kinds/mcsc.pxi): "table", passed only by a
    # LockTable(kind="mcs")'s stripes (tests/test_table_mcs.py kills each)
    "mcsc.acquire.joined": ("table",),      # tail taken, own pred not yet published
    "mcsc.acquire.pred": ("table",),        # pred published, hint not yet linked
    "mcsc.redirect.pred": ("table",),       # a successor's pred names the holder, tail not yet
    "mcsc.grant.moved": ("table",),         # granted: successor link moved, node not yet idle
    "mcsc.release.emptied": ("table",),     # tail emptied by its holder, before return
    "mcsc.pass.emptied": ("table",),        # passed-through last node: tail emptied, node not idle
    "mcsc.release.passing": ("table",),     # successor redirected, passed node not yet idle
    "mcsc.recover.flagged": ("table",),     # recoverer set the verdict, before the release
    # a table's compact clh stripe (kinds/clhc.pxi): "table", passed only by a
    # LockTable(kind="clh")'s stripes (tests/test_table_clh.py kills each)
    "clhc.acquire.joined": ("table",),      # tail taken, own pred not yet published
    "clhc.acquire.pred": ("table",),        # pred published, before checking it
    "clhc.grant.head": ("table",),          # granted: the head names our node, pred's not adopted
    "clhc.wait.reclaiming": ("table",),     # taking an abandoned predecessor's pred
    "clhc.abort.stepped_out": ("table",),   # tail given back, own node not yet reclaimed
    "clhc.abandon.left": ("table",),        # own node ABANDONED, its waiters not yet woken
    "clhc.release.named": ("table",),       # the head's passage named in own line, not freed
    "clhc.release.freed": ("table",),       # the head's node freed, before the release returns
    "clhc.recover.flagged": ("table",),     # recoverer gave the verdict, before the release
    "clhc.aside.left": ("table",),          # own node ASIDE (place kept), not yet marked aside
    "clhc.aside.passed": ("table",),        # passed a node aside at its turn, before the wake
    "clhc.aside.back": ("table",),          # own node taken back from ASIDE, before the wait
    "clhc.aside.adopt": ("table",),         # back from aside, passed over: pred not yet adopted
    # a multi-acquire (table/table.pxi: LockTable.hold, hold_all and their async forms),
    # passed after each lock it takes: "hold", no kind's code (tests/test_sharding.py)
    "hold.took": ("hold",),                 # a lock taken, the next not yet asked for
}


@cython.binding(True)        # a real signature on 3.13 too, where a METH_NOARGS builtin
def _crashpoints():          # shows "(self, /)" to inspect and stubtest
    """The crash points this build has: {name: kinds that pass through it}."""
    return dict(_CRASHPOINTS)


#: a name with one of these prefixes is the library's: a typo in one fails the import
_LIB_PREFIXES = tuple(sorted({n.split(".")[0] + "." for n in _CRASHPOINTS}))
_user_point = None          # [name, passes to let by, signal] while a user point is armed
_user_names_ok = set()      # names crashpoint() has checked: not the library's


def _user_crashpoint(name):     # shmlocks.crashpoint (here `crashpoint` is the C one)
    """crashpoint(name) -> None

    A crash point in your own code (docs: README "Testing your recovery"). Does nothing
    unless the process runs with SHMLOCKS_CRASHPOINT=name (or name:N, the N-th pass), when
    the process SIGKILLs itself here. A name of the library's own points (or with their
    prefixes) is refused with ValueError."""
    global _user_point
    if name not in _user_names_ok:
        if not isinstance(name, str):
            raise TypeError(f"crash point name must be a str, not {type(name).__name__}")
        if name in _CRASHPOINTS or name.startswith(_LIB_PREFIXES):
            raise ValueError(f"{name!r} is a name of shmlocks' own crash points "
                             f"(prefixes {', '.join(_LIB_PREFIXES)}): pick another")
        if not name or ":" in name:
            raise ValueError(f"crash point name {name!r} could never be armed: "
                             "SHMLOCKS_CRASHPOINT is NAME or NAME:N (N the pass)")
        _user_names_ok.add(name)
    u = _user_point
    if u is None or u[0] != name:
        return
    if u[1] > 0:
        u[1] -= 1
        return
    _user_point = None
    import os
    os.kill(os.getpid(), u[2])


def _arm_crashpoint_from_env():
    import os
    spec = os.environ.get("SHMLOCKS_CRASHPOINT")
    if not spec:
        return
    _arm_crashpoint(spec, os.environ.get("SHMLOCKS_CRASHPOINT_ACTION", "kill"))


def _arm_crashpoint(spec, action="kill", _Lock only=None):
    """Arm crash point NAME or NAME:N (a library point or a user one) in this process, as
    SHMLOCKS_CRASHPOINT does at import (shmlocks.testing arms a child with it). ``only``:
    lock.acquire.done fires for that lock alone (its hold, whichever object of this
    process took it)."""
    global _user_point, shm_crash_only_ino, shm_crash_only_lock1
    import signal as _signal
    name, sep, nth = spec.partition(":")
    if sep and not (nth.isdigit() and int(nth) >= 1):
        raise ValueError(f"SHMLOCKS_CRASHPOINT={spec!r}: NAME or NAME:N, N the pass (1, 2, ...)")
    if action not in ("kill", "stop"):
        raise ValueError(f"SHMLOCKS_CRASHPOINT_ACTION={action!r}: 'kill' (SIGKILL there, the "
                         "default) or 'stop' (SIGSTOP there, once: a stalled process)")
    skip = int(nth) - 1 if sep else 0
    if only is not None:
        if name != "lock.acquire.done":
            raise ValueError("only= applies to lock.acquire.done")
        only._check()
        shm_crash_only_ino = only.rm.ino
        shm_crash_only_lock1 = only._lock1
    if name not in _CRASHPOINTS:
        if name.startswith(_LIB_PREFIXES) or not name:
            raise ValueError(f"SHMLOCKS_CRASHPOINT={name!r} is not a crash point of this build "
                             f"(see shmlocks._crashpoints())")
        _user_point = [name, skip,
                       _signal.SIGSTOP if action == "stop" else _signal.SIGKILL]
        return
    b = name.encode()
    memcpy(shm_crash_name, <const char*>b, len(b))
    shm_crash_name[len(b)] = 0
    global shm_crash_armed, shm_crash_signal, shm_crash_skip
    if action == "stop":
        shm_crash_signal = SIGSTOP
    shm_crash_skip = skip
    shm_crash_armed = 1


def _trace_open(size_t entries=1 << 16):
    """Start the debug trace (SHMLOCKS_DEBUG builds): a ring of `entries` (a power of two)
    events shared with every process forked after this call. False if this build has no
    trace. For diagnosing protocol bugs (shmlocks torture uses it); not API."""
    global shm_trace_ring, shm_trace_count, shm_trace_mask
    cdef void* m
    if not SHM_TRACE_BUILT:
        return False
    if entries == 0 or entries & (entries - 1):
        raise ValueError("entries must be a power of two")
    if shm_trace_ring != NULL:
        return True
    m = mmap(NULL, SHM_LINE + entries * sizeof(shm_trace_ent), PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS, -1, 0)
    if m == MAP_FAILED:
        raise OSError("mmap of the trace ring failed")
    shm_trace_count = <uint64_t*>m
    shm_trace_mask = entries - 1
    shm_trace_ring = <shm_trace_ent*>(<char*>m + SHM_LINE)
    return True


def _trace_dump(size_t last=4096):
    """The last `last` events of the debug trace, oldest first: (seq, pid, tid, what, a, b,
    c). Only meaningful in the process that called _trace_open() (and its forks)."""
    cdef uint64_t n, i, lo
    cdef shm_trace_ent* e
    if shm_trace_ring == NULL:
        return []
    n = ld64_acq(shm_trace_count)
    lo = n - last if n > last else 0
    if n - lo > shm_trace_mask + 1:
        lo = n - (shm_trace_mask + 1)
    out = []
    for i in range(lo, n):
        e = &shm_trace_ring[i & shm_trace_mask]
        if ld64_acq(&e.seq) != i + 1:
            continue
        out.append((i, e.pid, e.tid, (<const char*><size_t>e.what).decode(), e.a, e.b, e.c))
    return out


participants_init()
_arm_crashpoint_from_env()
