"""Who owns a segment's name, and when it goes: nothing leaks in /dev/shm when a program
ends normally; persist keeps it; unlink() removes it at once while mappings keep working;
garbage collection of the creator unlinks; a forked child never unlinks its parent's."""

from __future__ import annotations

import gc
import json
import os
import textwrap

import pytest
from support import KINDS, assert_child_excludes, run_python, shm_exists, shm_remove, uniq

import shmlocks

pytestmark = pytest.mark.timeout(60)

CREATOR = textwrap.dedent(
    """
    import json, sys, shmlocks
    names, close, hold = json.loads(sys.argv[1]), sys.argv[2] == "close", sys.argv[3] == "hold"
    made = []
    for kind, name in zip(shmlocks.KINDS, names["locks"]):
        made.append(shmlocks.KINDS[kind].create(name=name))
    for kind in shmlocks.KINDS:
        made.append(shmlocks.KINDS[kind].create())          # generated names
    region = shmlocks.Region.create(name=names["region"])
    for kind in shmlocks.KINDS:
        region.create_lock("in-" + kind, kind)
    made.append(region)
    made.append(shmlocks.Region.create())
    held = []
    if hold:
        for obj in made:
            if isinstance(obj, shmlocks.Region):
                held.extend(obj.open_lock(n) for n in obj.lock_names())
            else:
                held.append(obj)
        for lk in held:
            assert lk.acquire(timeout=1)
    print(json.dumps([o.name for o in made]))
    sys.stdout.flush()
    if close:
        for obj in made:
            obj.close()
    # otherwise: just end, with everything still open (and maybe held)
    """
)


def run_creator(mode, hold, persist_names=()):
    names = {"locks": [uniq(f"life-{k}") for k in KINDS], "region": uniq("life-region")}
    proc = run_python(CREATOR, json.dumps(names), mode, "hold" if hold else "-")
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    assert made[: len(KINDS)] == names["locks"]
    return made


@pytest.mark.parametrize("hold", [False, True], ids=["free", "held"])
@pytest.mark.parametrize("mode", ["close", "exit"])
def test_normal_exit_leaves_nothing(mode, hold):
    made = run_creator(mode, hold)
    try:
        left = [n for n in made if shm_exists(n)]
        assert not left, f"left in /dev/shm after a normal exit ({mode}, {hold=}): {left}"
    finally:
        for n in made:
            shm_remove(n)


PERSIST = textwrap.dedent(
    """
    import sys, shmlocks
    lock = shmlocks.KINDS[sys.argv[1]].create(name=sys.argv[2], persist=True)
    region = shmlocks.Region.create(name=sys.argv[3], persist=True)
    region.create_lock("x", sys.argv[1])
    lock.acquire(); lock.release()
    """
)


def test_persist_keeps_the_segment(kind):
    lock_name, region_name = uniq(f"persist-{kind}"), uniq("persist-region")
    try:
        proc = run_python(PERSIST, kind, lock_name, region_name)
        assert proc.returncode == 0, proc.stderr
        assert shm_exists(lock_name) and shm_exists(region_name)
        lock = shmlocks.KINDS[kind].open(lock_name)
        assert lock.acquire(timeout=1) is True
        lock.release()
        lock.unlink()
        assert not shm_exists(lock_name)
        lock.close()
        region = shmlocks.Region.open(region_name)
        assert region.lock_names() == ["x"]
        region.unlink()
        region.close()
        assert not shm_exists(region_name)
    finally:
        shm_remove(lock_name)
        shm_remove(region_name)


def test_persist_in_process(kind):
    name = uniq(f"persist2-{kind}")
    try:
        lock = shmlocks.KINDS[kind].create(name=name, persist=True)
        lock.close()
        assert shm_exists(name)
        del lock
        gc.collect()
        assert shm_exists(name)
    finally:
        shm_remove(name)


def test_unlink_removes_name_mapping_keeps_working(procs, kind):
    cls = shmlocks.KINDS[kind]
    lock = cls.create(name=uniq(f"unlink-{kind}"))
    try:
        lock.unlink()
        assert not shm_exists(lock.name)
        with pytest.raises(FileNotFoundError):
            cls.open(lock.name)
        assert lock.acquire(timeout=1) is True
        lock.release()
        # a forked child shares the unlinked mapping and contends with us
        assert_child_excludes(procs, lock, "fork")
    finally:
        lock.close()  # the name is gone already: close must not complain
    with pytest.raises(ValueError):
        lock.acquire()


