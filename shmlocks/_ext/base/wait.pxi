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
#          served first; MCS, CLH: its predecessor waits too, or (MCS) left its place) yields
#          instead of spinning, for up to FAR_YIELD_NS: on an oversubscribed machine the next
#          holder may need this CPU;
#   aside  (the queue kinds: docs/design.md §7.0) a queued waiter first takes a spinner
#          seat; with none free and others ahead of it, it steps aside (park returns
#          R_ASIDE): out of the queue (clh: its place kept), asleep, back on its VIP turn
#          (aside_sleep);
#   yield  sched_yield a few times (lets a descheduled holder run on an oversubscribed box);
#          while no yield lets another task run (this CPU has nothing else to do), go on
#          yielding for up to YIELD_IDLE_NS before parking: the holder may itself be waking
#          from a park, and parking then too makes a convoy in which every hand-off of a
#          FIFO lock costs a wake-up (commit d11b846 has the measurements);
#   park   announce (parked += 1), re-check, let the kind arm whom it depends on (dep: a
#          liveness token, and the words that say it moved), then one futex_waitv on all
#          of them until a word is woken, the deadline or the next deadlock look (the
#          futex call's own timeout): no periodic wake-up. The main thread alone takes the
#          GIL, for Python's signal handlers, before a sleep and when a signal ends one
#          (EINTR). Without futex_waitv (ENOSYS, or SHMLOCKS_WAIT=sliced): FUTEX_WAIT on
#          the word alone, PARK_SLICE_NS at most, dep run after each as a check.
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

cdef double _FOREVER_S = 1e9          # timeouts beyond ~31 years mean "wait forever"
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
cdef int64_t PARK_SLICE_NS = 5000000  # 5 ms: a sleep that cannot watch whom it depends on
cdef int g_wait_waitv = 0            # 1: sleeps are futex_waitv (wait_mode_init)
cdef uint32_t g_aside_seats = 0      # spinner seats: the CPUs this process may use - 1 (import)
cdef uint64_t g_aside_steps = 0      # this process's steps aside (_aside_stats; racy, a hint)
cdef uint64_t g_aside_vips = 0       # ... and VIP turns taken
cdef uint64_t g_aside_sleeps = 0     # ... and sleeps made aside
cdef int64_t ASIDE_NS = 1000000      # 1 ms aside, then try for the VIP turn
cdef unsigned long g_main_ident = 0  # the thread that runs Python's signal handlers


cdef str wait_mode_init(str forced):
    """Chosen once, at import: futex_waitv if the kernel has it (Linux 5.16+) unless
    SHMLOCKS_WAIT=sliced forces the fallback. Returns the mode's name."""
    global g_wait_waitv, g_main_ident
    import threading
    g_main_ident = threading.main_thread().ident
    # n = 0 is refused (EINVAL) by a kernel that has the call, ENOSYS by one that has not
    g_wait_waitv = forced != "sliced" and shm_futex_waitv(NULL, NULL, 0, -1) == -EINVAL
    _aside_init(None)
    return "futex_waitv" if g_wait_waitv else "sliced"


def _wait_after_fork():
    """The child of a fork runs its handlers in the thread that forked."""
    global g_main_ident
    g_main_ident = PyThread_get_thread_ident()


def _aside_init(seats=None, aside_ns=None):
    """The spinner seats of a FIFO lock (docs/design.md §7.0): the CPUs this process may run
    on, less one (the holder's), 1 to AS_MAX_SEATS, read at import; and how long a waiter
    stays aside before it tries for the VIP turn. For tests and experiments: set either
    (in this process). Returns (seats, aside_ns)."""
    global g_aside_seats, ASIDE_NS
    import os
    if seats is not None or g_aside_seats == 0:
        n = seats if seats is not None else len(os.sched_getaffinity(0)) - 1
        g_aside_seats = max(1, min(AS_MAX_SEATS, int(n)))
    if aside_ns is not None:
        ASIDE_NS = max(1000, int(aside_ns))
    return (g_aside_seats, ASIDE_NS)


def _aside_stats():
    """This process's waits that stepped aside, the VIP turns they took and the sleeps
    they made aside (counted since import, never reset): (steps aside, VIP turns, sleeps)."""
    return (g_aside_steps, g_aside_vips, g_aside_sleeps)


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


cdef look_fn wait_look = NULL
cdef int64_t DL_POKE_GAP_NS = 5000000      # 5 ms: two waiters that disagree cannot ping-pong


cdef bint wait_signals(wait_t* w) noexcept nogil:
    """Run Python's signal handlers if this is the thread that runs them (the main thread:
    in any other, PyErr_CheckSignals does nothing, so it never takes the GIL for it).
    1 if a handler raised."""
    cdef int r = 0
    cdef int entered
    if PyThread_get_thread_ident() != g_main_ident:
        return 0
    # Python code runs from here (handlers, and any finalizer): the waiting participant
    # is hidden, so a lock call on its region is refused (re-entry)
    entered = window_enter(w.rm)
    with gil:
        r = PyErr_CheckSignals() < 0
    window_exit(entered)
    return r


