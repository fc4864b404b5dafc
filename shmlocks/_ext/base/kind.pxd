# kind.pxd -- the kind contract: what a lock kind provides, and what it may use.
#
# A kind (ticket, mcs, clh, futex, robust, pi: one unit each in kinds/) is
#   1. a cdef class deriving from _Lock (below) that sets the class facts (kind_name, a key
#      of shmlocks.KINDS; kind_code, its SHM_KIND_* code, stored in the directory and the
#      body; fifo; recovery, "user" or "kernel"; priority_inheritance) and overrides the
#      hooks marked HOOK below, all `noexcept nogil`, so they run with or without the GIL;
#   2. a named view of the lock body's words A and B it uses (shm_body.wa, .wb: anonymous
#      lines), in its .pxd, as qspinlock_types.h names the parts of its word (ticket_next,
#      ticket_serving; queue_tail with tail_last/tail_prev; fx_state; pm_mutex, pm_word),
#      with the word table at the top of its .pxi saying what each part means; and the
#      node lines if it queues (shm_qnode, shm_tslot, shm_prec: shm_layout.h);
#   3. registered at the end of its .pxi: _register_kind(cls, init, recover, repair).
#
# Every hook returns one of the result codes (R_*, below). A blocking wait is park() (with
# the ready and dep callbacks below: base/wait.pxd), so that every kind sleeps, wakes, runs
# signal handlers and looks for deadlocks alike.
#
# What a kind may use, besides this file and the system ABI (sys/sys.pxd: the body's
# layout, the atomics, futex, crash points, dassert, trace):
#   base/participants.pxd  rmap_t (the region's validated geometry: P, part[]), the holder
#                          ids, participant_op/_dead/_try_recover, participants_settle,
#                          recover_verdict ([V]), holder_forget, and a recovery's context
#                          (recov_t: recover_until, recover_wait_check)
#   base/wait.pxd          wait_t (the policy's state: deadline, backoff), park(),
#                          watch_word, watch_participant, wake_if_parked, and for a kind
#                          that sleeps in its own way (robust, pi) the policy's steps
#   kinds/queue.pxd        (a queue lock) the tail word and pass record codecs, a
#                          successor found from the tail
# It needs nothing of diag/ (the base class counts, checks lock order and looks for
# deadlocks for every kind alike), nor of another kind but what it derives from (pi:
# robust's _PthreadMutexLock); tests/test_layers.py checks that nothing below the kinds
# uses them.
#
# rmap_t, reg_t, recov_t (base/participants.pxd) and wait_t (base/wait.pxd) are opaque
# here: this file only names them.

cdef struct rmap_t
cdef struct reg_t
cdef struct wait_t
cdef struct recov_t

# ---- the result codes: every hook, park() and the wait policy's steps return one -------
cdef enum:
    R_TIMEOUT = 0      # the deadline passed (or a deadlock's victim gives up)
    R_ACQ = 1          # acquired; for a wait: what it waited for holds (ready said READY)
    R_ACQ_DIED = 2     # acquired, after the holder died
    R_PENDING = 3      # _fast: enqueued, _wait goes on
    R_BUSY = 4         # _fast, _try: held by another, nothing changed
    R_CONT = 5         # the wait layer: go on (poll again; a check found nothing)
    R_PARK = 6         # the wait layer: spinning and yielding are over, park
    R_TICK = 7         # the wait layer: a park slice ended, tick and wait again
    R_WOULDBLOCK = 8   # a non-blocking wait (wait_t.nb) would sleep now: its place is kept,
                       # its watch set is in the wait_t; re-enter _wait with w.resume_rc
    R_ASIDE = 9        # a FIFO waiter found no spinner seat (wait_t.aside): park() returns it
                       # before spinning; the kind leaves its place as at a timeout and passes
                       # it up, and the waiter parks aside (docs/design.md §7.0)
    R_SIGNAL = -1      # a Python signal handler raised
    R_NOTREC = -2      # the lock is not recoverable
    R_CORRUPT = -3     # its shared state is corrupt
    R_BOUND = -4       # a bounded semaphore released past its initial value (toolbox)

