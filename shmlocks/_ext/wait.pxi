# wait.pxi -- the one waiting policy every kind uses (docs/design.md §5).
#
#   spin   poll the condition with one cpu_relax between polls (a batch of pauses would
#          delay every hand-off by its length). The budget adapts per participant and
#          lock: doubled (to SPIN_MAX_NS) when a wait ended while spinning, or while
#          yielding with the CPU to itself (the holder ran elsewhere: a longer spin would
#          have caught it), or parked but was over within PARKED_SHORT_NS (the wake-up cost
#          more than the spin would have); halved (to SPIN_MIN_NS) when a yield let another
#          task run or a park was long, so a waiter that shares a CPU with the holder stops
#          burning the holder's time slice.
#          The barging kinds (futex, robust, pi) back off: the pauses between two polls
#          double, up to BACKOFF_MAX. Each poll of the lock word takes its cache line from
#          the holder, who re-takes the lock at once after releasing it; polled less, it
#          runs more sections per line transfer: more throughput, at a cost to hand-offs
#          (commit 1acfa2b has the measurements). FIFO kinds hand the lock to the
#          waiter, which must see it at once: one pause per poll.
#   far    a waiter that knows others are ahead of it (ticket: two or more tickets to be
#          served first; MCS, CLH: its predecessor waits too) yields instead of spinning, for up
#          to FAR_YIELD_NS: on an oversubscribed machine the next holder may need this CPU;
#   yield  sched_yield a few times (lets a descheduled holder run on an oversubscribed box);
#          while no yield lets another task run (this CPU has nothing else to do), go on
#          yielding for up to YIELD_IDLE_NS before parking: the holder may itself be waking
#          from a park, and parking then too makes a convoy in which every hand-off of a
#          FIFO lock costs a wake-up (commit d11b846 has the measurements);
#   park   announce (parked += 1), re-check, FUTEX_WAIT on the word for at most PARK_SLICE_NS,
#          then check the deadline (CLOCK_MONOTONIC) and, with the GIL re-taken briefly,
#          Python's signal handlers (Ctrl-C -> R_SIGNAL within one slice); with ticks on,
#          return R_TICK after each slice so the kind can check that the participant it
#          depends on is still alive (and recover it if not), then wait again.
#
# The waker's side of the protocol, which makes a lost wake-up impossible:
#     make the condition true (SC store/RMW); [change *word (SC)]; if load(parked) != 0: FUTEX_WAKE
# The waiter announces (SC) before it reads the word and re-checks, so either the waker sees
# the announcement, or the waiter's re-check sees the condition; a FUTEX_WAIT on a stale
# value returns EAGAIN at once.
#
# The GIL: a kind's _wait starts with the caller's GIL held when w.gil is set (no other
# thread of this process is registered on the region, so the holder cannot need our GIL);
# it is released (wait_nogil) before the first yield, park or blocking call, and re-taken
# by the caller (wait_regil) after _wait returns. Otherwise _wait runs without it.

# The one set of result codes: what a kind's step returns (the kinds' internal interface,
# lockbase.pxi), what park() returns, and what the wait layer's steps below return.
cdef enum:
    R_TIMEOUT = 0      # the deadline passed (or a deadlock's victim gives up)
    R_ACQ = 1          # acquired; for a wait: what it waited for holds (ready said READY)
    R_ACQ_DIED = 2     # acquired, after the holder died
    R_PENDING = 3      # _fast: enqueued, _wait goes on
    R_BUSY = 4         # _fast, _try: held by another, nothing changed
    R_CONT = 5         # the wait layer: go on (poll again; a check found nothing)
    R_PARK = 6         # the wait layer: spinning and yielding are over, park
    R_TICK = 7         # the wait layer: a park slice ended, tick and wait again
    R_SIGNAL = -1      # a Python signal handler raised
    R_NOTREC = -2      # the lock is not recoverable
    R_CORRUPT = -3     # its shared state is corrupt

cdef int64_t SPIN_NS = 4000          # first budget: about one cross-core hand-off
cdef int64_t SPIN_MIN_NS = 200
cdef int64_t SPIN_MAX_NS = 16000
cdef int64_t PARKED_SHORT_NS = 32000  # a wait this short, park and wake-up included, came within a spin
cdef int YIELD_ROUNDS = 6
cdef uint32_t BACKOFF_MAX = 64       # pauses between two polls, at most
cdef int64_t YIELD_IDLE_NS = 50000   # yielding with nothing else to run, then park
cdef int64_t FAR_YIELD_NS = 2000000  # 2 ms of yielding behind other waiters, then park
cdef int64_t YIELD_SWITCHED_NS = 1500  # a sched_yield this long ran another task
cdef uint32_t SPIN_CLOCK_EVERY = 8   # polls per clock read while spinning
cdef int64_t PARK_SLICE_NS = 5000000  # 5 ms: bounds the time to notice a dead holder


