"""Two deaths: every ordered pair of crash points, in two different participants.

For a kind and a pair (p1, p2): H holds the lock; A (armed at p1) and then B (armed at
p2), fresh interpreters, each try to take and release the lock three times; H releases.
A and B either finish or SIGKILL themselves at their points, in whatever order the
protocol brings them there: waiting behind H, taking the lock, releasing it, or
recovering the other (a recoverer killed mid-recovery). Then a live survivor must get the
lock within 10 s, two processes must count under it exactly, and no slot may be left.

The same matrix with A and B event loops (two tasks each, `acquire_async`), for every kind
(robust and pi included, and the points only an async waiter passes), in both wait modes
(io_uring, and `SHMLOCKS_AIO=thread`'s waiter thread): a process that lives must get every
one of its acquires, and the survivor's checks are the same. The suite runs, per kind,
each point once as A's and once as B's (in io_uring mode; once, as A's or B's, with the
waiter thread), and as much of the lock matrix.

The same matrix on a LockTable's stripes (docs/design.md §15) of every kind, with the
points a stripe of the kind passes (a compact ticket, mcs or clh stripe's own `ticketc.*`,
`mcsc.*` or `clhc.*` instead of its kind's body points): A and B on the stripe H holds;
or A and B each holding two stripes (`hold()`), the second the one H holds, so that B
waits on the first behind A while A, holding it, waits on the second (the state a compact
stripe keeps per participant per table, not per stripe, in use across two stripes); or
the same after a wait for the second stripe that timed out behind H (for ticket, mcs and clh, whose
waiters leave a place behind: a marker, an abandoned node, a node stepped out of the
tail), so that the abandon, a ticketless or polled wait and the releases passing what was
left die too.
Afterwards every stripe of the table must come to a survivor, the counts be exact on the
stripes used, no slot left. The suite runs, for ticket, mcs and clh, each point once as A's
and once as B's on one stripe, once (as A's or B's) on two, and the points only the wait
that timed out passes; for the other kinds (their stripes run their kinds' own code), each
point once on one stripe.

The queue kinds (ticket, mcs, clh), on a lock and on one stripe, step aside (docs/design.md
§7.0) only when they would spin with a waiter ahead and find no spinner seat: behind H's
sleep they park in their places instead. So in the "aside" shape an unarmed spinner S
queues first behind H on the one seat A and B may take: A and B step aside behind it and
each takes the VIP turn and rejoins; and in "passed" (clh) A stays aside while B, on a
second seat behind it, passes its node at S's release and A, back, adopts one (a clh
table's stripe has one seat: B steps aside too, and A, back, passes B's place). The suite
runs each aside point once as A's and once as B's there, and checks that each shape
passes its points (on a clh table's stripe, the compact stripe's own `clhc.aside.*` in
place of the body's `clh.aside.*`).

The RWLock has its own matrix over its points and the recovery driver's: H holds the
write; A and B each read then write, three times; afterwards a survivor gets the write and
a read, two writers count exactly while a reader never sees a writer inside, and no slot
is left.

The full matrix runs with `SHMLOCKS_DOUBLE_DEATH=all pytest -s tests/test_double_death.py`
(about 80 s on 4 workers, 4 min on one, for the locks; the RWLock's 121 pairs about
3 min; the async one's 1,134 pairs a mode about 1 s each; the tables' 5,021
pairs about 10 min on 2 workers; the aside shapes' 1,514 lock and 1,596 stripe pairs
about 7 min on 2 workers); the suite runs a fixed sample of each.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest
from support import USERSPACE_KINDS, RWSide, recovering_sections, uniq, wait_seated

import shmlocks
from shmlocks import _core
from shmlocks._harness import MARK_W, Exclusion, words


def _points(kind: str) -> list[str]:
    return sorted(p for p, kinds in shmlocks._crashpoints().items() if kind in kinds)


def _each_twice(pts: list[str], step: int) -> list[tuple[str, str]]:
    """Pairs in which each point is A's once and B's once: point i with point i * s + 1
    (mod n), s the first of step, step + 2, ... that makes it a permutation."""
    n = len(pts)
    s = step
    while math.gcd(s, n) != 1:
        s += 2
    return [(pts[i], pts[(i * s + 1) % n]) for i in range(n)]


PAIRS = [(k, a, b) for k in USERSPACE_KINDS for a in _points(k) for b in _points(k)]
#: the sample the suite runs: per kind, each point once as A's and once as B's
SAMPLE = [(k, a, b) for k in USERSPACE_KINDS for a, b in _each_twice(_points(k), 7)]

CODE = r"""
import sys, shmlocks
l = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
for _ in range(3):
    if l.acquire(timeout=3):
        if l.owner_died:
            l.mark_consistent()
        l.release()
