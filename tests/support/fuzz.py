"""Fuzzer of a segment's bytes: no bytes in a segment may crash the interpreter or hang it.

For each trial it takes a template segment (a region with one lock of each kind and one
of each toolbox object, either fresh or with live holders, a queued waiter and a
SIGKILLed holder), scribbles a few fields
(random words, boundary values, thread ids, glibc mutex kinds, byte runs) in the header
(its count of participants provisioned, part_hwm, on its own too: a lower one makes a
registration grow the region over slots in use, a higher one points past them), the
directory, the participant slots (their state, and the lines reserved for later issues)
and tokens, or one lock's ctl line, repair mutex, words A/B, nodes and per-participant
records (the ticket kind's overflow count and record markers too), writes the result as
a new segment, and
forks a child that opens it and runs every operation with short timeouts: describe,
lock_names, open_lock, locked, owner, stats, acquire(False), acquire(timeout) from two
threads at once, mark_consistent, release, close; on a toolbox object (open_object) its
timed waits (Semaphore.acquire, Event.wait, Barrier.wait, Condition.wait, an RWLock's
timed read and write) from two threads at once, and the calls that take no timeout
(release, set, clear, reset, abort, notify) in a thread of their own that is not waited
for: they wait for a held guard without end by design (docs/design.md §12), which is no
hang of the interpreter. Then the read-only tools over the same bytes: the private copy
and its describe (inspect), the statistics (stat, top) and the wait-for graph
(deadlocks).

  crash  the child is killed by a signal (SIGABRT, SIGSEGV, SIGBUS, ...)
  hang   the child is still running past its deadline (every operation has a timeout)
  ok     anything else; a Python exception is a fine answer to corrupt bytes

Deterministic by seed (the template's thread ids aside); every crash or hang input is
saved (``--save DIR``) and can be replayed (``--replay FILE ...``). Segments are named
``shmlt-fz-<pid>-<n>`` and removed after each trial.

    python tests/support/fuzz.py --seconds 3600 --seed 7 --save fz-out
    python tests/support/fuzz.py --replay tests/data/fz/*.bin

The last line printed is a JSON summary (tests/test_fuzz.py reads it).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable

import shmlocks

SHM_DIR = "/dev/shm"
LINE = 128
HDR = struct.Struct("<QIIQIIQQQQ")  # magic .. lock_stride (shmlocks/_ext/sys/shm_layout.h)
P = 6  # participant slots of the template (its cap: all provisioned)
PART = shmlocks._core.LAYOUT["participant_size"]  # four lines: token, state, the wait link
HWM_OFF = shmlocks._core.LAYOUT["part_hwm_off"]  # header.part_hwm
KIND_NAMES = list(shmlocks.KINDS)
#: the toolbox objects of the template, after the locks, in their directory order (the
#: condition's lock, an RLock entry of its own, is made just before it)
TB_NAMES = ["event", "semaphore", "barrier", "condition", "rwlock"]
ENTRIES = [*KIND_NAMES, "event", "semaphore", "barrier", "condition.lock", "condition", "rwlock"]
TARGETS = KIND_NAMES + TB_NAMES
CHILD_LIMIT = 40.0  # s: a child past this is a hang (each op's own timeout is <= 0.05 s)
OP_TIMEOUT = 0.05
# header.flags follows creator_pidns (shmlocks/_ext/sys/shm_layout.h); SHM_HDR_PERSIST is bit 0.
# An image is written as a file that no process holds open: without persist, the first open
# takes it for a segment whose last user died and removes it (docs/design.md §2), and the
# trial would test nothing past open().
HDR_FLAGS_OFF = shmlocks._core.LAYOUT["creator_pidns_off"] + 8
HDR_PERSIST = 1
# Saved inputs of layouts 6 and 7 are laid out again as 8 (upgrade(): layout 7 added
# header.flags, zero padding in 6; 8 widened a participant from two lines to four and
# counts the participants provisioned in header.part_hwm).
UPGRADABLE_VERSIONS = (6, 7)

_seq = 0


def _name() -> str:
    global _seq
    _seq += 1
    return f"shmlt-fz-{os.getpid()}-{_seq}"


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_path(name))


# --------------------------------------------------------------------------- templates


class Templates:
    """Template segments: a fresh one and a busy one (live holders of ticket and clh in a
    helper process, a waiter queued on ticket, mcs/futex/robust/pi held by a process that
    was SIGKILLed). The helper lives until close()."""

    def __init__(self) -> None:
        self.helper = 0
        self.tids: list[int] = []
        self.names: list[str] = []
        self.images: list[bytes] = []
        self._fresh()
        self._busy()

    def _region(self):
        name = _name()
        self.names.append(name)
        reg = shmlocks.Region.create(name, max_locks=len(ENTRIES) + 1, max_participants=P)
        for k in KIND_NAMES:
            reg.create_lock(k, k)
        reg.create_event("event")
        reg.create_semaphore("semaphore", 2, bounded=True)
        reg.create_barrier("barrier", 2)
        reg.create_condition("condition")
        reg.create_rwlock("rwlock")
        assert reg.lock_names() == ENTRIES, reg.lock_names()
        return name, reg

    def _fresh(self) -> None:
        name, reg = self._region()
        self.images.append(_read(name))
        reg.close()

    def _busy(self) -> None:
        name, reg = self._region()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the live helper: holds ticket, clh and a read, a second thread waits
            try:
                rr = shmlocks.Region.open(name)
                for k in ("ticket", "clh"):
                    rr.open_lock(k).acquire()
                rr.open_object("rwlock").acquire_read()
                t = threading.Thread(
                    target=lambda: rr.open_lock("ticket").acquire(timeout=1e6), daemon=True
                )
                t.start()
                time.sleep(0.2)
                os.write(w, f"{threading.get_native_id()} {t.native_id}\n".encode())
                time.sleep(1e6)
            finally:
                os._exit(0)
        self.helper = pid
        self.tids += [int(x) for x in os.read(r, 100).split()]
        os.close(r)
        os.close(w)
        r, w = os.pipe()
        dead = os.fork()
        if dead == 0:  # holds mcs, futex, robust, pi and a read, and is SIGKILLed
            try:
                rr = shmlocks.Region.open(name)
                for k in ("mcs", "futex", "robust", "pi"):
                    rr.open_lock(k).acquire()
                rr.open_object("rwlock").acquire_read()
                os.write(w, f"{threading.get_native_id()}\n".encode())
            finally:
                os.kill(os.getpid(), signal.SIGKILL)
        self.tids += [int(x) for x in os.read(r, 100).split()]
        os.close(r)
        os.close(w)
        os.waitpid(dead, 0)
        time.sleep(0.1)
        self.images.append(_read(name))
        self._busy_region = reg

    def close(self) -> None:
        if self.helper:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.helper, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.helper, 0)
            self.helper = 0
        with contextlib.suppress(Exception):
            self._busy_region.close()
        for n in self.names:
            _unlink(n)


def _read(name: str) -> bytes:
    with open(_path(name), "rb") as f:
        return f.read()


# --------------------------------------------------------------------------- mutation


def areas(img: bytes) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges of every field group, by name; lock-body groups per kind
    (``ctl:<kind>``, ``repair:<kind>``, ``words:<kind>``, ``nodes:<kind>``,
    ``precs:<kind>``)."""
    (_m, _v, _ln, _t, nl, npart, dir_off, part_off, locks_off, stride) = HDR.unpack_from(img)
    out: dict[str, list[tuple[int, int]]] = {
        "header": [(0, 96)],
        "hwm": [(HWM_OFF, HWM_OFF + 4)],
        "dir_mutex": [(LINE, LINE + 48)],
        "dir": [(dir_off + i * LINE, dir_off + i * LINE + 72) for i in range(nl)],
        "token": [(part_off + i * PART, part_off + i * PART + 48) for i in range(npart)],
        "slot": [
            (part_off + i * PART + LINE, part_off + i * PART + 2 * LINE) for i in range(npart)
        ],
        "link": [
            (part_off + i * PART + 2 * LINE, part_off + i * PART + PART) for i in range(npart)
        ],
    }
    for k in TARGETS:
        b = locks_off + ENTRIES.index(k) * stride
        out[f"ctl:{k}"] = [(b, b + 64), (b + 112, b + 128)]
        out[f"repair:{k}"] = [(b + 64, b + 112)]
        out[f"words:{k}"] = [(b + LINE, b + LINE + 48), (b + 2 * LINE, b + 2 * LINE + 48)]
        out[f"nodes:{k}"] = [
            (b + (3 + j) * LINE, b + (3 + j) * LINE + 40) for j in range(npart + 1)
        ]
        out[f"precs:{k}"] = [
            (b + (4 + npart + j) * LINE, b + (4 + npart + j) * LINE + 48) for j in range(npart)
        ]
    return out