# ---- the ops table: what the layers below the kinds need of one -------------------------
# Filled by _register_kind, indexed by kind code; no layer below names a kind.
#   init(b)           a new lock body, after ctl and the repair mutex (NULL: all zero will do);
#                     its per-participant state for the participants provisioned so far
#                     (participants.pxd body_hwm: stable, the directory mutex is held)
#   grow(b, lo, hi)   participants [lo, hi) are being provisioned (docs/design.md §2): their
#                     nodes and precs are zero; set up what init sets up for a participant
#                     (NULL: zero will do). Called under the directory mutex, before the
#                     region publishes hi as its part_hwm, so nobody uses them yet
#   recover(rm, b, q, rc)
#                     complete dead participant q's protocol on this lock (docs/design.md
#                     §6), under the lock's repair mutex if `repair` is set (a user-recovered
#                     kind), each wait inside bounded by the recoverer's context rc
#                     (participants_settle, recover_until, recover_wait_check: a wait cut
#                     short sets rc.cut, and the kind decides nothing more); a kind whose
#                     owner deaths the kernel reports (robust, pi) only forgets q's holder id
#                     (holder_forget), with repair 0.
ctypedef void (*kind_init_fn)(shm_body* b) noexcept nogil
ctypedef void (*kind_grow_fn)(shm_body* b, uint32_t lo, uint32_t hi) noexcept nogil
ctypedef void (*kind_recover_fn)(rmap_t* rm, shm_body* b, uint32_t q,
                                 recov_t* rc) noexcept nogil

cdef struct kind_ops_t:
    kind_init_fn init
    kind_recover_fn recover
    bint repair
    kind_grow_fn grow
    uint32_t fixed_nodes    # node lines it uses by index, whatever its participants (the
                            # ticket's slots, a toolbox object's journal): provisioned with
                            # the body (docs/design.md §2); at most P + 1 are (shm_fixed_nodes)
    kind_recover_fn stripe_recover  # a compact stripe's recover, if the kind has a stripe
                            # protocol of its own (_register_stripe: ticket, mcs, clh); NULL:
                            # recover
    kind_init_fn stripe_init  # a compact stripe's init, if not the body's (clh); NULL: init

cdef int _register_kind(type cls, kind_init_fn init, kind_recover_fn recover,
                        bint repair, kind_grow_fn grow=*, uint32_t fixed_nodes=*) except -1
cdef kind_ops_t* kind_ops(uint32_t code) noexcept nogil
cdef uint32_t kind_code_of(kind) except 0
cdef object kind_new_lock(uint32_t code, object region, uint32_t index, object name)
# a table's compact stripe of kind `code`: the class a kind registered for its stripes
# (_register_stripe: ticket's TicketStripe, ticketc.pxi; mcs's MCSStripe, mcsc.pxi), else
# its lock class
cdef object kind_new_stripe(uint32_t code, object region, uint32_t index, object name)
cdef int _register_stripe(type cls, kind_recover_fn recover, kind_init_fn init=*) except -1
cdef list _KIND_CLASSES                 # the registered classes, in registration order

# The synchronization toolbox's objects (docs/design.md §12) live in the directory beside
# the locks, with kind codes of their own and entries in the same ops table, but are not
# locks (not in KINDS): the toolbox layer registers them with _register_object and fills
# g_tb_api with what Region's toolbox methods call.
cdef dict _OBJ_BY_CODE                  # object kind code -> its class
cdef dict g_tb_api                      # Region method name -> the toolbox's function
cdef int _register_object(type cls, kind_init_fn init, kind_recover_fn recover,
                          bint repair) except -1
cdef object kind_new_object(uint32_t code, object region, uint32_t index, object name)

# How a lock object is made for a directory entry (kind_new_lock): the lock layer's binder,
# set by lock/lockbase.pxi, called with the class registered for the entry's kind.
ctypedef object (*kind_bind_fn)(type cls, object region, uint32_t index, object name)
cdef kind_bind_fn g_kind_bind

# ---- waiting: park()'s callbacks (park() itself: base/wait.pxd) --------------------------
# ready(ctx): is the wait over? READY, or not yet: NEAR (next in line, or unknown), FAR (at
# least one other waiter is ahead: the lock cannot come within one hand-off, so the
# policy yields rather than spins).
ctypedef int (*ready_fn)(void* ctx) noexcept nogil

cdef enum:
    Q_NEAR = 0
    Q_READY = 1
    Q_FAR = 2