"""


def _hold(lock, ready, go) -> None:
    lock.acquire()
    ready.set()
    go.wait(30)
    lock.release()


def _armed(code: str, args: list[str], point: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**(os.environ if env is None else env), "SHMLOCKS_CRASHPOINT": point},
    )


def _settle(p: subprocess.Popen, seconds: float, where: str = "futex") -> None:
    """Give p time to reach its wait (or its death) before the next step: its main
    thread asleep in `where` (a blocking acquire's futex; an event loop's epoll)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/wchan") as f:
                if where in f.read():
                    return
        except OSError:
            return
        time.sleep(0.005)


@contextlib.contextmanager
def _two_deaths(
    held,
    code: str | tuple[str, str],
    args: list[str],
    p1: str,
    p2: str,
    what: str,
    env: dict | None = None,
    settle=lambda p: _settle(p, 1.0),
    ahead=None,
):
    """H holds `held` (acquire/release); A and B run `code` (or A `code[0]`, B `code[1]`)
    armed at p1 and p2 (in environment `env`), queued behind H in that order (`settle`:
    until each waits); H releases. Yields how A and B ended ("killed"/"done" each), once both have; every
    process is gone after the block. A participant that ends otherwise than by SIGKILL or
    exit status 0 fails. `ahead(ctx, extra)`, if given, starts unarmed waiters (fork
    processes, appended to `extra`) once H holds, before A and B: each must end with
    status 0 too, joined before the yield."""
    ctx = mp.get_context("fork")
    ready, go = ctx.Event(), ctx.Event()
    h = ctx.Process(target=_hold, args=(held, ready, go), daemon=True)
    armed: list[subprocess.Popen] = []
    extra: list = []
    try:
        h.start()
        assert ready.wait(20)
        if ahead is not None:
            ahead(ctx, extra)
        for point, c in zip(
            (p1, p2), code if isinstance(code, tuple) else (code, code), strict=True
        ):
            armed.append(_armed(c, args, point, env))
            settle(armed[-1])
        go.set()
        h.join(20)
        ends = []
        for p in armed:
            try:
                _, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{what}: a participant hung") from None
            assert p.returncode in (0, -signal.SIGKILL), (what, p.returncode, err)
            ends.append("killed" if p.returncode else "done")
        for x in extra:
            x.join(30)
            assert x.exitcode == 0, f"{what}: a waiter ahead failed ({x.exitcode})"
        yield "/".join(ends)
    finally:
        go.set()
        for p in armed:
            if p.poll() is None:
                p.kill()
                p.communicate()
        for x in extra:
            if x.is_alive():
                x.kill()
                x.join(10)
        if h.is_alive():
            h.kill()


def _count_exactly(ctx, lock, what: str, *others, a=None) -> None:
    """Two processes count 300 sections each under `lock` (repairing after owner_died),
    in the checker's words `a` (new ones if None), beside the processes `others`
    (started here, joined by the caller); exact counts."""
    ex = Exclusion(a if a is not None else ctx.RawArray("q", words(2)), participants=2)
    workers = [
        ctx.Process(target=recovering_sections, args=(lock, ex, 1 + i, 300, 20.0)) for i in range(2)
    ]
    for w in [*workers, *others]:
        w.start()
    for w in workers:
        w.join(30)
        assert w.exitcode == 0, f"{what}: a counter failed ({w.exitcode})"
    books = ex.report()
    assert books.ok and books.total == 600, f"{what}: exclusion lost: {books}"


def _no_slot_left(region, what: str) -> None:
    region._recover_dead()
    parts = region._describe()["participants"]
    assert [p["pid"] for p in parts] == [os.getpid()], f"{what}: {parts}"