def mutex_offsets(img: bytes, target: str) -> list[int]:
    """Where the glibc mutexes are: the directory mutex, every token, and the repair
    mutex (and for robust and pi, word A; for a toolbox object, its guard, word B) of the
    lock or object `target`."""
    (_m, _v, _ln, _t, nl, npart, dir_off, part_off, locks_off, stride) = HDR.unpack_from(img)
    b = locks_off + ENTRIES.index(target) * stride
    out = [LINE, b + 64] + [part_off + i * PART for i in range(npart)]
    if target in ("robust", "pi"):
        out += [b + LINE] * 4
    if target in TB_NAMES and target != "rwlock":  # (an RWLock keeps no guard)
        out += [b + 2 * LINE] * 4
    return out


def interesting(tids: list[int]) -> list[int]:
    vals = [0, 1, 2, 3, 4, P - 1, P, P + 1, P + 2, 0xFFFFFFFF, 0xFFFFFFFE, 0x80000000,
            0x7FFFFFFF, 0x40000000, 0x3FFFFFFF, 0x3FFFFFF0, 0xDEAD, 1 << 13, (1 << 13) | 1,
            0x10, 0x20, 0x40, 0x80, 0x90, 0xB0, 0xC0, 0x100, 0x200, 0x7FFFFFFE, os.getpid(),
            1, 0xFFFF, 0x10000]  # fmt: skip
    for t in tids:
        vals += [t, t | 0x40000000, t | 0x80000000, t | 0xC0000000]
    return vals