def _wait_policy(spin_ns=None, yield_rounds=None, backoff_max=None):
    """Read (and for experiments, set) the wait policy:
    (spin_ns, yield_rounds, slice_ns, backoff_max)."""
    global SPIN_NS, YIELD_ROUNDS, BACKOFF_MAX
    if spin_ns is not None:
        SPIN_NS = spin_ns
    if yield_rounds is not None:
        YIELD_ROUNDS = yield_rounds
    if backoff_max is not None:
        BACKOFF_MAX = max(1, int(backoff_max))
    return (SPIN_NS, YIELD_ROUNDS, PARK_SLICE_NS, BACKOFF_MAX)

# A ready function answers READY (1), NEAR (0: not yet, but next in line or unknown) or
# FAR (2: at least one other waiter is ahead, so the lock cannot come within one hand-off).
ctypedef int (*ready_fn)(void* ctx) noexcept nogil

cdef enum:
    Q_NEAR = 0
    Q_READY = 1
    Q_FAR = 2

cdef struct node_wait_t:   # a queue lock's ready-function context (MCS, CLH)
    shm_qnode* n           # the node whose state the waiter watches
    shm_qnode* nodes       # the lock's nodes, for the far hint (an id read from shm)
    uint32_t count         # how many: ids 1..count

cdef extern from "Python.h":
    ctypedef struct PyThreadState
    PyThreadState* PyEval_SaveThread() nogil
    void PyEval_RestoreThread(PyThreadState*) nogil

cdef struct wait_t:
    PyThreadState* saved    # the GIL, released by wait_nogil (NULL: not released here)
    int gil                 # 1 while the caller's GIL is still held (see wait_nogil)
    int64_t deadline        # absolute CLOCK_MONOTONIC ns; -1 = wait forever; 0 = do not wait
    int64_t t0              # when the wait began (its first clock read; 0 = not yet)
    int64_t spin_until
    int64_t spin_ns         # this wait's spin budget
    int phase               # 0 spin, 1 yield, 2 park
    int yields
    uint32_t polls          # spin polls so far (the clock is read every SPIN_CLOCK_EVERY)
    int64_t far_until       # end of the far-waiter yield phase (0 = not started)
    int far                 # 1 once this wait yielded as a far waiter
    int switched            # 1 once a yield of this wait let another task run here
    uint32_t backoff        # barging kinds: pauses between polls, doubling to BACKOFF_MAX
                            # (0: FIFO kinds, one pause per poll)
    int64_t dl_next         # when to look for a deadlock next (deadlock.pxi); -1: never
    void* dl_lock           # the waiting _Lock (borrowed: the acquire holds a reference)
    uint32_t dl_slot        # its participant slot
    int dl_hit              # 1: a deadlock's victim, withdrawing as on a timeout
    rmap_t* rm              # the waiter's region: hidden while Python code runs (its
                            # re-entry window, participants.pxi); NULL: none


cdef inline void wait_init(wait_t* w, int64_t deadline, uint32_t* budget=NULL) noexcept nogil:
    w.saved = NULL
    w.gil = 0
    w.deadline = deadline
    w.spin_ns = SPIN_NS
    if budget != NULL and budget[0] != 0:
        w.spin_ns = budget[0]
    w.t0 = 0
    w.spin_until = 0
    w.phase = 0
    w.yields = 0
    w.polls = 0
    w.far_until = 0
    w.far = 0
    w.switched = 0
    w.backoff = 0
    w.dl_next = -1
    w.dl_lock = NULL
    w.dl_slot = 0
    w.dl_hit = 0
    w.rm = NULL


cdef inline void wait_nogil(wait_t* w) noexcept nogil:
    """Release the GIL if the caller still holds it: before the first yield, far yield,
    park or blocking call. The spin phase keeps it (a release and re-take would add two
    GIL transfers to every contended hand-off); the caller re-takes it with wait_regil."""
    if w.gil:
        w.gil = 0
        w.saved = PyEval_SaveThread()


cdef inline void wait_regil(wait_t* w) noexcept nogil:
    if w.saved != NULL:
        PyEval_RestoreThread(w.saved)
        w.saved = NULL


# The look for a deadlock a long wait makes (deadlock.pxi sets it to its dl_look at import,
# so this layer names nothing above it): 1 this waiter must give up, 0 go on, -1 a signal.
ctypedef int (*look_fn)(wait_t* w, int64_t now) noexcept nogil
cdef look_fn wait_look = NULL