def run_pair(kind: str, p1: str, p2: str, shape: str = "queue") -> str:
    """One pair; returns how A and B ended ("killed"/"done" each). `shape` "aside" or
    "passed": A and B queue behind a spinner on the one seat (_seated_ahead), and step
    aside (_shape_codes)."""
    lock = shmlocks.KINDS[kind].create(uniq(f"dd-{kind}"), max_participants=8)
    what = f"{kind} {p1} x {p2}" + ("" if shape == "queue" else f" ({shape})")
    code, ahead = _shape_codes(CODE, shape), None if shape == "queue" else _seated_ahead(lock)
    try:
        with _two_deaths(lock, code, [lock.kind, lock.name], p1, p2, what, ahead=ahead) as ends:
            assert lock.acquire(timeout=10), f"{what}: the survivor got no lock"
            if lock.owner_died:
                lock.mark_consistent()
            lock.release()
            _count_exactly(mp.get_context("fork"), lock, what)
            _no_slot_left(lock.region, what)
            return ends
    finally:
        lock.close()


# ------------------------------------------- waiters that step aside (docs/design.md §7.0)

#: the kinds whose waiters step aside (docs/design.md §7.0, "FIFO among the running
#: waiters"): a queued waiter that would spin with another ahead of it and finds no spinner
#: seat free. Behind H's sleep, A and B park in their places and never do: in the "aside"
#: shape an unarmed spinner S, first in line behind H, holds the one seat (_seated), so
#: that A and B, each with one seat (_seats), step aside behind it, and each takes the
#: VIP turn 1 ms later (ASIDE_NS) and rejoins, before H releases
ASIDE_KINDS = ("ticket", "mcs", "clh")
#: the points only a waiter that steps aside, or one behind it, passes (a clh table's
#: compact stripe passes its own, `clhc.aside.*`, in place of the body's `clh.aside.*`)
ASIDE_POINTS = sorted(
    p for p in shmlocks._crashpoints() if p.startswith(("aside.", "clh.aside.", "clhc.aside."))
)


def _aside_points(kind: str) -> list[str]:
    return [p for p in ASIDE_POINTS if kind in shmlocks._crashpoints()[p]]


def _seats(code: str, seats: int, aside_s: float = 0.001) -> str:
    """`code`, run with `seats` spinner seats (1: the CPUs less one on 2 CPUs, whatever
    the machine), aside `aside_s` before the VIP turn (1 ms: the default)."""
    return (
        f"import shmlocks._core\nshmlocks._core._aside_init({seats}, {int(aside_s * 1e9)})\n{code}"
    )


#: "passed" (clh): A steps aside for PASSED_S, B takes a second seat and waits in its
#: place behind A's: at H's release S takes the lock, and at S's B passes A's place (clh:
#: its node aside, FREE'd under it), and A, back, finds it passed (clh: adopts a node).
#: On a clh table's stripe, which has one seat (S's), B steps aside too, behind A; A,
#: back at its turn, takes the stripe, and its next acquire passes B's place, which B,
#: back, finds passed: the roles swap (_table_shape_sample)
PASSED_S = 1.0


def _shape_codes(code: str, shape: str) -> str | tuple[str, str]:
    """A's and B's code in `shape`: "queue" as it is; "aside" both with the one seat S
    holds; "passed" A with none free, B with a second one."""
    if shape == "aside":
        return _seats(code, 1)
    if shape == "passed":
        return (_seats(code, 1, PASSED_S), _seats(code, 2))
    return code


def _seated(lock, ready) -> None:
    """S: spins in its place on the one seat (10 s at most) until H releases, then takes
    and releases the lock once, as any survivor would."""
    _core._wait_policy(spin_ns=int(10e9))
    _core._aside_init(1)
    ready.set()
    if lock.acquire(timeout=30):
        if lock.owner_died:
            lock.mark_consistent()
        lock.release()


def _seated_ahead(lock):
    """`_two_deaths`'s `ahead` for the "aside" shape: S, seated, before A and B queue."""

    def ahead(ctx, extra) -> None:
        ready = ctx.Event()
        extra.append(ctx.Process(target=_seated, args=(lock, ready), daemon=True))
        extra[-1].start()
        assert ready.wait(20), "the spinner ahead did not start"
        wait_seated(lock, "the spinner ahead")

    return ahead


#: the shapes in which A and B step aside, and the kinds they run for
ASIDE_SHAPES = {"aside": ASIDE_KINDS, "passed": ("clh",)}
#: the aside points each shape passes (checked: test_aside_shapes_pass_their_points)
SHAPE_POINTS = {
    "aside": {"aside.marked", "aside.vip", "clh.aside.left", "clh.aside.back"},
    "passed": {"clh.aside.passed", "clh.aside.adopt"},
}