def mutate(rnd: random.Random, img: bytes, target: str, tids: list[int]) -> bytearray:
    """Scribble 1..4 fields: of the lock of kind `target` (70 %) or anywhere else."""
    buf = bytearray(img)
    ar = areas(img)
    mine = [a for a in ar if a.endswith(":" + target)]
    other = [a for a in ar if ":" not in a]
    vals = interesting(tids)
    mutexes = mutex_offsets(img, target)
    for _ in range(rnd.randint(1, 4)):
        if rnd.random() < 0.3:  # a glibc mutex's field: what glibc asserts on
            off = rnd.choice(mutexes) + rnd.choice([0, 0, 0, 4, 8, 12, 16, 16, 16, 20])
            struct.pack_into("<I", buf, off, rnd.choice(vals))
            continue
        group = rnd.choice(mine if rnd.random() < 0.7 else other)
        lo, hi = rnd.choice(ar[group])
        off = rnd.randrange(lo, hi) & ~3
        c = rnd.random()
        if c < 0.45:
            struct.pack_into("<I", buf, off, rnd.choice(vals))
        elif c < 0.65:
            struct.pack_into("<I", buf, off, rnd.getrandbits(32))
        elif c < 0.75 and off + 8 <= hi and off % 8 == 0:
            struct.pack_into("<Q", buf, off, rnd.choice([rnd.getrandbits(64), 2**64 - 1, 2**63]))
        elif c < 0.85:
            n = rnd.randrange(1, 24)
            buf[off : min(off + n, hi)] = rnd.randbytes(n)[: max(0, min(off + n, hi) - off)]
        elif c < 0.93:
            buf[lo:hi] = bytes(hi - lo)  # a whole field group zeroed
        else:  # a word copied from elsewhere in the segment
            src = rnd.randrange(0, len(img) - 4) & ~3
            buf[off : off + 4] = img[src : src + 4]
    return buf


# --------------------------------------------------------------------------- the child


def exercise(name: str) -> collections.Counter:
    """Every operation on every lock of segment `name`: what raised what."""
    res: collections.Counter = collections.Counter()

    def op(what: str, fn: Callable[[], object]) -> object:
        try:
            v = fn()
            res[what] += 1
            return v
        except Exception as e:  # any exception is a fine answer to corrupt bytes
            res[f"{what}:{type(e).__name__}"] += 1
            return None

    reg = op("open", lambda: shmlocks.Region.open(name))
    if reg is None:
        return res
    op("describe", reg._describe)
    names = op("names", reg.lock_names) or []
    for n in names:
        if n in TB_NAMES:
            obj = op("open_object", lambda n=n: reg.open_object(n))
            if obj is not None and n == "condition":
                # its lock by this segment's name (the body names the template's region)
                obj._lock = op("open_rlock", lambda: reg.open_rlock("condition.lock"))
            if obj is not None:
                exercise_object(obj, op)
            continue
        lk = op("open_lock", lambda n=n: reg.open_lock(n))
        if lk is None:
            continue
        for what in ("locked", "owner", "stats", "_describe", "_raw"):
            op(what, lambda what=what, lk=lk: _call(lk, what))

        def take(lk=lk, blocking=True) -> None:
            got = lk.acquire(timeout=OP_TIMEOUT) if blocking else lk.acquire(False)
            if got:
                if lk.owner_died:
                    lk.mark_consistent()
                lk.release()

        op("try", lambda take=take: take(blocking=False))
        other = threading.Thread(target=lambda take=take: op("thread", take), daemon=True)
        other.start()
        op("timed", take)
        other.join(CHILD_LIMIT)
    op("close", reg.close)
    tools(name, op)
    return res