cdef int wait_walk(wait_t* w, uint32_t** pw, uint32_t* pv) noexcept nogil:
    """Before a sleep of a wait armed for the deadlock chain walk (w.dl_state, deadlock.pxi):
    its poke word and the value it holds (*pw, *pv: the sleep watches it, read before the
    walk so that a poke after it wakes the sleep; *pw NULL if not armed), and the walk, if
    due: at the wait's first sleep, once w.dl_next has come, or when poked (its deadlock
    timeout passed; at most every DL_POKE_GAP_NS, else at the end of that gap). C, no GIL,
    no Python code. R_CONT, or R_TIMEOUT: this waiter is a cycle's victim (w.dl_hit), and
    withdraws as on a timeout."""
    cdef uint32_t v
    cdef int64_t now
    cdef bint due
    pw[0] = NULL
    if w.dl_state == 0 or w.rm == NULL or wait_look == NULL or w.dl_slot >= rmap_hwm(w.rm):
        return R_CONT
    pw[0] = &w.rm.part[w.dl_slot].poke
    v = ld32_seq(pw[0])
    pv[0] = v
    now = shm_now_ns()
    due = w.dl_state == 1 or 0 <= w.dl_next <= now
    if not due and v != w.dl_poke and 0 <= w.dl_from <= now:
        if now - w.dl_last >= DL_POKE_GAP_NS:
            due = 1
        elif w.dl_next < 0 or w.dl_last + DL_POKE_GAP_NS < w.dl_next:
            w.dl_next = w.dl_last + DL_POKE_GAP_NS
    if due and wait_look(w, now, v) > 0:
        return R_TIMEOUT
    return R_CONT


cdef int64_t wait_until(wait_t* w, bint sliced) noexcept nogil:
    """When the next sleep must end (absolute CLOCK_MONOTONIC ns, -1: never): the deadline,
    the next deadlock look, and in a sliced wait one PARK_SLICE_NS from now."""
    cdef int64_t until = w.deadline
    cdef int64_t t
    if w.dl_next >= 0 and (until < 0 or w.dl_next < until):
        until = w.dl_next
    if sliced:
        t = shm_now_ns() + PARK_SLICE_NS
        if until < 0 or t < until:
            until = t
    return until


cdef int wait_due(wait_t* w) noexcept nogil:
    """After a sleep that did not end the wait: R_TIMEOUT once the deadline has passed or
    a walk found it a deadlock's victim (w.dl_hit: a resumable wait's walk,
    nb_would_block), else R_CONT (look at the lock again)."""
    cdef int64_t now = shm_now_ns()
    if w.deadline >= 0 and now >= w.deadline:
        return R_TIMEOUT
    if w.dl_hit:
        return R_TIMEOUT
    return R_CONT


cdef int wait_sleep(wait_t* w, watch_t* ws, bint sliced) noexcept nogil:
    """One sleep of a blocked wait, the same for park() and the pthread kinds: the signals
    that came before it (main thread), the sleep on ws to the deadline, the next look or
    (sliced) one slice, a watched death passed on (park_woken), the signal that woke it.
    R_CONT: look at the lock again; R_SIGNAL: a handler raised."""
    return _wait_sleep_to(w, ws, sliced, -1)


cdef int _wait_sleep_to(wait_t* w, watch_t* ws, bint sliced, int64_t end) noexcept nogil:
    """wait_sleep, ending by `end` too (absolute CLOCK_MONOTONIC ns; -1: no end of its own)."""
    cdef int r
    cdef int64_t until
    cdef uint32_t* pw
    cdef uint32_t pv
    if wait_signals(w):
        return R_SIGNAL
    if wait_walk(w, &pw, &pv) != R_CONT:
        return R_TIMEOUT                    # a deadlock's victim (deadlock.pxi)
    if pw != NULL and not watch_word(ws, pw, pv):
        sliced = 1                          # (a poke is then seen at the slice's end)
    until = wait_until(w, sliced)
    if end >= 0 and (until < 0 or end < until):
        until = end
    r = park_sleep(ws, until)
    park_woken(ws)
    if r == -EINTR and wait_signals(w):
        return R_SIGNAL
    return R_CONT