def test_region_unlink_keeps_mapping():
    region = shmlocks.Region.create(name=uniq("unlink-region"))
    lk = region.create_lock("x", "clh")
    region.unlink()
    assert not shm_exists(region.name)
    region.create_lock("y", "futex")
    assert sorted(region.lock_names()) == ["x", "y"]
    with lk:
        assert lk.locked()
    region.close()


def test_gc_of_creator_unlinks(kind):
    lock = shmlocks.KINDS[kind].create(name=uniq(f"gc-{kind}"))
    region = shmlocks.Region.create(name=uniq("gc-region"))
    region.create_lock("x", kind)
    names = [lock.name, region.name]
    try:
        assert all(shm_exists(n) for n in names)
        del lock, region
        gc.collect()
        left = [n for n in names if shm_exists(n)]
        assert not left, f"garbage collecting the creator left its name behind: {left}"
    finally:
        for n in names:
            shm_remove(n)


def test_gc_of_an_opened_view_does_not_unlink(new_lock, kind):
    lock = new_lock(kind)
    view = shmlocks.KINDS[kind].open(lock.name)
    del view
    gc.collect()
    assert shm_exists(lock.name)


def _use_and_exit(lock):
    assert lock.acquire(timeout=5)
    lock.release()
    return lock.name


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_child_exit_does_not_unlink_parents_segment(procs, new_lock, kind, method):
    lock = new_lock(kind)
    assert procs.call(_use_and_exit, lock, method=method) == lock.name
    assert shm_exists(lock.name), f"a {method} child's normal exit unlinked its parent's segment"
    assert lock.acquire(timeout=1)
    lock.release()


FORK_SCRIPT = textwrap.dedent(
    """
    import os, sys, shmlocks
    lock = shmlocks.KINDS[sys.argv[1]].create(name=sys.argv[2])
    region = shmlocks.Region.create(name=sys.argv[3])
    region.create_lock("x", sys.argv[1])
    pid = os.fork()
    if pid == 0:
        lock.acquire(); lock.release()
        region.open_lock("x").acquire(timeout=1)
        sys.exit(0)          # a normal exit: atexit handlers and finalizers run
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print(os.path.exists("/dev/shm/" + sys.argv[2]), os.path.exists("/dev/shm/" + sys.argv[3]))
    """
)


def test_forked_child_normal_exit_keeps_parents_names(kind):
    lock_name, region_name = uniq(f"fork-{kind}"), uniq("fork-region")
    try:
        proc = run_python(FORK_SCRIPT, kind, lock_name, region_name)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["True", "True"], "the forked child unlinked them"
        assert not shm_exists(lock_name) and not shm_exists(region_name), (
            "the parent's exit did not unlink"
        )
    finally:
        shm_remove(lock_name)
        shm_remove(region_name)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", list(shmlocks.KINDS))
def test_weak_references(kind):
    """Locks and regions support weak references, as threading.Lock does (caches keyed by
    lock rely on it); a dead referent clears the reference, and its segment is gone."""
    import weakref

    lock = shmlocks.KINDS[kind].create(uniq(f"weak-{kind}"))
    name = lock.name
    ref, rref = weakref.ref(lock), weakref.ref(lock.region)
    cache = weakref.WeakKeyDictionary({lock: "x"})
    assert ref() is lock and rref() is lock.region and cache[lock] == "x"
    del lock
    gc.collect()
    assert ref() is None and rref() is None and len(cache) == 0
    assert not shm_exists(name), "the segment outlived its last reference"


@pytest.mark.parametrize("kind", list(shmlocks.KINDS))
def test_name_with_a_lone_surrogate_is_refused_before_creation(kind):
    """os.listdir gives a non-UTF-8 file name back as a lone surrogate: such a name used to
    be created, then close() could not encode it to unlink it (a leak in /dev/shm)."""
    name = uniq(f"surrogate-{kind}") + "-\udcff"
    disk = os.fsencode(name)
    try:
        with pytest.raises(ValueError, match="surrogate"):
            shmlocks.KINDS[kind].create(name)
        with pytest.raises(ValueError, match="surrogate"):
            shmlocks.Region.create(name)
        with pytest.raises(ValueError, match="surrogate"):
            shmlocks.Region.open(name)
        assert not os.path.exists(b"/dev/shm/" + disk)
    finally:
        if os.path.exists(b"/dev/shm/" + disk):
            os.unlink(b"/dev/shm/" + disk)