def tools(name: str, op: Callable[[str, Callable[[], object]], object]) -> None:
    """The read-only tools over the segment's bytes, as the commands run them."""
    from shmlocks import _segment, stats, waitgraph

    seg = op("tool_read", lambda: _segment.read(name))
    if seg is not None:
        op("tool_describe", lambda: _segment.describe(seg))
    op("tool_stat", lambda: stats.segment_stats(name))
    op("tool_graph", lambda: waitgraph.snapshot([name]).cycles())


def exercise_object(obj, op: Callable[[str, Callable[[], object]], object]) -> None:
    """A toolbox object's operations: its readers, its timed waits from this thread and
    another at once; the calls without a timeout in a thread nobody waits for."""
    for what in ("_describe", "_raw", "stats", "_state"):
        op(what, lambda what=what: _call(obj, what))
    kind = type(obj).__name__

    def timed() -> None:
        if kind == "RWLock":
            obj.readers, obj.writer, obj.locked(), obj.owner_died  # noqa: B018 - the readers
            if obj.acquire_read(timeout=OP_TIMEOUT):
                obj.release_read()
            if obj.acquire_write(timeout=OP_TIMEOUT):
                if obj.owner_died:
                    obj.mark_consistent()
                obj.release_write()
            obj.acquire_read(False) and obj.release_read()
        elif kind == "Event":
            obj.wait(OP_TIMEOUT)
        elif kind in ("Semaphore", "BoundedSemaphore"):
            if obj.acquire(timeout=OP_TIMEOUT):
                obj.release()
            obj.acquire(False)
        elif kind == "Barrier":
            obj.n_waiting, obj.broken, obj.parties  # noqa: B018 - the readers
            with contextlib.suppress(threading.BrokenBarrierError):
                obj.wait(OP_TIMEOUT)
        elif kind == "Condition" and obj._lock is not None and obj.acquire(timeout=OP_TIMEOUT):
            try:
                obj.wait(OP_TIMEOUT)
            finally:
                obj.release()

    def notify() -> None:
        if obj.acquire(timeout=OP_TIMEOUT):
            try:
                obj.notify()
            finally:
                obj.release()

    def untimed() -> None:
        if kind == "RWLock":
            op("untimed_clear_not_recoverable", obj.clear_not_recoverable)
            return
        if kind == "Condition":
            if obj._lock is not None:
                op("untimed_notify", notify)
            return
        for what in ("set", "clear", "reset", "abort", "release"):
            f = getattr(obj, what, None)
            if f is not None:
                op(f"untimed_{what}", f)

    op("tb_timed", timed)
    other = threading.Thread(target=lambda: op("tb_thread", timed), daemon=True)
    other.start()
    op("tb_timed2", timed)
    other.join(CHILD_LIMIT)
    threading.Thread(target=untimed, daemon=True).start()


def _call(lk, what: str) -> object:
    v = getattr(lk, what)
    return v() if callable(v) else v


def run_child(img: bytes | bytearray, limit: float = CHILD_LIMIT) -> tuple[str, str, float]:
    """Write `img` as a new segment, exercise it in a forked child: (outcome, detail, s)."""
    name = _name()
    img = bytearray(img)
    flags = struct.unpack_from("<I", img, HDR_FLAGS_OFF)[0]
    struct.pack_into("<I", img, HDR_FLAGS_OFF, flags | HDR_PERSIST)
    with open(_path(name), "wb") as f:
        f.write(img)
    r, w = os.pipe()
    t0 = time.monotonic()
    try:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(r)
                res = exercise(name)
                os.write(w, " ".join(sorted(k for k in res if ":" in k)).encode()[:4000])
            except BaseException:
                code = 3
            finally:
                os._exit(code)
        os.close(w)
        st = None
        while time.monotonic() - t0 < limit:
            p, st = os.waitpid(pid, os.WNOHANG)
            if p:
                break
            st = None
            time.sleep(0.005)
        if st is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            outcome = "hang"
        elif os.WIFSIGNALED(st):
            outcome = "crash:" + signal.Signals(os.WTERMSIG(st)).name
        else:
            outcome = "ok" if os.WEXITSTATUS(st) == 0 else f"exit:{os.WEXITSTATUS(st)}"
        detail = os.read(r, 8192).decode(errors="replace")
        os.close(r)
        return outcome, detail, time.monotonic() - t0
    finally:
        _unlink(name)