cdef int wait_check(wait_t* w) noexcept nogil:
    """Deadline, signals, and (once its time has come) a look for a deadlock this waiter
    must break (wait_look). R_CONT to go on, else R_TIMEOUT or R_SIGNAL."""
    cdef int64_t now = shm_now_ns()
    cdef int r = R_CONT
    cdef int entered
    if w.deadline >= 0 and now >= w.deadline:
        return R_TIMEOUT
    # Python code runs from here (handlers; the look's own code, and any finalizer): the
    # waiting participant is hidden, so a lock call on its region is refused (re-entry)
    entered = window_enter(w.rm)
    with gil:
        if PyErr_CheckSignals() < 0:
            r = R_SIGNAL
    if r == R_CONT and 0 <= w.dl_next <= now and wait_look != NULL:
        r = wait_look(w, now)           # (the look's own 1 / 0 / -1, mapped here)
        r = R_CONT if r == 0 else (R_TIMEOUT if r > 0 else R_SIGNAL)
    window_exit(entered)
    return r


cdef int64_t wait_slice(wait_t* w) noexcept nogil:
    """How long the next park may sleep: the slice, or what is left of the deadline."""
    cdef int64_t left
    if w.deadline < 0:
        return PARK_SLICE_NS
    left = w.deadline - shm_now_ns()
    if left <= 0:
        return 0
    return left if left < PARK_SLICE_NS else PARK_SLICE_NS


cdef int wait_pause(wait_t* w) noexcept nogil:
    """One step of the spin and yield phases: R_CONT (poll again), R_PARK or R_TIMEOUT."""
    cdef int64_t now, t
    cdef uint32_t i
    if w.phase == 0:
        # one pause per poll: a batch of them between two polls adds its length to every
        # hand-off
        cpu_relax()
        if w.backoff != 0:
            for i in range(w.backoff):
                cpu_relax()
            if w.backoff < BACKOFF_MAX:
                w.backoff <<= 1
        w.polls += 1
        if w.polls % SPIN_CLOCK_EVERY != 0 and w.backoff < 16:
            return R_CONT
        now = shm_now_ns()
        if w.spin_until == 0:
            w.t0 = now
            w.spin_until = now + w.spin_ns
        if w.deadline >= 0 and now >= w.deadline:
            return R_TIMEOUT
        if now >= w.spin_until:
            w.phase = 1
        return R_CONT
    if w.phase == 1:
        wait_nogil(w)
        t = shm_now_ns()
        sched_yield()
        w.yields += 1
        now = shm_now_ns()
        if now - t > YIELD_SWITCHED_NS:
            w.switched = 1                  # something else ran on this CPU meanwhile
        if w.deadline >= 0 and now >= w.deadline:
            return R_TIMEOUT
        if w.yields >= YIELD_ROUNDS and (w.switched or now - w.spin_until > YIELD_IDLE_NS):
            w.phase = 2
        return R_CONT
    return R_PARK


cdef int wait_park(wait_t* w, uint32_t* word, uint32_t expected) noexcept nogil:
    """Sleep on word while it holds `expected` (one slice), then check deadline and signals."""
    cdef int64_t sl = wait_slice(w)
    wait_nogil(w)
    if sl > 0:
        shm_futex_wait(word, expected, sl)
    return wait_check(w)


cdef int wait_far(wait_t* w) noexcept nogil:
    """One step for a waiter with others ahead of it: yield the CPU to them (on an
    oversubscribed machine the next holder may be waiting for this very CPU) rather than
    spin; park after FAR_YIELD_NS of that. R_CONT, R_PARK or R_TIMEOUT."""
    cdef int64_t now
    wait_nogil(w)
    w.far = 1
    sched_yield()
    now = shm_now_ns()
    if w.far_until == 0:
        if w.t0 == 0:
            w.t0 = now
        w.far_until = now + FAR_YIELD_NS
    if w.deadline >= 0 and now >= w.deadline:
        return R_TIMEOUT
    return R_PARK if now >= w.far_until else R_CONT