def _shape_pairs(kind: str, shape: str, pts: list[str]) -> list[tuple[str, str]]:
    """The matrix of `shape`: "aside", every pair; "passed", whose A sleeps PASSED_S aside,
    the pairs with an aside point (the others are much as in "aside")."""
    return [(a, b) for a in pts for b in pts if shape == "aside" or {a, b} & set(ASIDE_POINTS)]


def _shape_sample(kind: str, shape: str) -> list[tuple[str, str]]:
    """The sample of `shape`: "aside", each aside point it passes once as A's and once as
    B's; "passed", A at the point only A passes (back and adopting), B at the one only B
    passes (passing)."""
    if shape == "passed":
        return [("clh.aside.adopt", "clh.aside.passed")]
    return _each_twice([p for p in _aside_points(kind) if p in SHAPE_POINTS[shape]], 1)


#: the lock matrix of the shapes that step aside, and the sample the suite runs
ASIDE_PAIRS = [
    (k, shape, a, b)
    for shape, kinds in ASIDE_SHAPES.items()
    for k in kinds
    for a, b in _shape_pairs(k, shape, _points(k))
]
ASIDE_SAMPLE = [
    (k, shape, a, b)
    for shape, kinds in ASIDE_SHAPES.items()
    for k in kinds
    for a, b in _shape_sample(k, shape)
]


#: the whole matrices are opt-in: the suite runs a fixed sample of each
WHOLE_MATRIX = pytest.mark.skipif(
    os.environ.get("SHMLOCKS_DOUBLE_DEATH") != "all",
    reason="the whole matrix runs with SHMLOCKS_DOUBLE_DEATH=all (the suite runs a sample)",
)


def _tally(what: str, ends) -> None:
    """Run a whole matrix (`ends`: how A and B ended, pair by pair) and print how many
    pairs killed both, one, or none."""
    tally: dict[str, int] = {}
    for end in ends:
        tally[end] = tally.get(end, 0) + 1
    print(f"\n{what}: {sum(tally.values())} pairs, {tally}")


def _ids(cases):
    return [f"{k}-{a}-x-{b}" for k, a, b in cases]


def _shape_ids(cases):
    return [f"{k}-{shape}-{a}-x-{b}" for k, shape, a, b in cases]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kind", "p1", "p2"), SAMPLE, ids=_ids(SAMPLE))
def test_double_death_sample(kind, p1, p2):
    run_pair(kind, p1, p2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kind", "shape", "p1", "p2"), ASIDE_SAMPLE, ids=_shape_ids(ASIDE_SAMPLE))
def test_aside_double_death_sample(kind, shape, p1, p2):
    run_pair(kind, p1, p2, shape)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["lock", "table"])
@pytest.mark.parametrize("kind", ASIDE_KINDS)
def test_aside_shapes_pass_their_points(kind, where):
    """The aside points are passed in the shapes that step aside (the others pass none), on
    a lock and on a table's stripe (a clh stripe's `clhc.aside.*` for the body's
    `clh.aside.*`): A and B armed at each, one of them at least is killed."""
    for shape, kinds in ASIDE_SHAPES.items():
        for p in sorted(SHAPE_POINTS[shape] & set(_aside_points(kind)) if kind in kinds else ()):
            if where == "lock":
                end = run_pair(kind, p, p, shape)
            else:
                p = _on_stripe(kind, p)
                end = run_table_pair(kind, shape, p, p)
            assert end != "done/done", (shape, p)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@WHOLE_MATRIX
@pytest.mark.parametrize(("kind", "shape"), [(k, s) for s, ks in ASIDE_SHAPES.items() for k in ks])
def test_aside_double_death_every_pair(kind, shape):
    """The lock matrix of a shape that steps aside, for one kind; prints the tally of ends."""
    _tally(
        f"{kind} ({shape})",
        (run_pair(k, a, b, s) for k, s, a, b in ASIDE_PAIRS if k == kind and s == shape),
    )


@pytest.mark.slow
@pytest.mark.timeout(3600)
@WHOLE_MATRIX
@pytest.mark.parametrize("kind", USERSPACE_KINDS)
def test_double_death_every_pair(kind):
    """The whole matrix for one kind; prints how many pairs killed both, one, or none."""
    _tally(kind, (run_pair(k, a, b) for k, a, b in PAIRS if k == kind))


# ---------------------------------------------------------------------- lock-table stripes