def _bad(outcome: str) -> bool:
    return outcome != "ok"


# --------------------------------------------------------------------------- drivers


def fuzz(seconds: float, trials: int, seed: int, save: str | None, log=print) -> dict:
    rnd = random.Random(seed)
    tpl = Templates()
    outcomes: collections.Counter = collections.Counter()
    errors: collections.Counter = collections.Counter()
    saved: list[str] = []
    t_end = time.monotonic() + seconds if seconds else float("inf")
    n = 0
    try:
        while (trials == 0 or n < trials) and time.monotonic() < t_end:
            target = TARGETS[n % len(TARGETS)]  # every kind and object in turn
            ti = rnd.randrange(len(tpl.images))
            img = mutate(rnd, tpl.images[ti], target, tpl.tids)
            outcome, detail, dt = run_child(img)
            outcomes[outcome] += 1
            errors.update(detail.split())
            if _bad(outcome):
                path = None
                if save:
                    os.makedirs(save, exist_ok=True)
                    path = os.path.join(save, f"fz-{seed}-{n}-{target}.bin")
                    with open(path, "wb") as f:
                        f.write(img)
                    saved.append(path)
                log(f"trial {n} ({target}): {outcome} after {dt:.1f}s saved={path} {detail}")
            n += 1
            if n % 100 == 0:
                log(f"{n} trials: {dict(outcomes)}")
    finally:
        tpl.close()
    return _summary(n, seed, outcomes, errors, saved)


def replay(files: list[str], log=print) -> dict:
    outcomes: collections.Counter = collections.Counter()
    errors: collections.Counter = collections.Counter()
    bad = []
    for path in files:
        with open(path, "rb") as f:
            img = bytearray(f.read())
        if struct.unpack_from("<I", img, 8)[0] in UPGRADABLE_VERSIONS:
            img = upgrade(img)
        outcome, detail, dt = run_child(img)
        outcomes[outcome] += 1
        errors.update(detail.split())
        log(f"{path}: {outcome} in {dt:.1f}s {detail}")
        if _bad(outcome):
            bad.append(path)
    return _summary(len(files), None, outcomes, errors, bad)


def upgrade(img: bytearray) -> bytearray:
    """A saved image of layout 6 or 7 laid out as the current one (8): each participant's
    two lines followed by two zero lines (the wait link), the bodies moved after the wider
    table, every participant provisioned (part_hwm = P, as those layouts had them all)."""
    (_m, _v, line, _t, nl, npart, dir_off, part_off, locks_off, stride) = HDR.unpack_from(img)
    old = 2 * line
    new_locks = part_off + npart * PART
    out = bytearray(new_locks + nl * stride)
    out[:part_off] = img[:part_off]
    for i in range(npart):
        out[part_off + i * PART : part_off + i * PART + old] = img[
            part_off + i * old : part_off + (i + 1) * old
        ]
    out[new_locks:] = img[locks_off : locks_off + nl * stride]
    struct.pack_into("<I", out, 8, shmlocks._core.LAYOUT_VERSION)
    struct.pack_into("<Q", out, 16, len(out))  # total_size
    struct.pack_into("<Q", out, 48, new_locks)  # locks_off
    struct.pack_into("<I", out, HWM_OFF, npart)
    return out


def _summary(n, seed, outcomes, errors, saved) -> dict:
    return {
        "trials": n,
        "seed": seed,
        "crashes": sum(v for k, v in outcomes.items() if k.startswith("crash")),
        "hangs": outcomes["hang"],
        "other": sum(v for k, v in outcomes.items() if k.startswith("exit")),
        "outcomes": dict(outcomes),
        "errors": dict(errors.most_common(30)),
        "saved": saved,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=0.0, help="time budget (0: none)")
    ap.add_argument("--trials", type=int, default=0, help="trial budget (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--save", help="directory for the inputs that crash or hang")
    ap.add_argument("--replay", nargs="+", metavar="FILE", help="replay saved inputs")
    a = ap.parse_args(argv)
    if a.replay:
        s = replay(a.replay)
    else:
        if not a.seconds and not a.trials:
            ap.error("give --seconds or --trials")
        s = fuzz(a.seconds, a.trials, a.seed, a.save)
    print(json.dumps(s), flush=True)
    return 1 if s["crashes"] or s["hangs"] or s["other"] else 0


if __name__ == "__main__":
    sys.exit(main())