# What a parked waiter sleeps on (docs/design.md §5): one futex_waitv on the park word and
# on the words of what it depends on: the liveness token of the participant it waits
# behind (watch_participant: armed with FUTEX_WAITERS, so that the kernel, which rewrites
# the token at that participant's death, wakes it), and the words whose change means "the
# one I depend on is no longer that one" (watch_word), which their writers wake.
cdef struct watch_t:
    uint32_t* words[SHM_WAITV_MAX]
    uint32_t vals[SHM_WAITV_MAX]
    int n
    int token               # the index of the armed liveness token in words, or -1
    uint32_t slot           # whose token it is
    recov_t* rec            # the sleeper's recovery context: a death found while filling
                            # the set is recovered by the sleeper's deadline (park sets it)

cdef enum:
    DEP_UNKNOWN = 0   # whom we depend on is not known now (a step in flight): sleep a slice
    DEP_ARMED = 1     # they are watched: sleep until woken, the deadline or the next look
    DEP_CHANGED = 2   # one died and was recovered, or left: look again before sleeping

cdef struct park_t
# dep(pk, ws): fill the watch set (word 0, the park word, is there already) with whom the
# waiter depends on, checking it first: a dead one is recovered here
# (participant_try_recover, by ws.rec) and answers DEP_CHANGED; DEP_ARMED once watched;
# DEP_UNKNOWN when it cannot be known now (the sleep is then one slice). Each word's value is read
# BEFORE the state it is read to mean, so that a change after the read wakes the sleep.
ctypedef int (*dep_fn)(park_t* pk, watch_t* ws) noexcept nogil

cdef struct park_t:
    ready_fn ready          # is the wait over? Q_READY, Q_NEAR or Q_FAR
    void* ctx               # ready's argument
    uint32_t* word          # the futex word the waker changes ...
    uint32_t* parked        # ... and wakes if this count of parked waiters is not 0
    dep_fn dep              # whom we depend on: armed before each sleep (NULL: nobody)
    rmap_t* rm              # dep's arguments
    shm_body* b
    uint32_t arg