#: a LockTable's stripes (docs/design.md §15), all compact: ticket, mcs and clh with
#: protocols of their own; futex, robust, pi one-line views over the kinds' code
TABLE_KINDS = ("ticket", "mcs", "futex", "robust", "pi", "clh")
#: the compact ticket, mcs and clh stripes' own protocols, whose points are the "table" ones
TABLE_PROTOCOL = {"ticket": "ticketc.", "mcs": "mcsc.", "clh": "clhc."}
#: how A and B use the table: "one" stripe; "two" stripes held together; "leave": two,
#: after a wait that timed out on the second (the kinds whose waiters leave a place behind)
#: "aside", "passed": one stripe, A and B stepping aside behind a spinner (as on a lock)
TABLE_SHAPES = {
    "one": TABLE_KINDS,
    "two": TABLE_KINDS,
    "leave": ("ticket", "mcs", "clh"),
    "aside": ("ticket", "mcs", "clh"),
    "passed": ("clh",),
}


def _table_points(kind: str, shape: str = "one") -> list[str]:
    """Every point a stripe of `kind` passes in a blocking acquire and release. Left out:
    the body points of ticket.pxi, mcs.pxi and clh.pxi (`ticket.*`, `mcs.*`, `clh.*`):
    TicketStripe, MCSStripe and CLHStripe override every method that passes them (_fast,
    _try, _wait, _aside_end, _unlock) and recover through their own (ticketc.pxi,
    mcsc.pxi, clhc.pxi), whose points (`ticketc.*`, `mcsc.*`, `clhc.*`) stand in for
    them; and pi's `pi.async.*`, passed only by a resumable wait, as in the lock matrix.
    Two stripes are held with `hold()`, which passes `hold.took` after each."""
    proto = TABLE_PROTOCOL.get(kind)
    own = [p for p in _points(kind) if not p.startswith(f"{kind}." if proto else "pi.async.")]
    if proto is not None:
        own += [p for p in _points("table") if p.startswith(proto)]
    if shape in ("two", "leave"):
        own.append("hold.took")
    return sorted(own)


#: the stripe H holds, and the other stripe a two-stripe participant holds with it
STRIPE, OTHER = 2, 1

#: A and B on stripe STRIPE of table argv[1] (size 4), as CODE on a lock
TABLE_CODE = r"""
import sys, shmlocks
l = shmlocks.LockTable.open(sys.argv[1])[int(sys.argv[2])]
for _ in range(3):
    if l.acquire(timeout=3):
        if l.owner_died:
            l.mark_consistent()
        l.release()
"""

#: A and B hold stripes OTHER and STRIPE together (`hold()`, in index order: OTHER first,
#: uncontended, then STRIPE behind H), so that B waits on OTHER behind A while A, holding
#: it, waits on STRIPE: the state a participant keeps once per table, not per stripe (a
#: compact ticket stripe's tagged ticket and marker, an mcs stripe's one wait node), is
#: in use on one stripe while the participant holds another, and two deaths meet it there.
#: "leave": first a wait for STRIPE that times out behind H, leaving its place (a ticket
#: stripe's marker, then taken back or passed; an mcs node ABANDONED, rejoined or passed
#: through; a clh node stepped out of the tail: A and B each wait last, and take their
#: nodes back at once), so that the hold takes OTHER without a ticket (ticket), polls it
#: while its node is queued elsewhere (mcs), and the releases pass what was left
TABLE_TWO_CODE = r"""
import sys, shmlocks
t = shmlocks.LockTable.open(sys.argv[1])
keys = [int(k) for k in sys.argv[3:]]
if sys.argv[2] == "leave":
    l = t.lock_for(keys[-1])
    if l.acquire(timeout=0.05):
        l.release()
for _ in range(3):
    try:
        with t.hold(*keys, timeout=3) as held:
            if held.owner_died:
                held.mark_consistent()
    except TimeoutError:
        pass
"""

TABLE_PAIRS = [
    (k, shape, a, b)
    for shape, kinds in TABLE_SHAPES.items()
    for k in kinds
    for a, b in (
        _shape_pairs(k, shape, _table_points(k, shape))
        if shape in ASIDE_SHAPES
        else [(a, b) for a in _table_points(k, shape) for b in _table_points(k, shape)]
    )
]