cdef int wait_sleep_many(wait_t* w, watch_t* ws, shm_many* more) noexcept nogil:
    """wait_sleep on more words than one futex_waitv takes: ws and the thread's list
    `more` (a toolbox waiter that depends on more participants, docs/design.md §12),
    asleep on several io_uring FUTEX_WAITV at once until the first completion
    (shm_many_sleep); in slices on ws alone if the thread cannot."""
    cdef int r
    cdef void* head = NULL
    cdef uint32_t* pw
    cdef uint32_t pv
    if wait_signals(w):
        return R_SIGNAL
    if wait_walk(w, &pw, &pv) != R_CONT:
        return R_TIMEOUT                    # a deadlock's victim (deadlock.pxi)
    if pw != NULL and not watch_word(ws, pw, pv):
        return wait_sleep(w, ws, 1)         # (no room: slices, which watch the poke word)
    if ws.token >= 0:
        head = shm_robust_pending_set(ws.words[ws.token])   # (see park_sleep)
    r = shm_many_sleep(more, ws.words, ws.vals, ws.n, wait_until(w, 0))
    if head != NULL:
        shm_robust_pending_clear(head)
    if r == -ENOSYS:
        r = park_sleep(ws, wait_until(w, 1))
    park_woken(ws)
    if r == -EINTR and wait_signals(w):
        return R_SIGNAL
    return R_CONT


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


cdef int watch_participant(rmap_t* rm, uint32_t slot, watch_t* ws) noexcept nogil:
    """Sleep until participant `slot` dies (or its token changes): arm its token with
    FUTEX_WAITERS. DEP_ARMED; DEP_CHANGED if it is dead (recovered here if that is ours to
    do: participant_try_recover, by ws.rec's deadline); DEP_UNKNOWN if the slot is free
    now (it left: the caller's view of whom it depends on is stale) or the set is full."""
    cdef uint32_t* tw
    cdef uint32_t v, seen
    if slot >= rmap_hwm(rm) or ws.n >= SHM_WAITV_MAX or ws.token >= 0:
        return DEP_UNKNOWN
    tw = <uint32_t*>&rm.part[slot].token.m
    v = ld32_seq(tw)
    while True:
        if (v & FUTEX_OWNER_DIED_) or ((v & FUTEX_TID_MASK_) == 0
                                       and ld32_acq(&rm.part[slot].pending)):
            participant_try_recover(rm, slot, ws.rec)
            return DEP_CHANGED
        if (v & FUTEX_TID_MASK_) == 0:
            return DEP_UNKNOWN
        if v & FUTEX_WAITERS_:
            break
        seen = cmpxchg32(tw, v, v | FUTEX_WAITERS_)
        if seen == v:
            v = v | FUTEX_WAITERS_
            break
        v = seen
    ws.token = ws.n
    ws.slot = slot
    watch_word(ws, tw, v)
    return DEP_ARMED


cdef int park_sleep(watch_t* ws, int64_t until) noexcept nogil:
    """One sleep on the watch set, to `until` at most (-1: no end): a word's index (woken),
    or -EAGAIN (a word no longer held its value), -ETIMEDOUT, -EINTR. Without futex_waitv
    (or with SHMLOCKS_WAIT=sliced): FUTEX_WAIT on the park word alone, and the caller
    passes an `until` one PARK_SLICE_NS away at most."""
    cdef int r
    cdef int64_t rel
    cdef void* head = NULL
    if g_wait_waitv:
        if ws.token >= 0:
            # While we sleep on a participant's token, our own death passes the kernel's
            # wake-up on: the token is our robust list's pending operation, so if we die
            # after its owner's death woke us and before we woke the others (park_woken),
            # the kernel wakes another waiter on it (its rule for a woken waiter of a
            # robust mutex that dies before taking it).
            head = shm_robust_pending_set(ws.words[ws.token])
        r = shm_futex_waitv(ws.words, ws.vals, ws.n, until)
        if head != NULL:
            shm_robust_pending_clear(head)
        return r
    rel = -1
    if until >= 0:
        rel = until - shm_now_ns()
        if rel <= 0:
            return -ETIMEDOUT
    r = shm_futex_wait(ws.words[0], ws.vals[0], rel)
    return 0 if r == 0 else -r


cdef void park_woken(watch_t* ws) noexcept nogil:
    """After a sleep: if the participant we watched is dead and not yet recovered, make
    sure another waiter on its token wakes too (the kernel woke one; it may be us, leaving
    for a timeout or a signal before recovering it)."""
    cdef uint32_t v
    if ws.token < 0:
        return
    v = ld32_seq(ws.words[ws.token])
    if v & FUTEX_OWNER_DIED_:
        shm_futex_wake(ws.words[ws.token], 0x7fffffff)