# ---- the base class --------------------------------------------------------------------
cdef class _Lock:
    # what a kind reads: its region's geometry (rm.P, rm.part) and its lock's body (b.ctl,
    # b.wa, b.wb, the node lines), its kind code and its index + 1 (as published in op_lock)
    cdef object _region               # the Region (lock/lockbase.pxi casts it)
    cdef rmap_t* rm
    cdef shm_body b
    cdef bint _closed
    cdef bint _standalone
    cdef str _name
    cdef uint32_t _code
    cdef uint32_t _lock1
    cdef object __weakref__           # caches keyed by lock (WeakKeyDictionary)
    cdef str _ldcls                   # its lockdep class, once asked (diag/lockdep.pxi)
    cdef object _coh                  # the asyncio cohort its tasks used last (lockbase.pxi)

    # (This order is the vtable's, kept as it was before this file: _bind, _me, _me_by, the
    # hooks, the rest; a method added since, as _held_by_tid, goes last. The fast path's
    # calls through the vtable then stay the same instructions.)
    # -- the base's own: the Python API on the hooks (lock/lockbase.pxi); a kind neither
    #    calls nor overrides these, except _bind (pi checks its namespace there) --
    cdef _bind(self, object region, uint32_t i, name)
    cdef inline reg_t* _me(self) except NULL
    cdef reg_t* _me_by(self, int64_t deadline) except NULL

    # HOOK _fast(me, armed): the uncontended attempt by participant `me`. R_ACQ, R_PENDING
    #   (enqueued: _wait goes on) or R_BUSY (nothing changed); R_BUSY without side effects
    #   when `me` is already engaged on this lock (holding or queued). `armed`: crash points
    #   are armed (shm_crash_armed, read once per Python call): pass it to crashpoint_at.
    cdef int _fast(self, uint32_t me, bint armed) noexcept nogil
    # HOOK _try(me): a non-blocking attempt that leaves no trace: R_ACQ (R_ACQ_DIED) or
    #   R_BUSY; R_NOTREC, R_CORRUPT.
    cdef int _try(self, uint32_t me) noexcept nogil
    # HOOK _wait(me, rc, w): the slow path, after _fast returned rc (R_PENDING or R_BUSY),
    #   under the wait policy w (a deadline of 0: leave at once): R_ACQ, R_ACQ_DIED,
    #   R_TIMEOUT, R_SIGNAL, R_NOTREC or R_CORRUPT, leaving the lock fully usable for
    #   others whatever the outcome. With w.nb set (a non-blocking driver, docs/design.md
    #   §5 "Resumable waits") also R_WOULDBLOCK where it would sleep: it keeps its place,
    #   records in w.resume_rc the rc to re-enter with, and its watch set is in w.
    cdef int _wait(self, uint32_t me, int rc, wait_t* w) noexcept nogil
    # HOOK _unlock(me, armed): release by the holder `me` (the holder record is already
    #   cleared): 0, or R_CORRUPT.
    cdef int _unlock(self, uint32_t me, bint armed) noexcept nogil
    # HOOK _is_locked(): a snapshot, for locked() and inspect (default: a holder record).
    cdef bint _is_locked(self) noexcept nogil
    # _waiters(): live participants that published that they wait (not a hook).
    cdef int _waiters(self) noexcept nogil
    # HOOK _consistent(): make the kind's own state consistent after an owner death, before
    #   a release with OWNER_DIED (robust, pi: pthread_mutex_consistent; default nothing).
    cdef int _consistent(self) noexcept nogil
    # -- the base's own, continued --
    cdef inline reg_t* _me_fast(self) noexcept nogil
    cdef inline bint _got_fast(self, reg_t* r, int rc, bint armed) noexcept nogil
    cdef object _got(self, reg_t* r, int rc, bint armed)
    cdef inline int _take_fast(self, reg_t* r, bint armed) noexcept nogil
    cdef object _acquire_rest(self, reg_t* r, int rc)
    cdef object _got_flags(self, reg_t* r, int rc)
    cdef str _lockdep_class(self)
    cdef object _acquire_lockdep(self, blocking, timeout)
    cdef object _acquire_forever(self, reg_t* r)
    cdef object _acquire_args(self, blocking, timeout)
    cdef int _withdraw(self, reg_t* r, int rc) except? -100
    cdef bint _waiting_via_other_view(self, reg_t* r) noexcept nogil
    cdef bint _held_via_other_view(self, reg_t* r) noexcept nogil
    cdef _raise_deadlock(self)
    cdef object _acquire_slow(self, reg_t* r, int rc, int64_t deadline)
    cdef inline reg_t* _holding_me(self) noexcept nogil
    cdef inline int _unhold(self, reg_t* r, bint armed) noexcept nogil
    cdef int _release(self) except -1
    cdef int _release_rest(self, reg_t* r, int rc) except -1
    cdef int _check_held_across_close(self) except -1
    cdef int _not_owner(self, reg_t* r) except -1
    cdef int _release_handing_on(self) except -1
    cdef int _check(self) except -1
    cdef bint _handing_on(self)

    # HOOK _held_by_tid(tid): (kernel-recovered kinds) does the lock word name thread `tid`
    #   as its owner, or say its owner died? For inspect's view of a dead holder.
    cdef bint _held_by_tid(self, uint32_t tid) noexcept nogil
    # HOOK _dead_holder(): (kernel-recovered kinds) (pid, tid, pidns) of a holder that died
    #   holding and whose slot was recovered (so no holder record names it any more) while
    #   nobody has taken the lock since, or None (default: None). docs/design.md §7.4 [R1].
    cdef object _dead_holder(self)
    # HOOK _died_taken(): a hold begins with R_ACQ_DIED: forget what _dead_holder kept
    #   (default: nothing). Off the fast path (_got_flags).
    cdef void _died_taken(self) noexcept nogil
    # -- the base's own, added since (docs/design.md §14): does an asyncio cohort of the
    #    calling thread's loop hold or await the lock (the slow path, rm.agents > 0)?
    cdef bint _task_of_mine(self, reg_t* r) noexcept nogil
    cdef int _wait_aside(self, uint32_t me, int rc, wait_t* w) noexcept nogil
    # HOOK _aside_end(me, rc): (a kind that steps aside, docs/design.md §7.0) its waiter's
    #   sleep aside ended with rc: R_CONT (its VIP turn: rejoin; R_PENDING or R_BUSY for
    #   _wait to go on, or what _fast returned), else R_TIMEOUT / R_SIGNAL (the wait is
    #   over: a place it kept while aside is left; R_ACQ if granted meanwhile). Default:
    #   _fast on R_CONT (ticket, mcs left their place as they stepped aside).
    cdef int _aside_end(self, uint32_t me, int rc) noexcept nogil