def _table_sample(kind: str, shape: str) -> list[tuple[str, str, str, str]]:
    """The compact ticket, mcs and clh stripes (protocols of their own): on one stripe, each
    point once as A's and once as B's; on two, each point once, as A's or B's; "leave",
    the points only it passes, as A's and as B's. The other kinds' stripes (their kinds'
    own code, which the lock matrix samples): each point once on one stripe."""
    pts = _table_points(kind, shape)
    if shape == "one" and kind in TABLE_PROTOCOL:
        return [(kind, shape, a, b) for a, b in _each_twice(pts, 7)]
    if shape == "leave":
        pts = [p for p in pts if p in _LEAVE_ONLY]
        return [(kind, shape, a, b) for a, b in _each_twice(pts, 1)]
    evens, odds = pts[::2], pts[1::2]
    return [(kind, shape, a, odds[(j + 3) % len(odds)]) for j, a in enumerate(evens)]


#: points that only a participant that left a place passes (a timeout's abandon, what
#: the next releases do with it), or a ticketless or polled wait (checked:
#: test_table_leave_shape_passes_its_points)
_LEAVE_ONLY = {
    "ticketc.abandon.counted",
    "ticketc.abandon.marked",
    "ticketc.release.claimed",
    "ticketc.release.skipped",
    "ticketc.ticketless.took",
    "mcsc.pass.emptied",
    "clhc.abort.stepped_out",
}

#: the sample the suite runs
TABLE_SAMPLE = [
    c
    for k in TABLE_KINDS
    for shape in (("one", "two", "leave") if k in TABLE_PROTOCOL else ("one",))
    for c in _table_sample(k, shape)
]


def _on_stripe(kind: str, point: str) -> str:
    """The point a table's stripe of `kind` passes where a lock of the kind passes `point`:
    a compact stripe's own (TABLE_PROTOCOL: `clh.aside.back` -> `clhc.aside.back`) for a
    point of the kind's body, the point itself for the others (`aside.vip`)."""
    proto = TABLE_PROTOCOL.get(kind)
    if proto is not None and point.startswith(f"{kind}."):
        return proto + point[len(kind) + 1 :]
    return point


def _table_shape_sample(kind: str, shape: str) -> list[tuple[str, str]]:
    """_shape_sample on a table's stripe: the stripe's own points (_on_stripe); and in
    "passed", A at the pass and B at the adoption (a clh stripe has one seat: A passes B's
    place, see PASSED_S; the lock's order, A adopting and B passing, ends done/done)."""
    pairs = _shape_sample(kind, shape)
    if shape == "passed":
        pairs = [(b, a) for a, b in pairs]
    return [(_on_stripe(kind, a), _on_stripe(kind, b)) for a, b in pairs]


#: and of the shapes that step aside, as on a lock (test_aside_double_death_sample)
TABLE_SAMPLE += [
    (k, shape, a, b)
    for shape, kinds in ASIDE_SHAPES.items()
    for k in kinds
    for a, b in _table_shape_sample(k, shape)
]


def _key_of(table, i: int) -> int:
    """A key that maps to stripe i."""
    return next(k for k in range(10_000) if table.index_of(k) == i)


def run_table_pair(kind: str, shape: str, p1: str, p2: str) -> str:
    """One pair on a 4-stripe table of `kind`, A and B using it as `shape` says; returns
    how they ended. Afterwards every stripe comes to a survivor, two processes count
    exactly under the stripes A and B used, and no slot is left."""
    table = shmlocks.LockTable(4, kind, name=uniq(f"ddt-{kind}"), max_participants=8)
    what = f"{kind} table ({shape}) {p1} x {p2}"
    used = [STRIPE] if shape in ("one", "aside", "passed") else [OTHER, STRIPE]
    ahead = None
    if len(used) == 1:
        code, args = _shape_codes(TABLE_CODE, shape), [table.name, str(STRIPE)]
        if shape != "one":
            ahead = _seated_ahead(table[STRIPE])
    else:
        code, args = TABLE_TWO_CODE, [table.name, shape, *(str(_key_of(table, i)) for i in used)]
    # a pi waiter sleeps in the kernel's rt_mutex (FUTEX_LOCK_PI), not a futex wait
    where = "rt_mutex" if kind == "pi" else "futex"

    def settle(p):
        _settle(p, 1.0, where)
        if shape == "leave":  # (that may have been the wait that times out: past it)
            time.sleep(0.06)
            _settle(p, 1.0, where)

    try:
        with _two_deaths(
            table[STRIPE], code, args, p1, p2, what, settle=settle, ahead=ahead
        ) as ends:
            for i in range(table.size):
                lock = table[i]
                assert lock.acquire(timeout=10), f"{what}: the survivor got no stripe {i}"
                if lock.owner_died:
                    lock.mark_consistent()
                lock.release()
            for i in used:
                _count_exactly(mp.get_context("fork"), table[i], f"{what} (stripe {i})")
            _no_slot_left(table.region, what)
            return ends
    finally:
        table.close()