# park(): the one wait of every kind but the pthread ones (parking_lot's park(), with
# callbacks). The kind says what it waits for and whom it depends on; park runs the
# policy above, then sleeps in the kernel until its word changes, someone it depends on
# dies, its deadline or next deadlock look comes, or (main thread) a signal arrives:
#     R_ACQ      ready(ctx) said READY (for an acquire: granted; else: the wait is over)
#     R_TIMEOUT  the deadline passed first     R_SIGNAL  a Python signal handler raised
cdef int park(park_t* pk, wait_t* w) noexcept nogil:
    """Wait under the policy w until pk.ready says READY: R_ACQ, R_TIMEOUT or R_SIGNAL; and
    R_ASIDE for a FIFO waiter in its queued place (w.aside_ok) that finds no spinner seat
    free, or a VIP turn taken by another (docs/design.md §7.0): it must step aside."""
    cdef int r, q
    if w.aside == NULL or not w.aside_ok or w.nb or w.phase == 2:
        return _park_run(pk, w)                 # (phase 2: it slept in its place already)
    q = pk.ready(pk.ctx)
    if q == Q_READY:
        return R_ACQ
    if not _aside_seat(w) and q == Q_FAR:
        # No seat, and another waiter ahead of it: stepping aside hands its turn to a
        # running waiter. Next in line (Q_NEAR) it stays and spins without a seat: nobody
        # else could take its turn (two processes, or a seat its granted taker has not yet
        # freed, never make it step aside).
        return R_ASIDE
    r = _park_run(pk, w)
    _aside_unseat(w)
    return r


cdef inline bint _aside_seat(wait_t* w) noexcept nogil:
    """Take a spinner seat (1), or find none (0): all taken, or a VIP turn pending that
    is not ours. A waiter that took the VIP turn needs none (it never steps aside)."""
    cdef uint32_t* a = w.aside
    cdef uint32_t v, i
    if w.vip or w.seat >= 0:
        return 1
    v = ld32_seq(&a[AS_VIP])
    if v != 0 and v != w.aside_id:
        return 0
    for i in range(min(g_aside_seats, w.aside_cap)):
        if ld32_rlx(&a[AS_SEATS + i]) == 0 and cas32(&a[AS_SEATS + i], 0, w.aside_id):
            w.seat = <int>i
            return 1
    return 0


cdef inline void _aside_unseat(wait_t* w) noexcept nogil:
    if w.seat >= 0:
        cas32(&w.aside[AS_SEATS + w.seat], w.aside_id, 0)
        w.seat = -1


cdef void _aside_heal(wait_t* w) noexcept nogil:
    """Before a sleep aside: the seats and the VIP turn name live waiters, or are freed.
    A taker that died is recovered here (participant_try_recover: its recovery frees
    them and wakes the oldest waiter aside); one whose slot was reused since (stale) is
    CASed out, and a stale VIP's turn so freed wakes the oldest too."""
    cdef uint32_t* a = w.aside
    cdef uint32_t* p
    cdef uint32_t i, v, h
    for i in range(w.aside_cap + 1):
        p = &a[AS_VIP] if i == 0 else &a[AS_SEATS + i - 1]
        v = ld32_seq(p)
        if v == 0 or v == w.aside_id:
            continue
        h = holder_slot(w.rm, v)
        if h == 0:
            if cas32(p, v, 0) and i == 0:            # stale
                aside_kick(w.rm, w.aside_b)
        elif participant_state(w.rm, h - 1) == 2:
            participant_try_recover(w.rm, h - 1, &w.rec)


cdef void _aside_give_back(wait_t* w) noexcept nogil:
    """Give back the VIP turn this waiter holds, and wake the oldest waiter aside: the
    turn may be its now (it sleeps on its own word, not on a timer)."""
    if cas32(&w.aside[AS_VIP], w.aside_id, 0):
        aside_kick(w.rm, w.aside_b)


cdef void _aside_asleep(wait_t* w) noexcept nogil:
    """A waiter in its queued place is going to sleep there (its spin and yield budget ran
    out: the lock is held long): it is no longer a spinner (its seat freed), and a VIP
    needs its turn no longer (it is in its place, which no one passes: the next waiter
    aside may rejoin after it, in arrival order). It never steps aside again."""
    _aside_unseat(w)
    if w.vip == 1:
        _aside_give_back(w)
        w.vip = 2