cdef int wait_for(ready_fn ready, void* ctx, uint32_t* word, uint32_t* parked,
                  wait_t* w) noexcept nogil:
    """Wait until ready(ctx). The waker changes *word and wakes it when *parked != 0.
    Returns R_TICK after each park slice (park() calls it again to go on waiting)."""
    cdef int r
    cdef int q
    cdef uint32_t v
    q = ready(ctx)
    if q == Q_READY:
        return R_ACQ
    if w.deadline == 0:
        return R_TIMEOUT
    while True:
        if q == Q_FAR and w.phase < 2:
            r = wait_far(w)
        else:
            r = wait_pause(w)
        if r == R_CONT:
            q = ready(ctx)
            if q == Q_READY:
                return R_ACQ
            continue
        if r != R_PARK:
            return r
        w.phase = 2
        wait_nogil(w)
        fadd32(parked, 1)                   # announce, SC: the waker reads parked after its change
        v = ld32_seq(word)
        if ready(ctx) == Q_READY:
            fsub32(parked, 1)
            return R_ACQ
        r = wait_park(w, word, v)
        fsub32(parked, 1)
        if r == R_SIGNAL:
            # A handler raised: the wait ends with it even if ready(ctx) now says READY.
            # For a kind's inner wait (CLH behind an abandoned node, MCS for a pass through
            # its node, ticket for an inherited ticket) READY only means "go on waiting":
            # going on with the exception set would end in a return value with an
            # exception set (SystemError). The kind leaves its place on R_SIGNAL; a lock
            # granted meanwhile is handed back by _acquire_slow.
            return R_SIGNAL
        q = ready(ctx)
        if q == Q_READY:
            return R_ACQ
        if r != R_CONT:
            return r
        return R_TICK


# park(): the one wait of the queue kinds (parking_lot's park(), with callbacks). The kind
# says what it waits for and whom it depends on; park runs the policy above and returns:
#     R_ACQ      ready(ctx) said READY (for an acquire: granted; else: the wait is over)
#     R_TIMEOUT  the deadline passed first     R_SIGNAL  a Python signal handler raised
# Each park slice ends with wait_check (deadline, signals, the deadlock look), then a
# tick: the kind's tick(rm, b, arg), which checks the participant it depends on and
# recovers it if dead (docs/design.md §6), then waiting goes on.
ctypedef void (*tick_fn)(rmap_t* rm, shm_body* b, uint32_t arg) noexcept nogil

cdef struct park_t:
    ready_fn ready          # is the wait over? Q_READY, Q_NEAR or Q_FAR
    void* ctx               # ready's argument
    uint32_t* word          # the futex word the waker changes ...
    uint32_t* parked        # ... and wakes if this count of parked waiters is not 0
    tick_fn tick            # each park slice: check (and recover) whom we depend on
    rmap_t* rm              # tick's arguments
    shm_body* b
    uint32_t arg


cdef int park(park_t* pk, wait_t* w) noexcept nogil:
    """Wait under the policy w until pk.ready says READY: R_ACQ, R_TIMEOUT or R_SIGNAL."""
    global shm_recover_sig
    cdef int res
    if SHM_DEBUG_BUILT:
        dassert(pk.ready != NULL and pk.tick != NULL and pk.word != NULL
                and pk.parked != NULL, "park: every callback and word given")
    while True:
        res = wait_for(pk.ready, pk.ctx, pk.word, pk.parked, w)
        if res != R_TICK:
            break
        pk.tick(pk.rm, pk.b, pk.arg)            # the one we depend on: alive?
        if shm_recover_sig:                     # a handler raised inside that recovery
            shm_recover_sig = 0
            res = R_SIGNAL
            break
    return res                                  # R_ACQ, R_TIMEOUT or R_SIGNAL


cdef inline void wait_adapt(wait_t* w, uint32_t* budget) noexcept nogil:
    """After a successful wait: spin longer next time if a spin would have caught the lock,
    else less. It would have when the wait ended while spinning; or when no yield of it let
    another task run here (so the holder ran on another CPU) and either it ended while
    yielding, or the whole wait, park and wake-up included, took less than PARKED_SHORT_NS.
    A wake-up can cost more than a short critical section: without that last test, a
    section about as long as a wake-up made every wait park once the budget was halved for
    it, and kept it parking, doubling the hand-off time."""
    cdef int64_t s = w.spin_ns
    cdef int64_t took = 0
    cdef bint longer
    if w.far and w.phase == 0:
        return                              # it yielded behind others: says nothing of spinning
    if w.far or w.switched:
        longer = 0                          # it waited behind others, or shared this CPU
    elif w.phase < 2:
        longer = 1
    else:
        took = shm_now_ns() - w.t0 if w.t0 != 0 else PARKED_SHORT_NS
        longer = took < PARKED_SHORT_NS
    if longer:
        # double, and at least half again what this wait took (it may have parked)
        s = s * 2 if s * 2 > took + took // 2 else took + took // 2
        s = s if s < SPIN_MAX_NS else SPIN_MAX_NS
    else:
        s = s // 2 if s // 2 > SPIN_MIN_NS else SPIN_MIN_NS
    budget[0] = <uint32_t>s


cdef inline void wake_if_parked(uint32_t* word, uint32_t* parked) noexcept nogil:
    if ld32_seq(parked) != 0:
        shm_futex_wake(word, 0x7fffffff)