def _table_ids(cases):
    return [f"{k}-{shape}-{a}-x-{b}" for k, shape, a, b in cases]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kind", "shape", "p1", "p2"), TABLE_SAMPLE, ids=_table_ids(TABLE_SAMPLE))
def test_table_double_death_sample(kind, shape, p1, p2):
    run_table_pair(kind, shape, p1, p2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(TABLE_PROTOCOL))
def test_table_leave_shape_passes_its_points(kind):
    """The points the sample of "leave" runs for them are passed there: a participant
    armed at each is killed (the other shapes pass none of them)."""
    for p in sorted(_LEAVE_ONLY & set(_table_points(kind, "leave"))):
        assert run_table_pair(kind, "leave", p, p) != "done/done", p


@pytest.mark.slow
@pytest.mark.timeout(3600)
@WHOLE_MATRIX
@pytest.mark.parametrize(
    ("kind", "shape"), [(k, s) for s, kinds in TABLE_SHAPES.items() for k in kinds]
)
def test_table_double_death_every_pair(kind, shape):
    """The whole table matrix for one kind and shape; prints the tally of ends."""
    _tally(
        f"{kind} table ({shape})",
        (run_table_pair(k, s, a, b) for k, s, a, b in TABLE_PAIRS if k == kind and s == shape),
    )


# --------------------------------------------------------------------------- asyncio

#: A and B as event loops (docs/design.md §14): two tasks each take and release the lock
#: three times (a cohort that holds for one task while the other waits behind it, and takes
#: a new place when it releases); every acquire of a process that lives must succeed
AIO_CODE = r"""
import asyncio, sys, shmlocks
l = shmlocks.KINDS[sys.argv[1]].open(sys.argv[2])
failed = 0
async def rounds():
    global failed
    for _ in range(3):
        if await l.acquire_async(timeout=10):
            if l.owner_died:
                l.mark_consistent()
            await asyncio.sleep(0)
            l.release()
        else:
            failed += 1
async def main():
    await asyncio.gather(rounds(), rounds())
asyncio.run(main())
sys.exit(3 if failed else 0)
"""

AIO_MODES = ["io_uring", "thread"]


def _aio_points(kind: str) -> list[str]:
    """Every point of the kind an async participant may pass (the asynchronous ones
    included; not the ticket overflow's, which needs 64 tickets outstanding)."""
    return sorted(
        p
        for p, kinds in shmlocks._crashpoints().items()
        if kind in kinds and not p.startswith("ticket.overflow.")
    )


AIO_PAIRS = [(k, a, b) for k in shmlocks.KINDS for a in _aio_points(k) for b in _aio_points(k)]


def _aio_sample(mode: str) -> list[tuple[str, str, str]]:
    """Per kind: in io_uring mode (the default where the kernel has it) each point once
    as A's and once as B's; with the waiter thread, each point once (as A's or B's),
    paired differently."""
    out = []
    for k in shmlocks.KINDS:
        pts = _aio_points(k)
        if mode == "io_uring":
            out += [(k, a, b) for a, b in _each_twice(pts, 3)]
        else:
            evens, odds = pts[::2], pts[1::2]
            out += [(k, a, odds[(j + 2) % len(odds)]) for j, a in enumerate(evens)]
    return out


AIO_SAMPLE = [(m, *c) for m in AIO_MODES for c in _aio_sample(m)]


def _aio_env(mode: str) -> dict:
    if mode == "io_uring" and shmlocks._core.AIO_MODE != "io_uring":
        pytest.skip("no io_uring FUTEX_WAITV here")
    env = dict(os.environ)
    env.pop("SHMLOCKS_AIO", None)
    if mode == "thread":
        env["SHMLOCKS_AIO"] = "thread"
    return env