cdef int aside_sleep(wait_t* w) noexcept nogil:
    """A waiter that stepped aside (its place left as at a timeout): marked aside with its
    arrival (prec.aside_since), it sleeps on its own word (prec.aside_wake) until it is
    the oldest live waiter aside, has been aside ASIDE_NS, and finds the VIP turn free:
    it takes the turn (R_CONT: it rejoins, and never steps aside again in this wait). Or
    its deadline or a deadlock look's verdict comes (R_TIMEOUT), or a signal (R_SIGNAL).
    Its wait record says WAITING for the lock throughout (the wait-for graph sees it).

    No waiter aside polls. The oldest sleeps to the end of its first ASIDE_NS aside (and
    of ASIDE_NS since the last VIP turn was taken: AS_VIP_AT) at most, watching the
    holder's liveness token; while a VIP turn is pending, on its word and the VIP's token. Every other one sleeps on its word and the token of the
    waiter aside just ahead of it. Whoever makes it the oldest (that one taking the turn
    or leaving: aside_kick) or frees the turn wakes it; a death it watches wakes it too
    (with futex_waitv; else it looks every PARK_SLICE_NS). As it leaves, it wakes the next."""
    cdef uint32_t* a = w.aside
    cdef shm_body* b = w.aside_b
    cdef uint32_t me = w.aside_slot
    cdef uint64_t* mark = &b.precs[me].aside_since
    cdef uint32_t* own = &b.precs[me].aside_wake
    cdef uint64_t since = ld64_rlx(&w.rm.part[me].wait_since)
    cdef watch_t ws
    cdef int64_t now, t_first, t, t_gap
    cdef uint32_t gap
    cdef int r, d, ahead, changed = 0
    cdef uint32_t v, vip, h, rv
    global g_aside_steps, g_aside_vips, g_aside_sleeps
    if since == 0:
        since = <uint64_t>shm_now_ns()
    g_aside_steps += 1
    wait_nogil(w)
    st64_seq(mark, since)
    crashpoint("aside.marked")
    t_first = shm_now_ns() + ASIDE_NS            # the VIP turn may be ours from then on
    while True:
        v = ld32_seq(own)                        # before the state it is read to mean
        ws.words[0] = own
        ws.vals[0] = v
        ws.n = 1
        ws.token = -1
        ws.rec = &w.rec
        if w.recall != NULL:
            rv = ld32_seq(w.recall)
            if rv < 32 and (w.recall_set >> rv) & 1:
                # called back before its VIP turn (clhc.pxi: the node it waits on was
                # abandoned, which only it may hand back): it goes back to its place, and
                # may step aside again (w.vip stays 0)
                w.phase = 0
                w.spin_until = 0
                w.yields = 0
                w.far_until = 0
                r = R_CONT
                break
        _aside_heal(w)
        if w.rec.sig:                            # a handler raised inside a recovery it ran
            w.rec.sig = 0
            r = R_SIGNAL
            break
        ahead = aside_ahead(w.rm, b, me, since)
        now = shm_now_ns()
        t = -1                                   # the sleep's own end (-1: none)
        if ahead >= 0:
            d = watch_participant(w.rm, <uint32_t>ahead, &ws)
            if d != DEP_ARMED:
                t = now + PARK_SLICE_NS          # (it left or died: look again soon)
        else:
            vip = ld32_seq(&a[AS_VIP])
            if vip == 0:
                # one turn per ASIDE_NS at most: back-to-back turns would keep a VIP
                # pending all the time, and every newcomer would step aside
                gap = <uint32_t>(now >> 10) - ld32_rlx(&a[AS_VIP_AT])
                if gap < <uint32_t>(ASIDE_NS >> 10):             # (a hint: at most ASIDE_NS)
                    t_gap = now + <int64_t>((<uint32_t>(ASIDE_NS >> 10) - gap) << 10)
                    if t_gap > t_first:
                        t_first = t_gap
            if vip == 0 and now >= t_first:
                if cas32(&a[AS_VIP], 0, w.aside_id):
                    st32_rlx(&a[AS_VIP_AT], <uint32_t>(now >> 10))
                    w.vip = 1
                    g_aside_vips += 1
                    crashpoint("aside.vip")
                    w.phase = 0                  # it rejoins running: spin and yield again
                    w.spin_until = 0
                    w.yields = 0
                    w.far_until = 0
                    r = R_CONT
                    break
                continue                         # another took it: look again
            h = holder_slot(w.rm, vip if vip != 0 else ld32_acq(&b.ctl.holder))
            d = DEP_UNKNOWN
            if h != 0 and h - 1 != me:
                d = watch_participant(w.rm, h - 1, &ws)
            t = t_first if vip == 0 else -1          # (a VIP's give-back wakes it)
        if d == DEP_CHANGED and changed < 8:
            changed += 1                         # one died: look again at once (bounded)
            continue
        changed = 0
        g_aside_sleeps += 1
        r = _wait_sleep_to(w, &ws, d != DEP_ARMED or not g_wait_waitv, t)
        if r != R_CONT:
            break
        r = wait_due(w)
        if r != R_CONT:
            break
    w.recall = NULL
    st64_rel(mark, 0)
    aside_kick(w.rm, b)                          # the next waiter aside may be the oldest now
    return r


cdef void aside_done(wait_t* w) noexcept nogil:
    """The wait is over (acquired, or left): give back the VIP turn if it holds it."""
    if w.vip == 1:
        _aside_give_back(w)
        w.vip = 0
    _aside_unseat(w)


