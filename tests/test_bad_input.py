"""Malformed input of every sort: names, arguments, and the bytes of the segment itself.
None may crash the interpreter; whatever can go wrong in a child process is tried there,
and the child must end by itself (never by a signal)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import posix_ipc
import pytest
from support import (
    KINDS,
    ROBUST_KINDS,
    kill,
    outcome,
    run_python,
    shm_exists,
    shm_path,
    shm_remove,
    uniq,
)

import shmlocks

pytestmark = pytest.mark.timeout(60)

BAD_NAME_VALUES = ["", "a/b", "../etc", "x/", "a\0b", "\0", "x" * 300, "y" * 10000, ".", ".."]
BAD_NAME_TYPES = [123, 1.5, 3j, object(), ["a"], ("a",)]


def _openers():
    yield "Region.create", lambda n: shmlocks.Region.create(name=n)
    yield "Region.open", shmlocks.Region.open
    for kind_name, cls in shmlocks.KINDS.items():
        yield f"{kind_name}.create", lambda n, cls=cls: cls.create(name=n)
        yield f"{kind_name}.open", cls.open


@pytest.mark.parametrize("bad", BAD_NAME_VALUES, ids=lambda b: repr(b)[:20])
def test_bad_segment_names_raise_value_error(bad):
    for what, call in _openers():
        with pytest.raises(ValueError):
            call(bad)
            pytest.fail(f"{what}({bad!r}) did not raise")


@pytest.mark.parametrize("bad", BAD_NAME_TYPES, ids=lambda b: type(b).__name__)
def test_bad_segment_name_types_raise_type_error(bad):
    for what, call in _openers():
        with pytest.raises(TypeError):
            call(bad)
            pytest.fail(f"{what}({bad!r}) did not raise")


def test_bad_lock_names_and_kinds(new_region):
    region = new_region()
    for bad in ["", "a\0b", "n" * 56, "n" * 1000]:
        with pytest.raises(ValueError):
            region.create_lock(bad, "ticket")
    for bad in [1, None, b"x", object()]:
        with pytest.raises(TypeError):
            region.create_lock(bad, "ticket")
        with pytest.raises(TypeError):
            region.open_lock(bad)
    for bad in ["nope", "TICKET", ""]:
        with pytest.raises((ValueError, shmlocks.LockKindError)):
            region.create_lock("k", bad)
    for bad in [1, None, object(), int, shmlocks.Region]:
        with pytest.raises(TypeError):
            region.create_lock("k", bad)
    assert region.lock_names() == []
    region.create_lock("n" * 55, "mcs")  # the longest name that fits
    assert region.lock_names() == ["n" * 55]


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"max_participants": 0}, ValueError),
        ({"max_participants": -1}, ValueError),
        ({"max_participants": "8"}, TypeError),
        ({"max_participants": 2.0}, TypeError),
        ({"max_locks": 0}, ValueError),
        ({"max_locks": -5}, ValueError),
        ({"max_locks": None}, TypeError),
    ],
)
def test_bad_sizes(kwargs, exc):
    name = uniq("size")
    try:
        with pytest.raises(exc):
            shmlocks.Region.create(name=name, **kwargs)
        if "max_participants" in kwargs:
            with pytest.raises(exc):
                shmlocks.TicketLock.create(name=name, **kwargs)
        assert not shm_exists(name), "a rejected create left its segment behind"
    finally:
        shm_remove(name)


# --------------------------------------------------------------------------- foreign segments


def _foreign_segment(name, content: bytes | None, size: int):
    shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, size=size)
    try:
        if content is not None:
            os.pwrite(shm.fd, content, 0)
    finally:
        shm.close_fd()


OPEN_SCRIPT = textwrap.dedent(
    """
    import sys, shmlocks
    name, every = sys.argv[1], sys.argv[2] == "all"
    results = []
    openers = [shmlocks.Region.open] + [c.open for c in shmlocks.KINDS.values()]
    for opener in openers if every else openers[:2]:
        try:
            opener(name)
            results.append("opened")
        except shmlocks.CorruptRegionError:
            results.append("CorruptRegionError")
        except Exception as e:
            results.append(type(e).__name__ + ": " + str(e))
    print(";".join(results))
    """
)


def open_in_child(name, every=True):
    """Try every opener on ``name`` in a child (or only Region.open and TicketLock.open:
    a segment that never became ready costs each opener its bounded wait)."""
    proc = run_python(OPEN_SCRIPT, name, "all" if every else "two", timeout=40)
    assert proc.returncode == 0, f"child died (rc={proc.returncode}): {proc.stderr[-2000:]}"
    return proc.stdout.strip().split(";")


@pytest.mark.parametrize("variant", ["random", "zeros", "ten-bytes", "empty", "magic-only"])
def test_foreign_segment_is_corrupt_region(variant):
    name = uniq(f"foreign-{variant}")
    rng = random.Random(7)
    content, size = {
        "random": (rng.randbytes(65536), 65536),
        "zeros": (None, 65536),
        "ten-bytes": (rng.randbytes(10), 10),
        "empty": (None, 0),
        "magic-only": (b"SHMLOCK1" + bytes(8), 4096),
    }[variant]
    try:
        _foreign_segment(name, content, size)
        results = open_in_child(name, every=variant in ("random", "zeros"))
        assert len(results) >= 2
        assert results == ["CorruptRegionError"] * len(results), results
        assert shm_exists(name), "opening a foreign segment must not unlink it"
    finally:
        shm_remove(name)


def _persisted_region(name, kinds=KINDS, max_participants=4):
    region = shmlocks.Region.create(
        name=name, max_locks=len(kinds), max_participants=max_participants, persist=True
    )
    for k in kinds:
        region.create_lock(f"L-{k}", k)
    region.close()
    assert shm_exists(name)
    with open(shm_path(name), "rb") as f:
        return f.read()


@pytest.mark.parametrize("damage", ["magic", "truncated", "extended", "halved"])
def test_damaged_region_is_corrupt_region(damage):
    name = uniq(f"damaged-{damage}")
    try:
        image = _persisted_region(name)
        path = shm_path(name)
        if damage == "magic":
            with open(path, "r+b") as f:
                f.write(b"NOTALOCK")
        elif damage == "truncated":
            os.truncate(path, len(image) - 128)
        elif damage == "extended":
            os.truncate(path, len(image) + 4096)
        else:
            os.truncate(path, len(image) // 2)
        assert open_in_child(name)[0] == "CorruptRegionError"
    finally:
        shm_remove(name)


# --------------------------------------------------------------------------- scribbling

SCRIBBLE_SCRIPT = textwrap.dedent(
    """
    import faulthandler, sys, shmlocks
    faulthandler.enable()
    name = sys.argv[1]
    report = {"errors": [], "foreign": []}
    def note(e):
        key = "errors" if isinstance(e, shmlocks.ShmLockError) else "foreign"
        report[key].append(type(e).__name__ + ": " + str(e)[:200])
    try:
        region = shmlocks.Region.open(name)
    except Exception as e:
        note(e)
    else:
        try:
            names = region.lock_names()
        except Exception as e:
            note(e)
            names = []
        for n in names[:16]:
            try:
                lk = region.open_lock(n)
            except Exception as e:
                note(e)
                continue
            for op in ("acquire", "locked", "owner", "owner_died", "release", "mark_consistent"):
                try:
                    if op == "acquire":
                        lk.acquire(timeout=0.2)
                    elif op in ("release", "mark_consistent", "locked"):
                        getattr(lk, op)()
                    else:
                        getattr(lk, op)
                except Exception as e:
                    note(e)
        try:
            region.close()
        except Exception as e:
            note(e)
    import json
    print(json.dumps(report))
    """
)


def scribble(image: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    buf = bytearray(image)
    for _ in range(rng.randint(1, 8)):
        length = rng.choice([1, 2, 4, 8, rng.randint(1, 256)])
        off = rng.randrange(0, len(buf) - length)
        mode = rng.random()
        if mode < 0.4:
            chunk = rng.randbytes(length)
        elif mode < 0.7:  # plausible indices and counts: the dangerous kind of garbage
            word = rng.choice([0, 1, 2, 3, 7, 0x7FFFFFFF, 0xFFFFFFFF, rng.randrange(1 << 32)])
            chunk = (word.to_bytes(4, "little") * (length // 4 + 1))[:length]
        elif mode < 0.85:
            chunk = b"\xff" * length
        else:
            chunk = bytes(length)
        buf[off : off + length] = chunk
    return bytes(buf)


@pytest.mark.timeout(180)
def test_scribbled_region_never_crashes():
    base = uniq("scribble")
    image = _persisted_region(base)
    shm_remove(base)
    seeds = list(range(64))
    names = [uniq(f"scribble-{s}") for s in seeds]
    crashed, hung, foreign = [], [], []
    try:
        for batch in range(0, len(seeds), 8):
            running = []
            for seed in seeds[batch : batch + 8]:
                name = names[seed]
                with open(shm_path(name), "wb") as f:
                    f.write(scribble(image, seed))
                os.chmod(shm_path(name), 0o600)
                p = subprocess.Popen(
                    [sys.executable, "-c", SCRIBBLE_SCRIPT, name],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                running.append((seed, p))
            for seed, p in running:
                try:
                    out, err = p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
                    hung.append(seed)
                    continue
                if p.returncode < 0:
                    crashed.append((seed, signal.Signals(-p.returncode).name, err[-1500:]))
                elif p.returncode != 0:
                    foreign.append((seed, f"rc={p.returncode}", err[-500:]))
                else:
                    report = json.loads(out.strip().splitlines()[-1])
                    if report["foreign"]:
                        foreign.append((seed, report["foreign"]))
    finally:
        for name in names:
            shm_remove(name)
    assert not crashed, f"a scribbled segment killed the process: {crashed}"
    assert not hung, f"a scribbled segment hung the process for 30 s (seeds {hung})"
    assert not foreign, f"errors that are not shmlocks errors: {foreign}"


# --------------------------------------------------------------------------- capacity


@pytest.mark.timeout(30)
def test_capacity_error_and_slots_freed_by_thread_exit(new_region):
    region = new_region(max_locks=4, max_participants=2)
    locks = [region.create_lock(f"c{i}", k) for i, k in enumerate(["ticket", "robust", "mcs"])]
    outcomes = {}
    holding = [threading.Event() for _ in range(3)]
    done = threading.Event()

    def use(i):
        try:
            outcomes[i] = locks[i].acquire(timeout=5)
        except shmlocks.CapacityError:
            outcomes[i] = "CapacityError"
            return
        finally:
            holding[i].set()
        done.wait(10)
        locks[i].release()

    threads = []
    for i in range(3):
        t = threading.Thread(target=use, args=(i,))
        t.start()
        threads.append(t)
        assert holding[i].wait(10)
    assert outcomes == {0: True, 1: True, 2: "CapacityError"}
    done.set()
    for t in threads:
        t.join(10)

    # the slots came back when those threads exited
    later = {}

    def again(i):
        later[i] = locks[i].acquire(timeout=5)
        locks[i].release()

    for i in range(3):
        t = threading.Thread(target=again, args=(i,))
        t.start()
        t.join(10)
    assert later == {0: True, 1: True, 2: True}


@pytest.mark.timeout(30)
def test_capacity_error_single_lock(new_lock):
    lock = new_lock("futex", max_participants=1)
    assert lock.acquire()
    try:
        got = []
        t = threading.Thread(target=lambda: got.append(outcome(lock.acquire, timeout=0.5)))
        t.start()
        t.join(10)
        assert got == ["CapacityError"]
    finally:
        lock.release()


def _use_then_idle(lock, conn):
    assert lock.acquire(timeout=5)
    lock.release()
    conn.send(os.getpid())
    time.sleep(30)  # keeps its participant slot until killed


@pytest.mark.timeout(30)
def test_slot_of_a_killed_process_is_reclaimed(procs, new_lock):
    lock = new_lock("ticket", max_participants=1)
    r, w = mp.Pipe(duplex=False)
    p = procs.start(_use_then_idle, lock, w)
    assert r.poll(20)
    r.recv()
    with pytest.raises(shmlocks.CapacityError):
        lock.acquire(timeout=0.5)  # the idle child still owns the only slot
    kill(p)
    assert p.exitcode == -signal.SIGKILL
    assert lock.acquire(timeout=2) is True, "the dead process's slot was not reclaimed"
    lock.release()


# --------------------------------------------------------------------------- close while held

REOPEN_SCRIPT = textwrap.dedent(
    """
    import sys, shmlocks
    region = shmlocks.Region.open(sys.argv[1])
    lk = region.open_lock(sys.argv[2])
    got = lk.acquire(timeout=2)
    print(got, lk.owner_died if got else None)
    if got:
        try:
            lk.mark_consistent()
        except Exception:
            pass
        lk.release()
    """
)


@pytest.mark.timeout(30)
def test_close_while_this_thread_holds_releases(kind):
    name = uniq(f"closeheld-{kind}")
    creator = shmlocks.Region.create(name=name)
    try:
        creator.create_lock("a", kind)
        view = shmlocks.Region.open(name)
        lk = view.open_lock("a")
        assert lk.acquire()
        view.close()  # releases what this thread holds through it
        proc = run_python(REOPEN_SCRIPT, name, "a", timeout=20)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["True", "False"], "close() did not release the lock"
        mine = creator.open_lock("a")
        assert mine.acquire(timeout=2) is True, "the creator's view stopped working"
        mine.release()
    finally:
        creator.close()
    assert not shm_exists(name)


@pytest.mark.timeout(30)
def test_close_of_a_standalone_lock_while_held_releases(kind):
    cls = shmlocks.KINDS[kind]
    lock = cls.create(name=uniq(f"closeheld1-{kind}"))
    try:
        view = cls.open(lock.name)
        assert view.acquire()
        view.close()
        proc = run_python(
            f"import shmlocks; lk = shmlocks.KINDS[{kind!r}].open({lock.name!r});"
            "got = lk.acquire(timeout=2); print(got, got and lk.owner_died)",
            timeout=20,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["True", "False"]
    finally:
        lock.close()


CLOSE_OTHER_THREAD = textwrap.dedent(
    """
    import sys, threading, shmlocks
    name1, name2, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    r1 = shmlocks.Region.create(name=name1, persist=True)
    r1.create_lock("a", kind)
    r2 = shmlocks.Region.create(name=name2, persist=True)
    r2.create_lock("b", kind)
    r2.create_lock("c", kind)
    held, closed = threading.Event(), threading.Event()
    ok = []

    def worker():
        c, a = r2.open_lock("c"), r1.open_lock("a")
        assert c.acquire(timeout=5)  # oldest entry of this thread's robust list
        assert a.acquire(timeout=5)  # the newest: the list runs c <- a <- head
        held.set()
        closed.wait(10)
        # glibc updates this thread's robust list on every robust lock and unlock, walking
        # it through a (in r1): r1 must still be mapped here
        b = r2.open_lock("b")
        for _ in range(3):
            assert b.acquire(timeout=5)
            b.release()
        ok.append(True)
        # now exit holding a and c: the kernel walks the list at thread exit and must mark
        # both dead, which it cannot do past a hole where r1 used to be

    t = threading.Thread(target=worker)
    t.start()
    assert held.wait(10)
    r1.close()
    closed.set()
    t.join(20)
    assert not t.is_alive() and ok == [True]
    print("done")
    """
)


@pytest.mark.timeout(40)
@pytest.mark.parametrize("kind", ROBUST_KINDS)
def test_close_while_another_thread_holds(kind):
    name1, name2 = uniq(f"closeother-{kind}"), uniq(f"closeother2-{kind}")
    try:
        proc = run_python(CLOSE_OTHER_THREAD, name1, name2, kind, timeout=30)
        assert proc.returncode == 0, f"rc={proc.returncode}: {proc.stderr[-2000:]}"
        assert proc.stdout.split() == ["done"]
        # the robust list stayed intact: both locks the exited thread held are marked dead
        for name, lock_name in ((name1, "a"), (name2, "c")):
            check = run_python(REOPEN_SCRIPT, name, lock_name, timeout=20)
            assert check.returncode == 0, check.stderr
            assert check.stdout.split() == ["True", "True"], (
                f"lock {lock_name!r} held by the exited thread was not seen as owner death: "
                f"{check.stdout!r}"
            )
    finally:
        shm_remove(name1)
        shm_remove(name2)