def run_aio_pair(mode: str, kind: str, p1: str, p2: str) -> str:
    """One pair with A and B event loops in wait mode `mode`; returns how they ended."""
    env = _aio_env(mode)
    lock = shmlocks.KINDS[kind].create(uniq(f"dda-{kind}"), max_participants=8)
    what = f"{kind} async ({mode}) {p1} x {p2}"
    try:
        with _two_deaths(
            lock,
            AIO_CODE,
            [lock.kind, lock.name],
            p1,
            p2,
            what,
            env=env,
            settle=lambda p: _settle(p, 5.0, "epoll"),
        ) as ends:
            assert lock.acquire(timeout=10), f"{what}: the survivor got no lock"
            if lock.owner_died:
                lock.mark_consistent()
            lock.release()
            assert lock._describe()["waiters"] == 0, f"{what}: {lock._describe()}"
            _count_exactly(mp.get_context("fork"), lock, what)
            _no_slot_left(lock.region, what)
            return ends
    finally:
        lock.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "kind", "p1", "p2"),
    AIO_SAMPLE,
    ids=[f"{m}-{k}-{a}-x-{b}" for m, k, a, b in AIO_SAMPLE],
)
def test_async_double_death_sample(mode, kind, p1, p2):
    run_aio_pair(mode, kind, p1, p2)


@pytest.mark.slow
@pytest.mark.timeout(7200)
@WHOLE_MATRIX
@pytest.mark.parametrize("mode", AIO_MODES)
@pytest.mark.parametrize("kind", list(shmlocks.KINDS))
def test_async_double_death_every_pair(kind, mode):
    """The whole async matrix for one kind and wait mode; prints the tally of ends."""
    _tally(
        f"{kind} async ({mode})",
        (run_aio_pair(mode, k, a, b) for k, a, b in AIO_PAIRS if k == kind),
    )


# ---------------------------------------------------------------------------- RWLock

#: the RWLock's points, and the recovery driver's that its recoverers pass through
RW_POINTS = sorted(p for p in shmlocks._crashpoints() if p.startswith("rwlock.")) + [
    "recover.done",
    "recover.locked",
]
RW_PAIRS = [(a, b) for a in RW_POINTS for b in RW_POINTS]
RW_SAMPLE = RW_PAIRS[::10]  # 13 of 121: each point appears

RW_CODE = r"""
import sys, shmlocks
rw = shmlocks.RWLock.open(sys.argv[1])
for _ in range(3):
    if rw.acquire_read(timeout=3):
        rw.release_read()
    if rw.acquire_write(timeout=3):
        if rw.owner_died:
            rw.mark_consistent()
        rw.release_write()
"""


def _reads_check(rw, a, bad, stop) -> None:
    """Read holds until told to stop; a writer's marker seen inside one is a violation."""
    while not stop.value:
        if rw.acquire_read(timeout=20):
            if a[MARK_W]:
                bad.value += 1
            rw.release_read()


def run_rw_pair(p1: str, p2: str) -> str:
    """One RWLock pair; returns how A and B ended ("killed"/"done" each)."""
    rw = shmlocks.RWLock.create(uniq("dd-rw"), max_participants=8)
    what = f"rwlock {p1} x {p2}"
    ctx = mp.get_context("fork")
    reader = None
    try:
        with _two_deaths(RWSide(rw, True), RW_CODE, [rw.name], p1, p2, what) as ends:
            assert rw.acquire_write(timeout=10), f"{what}: the survivor got no write"
            if rw.owner_died:
                rw.mark_consistent()
            rw.release_write()
            assert rw.acquire_read(timeout=10), f"{what}: the survivor got no read"
            rw.release_read()
            a = ctx.RawArray("q", words(2))
            bad, stop = ctx.RawValue("q", 0), ctx.RawValue("i", 0)
            reader = ctx.Process(target=_reads_check, args=(rw, a, bad, stop))
            _count_exactly(ctx, RWSide(rw, True), what, reader, a=a)
            stop.value = 1
            reader.join(30)
            assert reader.exitcode == 0, f"{what}: the reader failed"
            assert bad.value == 0, f"{what}: a reader saw a writer inside"
            _no_slot_left(rw.region, what)
            return ends
    finally:
        if reader is not None and reader.is_alive():
            reader.kill()
            reader.join(10)
        rw.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("p1", "p2"), RW_SAMPLE, ids=[f"{a}-x-{b}" for a, b in RW_SAMPLE])
def test_rwlock_double_death_sample(p1, p2):
    run_rw_pair(p1, p2)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@WHOLE_MATRIX
def test_rwlock_double_death_every_pair():
    """The RWLock's whole matrix; prints how many pairs killed both, one, or none."""
    _tally("rwlock", (run_rw_pair(a, b) for a, b in RW_PAIRS))