cdef int _park_run(park_t* pk, wait_t* w) noexcept nogil:
    cdef int r, q, d, changed = 0
    cdef uint32_t v
    cdef watch_t ws
    if SHM_DEBUG_BUILT:
        dassert(pk.ready != NULL and pk.word != NULL and pk.parked != NULL,
                "park: every callback and word given")
    q = pk.ready(pk.ctx)
    if q == Q_READY:
        return R_ACQ
    if w.deadline == 0:
        return R_TIMEOUT
    if w.nb:
        return park_nb(pk, w)               # a resumable wait: no spin, no sleep
    while w.phase < 2:                      # spin, then yield
        if q == Q_FAR:
            r = wait_far(w)
        else:
            r = wait_pause(w)
        if r == R_PARK:
            break
        if r != R_CONT:
            return r
        q = pk.ready(pk.ctx)
        if q == Q_READY:
            return R_ACQ
    w.phase = 2
    if w.aside != NULL:
        _aside_asleep(w)                    # asleep in its place (§7.0)
    wait_nogil(w)
    while True:                             # park
        fadd32(pk.parked, 1)                # announce, SC: the waker reads parked after its change
        v = ld32_seq(pk.word)
        if pk.ready(pk.ctx) == Q_READY:
            fsub32(pk.parked, 1)
            return R_ACQ
        ws.words[0] = pk.word
        ws.vals[0] = v
        ws.n = 1
        ws.token = -1
        ws.rec = &w.rec
        d = DEP_UNKNOWN if pk.dep == NULL else pk.dep(pk, &ws)
        if w.rec.sig:                       # a handler raised inside a recovery dep ran
            w.rec.sig = 0
            fsub32(pk.parked, 1)
            return R_SIGNAL
        if d == DEP_CHANGED and changed < 8:
            changed += 1                    # look again at once (bounded: then sleep a slice)
            fsub32(pk.parked, 1)
            if pk.ready(pk.ctx) == Q_READY:
                return R_ACQ
            if w.deadline >= 0 and shm_now_ns() >= w.deadline:
                return R_TIMEOUT
            continue
        changed = 0
        r = wait_sleep(w, &ws, d != DEP_ARMED or not g_wait_waitv)
        fsub32(pk.parked, 1)
        if r != R_CONT:
            return r
        if pk.ready(pk.ctx) == Q_READY:
            return R_ACQ
        r = wait_due(w)
        if r != R_CONT:
            return r




# ---- resumable waits (docs/design.md §5 "Resumable waits") --------------------------------
#
# One waiting mechanism, two drivers. A blocking wait (a thread) sleeps in park() (or the
# pthread kinds' own sleeps). A non-blocking one (w.nb: an event loop's thread, which must
# never sleep there) runs the same code up to the point where it would sleep, and returns
# R_WOULDBLOCK instead, leaving everything as the sleep would have:
#   - its place in the lock's queue (the kind records in w.resume_rc the rc to re-enter
#     _wait with: R_PENDING once queued, R_BUSY in a kind's pre-queue phase);
#   - its announcement (parked += 1, w.nb_parked): a waker wakes the word it would have
#     slept on, so a driver asleep on it (io_uring FUTEX_WAITV, a waiter thread's
#     futex_waitv) is woken like the sleeper;
#   - the watch set the sleep would have used (w.nb_ws: the park word, the liveness token
#     of whom it depends on, the words that say it moved; the token index for the death
#     hand-on), and when it must end at the latest (w.nb_until).
# The driver sleeps on the watch set; after a wake-up (a completion, a cancel, its timer)
# it calls nb_woken (the announcement taken back, a watched death passed on: park_woken)
# and re-enters _wait with w.resume_rc. The shared state says where the wait is, so the
# re-entry gives what the sleeper would have seen on waking: R_ACQ once granted, else
# another R_WOULDBLOCK. A driver that gives up (a cancelled task) re-enters with
# w.deadline = 0: the kind's own timeout path leaves the place (a grant passed on), as a
# timeout does. A recovery run inside a non-blocking wait (a dependency found dead) is cut
# at NB_RECOVER_NS and left pending for the next waiter (docs/design.md §6.3): the loop
# thread is never held for long; the sleep then lasts one slice (w.nb_until).

cdef int64_t NB_RECOVER_NS = 2000000     # 2 ms


cdef void nb_init(wait_t* w, watch_t* ws, int64_t deadline, int rc) noexcept nogil:
    """Make w a non-blocking wait (to `deadline`; -1 none) whose watch sets go to ws (the
    driver's, which outlives each _wait call), to be entered first with rc (what _fast
    returned)."""
    wait_init(w, deadline)
    w.nb = 1
    w.phase = 2                          # no spinning, no yielding: the loop thread's time
    w.resume_rc = rc
    w.nb_slept = 0
    w.nb_ws = ws
    w.nb_parked = NULL
    w.nb_until = -1
    w.own_parked = 0
    ws.n = 0
    ws.token = -1
    ws.rec = &w.rec


cdef int nb_enter(wait_t* w) noexcept nogil:
    """At each (re-)entry of a non-blocking wait, before it looks at the lock to decide to
    sleep: after a sleep, what a blocking wait does when one ends (the deadline, the
    deadlock look: R_TIMEOUT, R_SIGNAL); then the short recovery deadline. R_CONT."""
    cdef int64_t now
    cdef int r
    if w.nb_slept:
        r = wait_due(w)
        if r != R_CONT:
            return r
    now = shm_now_ns()
    w.rec.deadline = now + NB_RECOVER_NS
    if 0 <= w.deadline < w.rec.deadline:
        w.rec.deadline = w.deadline
    return R_CONT


cdef int nb_would_block(wait_t* w, watch_t* ws, uint32_t* parked, bint sliced) noexcept nogil:
    """Where a non-blocking wait would sleep on ws: hand the sleep to the driver (the watch
    set copied into w.nb_ws, the announcement on `parked` left in place, the latest time to
    look again). R_WOULDBLOCK. Where the wait is armed for the deadlock walk, the walk is
    made here as before a blocking sleep (wait_walk), and the poke word joins the set; a
    victim sets w.dl_hit and has the driver re-enter at once (wait_due: R_TIMEOUT then)."""
    cdef int i
    cdef uint32_t* pw
    cdef uint32_t pv
    if ws != w.nb_ws:
        for i in range(ws.n):
            w.nb_ws.words[i] = ws.words[i]
            w.nb_ws.vals[i] = ws.vals[i]
        w.nb_ws.n = ws.n
        w.nb_ws.token = ws.token
        w.nb_ws.slot = ws.slot
    w.nb_ws.rec = &w.rec
    w.nb_parked = parked
    w.nb_slept = 1
    if wait_walk(w, &pw, &pv) != R_CONT:
        w.nb_until = shm_now_ns()           # a deadlock's victim: re-enter at once
        return R_WOULDBLOCK
    if pw != NULL and not watch_word(w.nb_ws, pw, pv):
        sliced = 1
    w.nb_until = wait_until(w, sliced)
    return R_WOULDBLOCK


cdef void nb_woken(wait_t* w) noexcept nogil:
    """The driver, after the sleep it made on w's watch set ended (a word woken or changed,
    a cancel, its timer), before it re-enters: take the announcement back, and if a watched
    participant is dead and not yet recovered, wake the others on its token (park_woken:
    the kernel woke one waiter, maybe this one, which may now leave without recovering)."""
    nb_unannounce(w)
    if w.nb_ws.n > 0:
        park_woken(w.nb_ws)


cdef int park_nb(park_t* pk, wait_t* w) noexcept nogil:
    """park() for a non-blocking wait (w.nb): the park loop without its sleep. R_ACQ,
    R_TIMEOUT, R_SIGNAL, or R_WOULDBLOCK with the sleep handed to the driver (nb_would_block:
    the announcement stays, the watch set in w)."""
    cdef int r, d, changed = 0
    cdef uint32_t v
    cdef watch_t ws
    r = nb_enter(w)
    if r != R_CONT:
        return r
    while True:
        fadd32(pk.parked, 1)                # announce, SC: the waker reads parked after its change
        v = ld32_seq(pk.word)
        if pk.ready(pk.ctx) == Q_READY:
            fsub32(pk.parked, 1)
            return R_ACQ
        ws.words[0] = pk.word
        ws.vals[0] = v
        ws.n = 1
        ws.token = -1
        ws.rec = &w.rec
        d = DEP_UNKNOWN if pk.dep == NULL else pk.dep(pk, &ws)
        if w.rec.sig:                       # a handler raised inside a recovery dep ran
            w.rec.sig = 0
            fsub32(pk.parked, 1)
            return R_SIGNAL
        if d == DEP_CHANGED and changed < 8:
            changed += 1                    # look again at once (bounded: then a slice)
            fsub32(pk.parked, 1)
            if pk.ready(pk.ctx) == Q_READY:
                return R_ACQ
            if w.deadline >= 0 and shm_now_ns() >= w.deadline:
                return R_TIMEOUT
            continue
        return nb_would_block(w, &ws, pk.parked, d != DEP_ARMED or not g_wait_waitv)


# ---- the fallback driver's sleeper (docs/design.md §14) -------------------------------------
#
# Without io_uring (AIO_MODE "thread"), an event loop's thread cannot sleep on its cohorts'
# watch sets itself: one thread of the process per loop thread with waiting cohorts does,
# in futex_waitv on the union of their watch sets (one arm each) plus its own re-arm word,
# which the loop's thread bumps and wakes whenever it adds or takes back an arm. When a
# word of an arm changed, the arm fires (it is taken out: an arm is one sleep) and the
# thread tells the loop which ones (the driver's callback, call_soon_threadsafe), which
# re-enters their waits and arms them again. Past SHM_WAITV_MAX - 1 words the union does
# not fit one futex_waitv: the first ones are slept on, in slices of PARK_SLICE_NS, and
# every arm's words are compared after each (polling, documented). Every word is in a
# mapping its cohort keeps (its agent slot, participants.pxi reg_claim_agent); an arm is
# taken back (under the mutex) before its cohort gives its slot back, so the words this
# thread reads after a sleep, under the mutex, are all mapped.

cdef class _Waiter:
    """The sleeping thread of AIO_MODE "thread" (not API: shmlocks/_aio.py's driver, one per
    event loop thread). ``disarm(id)``, ``stop()`` from the loop's thread (an _Agent arms
    it, _Agent.arm_thread); ``sleep()`` on the waiter thread: the ids of the arms that
    fired (their words changed), [] after a re-arm or a slice, None once stopped."""

    def __cinit__(self):
        pthread_mutex_init(&self.mu, NULL)
        self.arms = NULL
        self.narms = 0
        self.cap = 0
        self.rearm = 0
        self.stopped = 0
        self.slices = 0

    cdef int _add(self, watch_t* ws, uint64_t id) except -1:
        cdef waiter_arm* a
        cdef int i
        pthread_mutex_lock(&self.mu)
        if self.narms == self.cap:
            a = <waiter_arm*>realloc(self.arms, (2 * self.cap + 4) * sizeof(waiter_arm))
            if a == NULL:
                pthread_mutex_unlock(&self.mu)
                raise MemoryError()
            self.arms = a
            self.cap = 2 * self.cap + 4
        a = &self.arms[self.narms]
        a.id = id
        a.n = ws.n
        for i in range(ws.n):
            a.words[i] = ws.words[i]
            a.vals[i] = ws.vals[i]
        self.narms += 1
        pthread_mutex_unlock(&self.mu)
        self._kick()
        return 0

    cdef void _kick(self) noexcept nogil:
        fadd32(&self.rearm, 1)
        shm_futex_wake(&self.rearm, 1)

    def disarm(self, uint64_t id):
        """Take arm `id` back (if it has not fired): its words are no longer read."""
        cdef int i
        pthread_mutex_lock(&self.mu)
        for i in range(self.narms):
            if self.arms[i].id == id:
                self.narms -= 1
                if i != self.narms:
                    memcpy(&self.arms[i], &self.arms[self.narms], sizeof(waiter_arm))
                break
        pthread_mutex_unlock(&self.mu)

    def stop(self):
        """The sleeping thread returns (sleep() gives None) and ends."""
        pthread_mutex_lock(&self.mu)
        self.stopped = 1
        self.narms = 0
        pthread_mutex_unlock(&self.mu)
        self._kick()

    @property
    def armed(self):
        return self.narms

    @property
    def sliced(self):
        """Sleeps so far that were cut to a slice (more words armed than one sleep takes)."""
        return self.slices

    def sleep(self):
        """On the waiter thread: sleep until an arm's word changes (or a re-arm, or a
        slice), then the ids of the arms that fired (taken out), or None once stopped."""
        cdef uint32_t* words[SHM_WAITV_MAX]
        cdef uint32_t vals[SHM_WAITV_MAX]
        cdef uint64_t* fired = NULL
        cdef int n = 0, nf = 0, i, j, k
        cdef bint full = 0
        cdef int64_t until = -1
        cdef waiter_arm* a
        with nogil:
            pthread_mutex_lock(&self.mu)
            if not self.stopped:
                words[0] = &self.rearm
                vals[0] = ld32_seq(&self.rearm)
                n = 1
                for i in range(self.narms):
                    a = &self.arms[i]
                    if n + a.n > SHM_WAITV_MAX:
                        full = 1
                        break
                    for j in range(a.n):
                        words[n] = a.words[j]
                        vals[n] = a.vals[j]
                        n += 1
            pthread_mutex_unlock(&self.mu)
            if n > 0:
                if full or not g_wait_waitv:
                    until = shm_now_ns() + PARK_SLICE_NS
                    self.slices += 1
                if g_wait_waitv:
                    shm_futex_waitv(words, vals, n, until)
                else:
                    shm_futex_wait(words[0], vals[0], PARK_SLICE_NS)
            pthread_mutex_lock(&self.mu)
            if not self.stopped and self.narms > 0:
                fired = <uint64_t*>malloc(self.narms * sizeof(uint64_t))
                i = 0
                while fired != NULL and i < self.narms:
                    a = &self.arms[i]
                    k = 0
                    for j in range(a.n):
                        if ld32_seq(a.words[j]) != a.vals[j]:
                            k = 1
                            break
                    if k:
                        fired[nf] = a.id
                        nf += 1
                        self.narms -= 1
                        if i != self.narms:
                            memcpy(a, &self.arms[self.narms], sizeof(waiter_arm))
                        continue
                    i += 1
            pthread_mutex_unlock(&self.mu)
        if self.stopped:
            free(fired)
            return None
        out = [fired[i] for i in range(nf)]
        free(fired)
        return out

    def __dealloc__(self):
        free(self.arms)
